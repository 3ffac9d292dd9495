// The CUDA version of examples/train_mlp.cc: the same model, dataset, global
// batch and elastic sampler, with parameters and momentum in GPU memory, the
// per-sample forward and backward passes in a hand-written kernel, the
// gradient allreduced through erun's GPU communicator (ctx.gpu(): NCCL, or the
// host-staged path when ranks share a GPU) and the device buffers kept in an
// erun::State (committed to pinned host memory).
//
//   erun -np 2 --min-np 1 build/examples/gpu/train_mlp_gpu --epochs 5
//
// Exactness: each per-sample gradient term is rounded to a fixed point of
// 2^-32 and added to an int64 accumulator with an atomic add, which is exact
// and associative; the int64 sums are allreduced; every other operation is
// elementwise and computed by one thread in a fixed order. So the parameters
// after a step do not depend on how the batch was split across ranks or
// threads, and an elastic run (a worker killed, one added) ends at the same
// `checksum=` as an uninterrupted run on the same kind of GPU.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "../mlp_common.h"
#include "erun/erun.hpp"

namespace {

using namespace mlp;

#define CUDA_CHECK(call)                                                                                  \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

struct DevLayout {
  int d;
  size_t w1, b1, w2, b2, w3, b3;
};

DevLayout dev_layout(const Layout& l) { return {l.d, l.w1, l.b1, l.w2, l.b2, l.w3, l.b3}; }

// Rounds g to 2^-32 and adds it to acc[i]; two's complement addition of the
// rounded integers is exact in any order.
__device__ void add_fixed(unsigned long long* acc, size_t i, double g, double limit) {
  double v = fmin(fmax(g * 4294967296.0, -limit), limit);
  long long q = __double2ll_rn(v);
  atomicAdd(acc + i, static_cast<unsigned long long>(q));
}

// One thread per sample of this rank's share: forward, softmax, backward.
__device__ double forward_sample(const DevLayout& l, const float* p, const float* x, int label, float* h1,
                                 float* h2, float* prob) {
  for (int i = 0; i < kHidden; ++i) {
    const float* w = p + l.w1 + static_cast<size_t>(i) * l.d;
    float s = p[l.b1 + i];
    for (int j = 0; j < l.d; ++j) s = __fadd_rn(s, __fmul_rn(w[j], x[j]));
    h1[i] = s > 0 ? s : 0;
  }
  for (int i = 0; i < kHidden; ++i) {
    const float* w = p + l.w2 + static_cast<size_t>(i) * kHidden;
    float s = p[l.b2 + i];
    for (int j = 0; j < kHidden; ++j) s = __fadd_rn(s, __fmul_rn(w[j], h1[j]));
    h2[i] = s > 0 ? s : 0;
  }
  float z[kClasses];
  float zmax = -INFINITY;
  for (int c = 0; c < kClasses; ++c) {
    const float* w = p + l.w3 + static_cast<size_t>(c) * kHidden;
    float s = p[l.b3 + c];
    for (int j = 0; j < kHidden; ++j) s = __fadd_rn(s, __fmul_rn(w[j], h2[j]));
    z[c] = s;
    zmax = fmaxf(zmax, s);
  }
  double sum = 0;
  for (int c = 0; c < kClasses; ++c) sum += exp(static_cast<double>(z[c] - zmax));
  for (int c = 0; c < kClasses; ++c) prob[c] = static_cast<float>(exp(static_cast<double>(z[c] - zmax)) / sum);
  return -(static_cast<double>(z[label] - zmax) - log(sum));
}

__global__ void grad_kernel(DevLayout l, const float* p, const float* xs, const int* ys, const long long* idx,
                            int count, unsigned long long* acc, double limit) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= count) return;
  const long long i = idx[t];
  const float* x = xs + static_cast<size_t>(i) * l.d;
  const int label = ys[i];
  float h1[kHidden], h2[kHidden], prob[kClasses], dh1[kHidden], dh2[kHidden], dz[kClasses];
  forward_sample(l, p, x, label, h1, h2, prob);
  for (int c = 0; c < kClasses; ++c) dz[c] = prob[c] - (c == label ? 1.0f : 0.0f);
  for (int j = 0; j < kHidden; ++j) dh2[j] = 0;
  for (int c = 0; c < kClasses; ++c) {
    const float* w = p + l.w3 + static_cast<size_t>(c) * kHidden;
    size_t row = l.w3 + static_cast<size_t>(c) * kHidden;
    for (int j = 0; j < kHidden; ++j) {
      add_fixed(acc, row + j, static_cast<double>(dz[c]) * h2[j], limit);
      dh2[j] = __fadd_rn(dh2[j], __fmul_rn(w[j], dz[c]));
    }
    add_fixed(acc, l.b3 + c, dz[c], limit);
  }
  for (int j = 0; j < kHidden; ++j) {
    if (h2[j] <= 0) dh2[j] = 0;
    dh1[j] = 0;
  }
  for (int i2 = 0; i2 < kHidden; ++i2) {
    if (dh2[i2] == 0) continue;
    const float* w = p + l.w2 + static_cast<size_t>(i2) * kHidden;
    size_t row = l.w2 + static_cast<size_t>(i2) * kHidden;
    for (int j = 0; j < kHidden; ++j) {
      if (h1[j] > 0) add_fixed(acc, row + j, static_cast<double>(dh2[i2]) * h1[j], limit);
      dh1[j] = __fadd_rn(dh1[j], __fmul_rn(w[j], dh2[i2]));
    }
    add_fixed(acc, l.b2 + i2, dh2[i2], limit);
  }
  for (int i1 = 0; i1 < kHidden; ++i1) {
    if (h1[i1] <= 0 || dh1[i1] == 0) continue;
    size_t row = l.w1 + static_cast<size_t>(i1) * l.d;
    for (int j = 0; j < l.d; ++j) add_fixed(acc, row + j, static_cast<double>(dh1[i1]) * x[j], limit);
    add_fixed(acc, l.b1 + i1, dh1[i1], limit);
  }
}

