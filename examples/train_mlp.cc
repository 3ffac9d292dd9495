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
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "erun/erun.hpp"

namespace {

constexpr int kClasses = 4;
constexpr int kHidden = 64;
constexpr double kFixedScale = 4294967296.0;  // 2^32: gradient fixed point

struct Options {
  int epochs = 10;
  int batch = 256;
  double lr = 0.02;
  double momentum = 0.9;
  uint64_t seed = 1;
  int samples = 40000;
  int features = 32;
  int commit_every = 10;
  int step_ms = 0;
  int fail_at_step = 0;  // > 0: the training function throws at this step (tests a crash loop)
  std::string checkpoint_dir;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "train_mlp: %s (see --help)\n", msg.c_str());
  std::exit(2);
}

double parse_number(const std::string& flag, const char* text, double lo, double hi) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(v >= lo && v <= hi))
    usage_error(flag + " '" + text + "' must be a number in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  return v;
}

int parse_int(const std::string& flag, const char* text, int lo, int hi) {
  double v = parse_number(flag, text, lo, hi);
  if (v != std::floor(v)) usage_error(flag + " '" + text + "' must be an integer");
  return static_cast<int>(v);
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--epochs") o.epochs = parse_int(flag, value(), 1, 1000000);
    else if (flag == "--batch") o.batch = parse_int(flag, value(), 1, 1 << 20);
    else if (flag == "--lr") o.lr = parse_number(flag, value(), 0, 100);
    else if (flag == "--momentum") o.momentum = parse_number(flag, value(), 0, 0.999);
    else if (flag == "--seed") o.seed = static_cast<uint64_t>(parse_number(flag, value(), 0, 1e15));
    else if (flag == "--samples") o.samples = parse_int(flag, value(), kClasses, 100000000);
    else if (flag == "--features") o.features = parse_int(flag, value(), 2, 4096);
    else if (flag == "--commit-every") o.commit_every = parse_int(flag, value(), 1, 1 << 30);
    else if (flag == "--step-ms") o.step_ms = parse_int(flag, value(), 0, 3600000);
    else if (flag == "--checkpoint-dir") o.checkpoint_dir = value();
    else if (flag == "--fail-at-step") o.fail_at_step = parse_int(flag, value(), 1, 1 << 30);
    else if (flag == "-h" || flag == "--help") {
      std::printf(
          "usage: train_mlp [--epochs N=10] [--batch B=256] [--lr X=0.02] [--momentum M=0.9]\n"
          "                 [--seed S=1] [--samples N=40000] [--features D=32]\n"
          "                 [--commit-every K=10] [--step-ms MS=0] [--checkpoint-dir DIR]\n"
          "                 [--fail-at-step N (throw there, to try erun's crash-loop check)]\n"
          "B is the global batch: the result does not depend on the number of workers.\n");
      std::exit(0);
    } else {
      usage_error("unknown argument '" + flag + "'");
    }
  }
  return o;
}

// Deterministic random numbers that do not depend on the standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t s_;
};

// Four interleaved spiral arms in a plane, embedded in `features` dimensions
// by a random linear map, plus Gaussian noise in every dimension.
struct Dataset {
  int n = 0, d = 0;
  std::vector<float> x;  // n * d
  std::vector<int> y;
  const float* row(size_t i) const { return x.data() + i * d; }
};

Dataset make_dataset(int n, int d, uint64_t seed) {
  Rng rng(seed ^ 0xda7a5e7ULL);
  std::vector<double> embed(static_cast<size_t>(d) * 2);
  for (double& e : embed) e = rng.normal();
  Dataset ds;
  ds.n = n;
  ds.d = d;
  ds.x.resize(static_cast<size_t>(n) * d);
  ds.y.resize(n);
  for (int i = 0; i < n; ++i) {
    int c = i % kClasses;
    double t = rng.uniform();
    double angle = c * (6.283185307179586 / kClasses) + t * 9.0 + rng.normal() * 0.15;
    double px = t * std::cos(angle) * 2.0, py = t * std::sin(angle) * 2.0;
    for (int j = 0; j < d; ++j)
      ds.x[static_cast<size_t>(i) * d + j] =
          static_cast<float>(embed[2 * j] * px + embed[2 * j + 1] * py + rng.normal() * 0.1);
    ds.y[i] = c;
  }
  return ds;
}

