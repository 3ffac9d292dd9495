// Elastic data-parallel training of a small MLP on a synthetic 4-class spiral,
// written against erun's worker API. Run it under erun (elastic), under
// mpirun/srun (static) or alone (a world of one):
//
//   erun -np 4 --min-np 2 build/examples/train_mlp --epochs 10
//
// Every rank generates the same dataset and initial weights from --seed. Each
// step takes a fixed global batch from erun::ElasticSampler; each rank computes
// the gradient of its share, every per-sample gradient is rounded to a fixed
// point of 2^-32 and summed as int64, so the allreduced gradient is exactly the
// same for any world size and any split: a run on 1, 2 or 4 workers, or one
// that shrinks and grows mid-epoch, ends at bit-identical parameters and prints
// the same `checksum=`. Parameters, momentum, epoch, step and sampler position
// live in an erun::State; a failure rolls back to the last commit.
//
// With --zero each rank keeps only its rows of the momentum (ZeRO stage 1:
// a sharded State entry, State::register_shard), receives only its rows of
// the summed gradient (reduce_scatter) and updates only its rows of the
// parameters, which the ranks then allgather: the same arithmetic
// element by element, so the same checksum. When the world changes, erun
// reshards the momentum from the pieces its hosts hold (docs/state.md,
// "Sharded entries").
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "erun/erun.hpp"
#include "mlp_common.h"

namespace {

using namespace mlp;

struct Activations {
  float h1[kHidden], h2[kHidden], prob[kClasses];
};

// Returns the loss of one sample; fills the activations for backward().
double forward(const Layout& l, const std::vector<float>& p, const float* x, int label, Activations& a) {
  for (int i = 0; i < kHidden; ++i) {
    const float* w = &p[l.w1 + static_cast<size_t>(i) * l.d];
    float s = p[l.b1 + i];
    for (int j = 0; j < l.d; ++j) s += w[j] * x[j];
    a.h1[i] = s > 0 ? s : 0;
  }
  for (int i = 0; i < kHidden; ++i) {
    const float* w = &p[l.w2 + static_cast<size_t>(i) * kHidden];
    float s = p[l.b2 + i];
    for (int j = 0; j < kHidden; ++j) s += w[j] * a.h1[j];
    a.h2[i] = s > 0 ? s : 0;
  }
  float z[kClasses], zmax = -INFINITY;
  for (int c = 0; c < kClasses; ++c) {
    const float* w = &p[l.w3 + static_cast<size_t>(c) * kHidden];
    float s = p[l.b3 + c];
    for (int j = 0; j < kHidden; ++j) s += w[j] * a.h2[j];
    z[c] = s;
    zmax = std::max(zmax, s);
  }
  double sum = 0;
  for (int c = 0; c < kClasses; ++c) sum += std::exp(static_cast<double>(z[c] - zmax));
  for (int c = 0; c < kClasses; ++c)
    a.prob[c] = static_cast<float>(std::exp(static_cast<double>(z[c] - zmax)) / sum);
  return -(static_cast<double>(z[label] - zmax) - std::log(sum));
}

int argmax(const float* v, int n) { return static_cast<int>(std::max_element(v, v + n) - v); }

// Adds one sample's gradient, rounded to 2^-32, to `acc`. a*b of two floats is
// exact in double, so the rounding is the only approximation and the int64
// sums are associative: the batch gradient does not depend on who computed what.
class FixedGrad {
 public:
  FixedGrad(size_t n, int batch) : acc(n, 0), limit_(static_cast<double>(INT64_MAX / 4) / batch) {}
  void add(size_t i, double g) {
    double v = std::clamp(g * kFixedScale, -limit_, limit_);
    acc[i] += static_cast<int64_t>(std::nearbyint(v));
  }
  std::vector<int64_t> acc;