// velocity = momentum * velocity + grad / global; params -= lr * velocity.
__global__ void update_kernel(float* p, float* v, const long long* acc, size_t n, double momentum, double lr,
                              double scale) {
  size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (k >= n) return;
  v[k] = static_cast<float>(momentum * v[k] + static_cast<double>(acc[k]) * scale);
  p[k] = __fsub_rn(p[k], __fmul_rn(static_cast<float>(lr), v[k]));
}

// Loss (fixed point) and correct count over samples rank, rank+size, ...
__global__ void eval_kernel(DevLayout l, const float* p, const float* xs, const int* ys, int n, int rank, int size,
                            unsigned long long* sums) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  long long i = rank + static_cast<long long>(t) * size;
  if (i >= n) return;
  float h1[kHidden], h2[kHidden], prob[kClasses];
  double loss = forward_sample(l, p, xs + static_cast<size_t>(i) * l.d, ys[i], h1, h2, prob);
  atomicAdd(sums, static_cast<unsigned long long>(__double2ll_rn(fmin(loss, 1e6) * 4294967296.0)));
  int best = 0;
  for (int c = 1; c < kClasses; ++c) {
    if (prob[c] > prob[best]) best = c;
  }
  if (best == ys[i]) atomicAdd(sums + 1, 1ULL);
}

template <typename T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

struct Metrics {
  double loss = 0, accuracy = 0;
};

