// _erun: the compiled half of the `erun` Python package (python/erun/). It
// binds the worker library (erun::init(), the Context's communicator, State,
// ElasticSampler) with raw addresses: the pure-Python side checks a tensor or
// array (contiguous, dtype) and passes its data pointer, so collectives and
// commits work on the caller's own memory without a copy and without linking
// libtorch. CUDA tensors go to the GPU collectives (Context::gpu()) with their
// device index and torch's current stream as an integer (a cudaStream_t);
// this file needs no CUDA header. Every blocking call releases the GIL and is aborted by a
// SIGINT (KeyboardInterrupt). C++ exceptions become erun.Error /
// erun.CommError / erun.HostsUpdated.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "erun/erun.hpp"

namespace py = pybind11;

namespace erun {
namespace {

Context* g_ctx = nullptr;  // owned by erun::init(); set once init() succeeded

Context& ctx() {
  if (g_ctx == nullptr) throw Error("erun: call erun.init() before any other erun function");
  return *g_ctx;
}

// Ctrl-C during a blocked collective: SIGINT (after Python's own handler has
// noted it) wakes a watcher thread through a pipe, which aborts the
// communicator of the collective in flight; the call then fails with
// CommError and Python raises KeyboardInterrupt at once instead of after the
// collective timeout.
struct Interrupts {
  int pipe_fds[2] = {-1, -1};
  struct sigaction previous {};
  std::mutex mu;
  std::function<void()> abort_in_flight;  // guarded by mu
};
Interrupts* g_interrupts = nullptr;  // installed once by init(), never freed

void on_sigint(int sig, siginfo_t* info, void* uctx) {
  Interrupts* in = g_interrupts;
  const char c = 1;
  (void)!::write(in->pipe_fds[1], &c, 1);
  if (in->previous.sa_flags & SA_SIGINFO) {
    in->previous.sa_sigaction(sig, info, uctx);
  } else if (in->previous.sa_handler != SIG_DFL && in->previous.sa_handler != SIG_IGN) {
    in->previous.sa_handler(sig);
  }
}

// Only when Python handles SIGINT (its default handler raises KeyboardInterrupt).
void install_interrupts() {
  if (g_interrupts != nullptr) return;
  struct sigaction current {};
  if (::sigaction(SIGINT, nullptr, &current) != 0) return;
  if (!(current.sa_flags & SA_SIGINFO) && (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN)) return;
  auto* in = new Interrupts();
  if (::pipe2(in->pipe_fds, O_CLOEXEC) != 0) {
    delete in;
    return;
  }
  ::fcntl(in->pipe_fds[1], F_SETFL, O_NONBLOCK);  // the handler never blocks
  in->previous = current;
  g_interrupts = in;
  std::thread([in] {
    char c;
    while (::read(in->pipe_fds[0], &c, 1) > 0 || errno == EINTR) {
      std::lock_guard<std::mutex> lock(in->mu);
      if (in->abort_in_flight) in->abort_in_flight();
    }
  }).detach();
  struct sigaction sa {};
  sa.sa_sigaction = on_sigint;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
}

// Sets what a SIGINT aborts (a CPU or GPU communicator) while this object lives.
class InFlight {
 public:
  explicit InFlight(std::function<void()> abort) { set(std::move(abort)); }
  ~InFlight() { set(nullptr); }

