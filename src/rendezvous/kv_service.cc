#include "rendezvous/kv_service.h"

#include <algorithm>

#include <fmt/format.h>

namespace erun {
namespace {

using wire::Type;
constexpr auto kMaxGetWait = std::chrono::hours(24);

}  // namespace

bool KvService::admit(const Request& r) {
  if (r.generation == gen_) return true;
  send_error(r.conn, r.request_id,
             fmt::format("{} generation {}, current {} (re-join to get the current generation's rank)",
                         r.generation < gen_ ? "stale" : "unknown", r.generation, gen_));
  return false;
}

void KvService::set(const Request& r, const std::string& key, std::string_view value) {
  auto& slot = kv_[key];
  slot.assign(value.begin(), value.end());
  out_.send(r.conn, Type::kKvSetOk, gen_, r.request_id, {});
  answer_waiters(key, slot);
}

void KvService::get(const Request& r, const std::string& key, uint64_t timeout_ms, TimePoint now) {
  auto it = kv_.find(key);
  if (it != kv_.end()) {
    out_.send(r.conn, Type::kKvValue, gen_, r.request_id, wire::encode_str({it->second.data(), it->second.size()}));
    return;
  }
  Duration wait = std::chrono::milliseconds(
      std::min<uint64_t>(timeout_ms, std::chrono::duration_cast<std::chrono::milliseconds>(kMaxGetWait).count()));
  uint64_t id = next_get_++;
  gets_[id] = PendingGet{r.conn, r.request_id, key, now + wait, wait};
  waiters_[key].push_back(id);
  by_conn_[r.conn].push_back(id);
  deadlines_.emplace(now + wait, id);
}

void KvService::check(const Request& r, const std::vector<std::string>& keys) {
  bool all = std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return kv_.count(k) > 0; });
  out_.send(r.conn, Type::kKvCheckResult, gen_, r.request_id, wire::encode_check_result(all));
}

void KvService::answer_waiters(const std::string& key, const std::vector<char>& value) {
  auto w = waiters_.find(key);
  if (w == waiters_.end()) return;
  std::vector<uint64_t> ids = std::move(w->second);
  waiters_.erase(w);
  std::string payload = wire::encode_str({value.data(), value.size()});
  for (uint64_t id : ids) {
    auto g = gets_.find(id);
    if (g == gets_.end()) continue;
    ConnId conn = g->second.conn;
    uint32_t req = g->second.request_id;
    gets_.erase(g);
    unlist(conn, id);
    out_.send(conn, Type::kKvValue, gen_, req, payload);
  }
}

void KvService::new_generation(int64_t gen) {
  const int64_t old = gen_;
  gen_ = gen;
  kv_.clear();
  for (auto& [id, pg] : gets_) {
    send_error(pg.conn, pg.request_id,
               fmt::format("stale generation {}, current {} (re-join to get the current generation's rank)", old,
                           gen));
  }
  gets_.clear();
  waiters_.clear();
  by_conn_.clear();
}

TimePoint KvService::next_deadline() const {
  return deadlines_.empty() ? TimePoint::max() : deadlines_.top().first;
}

void KvService::expire_next(TimePoint now) {
  if (deadlines_.empty() || deadlines_.top().first > now) return;
  uint64_t id = deadlines_.top().second;
  deadlines_.pop();
  auto it = gets_.find(id);
  if (it == gets_.end() || it->second.deadline > now) return;
  PendingGet g = std::move(it->second);
  forget(id);
  unlist(g.conn, id);
  send_error(g.conn, g.request_id,
             fmt::format("store: timed out after {:.1f} s waiting for key '{}' in generation {}: the rank that "
                         "sets it did not (it may have failed; see its log), or the timeout is too short",
                         seconds(g.waited), g.key, gen_));
}

void KvService::drop(ConnId conn) {
  auto it = by_conn_.find(conn);
  if (it == by_conn_.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  by_conn_.erase(it);
  for (uint64_t id : ids) forget(id);
}

// Forgets a pending get (not its connection's list of them).
void KvService::forget(uint64_t id) {
  auto it = gets_.find(id);
  if (it == gets_.end()) return;
  auto w = waiters_.find(it->second.key);
  if (w != waiters_.end()) {
    std::erase(w->second, id);
    if (w->second.empty()) waiters_.erase(w);
  }
  gets_.erase(it);
}

void KvService::unlist(ConnId conn, uint64_t id) {
  auto it = by_conn_.find(conn);
  if (it == by_conn_.end()) return;
  std::erase(it->second, id);
  if (it->second.empty()) by_conn_.erase(it);
}

void KvService::send_error(ConnId conn, uint32_t request_id, const std::string& message) {
  out_.send(conn, Type::kError, gen_, request_id, wire::encode_str(message));
}

}  // namespace erun
