// CallSignature: what one rank asked a collective to do (kind, type, count,
// reduce op, root), packed into two 64-bit words so that a communicator can
// publish it next to its arrival counter and compare it with its peers' where
// the ranks synchronise anyway. describe_calls() and CallMismatch turn the
// signatures of disagreeing ranks into the error every rank throws, e.g.
//   rank 0 called allreduce(int64 x 3, max); ranks 1, 2 called allreduce(float32 x 1000, sum)
// Any communicator (shm, hierarchical, a TCP transport) uses the same words
// and wording. Pure values; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "erun/communicator.hpp"
#include "erun/errors.hpp"

namespace erun {

enum class CollectiveKind : uint8_t {
  kNone = 0,
  kAllreduce,
  kBroadcast,
  kAllgather,
  kAllgatherv,
  kBarrier,
  kReduceScatter
};

struct CallSignature {
  CollectiveKind kind = CollectiveKind::kNone;
  DataType type = DataType::kUInt8;  // allreduce and reduce_scatter only
  ReduceOp op = ReduceOp::kSum;      // allreduce and reduce_scatter only
  int32_t root = 0;                  // broadcast only
  uint64_t count = 0;                // allreduce, reduce_scatter: elements (in all); broadcast, allgather: bytes

  static CallSignature allreduce(size_t count, DataType type, ReduceOp op);
  static CallSignature reduce_scatter(size_t total, DataType type, ReduceOp op);
  static CallSignature broadcast(size_t bytes, int root);
  static CallSignature allgather(size_t bytes);
  // Sizes differ between ranks by design: only the kind is compared.
  static CallSignature allgatherv();
  static CallSignature barrier();

  // word0: kind | type << 8 | op << 16 | root << 32; word1: count. Distinct
  // calls give distinct words; kNone packs to (0, 0).
  uint64_t word0() const;
  uint64_t word1() const { return count; }
  static CallSignature unpack(uint64_t word0, uint64_t word1);

  bool operator==(const CallSignature&) const = default;
};

// "allreduce(float32 x 1000, sum)", "broadcast(4096 bytes, root 0)",
// "allgather(8 bytes per rank)", "allgatherv", "barrier".
std::string describe(const CallSignature& sig);

struct RankCall {
  int rank = 0;
  CallSignature call;
};

// Groups ranks with the same call, in rank order of first appearance:
// "rank 0 called X; ranks 1, 2 called Y".
std::string describe_calls(const std::vector<RankCall>& calls);

// The error of a collective mismatch, with the calls it names, so that a
// layer above (hierarchical) can rename ranks and rethrow. what():
//   erun: <where>: mismatched collectives: <describe_calls>; <advice>
class CallMismatch : public CollectiveMismatch {
 public:
  CallMismatch(std::string where, std::vector<RankCall> calls);
  const std::string& where() const { return where_; }
  const std::vector<RankCall>& calls() const { return calls_; }

 private:
  std::string where_;
  std::vector<RankCall> calls_;
};

// What to do about any collective mismatch (shared by every message of the kind).
inline constexpr const char* kMismatchAdvice =
    "every rank must make the same collective calls in the same order (State::commit() included); a value that "
    "decides which collectives run, e.g. the step counter that decides when to commit, must be the same on every "
    "rank: register it in the State (see docs/state.md)";

}  // namespace erun