 private:
  static void set(std::function<void()> abort) {
    if (g_interrupts == nullptr) return;
    std::lock_guard<std::mutex> lock(g_interrupts->mu);
    g_interrupts->abort_in_flight = std::move(abort);
  }
};

// Runs a blocking call without the GIL, abortable by SIGINT through `abort`.
// When a SIGINT aborted it, Python's handler runs here and its
// KeyboardInterrupt replaces the CommError.
template <typename F>
void blocking_with(std::function<void()> abort, F&& f) {
  try {
    py::gil_scoped_release nogil;
    InFlight guard(std::move(abort));
    f();
  } catch (const CommError&) {
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    throw;
  }
}

template <typename F>
void blocking(Communicator& c, F&& f) {
  blocking_with([&c] { c.abort(); }, std::forward<F>(f));
}

// The GPU communicator on `device` (the tensor's): chosen before its first
// collective; a tensor on another device afterwards is an erun.Error.
GpuCommunicator& gpu_on(int device) {
  GpuCommunicator& g = ctx().gpu();
  g.set_device(device);
  return g;
}

template <typename F>
void gpu_blocking(GpuCommunicator& g, F&& f) {
  blocking_with([&g] { g.abort(); }, std::forward<F>(f));
}

GpuStream stream_of(uintptr_t s) { return reinterpret_cast<GpuStream>(s); }

// erun.DataType / erun.ReduceOp arrive as the enums bound below; pybind11
// also builds members from any integer (DataType(9)), which are refused here.
DataType checked(DataType t) {
  const int v = static_cast<int>(t);
  if (v < 0 || v > static_cast<int>(DataType::kBFloat16)) {
    throw Error("erun: unknown data type code " + std::to_string(v));
  }
  return t;
}

ReduceOp checked(ReduceOp op) {
  const int v = static_cast<int>(op);
  if (v < 0 || v > static_cast<int>(ReduceOp::kProduct)) {
    throw Error("erun: unknown reduce op code " + std::to_string(v));
  }
  return op;
}

// ReduceOp == ReduceOp or ReduceOp == int (not another enum, not None).
bool same_code(const py::object& op, const py::object& other) {
  if (py::isinstance<ReduceOp>(other)) return py::int_(op).equal(py::int_(other));
  return py::isinstance<py::int_>(other) && py::int_(op).equal(other);
}

void* address(uintptr_t p) { return reinterpret_cast<void*>(p); }

// A State whose entries may be Python callables. The callables live as long
// as the State (they are owned here; the State's entries keep raw pointers),
// and are called with the GIL, which every collective method releases.
class PyState {
 public:
  PyState() : state_(std::make_unique<State>(ctx())) {
    // The C++ State decides when a reset is due (after the sync that follows
    // any rank's re-join, on survivors and joiners alike); Python runs its
    // own callbacks with the sizes recorded here.
    state_->on_reset([this](int old_size, int new_size) { pending_reset_ = {old_size, new_size}; });
  }

  void register_buffer(const std::string& name, uintptr_t data, size_t bytes) {
    state_->register_buffer(name, address(data), bytes);
  }

  // save() returns a list of pieces, each a bytes-like object or an
  // (address, nbytes) pair; they are concatenated into the entry. load(view)
  // receives a read-only memoryview of the committed bytes.
  void register_callbacks(const std::string& name, py::function save, py::function load) {
    callbacks_.push_back(std::make_unique<Callbacks>(Callbacks{std::move(save), std::move(load)}));
    Callbacks* cb = callbacks_.back().get();
    // The pieces stay where they are until commit() has copied them into the
    // commit: `Held` keeps them alive, and is freed with the GIL held.
    struct Held {
      py::list pieces;
      std::vector<py::buffer_info> buffers;
    };
    auto save_fn = [cb]() {
      py::gil_scoped_acquire gil;
      auto held = std::shared_ptr<Held>(new Held{cb->save(), {}}, [](Held* h) {
        py::gil_scoped_acquire again;
        delete h;
      });
      erun::State::Pieces out;
      for (py::handle piece : held->pieces) {
        if (py::isinstance<py::tuple>(piece)) {
          auto t = piece.cast<std::pair<uintptr_t, size_t>>();
          out.ranges.emplace_back(address(t.first), t.second);
        } else {
          held->buffers.push_back(py::reinterpret_borrow<py::buffer>(piece).request());
          const py::buffer_info& b = held->buffers.back();
          out.ranges.emplace_back(b.ptr, static_cast<size_t>(b.size * b.itemsize));
        }
      }
      out.keep = std::move(held);
      return out;
    };
    auto load_fn = [cb](const char* data, size_t size) {
      py::gil_scoped_acquire gil;
      // Writable so that torch.frombuffer accepts it; the callee only reads.
      auto view = py::memoryview::from_memory(const_cast<char*>(data), static_cast<ssize_t>(size));
      cb->load(view);
    };
    state_->register_pieces(name, std::move(save_fn), std::move(load_fn));
  }

