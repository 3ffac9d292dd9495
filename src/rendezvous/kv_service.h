// KvService: the rendezvous server's key-value store (docs/protocol.md,
// "Store"). It keeps the keys of the current generation only; KV_GET on a
// missing key waits until a KV_SET of that key (answered in the order of
// sets) or its deadline. A plain class: requests come in decoded and with the
// time, replies go out through the Outbox, and the caller runs the deadlines
// (next_deadline(), expire_next()). Not thread-safe: the server calls it
// under its mutex.
#pragma once

#include <functional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "rendezvous/outbox.h"

namespace erun {

class KvService {
 public:
  explicit KvService(Outbox& out) : out_(out) {}

  // True when `r` names the current generation; otherwise false, with an
  // ERROR ("stale generation N, current M ...") sent back.
  [[nodiscard]] bool admit(const Request& r);
  void set(const Request& r, const std::string& key, std::string_view value);
  // Answers at once when the key exists; otherwise waits until a set of the
  // key or `now` + timeout_ms (at most 24 h).
  void get(const Request& r, const std::string& key, uint64_t timeout_ms, TimePoint now);
  void check(const Request& r, const std::vector<std::string>& keys);

  // Generation `gen` begins: the keys go, and every get still waiting gets
  // ERROR "stale generation ...".
  void new_generation(int64_t gen);
  int64_t generation() const { return gen_; }

  // The earliest deadline of a get (TimePoint::max() when none; it may be
  // one's that was answered since).
  TimePoint next_deadline() const;
  // Takes the earliest deadline, due by `now`: its get, if it still waits,
  // gets ERROR "store: timed out ...".
  void expire_next(TimePoint now);

  // The connection is gone: its gets stop waiting, unanswered.
  void drop(ConnId conn);
  // Gets waiting now.
  size_t waiting() const { return gets_.size(); }

 private:
  struct PendingGet {
    ConnId conn = 0;
    uint32_t request_id = 0;
    std::string key;
    TimePoint deadline;
    Duration waited;
  };
  using Deadline = std::pair<TimePoint, uint64_t>;  // when, get id

  void answer_waiters(const std::string& key, const std::vector<char>& value);
  void forget(uint64_t id);
  void unlist(ConnId conn, uint64_t id);
  void send_error(ConnId conn, uint32_t request_id, const std::string& message);

  Outbox& out_;
  int64_t gen_ = -1;
  uint64_t next_get_ = 1;
  std::unordered_map<std::string, std::vector<char>> kv_;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters_;  // key -> get ids, in arrival order
  std::unordered_map<uint64_t, PendingGet> gets_;
  std::unordered_map<ConnId, std::vector<uint64_t>> by_conn_;  // conn -> its get ids
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<Deadline>> deadlines_;
};

}  // namespace erun