// D -> 64 -> 64 -> 4, ReLU, softmax cross-entropy; all parameters in one vector.
struct Layout {
  int d;
  size_t w1, b1, w2, b2, w3, b3, total;
  explicit Layout(int features) : d(features) {
    w1 = 0;
    b1 = w1 + static_cast<size_t>(kHidden) * d;
    w2 = b1 + kHidden;
    b2 = w2 + static_cast<size_t>(kHidden) * kHidden;
    w3 = b2 + kHidden;
    b3 = w3 + static_cast<size_t>(kClasses) * kHidden;
    total = b3 + kClasses;
  }
};

std::vector<float> init_params(const Layout& l, uint64_t seed) {
  Rng rng(seed ^ 0x3713ULL);
  std::vector<float> p(l.total, 0.0f);
  auto fill = [&](size_t off, size_t count, int fan_in) {
    double s = std::sqrt(2.0 / fan_in);
    for (size_t i = 0; i < count; ++i) p[off + i] = static_cast<float>(rng.normal() * s);
  };
  fill(l.w1, l.b1 - l.w1, l.d);
  fill(l.w2, l.b2 - l.w2, kHidden);
  fill(l.w3, l.b3 - l.w3, kHidden);
  return p;
}

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

// FNV-1a over the parameters rounded to 1e-4.
uint64_t checksum(const std::vector<float>& p) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (float v : p) {
    int64_t q = std::llround(static_cast<double>(v) * 1e4);
    for (int b = 0; b < 8; ++b) {
      h ^= static_cast<uint64_t>(q >> (8 * b)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  }
  return h;
}

// An order-independent fingerprint of a set of sample indices: the sum of a
// 64-bit mix of each. The samples of an epoch were processed exactly once
// when their count is n and their fingerprint is that of 0..n-1.
uint64_t sample_mix(uint64_t i) {
  uint64_t z = i + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

int train(const Options& o) {
  erun::Context& ctx = erun::init();
  const Dataset ds = make_dataset(o.samples, o.features, o.seed);
  const Layout layout(o.features);

  std::vector<float> params = init_params(layout, o.seed);
  std::vector<float> velocity(layout.total, 0.0f);
  int32_t epoch = 0;
  int64_t step = 0;
  int64_t epoch_samples = 0;     // samples processed this epoch, by all ranks
  uint64_t epoch_fingerprint = 0;
  uint64_t full_fingerprint = 0;
  for (int i = 0; i < ds.n; ++i) full_fingerprint += sample_mix(static_cast<uint64_t>(i));
  erun::ElasticSampler sampler(static_cast<size_t>(ds.n), o.seed);

  erun::State state(ctx);
  state.register_vector("params", &params);
  state.register_vector("velocity", &velocity);
  state.register_value("epoch", &epoch);
  state.register_value("step", &step);
  state.register_value("epoch_samples", &epoch_samples);
  state.register_value("epoch_fingerprint", &epoch_fingerprint);
  sampler.register_with(state);
  // Runs on the survivors only (a replacement worker starts fresh), so every rank prints it.
  state.on_reset([&](int old_size, int new_size) {
    std::printf("rank %d: reset: world size %d -> %d (generation %ld)\n", ctx.rank(), old_size, new_size,
                ctx.info().generation);
  });
  if (!o.checkpoint_dir.empty()) state.set_checkpoint_dir(o.checkpoint_dir);

  if (ctx.rank() == 0)
    std::printf("train_mlp: samples=%d features=%d classes=%d params=%zu batch=%d steps/epoch=%d epochs=%d "
                "lr=%g momentum=%g world=%d%s\n",
                ds.n, ds.d, kClasses, layout.total, o.batch, (ds.n + o.batch - 1) / o.batch, o.epochs, o.lr,
                o.momentum, ctx.size(), ctx.elastic() ? " (elastic)" : "");

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
        c.comm().allreduce(grad.acc, erun::ReduceOp::kSum);
        c.comm().allreduce(seen, erun::ReduceOp::kSum);
        epoch_samples += seen[0];
        epoch_fingerprint += static_cast<uint64_t>(seen[1]);
        const double scale = 1.0 / (kFixedScale * static_cast<double>(global));
        for (size_t k = 0; k < params.size(); ++k) {
          velocity[k] = static_cast<float>(o.momentum * velocity[k] + static_cast<double>(grad.acc[k]) * scale);
          params[k] -= static_cast<float>(o.lr) * velocity[k];
        }
        sampler.record_batch(global);
        ++step;
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