  // A sharded entry (State::register_shard_bytes): save() returns the
  // piece as [(address, nbytes)], load(view) copies a committed piece of the
  // current layout back, prepare(rows) returns the address of new storage of
  // that many rows, install() makes it the piece.
  void register_shard(const std::string& name, uint64_t rows, uint64_t row_bytes, bool even, py::function save,
                      py::function load, py::function prepare, py::function install) {
    shards_.push_back(std::make_unique<ShardCallbacks>(
        ShardCallbacks{std::move(save), std::move(load), std::move(prepare), std::move(install)}));
    ShardCallbacks* cb = shards_.back().get();
    State::ShardStorage s;
    s.save = [cb] {
      py::gil_scoped_acquire gil;
      State::Pieces out;
      for (py::handle piece : cb->save()) {
        auto t = piece.cast<std::pair<uintptr_t, size_t>>();
        out.ranges.emplace_back(address(t.first), t.second);
      }
      return out;
    };
    s.load = [cb](const char* data, size_t size) {
      py::gil_scoped_acquire gil;
      cb->load(py::memoryview::from_memory(const_cast<char*>(data), static_cast<ssize_t>(size)));
    };
    s.prepare = [cb](uint64_t n) {
      py::gil_scoped_acquire gil;
      return address(cb->prepare(n).cast<uintptr_t>());
    };
    s.install = [cb] {
      py::gil_scoped_acquire gil;
      cb->install();
    };
    state_->register_shard_bytes(name, State::ShardSpec{rows, row_bytes, even ? State::ShardSplit::kEven
                                                                              : State::ShardSplit::kChunk},
                                 std::move(s));
  }

  void commit() {
    blocking(ctx().comm(), [&] { state_->commit(); });
  }
  void restore() {
    py::gil_scoped_release nogil;
    state_->restore();
  }
  void sync() {
    blocking(ctx().comm(), [&] { state_->sync(); });
  }
  void check_host_updates() {
    blocking(ctx().comm(), [&] { state_->check_host_updates(); });
  }
  uint64_t commit_id() const { return state_->commit_id(); }
  void set_checkpoint_dir(const std::string& dir) {
    py::gil_scoped_release nogil;
    state_->set_checkpoint_dir(dir);
  }
  // After a failed attempt of erun.run(): restore when comm_error, re-join the
  // next generation.
  void rejoin(bool comm_error, const std::string& what) {
    py::gil_scoped_release nogil;
    detail::rejoin(*state_, comm_error, what.c_str());
  }
  // After sync(): (old_size, new_size) when the reset callbacks are due, else None.
  std::optional<std::pair<int, int>> take_reset() {
    state_->run_pending_reset();
    return std::exchange(pending_reset_, std::nullopt);
  }
  State& state() { return *state_; }

 private:
  struct Callbacks {
    py::function save;
    py::function load;
  };
  std::vector<std::unique_ptr<Callbacks>> callbacks_;
  struct ShardCallbacks {
    py::function save;
    py::function load;
    py::function prepare;
    py::function install;
  };
  std::vector<std::unique_ptr<ShardCallbacks>> shards_;
  std::unique_ptr<State> state_;
  std::optional<std::pair<int, int>> pending_reset_;
};

}  // namespace
}  // namespace erun