int train(const Options& o) {
  erun::Context& ctx = erun::init();
  // Selects and sets this rank's device before anything is allocated. Not
  // collective: the GPU communicator itself is built inside erun::run(), on
  // the first GPU collective of each generation, where every rank is.
  ctx.gpu().device();
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const Dataset ds = make_dataset(o.samples, o.features, o.seed);
  const Layout layout(o.features);
  const DevLayout dl = dev_layout(layout);
  const size_t n_params = layout.total;

  float* d_x = device_alloc<float>(ds.x.size());
  int* d_y = device_alloc<int>(ds.y.size());
  float* d_params = device_alloc<float>(n_params);
  float* d_velocity = device_alloc<float>(n_params);
  long long* d_acc = device_alloc<long long>(n_params);
  long long* d_idx = device_alloc<long long>(static_cast<size_t>(o.batch));
  long long* d_sums = device_alloc<long long>(2);
  CUDA_CHECK(cudaMemcpy(d_x, ds.x.data(), ds.x.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_y, ds.y.data(), ds.y.size() * sizeof(int), cudaMemcpyHostToDevice));
  {
    std::vector<float> p0 = init_params(layout, o.seed);
    CUDA_CHECK(cudaMemcpy(d_params, p0.data(), n_params * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_velocity, 0, n_params * sizeof(float)));
  }
  // cudaMemset and the tail of a pageable cudaMemcpy may still run on the
  // legacy stream, which `stream` (non-blocking) does not wait for.
  CUDA_CHECK(cudaDeviceSynchronize());

  int32_t epoch = 0;
  int64_t step = 0;
  int64_t epoch_samples = 0;
  uint64_t epoch_fingerprint = 0;
  uint64_t full_fingerprint = 0;
  for (int i = 0; i < ds.n; ++i) full_fingerprint += sample_mix(static_cast<uint64_t>(i));
  erun::ElasticSampler sampler(static_cast<size_t>(ds.n), o.seed);

  erun::State state(ctx);
  erun::State::DeviceBufferOptions dev_opts;
  dev_opts.stream = stream;
  dev_opts.async = o.async_commit;
  state.register_device_buffer("params", d_params, n_params * sizeof(float), dev_opts);
  state.register_device_buffer("velocity", d_velocity, n_params * sizeof(float), dev_opts);
  state.register_value("epoch", &epoch);
  state.register_value("step", &step);
  state.register_value("epoch_samples", &epoch_samples);
  state.register_value("epoch_fingerprint", &epoch_fingerprint);
  sampler.register_with(state);
  state.on_reset([&](int old_size, int new_size) {
    std::printf("rank %d: reset: world size %d -> %d (generation %ld)\n", ctx.rank(), old_size, new_size,
                ctx.info().generation);
  });
  if (!o.checkpoint_dir.empty()) state.set_checkpoint_dir(o.checkpoint_dir);

  const double limit = static_cast<double>(INT64_MAX / 4) / o.batch;
  auto evaluate = [&](erun::Context& c) {
    CUDA_CHECK(cudaMemsetAsync(d_sums, 0, 2 * sizeof(long long), stream));
    int mine = (ds.n - c.rank() + c.size() - 1) / c.size();
    if (mine > 0) {
      eval_kernel<<<(mine + 127) / 128, 128, 0, stream>>>(dl, d_params, d_x, d_y, ds.n, c.rank(), c.size(),
                                                        reinterpret_cast<unsigned long long*>(d_sums));
      CUDA_CHECK(cudaGetLastError());
    }
    c.gpu().allreduce(d_sums, 2, erun::DataType::kInt64, erun::ReduceOp::kSum, stream);
    long long sums[2];
    CUDA_CHECK(cudaMemcpyAsync(sums, d_sums, sizeof(sums), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return Metrics{static_cast<double>(sums[0]) / 4294967296.0 / ds.n, static_cast<double>(sums[1]) / ds.n};
  };

  if (ctx.rank() == 0)
    std::printf("train_mlp_gpu: samples=%d features=%d classes=%d params=%zu batch=%d epochs=%d world=%d%s\n",
                ds.n, ds.d, kClasses, n_params, o.batch, o.epochs, ctx.size(), ctx.elastic() ? " (elastic)" : "");

  Metrics final_metrics = erun::run(state, [&](erun::State& s) {
    erun::Context& c = s.context();
    sampler.reset(c.rank(), c.size());
    for (; epoch < o.epochs; ++epoch, s.commit()) {
      auto t0 = std::chrono::steady_clock::now();
      sampler.set_epoch(static_cast<uint64_t>(epoch));
      if (sampler.processed() == 0) {
        epoch_samples = 0;
        epoch_fingerprint = 0;
      }
      while (sampler.remaining() > 0) {
        const size_t global = std::min(static_cast<size_t>(o.batch), sampler.remaining());
        std::vector<size_t> share = sampler.next_batch(global);
        std::vector<long long> idx(share.begin(), share.end());
        std::vector<int64_t> seen(2, 0);  // count, fingerprint (wrapping sum)
        for (size_t i : share) {
          seen[0] += 1;
          seen[1] = static_cast<int64_t>(static_cast<uint64_t>(seen[1]) + sample_mix(i));
        }
        CUDA_CHECK(cudaMemsetAsync(d_acc, 0, n_params * sizeof(long long), stream));
        if (!idx.empty()) {
          CUDA_CHECK(cudaMemcpyAsync(d_idx, idx.data(), idx.size() * sizeof(long long), cudaMemcpyHostToDevice,
                                     stream));
          grad_kernel<<<static_cast<unsigned>((idx.size() + 63) / 64), 64, 0, stream>>>(
              dl, d_params, d_x, d_y, d_idx, static_cast<int>(idx.size()),
              reinterpret_cast<unsigned long long*>(d_acc), limit);
          CUDA_CHECK(cudaGetLastError());
        }
        c.gpu().allreduce(d_acc, n_params, erun::DataType::kInt64, erun::ReduceOp::kSum, stream);
        c.comm().allreduce(seen, erun::ReduceOp::kSum);
        epoch_samples += seen[0];
        epoch_fingerprint += static_cast<uint64_t>(seen[1]);
        const double scale = 1.0 / (4294967296.0 * static_cast<double>(global));
        update_kernel<<<static_cast<unsigned>((n_params + 255) / 256), 256, 0, stream>>>(
            d_params, d_velocity, d_acc, n_params, o.momentum, o.lr, scale);
        CUDA_CHECK(cudaGetLastError());
        sampler.record_batch(global);
        ++step;
        if (o.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.step_ms));
        if (step % o.commit_every == 0) s.commit();
      }
      Metrics m = evaluate(c);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (c.rank() == 0)
        std::printf("epoch %d loss=%.4f accuracy=%.4f step=%lld world=%d gpu=%s time=%.2fs samples=%lld "
                    "exactly-once=%s\n",
                    epoch, m.loss, m.accuracy, static_cast<long long>(step), c.size(),
                    // Not collective here: evaluate() built this generation's backend.
                    erun::to_string(c.gpu().backend()), secs, static_cast<long long>(epoch_samples),
                    epoch_samples == ds.n && epoch_fingerprint == full_fingerprint ? "yes" : "NO");
    }
    return evaluate(c);
  });

  std::vector<float> params(n_params);
  CUDA_CHECK(cudaMemcpy(params.data(), d_params, n_params * sizeof(float), cudaMemcpyDeviceToHost));
  if (ctx.rank() == 0)
    std::printf("final accuracy=%.4f loss=%.4f checksum=%016llx\n", final_metrics.accuracy, final_metrics.loss,
                static_cast<unsigned long long>(checksum(params)));
  for (void* p : {static_cast<void*>(d_x), static_cast<void*>(d_y), static_cast<void*>(d_params),
                  static_cast<void*>(d_velocity), static_cast<void*>(d_acc), static_cast<void*>(d_idx),
                  static_cast<void*>(d_sums)})
    cudaFree(p);
  cudaStreamDestroy(stream);
  erun::shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Options o = parse_options(argc, argv);
  try {
    return train(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp_gpu: %s\n", e.what());
    return 1;
  }
}
