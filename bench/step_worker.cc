// Recovery and scale-up benchmark worker, written against erun's worker API.
//   step_worker [--steps N=100000] [--step-ms M=50] [--commit-every K=1] [--floats F=1024]
//               [--state-floats W=0]
// Each step sleeps M ms (the "compute"), sum-allreduces F floats, adds them
// into a model of W floats kept in the State, and increments the global
// step; every K steps it commits. A step is printed once committed, also
// when the commit then raises HostsUpdated (the driver admits a replacement
// or a new host before the next step). After every step it
// prints one line with a CLOCK_REALTIME timestamp, which bench/bench.py parses:
//   STEP pid=P host=H rank=R size=S gen=G step=N t=SECONDS
// A START line with the same timestamp clock is printed before erun::init().
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "erun/erun.hpp"

namespace {

double now_realtime() {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

long arg_long(int argc, char** argv, const std::string& flag, long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (flag == argv[i]) return std::atol(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const long steps = arg_long(argc, argv, "--steps", 100000);
  const long step_ms = arg_long(argc, argv, "--step-ms", 50);
  const long commit_every = std::max(1L, arg_long(argc, argv, "--commit-every", 1));
  const long floats = std::max(1L, arg_long(argc, argv, "--floats", 1024));
  const long state_floats = std::max(0L, arg_long(argc, argv, "--state-floats", 0));
  std::printf("START pid=%d t=%.6f\n", static_cast<int>(::getpid()), now_realtime());
  try {
    erun::Context& ctx = erun::init();
    int64_t step = 0;
    std::vector<float> grad(static_cast<size_t>(floats), 1.0f);
    erun::State state(ctx);
    std::vector<float> model(static_cast<size_t>(state_floats), 0.0f);
    state.register_value("step", &step);
    if (!model.empty()) state.register_buffer("model", model.data(), model.size() * sizeof(float));
    erun::run(state, [&](erun::State& s) {
      erun::Context& c = s.context();
      while (step < steps) {
        if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
        std::fill(grad.begin(), grad.end(), 1.0f);
        c.comm().allreduce(grad, erun::ReduceOp::kSum);
        for (size_t i = 0; i < model.size(); ++i) model[i] += 1e-3f * grad[i % grad.size()];
        ++step;
        auto done = [&] {
          std::printf("STEP pid=%d host=%s rank=%d size=%d gen=%ld step=%lld t=%.6f\n", static_cast<int>(::getpid()),
                      c.info().host.c_str(), c.rank(), c.size(), c.info().generation, static_cast<long long>(step),
                      now_realtime());
        };
        if (step % commit_every == 0) {
          try {
            s.commit();
          } catch (const erun::HostsUpdated&) {
            done();  // the step is committed; new members join before the next one
            throw;
          }
        }
        done();
      }
      return 0;
    });
    erun::shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step_worker: %s\n", e.what());
    return 1;
  }
}