PYBIND11_MODULE(_erun, m) {
  using namespace erun;
  m.doc() = "erun's worker library (see the erun package for the documented API)";

  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<CommError> comm_error(m, "CommError", error.ptr());
  static py::exception<HostsUpdated> hosts_updated(m, "HostsUpdated", error.ptr());
  static py::exception<StateLost> state_lost(m, "StateLost", error.ptr());
  // Most derived first: pybind11 tries translators newest first.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const HostsUpdated& e) {
      PyErr_SetString(hosts_updated.ptr(), e.what());
    } catch (const StateLost& e) {
      PyErr_SetString(state_lost.ptr(), e.what());
    } catch (const CommError& e) {
      PyErr_SetString(comm_error.ptr(), e.what());
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });

  // erun::ReduceOp and erun::DataType, re-exported by the erun package
  // (erun.ReduceOp.SUM, erun.DataType.FLOAT32). ReduceOp's members also
  // compare equal to the integer codes erun.Sum, ... were before it (they
  // hash as those integers): pybind11 compares the members of an enum class
  // only with members of the same enum.
  py::enum_<ReduceOp> reduce_op(m, "ReduceOp", "A reduction operator of erun.allreduce_ (erun::ReduceOp)");
  reduce_op.value("SUM", ReduceOp::kSum)
      .value("AVERAGE", ReduceOp::kAverage)
      .value("MIN", ReduceOp::kMin)
      .value("MAX", ReduceOp::kMax)
      .value("PRODUCT", ReduceOp::kProduct);
  // Replaces pybind11's own (a .def() would only add an overload after it).
  reduce_op.attr("__eq__") = py::cpp_function([](const py::object& a, const py::object& b) { return same_code(a, b); },
                                              py::name("__eq__"), py::is_method(reduce_op), py::arg("other"));
  reduce_op.attr("__ne__") = py::cpp_function([](const py::object& a, const py::object& b) { return !same_code(a, b); },
                                              py::name("__ne__"), py::is_method(reduce_op), py::arg("other"));
  py::enum_<DataType>(m, "DataType", "An element type of erun's collectives (erun::DataType)")
      .value("FLOAT32", DataType::kFloat32)
      .value("FLOAT64", DataType::kFloat64)
      .value("INT32", DataType::kInt32)
      .value("INT64", DataType::kInt64)
      .value("UINT8", DataType::kUInt8)
      .value("FLOAT16", DataType::kFloat16)
      .value("BFLOAT16", DataType::kBFloat16)
      .def_property_readonly("itemsize", [](DataType t) { return data_type_size(checked(t)); },
                             "bytes per element");

  // The exit code that tells the erun driver not to retry (see errors.hpp).
  m.attr("FATAL_EXIT_CODE") = kFatalExitCode;

  m.def("init", [] {
    if (g_ctx != nullptr) return;
    Context* c;
    {
      py::gil_scoped_release nogil;
      c = &init();
    }
    g_ctx = c;
    install_interrupts();
  });
  m.def("initialized", [] { return g_ctx != nullptr; });
  m.def(
      "shard_rows",
      [](uint64_t rows, int rank, int size, bool even) {
        return State::shard_rows(State::ShardSpec{rows, 1, even ? State::ShardSplit::kEven : State::ShardSplit::kChunk},
                                 rank, size);
      },
      py::arg("rows"), py::arg("rank"), py::arg("size"), py::arg("even"));
  m.def("shutdown", [] {
    g_ctx = nullptr;
    py::gil_scoped_release nogil;
    shutdown();
  });
  m.def("info", [] {
    const WorkerInfo& i = ctx().info();
    py::dict d;
    d["rank"] = i.rank;
    d["size"] = i.size;
    d["local_rank"] = i.local_rank;
    d["local_size"] = i.local_size;
    d["cross_rank"] = i.cross_rank;
    d["cross_size"] = i.cross_size;
    d["generation"] = i.generation;
    d["host"] = i.host;
    return d;
  });
  m.def("elastic", [] { return ctx().elastic(); });
  m.def("host_update_pending", [] { return ctx().host_update_pending(); });
  m.def("checkpoint_dir", [] { return ctx().checkpoint_dir(); });

  m.def("allreduce", [](uintptr_t data, size_t count, DataType type, ReduceOp op) {
    DataType t = checked(type);
    ReduceOp o = checked(op);
    Communicator& c = ctx().comm();
    blocking(c, [&] { c.allreduce(address(data), count, t, o); });
  }, py::arg("data"), py::arg("count"), py::arg("type"), py::arg("op"));
  m.def("broadcast", [](uintptr_t data, size_t bytes, int root) {
    Communicator& c = ctx().comm();
    if (root < 0 || root >= c.size()) {
      throw Error("erun: broadcast root " + std::to_string(root) + " is not a rank of a world of " +
                  std::to_string(c.size()));
    }
    blocking(c, [&] { c.broadcast(address(data), bytes, root); });
  }, py::arg("data"), py::arg("nbytes"), py::arg("root"));
  m.def("allgather", [](uintptr_t in, uintptr_t out, size_t bytes) {
    Communicator& c = ctx().comm();
    blocking(c, [&] { c.allgather(address(in), address(out), bytes); });
  }, py::arg("data"), py::arg("out"), py::arg("nbytes"));
  m.def("allgatherv", [](py::bytes in) {
    std::string s = in;
    Communicator& c = ctx().comm();
    std::vector<std::vector<char>> parts;
    blocking(c, [&] { parts = c.allgatherv(s.data(), s.size()); });
    py::list out;
    for (auto& p : parts) out.append(py::bytes(p.data(), p.size()));
    return out;
  }, py::arg("data"));
  m.def("reduce_scatter", [](uintptr_t in, uintptr_t out, std::vector<size_t> counts, DataType type, ReduceOp op) {
    DataType t = checked(type);
    ReduceOp o = checked(op);
    Communicator& c = ctx().comm();
    if (counts.size() != static_cast<size_t>(c.size())) {
      throw Error("erun: reduce_scatter needs one count per rank: " + std::to_string(counts.size()) +
                  " counts for a world of " + std::to_string(c.size()));
    }
    blocking(c, [&] { c.reduce_scatter(address(in), address(out), counts, t, o); });
  }, py::arg("data"), py::arg("out"), py::arg("counts"), py::arg("type"), py::arg("op"));
  m.def("barrier", [] {
    Communicator& c = ctx().comm();
    blocking(c, [&] { c.barrier(); });
  });
  m.def("built_with_mpi", [] {
#if ERUN_HAVE_MPI
    return true;
#else
    return false;
#endif
  });
  m.def("built_with_cuda", &built_with_cuda);
  m.def("built_with_nccl", &built_with_nccl);
  m.def("gpu_device_count", &gpu_device_count);
  // CUDA tensors: (address, ..., stream, device); each call returns when the
  // result is in the tensor (the work is enqueued on `stream` and waited for).
  m.def("gpu_allreduce", [](uintptr_t data, size_t count, DataType type, ReduceOp op, uintptr_t stream, int device) {
    DataType t = checked(type);
    ReduceOp o = checked(op);
    GpuCommunicator& g = gpu_on(device);
    gpu_blocking(g, [&] { g.allreduce(address(data), count, t, o, stream_of(stream)); });
  }, py::arg("data"), py::arg("count"), py::arg("type"), py::arg("op"), py::arg("stream"), py::arg("device"));
  m.def("gpu_broadcast", [](uintptr_t data, size_t bytes, int root, uintptr_t stream, int device) {
    GpuCommunicator& g = gpu_on(device);
    gpu_blocking(g, [&] { g.broadcast(address(data), bytes, root, stream_of(stream)); });
  }, py::arg("data"), py::arg("nbytes"), py::arg("root"), py::arg("stream"), py::arg("device"));
  m.def("gpu_allgather", [](uintptr_t in, uintptr_t out, size_t bytes, uintptr_t stream, int device) {
    GpuCommunicator& g = gpu_on(device);
    gpu_blocking(g, [&] { g.allgather(address(in), address(out), bytes, stream_of(stream)); });
  }, py::arg("data"), py::arg("out"), py::arg("nbytes"), py::arg("stream"), py::arg("device"));
  m.def("gpu_backend", [](int device) { return std::string(to_string(gpu_on(device).backend())); },
        py::arg("device"));

  py::class_<PyState>(m, "State")
      .def(py::init<>())
      .def("register_buffer", &PyState::register_buffer, py::arg("name"), py::arg("data"), py::arg("nbytes"))
      .def("register_callbacks", &PyState::register_callbacks, py::arg("name"), py::arg("save"), py::arg("load"))
      .def("register_shard", &PyState::register_shard, py::arg("name"), py::arg("rows"), py::arg("row_bytes"),
           py::arg("even"), py::arg("save"), py::arg("load"), py::arg("prepare"), py::arg("install"))
      .def("commit", &PyState::commit)
      .def("restore", &PyState::restore)
      .def("sync", &PyState::sync)
      .def("check_host_updates", &PyState::check_host_updates)
      .def("set_checkpoint_dir", &PyState::set_checkpoint_dir, py::arg("path"))
      .def("rejoin", &PyState::rejoin, py::arg("comm_error"), py::arg("what"))
      .def("take_reset", &PyState::take_reset)
      .def_property_readonly("commit_id", &PyState::commit_id);

  py::class_<ElasticSampler>(m, "ElasticSampler")
      .def(py::init<size_t, uint64_t, bool>(), py::arg("num_samples"), py::arg("seed"), py::arg("shuffle") = true)
      // The State keeps the sampler alive: its entry points at it.
      .def("register_with", [](ElasticSampler& s, PyState& st, const std::string& name) { s.register_with(st.state(), name); },
           py::keep_alive<2, 1>(), py::arg("state"), py::arg("name"))
      .def("reset", &ElasticSampler::reset, py::arg("rank"), py::arg("size"))
      .def("set_epoch", &ElasticSampler::set_epoch, py::arg("epoch"))
      .def_property_readonly("epoch", &ElasticSampler::epoch)
      .def("indices", &ElasticSampler::indices)
      .def("next_batch", &ElasticSampler::next_batch, py::arg("global_batch"))
      .def("record_batch", &ElasticSampler::record_batch, py::arg("global_batch"))
      .def_property_readonly("remaining", &ElasticSampler::remaining)
      .def_property_readonly("processed", &ElasticSampler::processed);
}
