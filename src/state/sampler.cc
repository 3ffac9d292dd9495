#include <algorithm>
#include <cstring>

#include "erun/state.hpp"

namespace erun {
namespace {

// splitmix64: a fixed, portable generator, so that a (seed, epoch) gives the
// same permutation on every machine and compiler.
struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) by rejection, bound > 0.
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }
};

}  // namespace

ElasticSampler::ElasticSampler(size_t num_samples, uint64_t seed, bool shuffle)
    : n_(num_samples), seed_(seed), shuffle_(shuffle) {
  reshuffle();
  recompute();
}

void ElasticSampler::reshuffle() {
  perm_.resize(n_);
  for (size_t i = 0; i < n_; ++i) perm_[i] = i;
  if (!shuffle_ || n_ < 2) return;
  SplitMix64 seeder{seed_};
  SplitMix64 rng{seeder.next() ^ (epoch_ * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull)};
  for (size_t i = n_ - 1; i > 0; --i) {
    size_t j = static_cast<size_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(perm_[i], perm_[j]);
  }
}

void ElasticSampler::recompute() {
  mine_.clear();
  const size_t step = static_cast<size_t>(size_);
  for (size_t p = processed_ + static_cast<size_t>(rank_); p < n_; p += step) {
    mine_.push_back(perm_[p]);
  }
}

void ElasticSampler::register_with(State& state, const std::string& name) {
  Serializer<ElasticSampler> ser;
  ser.save = [](const ElasticSampler& s) {
    std::vector<char> b(2 * sizeof(uint64_t));
    uint64_t v[2] = {s.epoch_, static_cast<uint64_t>(s.processed_)};
    std::memcpy(b.data(), v, sizeof(v));
    return b;
  };
  ser.load = [name](ElasticSampler& s, const std::vector<char>& b) {
    if (b.size() != 2 * sizeof(uint64_t)) {
      throw Error("erun: sampler state '" + name + "' has " + std::to_string(b.size()) +
                  " bytes, expected 16; register the same sampler on every worker");
    }
    uint64_t v[2];
    std::memcpy(v, b.data(), sizeof(v));
    if (v[1] > s.n_) {
      throw Error("erun: sampler state '" + name + "' says " + std::to_string(v[1]) +
                  " samples were processed of " + std::to_string(s.n_) +
                  "; every worker must use the same dataset size");
    }
    const bool new_epoch = v[0] != s.epoch_;
    s.epoch_ = v[0];
    s.processed_ = static_cast<size_t>(v[1]);
    if (new_epoch) s.reshuffle();
    s.recompute();
  };
  state.register_object(name, this, std::move(ser));
}

void ElasticSampler::reset(int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error("erun: ElasticSampler::reset(rank " + std::to_string(rank) + ", size " +
                std::to_string(size) + "): need 0 <= rank < size");
  }
  rank_ = rank;
  size_ = size;
  recompute();
}

void ElasticSampler::set_epoch(uint64_t epoch) {
  if (epoch == epoch_) return;
  epoch_ = epoch;
  processed_ = 0;
  reshuffle();
  recompute();
}

std::vector<size_t> ElasticSampler::next_batch(size_t global_batch) const {
  const size_t b = std::min(global_batch, remaining());
  const size_t r = static_cast<size_t>(rank_);
  const size_t step = static_cast<size_t>(size_);
  const size_t count = b > r ? (b - r + step - 1) / step : 0;
  return std::vector<size_t>(mine_.begin(), mine_.begin() + static_cast<std::ptrdiff_t>(count));
}

void ElasticSampler::record_batch(size_t global_batch) {
  processed_ += std::min(global_batch, remaining());
  recompute();
}

size_t ElasticSampler::remaining() const { return n_ - processed_; }

}  // namespace erun
