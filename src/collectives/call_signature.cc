#include "collectives/call_signature.h"

#include <fmt/format.h>

#include <map>

namespace erun {
namespace {

const char* kind_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kNone: return "nothing";
    case CollectiveKind::kAllreduce: return "allreduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kAllgather: return "allgather";
    case CollectiveKind::kAllgatherv: return "allgatherv";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
  }
  return "an unknown collective";
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string mismatch_message(const std::string& where, const std::vector<RankCall>& calls) {
  return fmt::format("erun: {}: mismatched collectives: {}; {}", where, describe_calls(calls), kMismatchAdvice);
}

}  // namespace

CallSignature CallSignature::allreduce(size_t count, DataType type, ReduceOp op) {
  CallSignature s;
  s.kind = CollectiveKind::kAllreduce;
  s.type = type;
  s.op = op;
  s.count = count;
  return s;
}

CallSignature CallSignature::reduce_scatter(size_t total, DataType type, ReduceOp op) {
  CallSignature s = allreduce(total, type, op);
  s.kind = CollectiveKind::kReduceScatter;
  return s;
}

CallSignature CallSignature::broadcast(size_t bytes, int root) {
  CallSignature s;
  s.kind = CollectiveKind::kBroadcast;
  s.root = root;
  s.count = bytes;
  return s;
}

CallSignature CallSignature::allgather(size_t bytes) {
  CallSignature s;
  s.kind = CollectiveKind::kAllgather;
  s.count = bytes;
  return s;
}

CallSignature CallSignature::allgatherv() {
  CallSignature s;
  s.kind = CollectiveKind::kAllgatherv;
  return s;
}

CallSignature CallSignature::barrier() {
  CallSignature s;
  s.kind = CollectiveKind::kBarrier;
  return s;
}

uint64_t CallSignature::word0() const {
  return uint64_t{static_cast<uint8_t>(kind)} | uint64_t{static_cast<uint8_t>(type)} << 8 |
         uint64_t{static_cast<uint8_t>(op)} << 16 | uint64_t{static_cast<uint32_t>(root)} << 32;
}

CallSignature CallSignature::unpack(uint64_t word0, uint64_t word1) {
  CallSignature s;
  s.kind = static_cast<CollectiveKind>(word0 & 0xff);
  s.type = static_cast<DataType>((word0 >> 8) & 0xff);
  s.op = static_cast<ReduceOp>((word0 >> 16) & 0xff);
  s.root = static_cast<int32_t>(static_cast<uint32_t>(word0 >> 32));
  s.count = word1;
  return s;
}

std::string describe(const CallSignature& s) {
  switch (s.kind) {
    case CollectiveKind::kAllreduce:
      return fmt::format("allreduce({} x {}, {})", to_string(s.type), s.count, to_string(s.op));
    case CollectiveKind::kReduceScatter:
      return fmt::format("reduce_scatter({} x {} in all, {})", to_string(s.type), s.count, to_string(s.op));
    case CollectiveKind::kBroadcast: return fmt::format("broadcast({} bytes, root {})", s.count, s.root);
    case CollectiveKind::kAllgather: return fmt::format("allgather({} bytes per rank)", s.count);
    default: return kind_name(s.kind);
  }
}

std::string describe_calls(const std::vector<RankCall>& calls) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  std::map<std::string, size_t> index;
  for (const RankCall& c : calls) {
    std::string d = describe(c.call);
    auto [it, added] = index.emplace(d, groups.size());
    if (added) groups.push_back({d, {}});
    groups[it->second].second.push_back(c.rank);
  }
  std::string out;
  for (auto& [call, ranks] : groups) {
    out += fmt::format("{}{} called {}", out.empty() ? "" : "; ", join_ranks(ranks), call);
  }
  return out;
}

CallMismatch::CallMismatch(std::string where, std::vector<RankCall> calls)
    : CollectiveMismatch(mismatch_message(where, calls)), where_(std::move(where)), calls_(std::move(calls)) {}

}  // namespace erun