 private:
  double limit_;
};

void backward(const Layout& l, const std::vector<float>& p, const float* x, int label, const Activations& a,
              FixedGrad& g) {
  float dz[kClasses], dh2[kHidden], dh1[kHidden];
  for (int c = 0; c < kClasses; ++c) dz[c] = a.prob[c] - (c == label ? 1.0f : 0.0f);
  for (int j = 0; j < kHidden; ++j) dh2[j] = 0;
  for (int c = 0; c < kClasses; ++c) {
    const float* w = &p[l.w3 + static_cast<size_t>(c) * kHidden];
    size_t row = l.w3 + static_cast<size_t>(c) * kHidden;
    for (int j = 0; j < kHidden; ++j) {
      g.add(row + j, static_cast<double>(dz[c]) * a.h2[j]);
      dh2[j] += w[j] * dz[c];
    }
    g.add(l.b3 + c, dz[c]);
  }
  for (int j = 0; j < kHidden; ++j) {
    if (a.h2[j] <= 0) dh2[j] = 0;
    dh1[j] = 0;
  }
  for (int i = 0; i < kHidden; ++i) {
    if (dh2[i] == 0) continue;
    const float* w = &p[l.w2 + static_cast<size_t>(i) * kHidden];
    size_t row = l.w2 + static_cast<size_t>(i) * kHidden;
    for (int j = 0; j < kHidden; ++j) {
      if (a.h1[j] > 0) g.add(row + j, static_cast<double>(dh2[i]) * a.h1[j]);
      dh1[j] += w[j] * dh2[i];
    }
    g.add(l.b2 + i, dh2[i]);
  }
  for (int i = 0; i < kHidden; ++i) {
    if (a.h1[i] <= 0 || dh1[i] == 0) continue;
    size_t row = l.w1 + static_cast<size_t>(i) * l.d;
    for (int j = 0; j < l.d; ++j) g.add(row + j, static_cast<double>(dh1[i]) * x[j]);
    g.add(l.b1 + i, dh1[i]);
  }
}

struct Metrics {
  double loss = 0, accuracy = 0;
};

// Collective: each rank scores every size-th sample; integer sums make the
// result identical for any world size.
Metrics evaluate(erun::Context& ctx, const Layout& l, const std::vector<float>& p, const Dataset& ds) {
  std::vector<int64_t> sums(2, 0);  // loss in fixed point, correct count
  Activations a;
  for (int i = ctx.rank(); i < ds.n; i += ctx.size()) {
    double loss = forward(l, p, ds.row(i), ds.y[i], a);
    sums[0] += static_cast<int64_t>(std::nearbyint(std::min(loss, 1e6) * kFixedScale));
    sums[1] += argmax(a.prob, kClasses) == ds.y[i];
  }
  ctx.comm().allreduce(sums, erun::ReduceOp::kSum);
  return {static_cast<double>(sums[0]) / kFixedScale / ds.n, static_cast<double>(sums[1]) / ds.n};
}

int train(const Options& o) {
  erun::Context& ctx = erun::init();
  const Dataset ds = make_dataset(o.samples, o.features, o.seed);
  const Layout layout(o.features);

  std::vector<float> params = init_params(layout, o.seed);
  std::vector<float> velocity(layout.total, 0.0f);
  int32_t epoch = 0;
  int64_t step = 0;
  // Steps this process computed, rolled-back ones included (not in the
  // State): beside `step` it says how many steps a fault cost.
  int64_t steps_run = 0;
  int64_t epoch_samples = 0;     // samples processed this epoch, by all ranks
  uint64_t epoch_fingerprint = 0;
  uint64_t full_fingerprint = 0;
  for (int i = 0; i < ds.n; ++i) full_fingerprint += sample_mix(static_cast<uint64_t>(i));
  erun::ElasticSampler sampler(static_cast<size_t>(ds.n), o.seed);

  erun::State state(ctx);
  state.register_vector("params", &params);
  // --zero: this rank's rows of the momentum, one element per row.
  const erun::State::ShardSpec zero_spec{layout.total, 1, erun::State::ShardSplit::kEven};
  if (o.zero) {
    auto [b, e] = erun::State::shard_rows(zero_spec, ctx.rank(), ctx.size());
    velocity.assign(static_cast<size_t>(e - b), 0.0f);
    state.register_shard("velocity", &velocity, zero_spec);
  } else {
    state.register_vector("velocity", &velocity);
  }
  state.register_value("epoch", &epoch);
  state.register_value("step", &step);
  state.register_value("epoch_samples", &epoch_samples);
  state.register_value("epoch_fingerprint", &epoch_fingerprint);
  sampler.register_with(state);
  // Runs after the sync that follows a re-join, on every rank of the new
  // generation (a worker new to the job included), so every rank prints it,
  // with the wall-clock time (Unix seconds) at which it computes again.
  state.on_reset([&](int old_size, int new_size) {
    double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::printf("rank %d: reset: world size %d -> %d (generation %ld) at=%.3f\n", ctx.rank(), old_size, new_size,
                ctx.info().generation, now);
  });
  if (!o.checkpoint_dir.empty()) state.set_checkpoint_dir(o.checkpoint_dir);

  if (ctx.rank() == 0)
    std::printf("train_mlp: samples=%d features=%d classes=%d params=%zu batch=%d steps/epoch=%d epochs=%d "
                "lr=%g momentum=%g world=%d%s%s\n",
                ds.n, ds.d, kClasses, layout.total, o.batch, (ds.n + o.batch - 1) / o.batch, o.epochs, o.lr,
                o.momentum, ctx.size(), ctx.elastic() ? " (elastic)" : "", o.zero ? " zero=1" : "");

  bool first_call = true;
  Metrics final_metrics = erun::run(state, [&](erun::State& s) {
    erun::Context& c = s.context();
    sampler.reset(c.rank(), c.size());
    // A sharded entry has no copy outside its rank until the first commit
    // (docs/state.md, "Sharded entries"): make one at once.
    if (o.zero && s.commit_id() == 0) s.commit();
    if (std::exchange(first_call, false) && s.commit_id() > 0 && c.rank() == 0) {
      // A worker that starts at a commit made before it existed: restored
      // from host memory, a durable file, or the survivors.
      double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::printf("rank %d: resumed at commit %llu in epoch=%d (generation %ld) at=%.3f\n", c.rank(),
                  static_cast<unsigned long long>(s.commit_id()), epoch, c.info().generation, now);
    }
    for (; epoch < o.epochs; ++epoch, s.commit()) {
      auto t0 = std::chrono::steady_clock::now();
      sampler.set_epoch(static_cast<uint64_t>(epoch));
      if (sampler.processed() == 0) {
        epoch_samples = 0;
        epoch_fingerprint = 0;
      }
      while (sampler.remaining() > 0) {
        const size_t global = std::min(static_cast<size_t>(o.batch), sampler.remaining());
        if (o.fail_at_step > 0 && step + 1 == o.fail_at_step) {
          throw std::runtime_error("--fail-at-step " + std::to_string(o.fail_at_step) + ": failing on purpose");
        }
        FixedGrad grad(layout.total, o.batch);
        Activations a;
        std::vector<int64_t> seen(2, 0);  // count, fingerprint (wrapping sum)
        for (size_t i : sampler.next_batch(global)) {
          forward(layout, params, ds.row(i), ds.y[i], a);
          backward(layout, params, ds.row(i), ds.y[i], a, grad);
          seen[0] += 1;
          seen[1] = static_cast<int64_t>(static_cast<uint64_t>(seen[1]) + sample_mix(i));
        }
        // --zero: each rank needs the sum of its own rows of the gradient only.
        std::vector<int64_t> my_grad;
        if (o.zero) {
          std::vector<size_t> counts(static_cast<size_t>(c.size()));
          for (int r = 0; r < c.size(); ++r) {
            auto [rb, re] = erun::State::shard_rows(zero_spec, r, c.size());
            counts[static_cast<size_t>(r)] = re - rb;
          }
          my_grad.resize(counts[static_cast<size_t>(c.rank())]);
          c.comm().reduce_scatter(grad.acc.data(), my_grad.data(), counts, erun::DataType::kInt64,
                                  erun::ReduceOp::kSum);
        } else {
          c.comm().allreduce(grad.acc, erun::ReduceOp::kSum);
        }
        c.comm().allreduce(seen, erun::ReduceOp::kSum);
        epoch_samples += seen[0];
        epoch_fingerprint += static_cast<uint64_t>(seen[1]);
        const double scale = 1.0 / (kFixedScale * static_cast<double>(global));
        if (o.zero) {
          // This rank's rows, then everyone's: the parameters stay whole.
          auto [b, e] = erun::State::shard_rows(zero_spec, c.rank(), c.size());
          for (size_t k = b; k < e; ++k) {
            float& v = velocity[k - b];
            v = static_cast<float>(o.momentum * v + static_cast<double>(my_grad[k - b]) * scale);
            params[k] -= static_cast<float>(o.lr) * v;
          }
          auto parts = c.comm().allgatherv(params.data() + b, (e - b) * sizeof(float));
          size_t at = 0;
          for (const auto& part : parts) {
            std::memcpy(params.data() + at, part.data(), part.size());
            at += part.size() / sizeof(float);
          }
        } else {
          for (size_t k = 0; k < params.size(); ++k) {
            velocity[k] = static_cast<float>(o.momentum * velocity[k] + static_cast<double>(grad.acc[k]) * scale);
            params[k] -= static_cast<float>(o.lr) * velocity[k];
          }
        }
        sampler.record_batch(global);
        ++step;
        ++steps_run;
        if (o.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.step_ms));
        if (step % o.commit_every == 0) s.commit();
      }
      Metrics m = evaluate(c, layout, params, ds);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (c.rank() == 0)
        std::printf("epoch %d loss=%.4f accuracy=%.4f step=%lld world=%d time=%.2fs samples=%lld exactly-once=%s\n",
                    epoch, m.loss, m.accuracy, static_cast<long long>(step), c.size(), secs,
                    static_cast<long long>(epoch_samples),
                    epoch_samples == ds.n && epoch_fingerprint == full_fingerprint ? "yes" : "NO");
    }
    return evaluate(c, layout, params, ds);
  });

  // Rolled-back steps of this process: steps_run - step when it ran from
  // the start (a survivor of every fault), as rank 0 does in the benches.
  if (ctx.rank() == 0)
    std::printf("rank 0 pid %d: steps run %lld, in the model %lld\n", static_cast<int>(::getpid()),
                static_cast<long long>(steps_run), static_cast<long long>(step));
  if (ctx.rank() == 0)
    std::printf("final accuracy=%.4f loss=%.4f checksum=%016llx\n", final_metrics.accuracy, final_metrics.loss,
                static_cast<unsigned long long>(checksum(params)));
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
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
}
