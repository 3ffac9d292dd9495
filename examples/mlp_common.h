// What the CPU and the CUDA versions of the MLP example share: options, the
// deterministic dataset and initial weights, the parameter layout, the
// checksum and the exactly-once fingerprint. Both versions sum per-sample
// gradients as int64 fixed point (2^-32), so their results do not depend on
// the world size or on how the batch was split.
#pragma once

#include <errno.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace mlp {

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
  bool async_commit = false;  // train_mlp_gpu: commit device state on a side stream
  bool zero = false;          // train_mlp: each rank keeps 1/N of the momentum (ZeRO-1, a sharded State entry)
};

[[noreturn]] inline void usage_error(const std::string& msg) {
  std::fprintf(stderr, "%s: %s (see --help)\n", program_invocation_short_name, msg.c_str());
  std::exit(2);
}

inline double parse_number(const std::string& flag, const char* text, double lo, double hi) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(v >= lo && v <= hi))
    usage_error(flag + " '" + text + "' must be a number in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  return v;
}

inline int parse_int(const std::string& flag, const char* text, int lo, int hi) {
  double v = parse_number(flag, text, lo, hi);
  if (v != std::floor(v)) usage_error(flag + " '" + text + "' must be an integer");
  return static_cast<int>(v);
}

inline Options parse_options(int argc, char** argv) {
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
    else if (flag == "--fail-at-step") o.fail_at_step = parse_int(flag, value(), 1, 1 << 30);
    else if (flag == "--checkpoint-dir") o.checkpoint_dir = value();
    else if (flag == "--async-commit") o.async_commit = true;
    else if (flag == "--zero") o.zero = true;
    else if (flag == "-h" || flag == "--help") {
      std::printf(
          "usage: train_mlp[_gpu] [--epochs N=10] [--batch B=256] [--lr X=0.02] [--momentum M=0.9]\n"
          "                 [--seed S=1] [--samples N=40000] [--features D=32]\n"
          "                 [--commit-every K=10] [--step-ms MS=0] [--checkpoint-dir DIR]\n"
          "                 [--fail-at-step N (throw there, to try erun's crash-loop check)]\n"
          "                 [--async-commit (train_mlp_gpu)]\n"
          "                 [--zero (train_mlp: shard the momentum over the ranks, ZeRO-1)]\n"
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

inline Dataset make_dataset(int n, int d, uint64_t seed) {
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

inline std::vector<float> init_params(const Layout& l, uint64_t seed) {
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

// FNV-1a over the parameters rounded to 1e-4.
inline uint64_t checksum(const std::vector<float>& p) {
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
inline uint64_t sample_mix(uint64_t i) {
  uint64_t z = i + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace mlp
