// The agent's host-memory commits: the job's directory, replicas, the persister (agent_internal.h).
#include "agent/agent_internal.h"

namespace erun::agent::internal {

void Agent::hold_commit_dir(const std::map<std::string, std::string>& env) {
  auto it = env.find("ERUN_COMMIT_DIR");
  if (it != env.end()) hold_commit_dir(it->second);
}

bool Agent::hold_commit_dir(const std::string& dir) {
  if (!commit_dir_.empty()) return commit_dir_ == dir;
  if (dir.empty() || dir[0] != '/') return false;
  commit_dir_ = dir;
  std::string error;
  commit_lease_fd_ = env_.hold_commit_dir(commit_dir_, &error);
  if (commit_lease_fd_ < 0) {
    ERUN_LOG_WARN("{}: cannot hold the host-memory commit directory: {}", me_, error);
  }
  if (watchdog_fd_ >= 0) (void)write_fully(watchdog_fd_, fmt::format("C {}\n", commit_dir_));
  return true;
}

// Whether a forked helper's channel hung up: the helper ended.
bool helper_ended(Env& env, int channel) {
  pollfd p{channel, POLLIN, 0};
  return channel < 0 || env.poll(&p, 1, 0) != 0;
}

void Agent::keep(const Keep& k) {
  // The driver repeats KEEP: a keeper that ended (its channel hung up) is
  // started again, on a new port that the answer says.
  if (keeper_.channel >= 0 && helper_ended(env_, keeper_.channel)) {
    ERUN_LOG_WARN("{}: the commit replica keeper ended: starting another", me_);
    env_.stop_helper(std::exchange(keeper_.channel, -1), kReplicaStopWait);
  }
  if (keeper_.channel < 0) {
    if (stopping_) {
      send(Keeping{0, "the agent is stopping"});
      return;
    }
    if (!hold_commit_dir(k.commit_dir)) {
      send(Keeping{0, fmt::format("cannot keep commits in {}: this agent holds {}", k.commit_dir,
                                  commit_dir_.empty() ? std::string("none") : commit_dir_)});
      return;
    }
    ensure_watchdog();  // it removes the directory should this agent die
    std::string error;
    keeper_ = env_.spawn_keeper(commit_dir_, secret_, me_, &error);
    if (keeper_.channel < 0) {
      send(Keeping{0, error});
      return;
    }
    ERUN_LOG_DEBUG("{}: keeping commit replicas in {} (port {})", me_, commit_dir_, keeper_.port);
  }
  send(Keeping{static_cast<uint32_t>(keeper_.port), ""});
}

void Agent::unkeep(const Unkeep& u) {
  if (keeper_.channel >= 0) {
    env_.stop_helper(std::exchange(keeper_.channel, -1), kReplicaStopWait);
    keeper_.port = 0;
    ERUN_LOG_DEBUG("{}: keeps commit replicas no more", me_);
  }
  arm_sweep(u.forget);
  sweep_replicas(env_.now());
}

void Agent::arm_sweep(bool all) {
  sweeping_ = true;
  sweep_all_ = all;
  sweep_every_ = 1s;
  next_sweep_ = SteadyClock::time_point{};  // at once
}

void Agent::sweep_replicas(SteadyClock::time_point now) {
  if (!sweeping_ || now < next_sweep_) return;
  if (keeper_.channel >= 0 || commit_dir_.empty()) {  // kept again since, or nothing held
    sweeping_ = false;
    return;
  }
  // `forget` holds only while no worker runs here: one that started since
  // may be restoring from a replica. Without it, only a worker's own commit
  // makes a replica redundant: with no worker, there is nothing to look at.
  const bool working = std::any_of(workers_.begin(), workers_.end(), [](auto& w) { return !w.second.reaped; });
  const bool all = sweep_all_ && !working;
  si::RemovedReplicas r;
  if (all || working) r = env_.remove_replicas(commit_dir_, all);
  if (!r.names.empty()) {
    ERUN_LOG_INFO("{}: removed the commit replicas {} ({:.1f} MiB): {}", me_, join(r.names, ", "),
                  static_cast<double>(r.bytes) / (1 << 20),
                  all ? "no longer a keeper" : "this host's workers hold a commit as new");
  }
  // Looked at again a second later, then less often while nothing goes
  // (a State without a worker file, or workers still behind the replica).
  sweep_every_ = r.names.empty() ? std::min<std::chrono::milliseconds>(sweep_every_ * 2, 8s) : 1s;
  next_sweep_ = now + sweep_every_;
  sweeping_ = !(all || working) || r.left > 0;
}

void Agent::stop_pushers() {
  for (auto& [dir, p] : pushers_) env_.stop_helper(p.channel, kReplicaStopWait);
  pushers_.clear();
}

void Agent::replicate(const Replicate& r) {
  if (r.keeper_dir.empty()) {  // stop every pusher
    stop_pushers();
    return;
  }
  const std::string to = fmt::format("{}:{}", r.host, r.port);
  const bool wanted = r.port > 0 && r.port <= 65535 && !r.host.empty();  // port 0: stop this keeper's pusher
  if (auto it = pushers_.find(r.keeper_dir); it != pushers_.end()) {
    // The driver repeats REPLICATE: a pusher that still runs to the same
    // address goes on; one that ended, or whose keeper moved, starts again.
    if (wanted && it->second.to == to && !helper_ended(env_, it->second.channel)) return;
    env_.stop_helper(it->second.channel, kReplicaStopWait);
    pushers_.erase(it);
  }
  if (!wanted || stopping_) return;
  if (commit_dir_.empty()) {
    ERUN_LOG_WARN("{}: cannot replicate commits to {}: this host keeps no commits", me_, to);
    return;
  }
  int fd = env_.spawn_pusher(commit_dir_, secret_, r.host, static_cast<int>(r.port), r.keeper_dir, me_);
  if (fd < 0) {
    ERUN_LOG_ERROR("{}: cannot start pushing commit replicas to {}: {}", me_, to, std::strerror(errno));
    return;
  }
  pushers_[r.keeper_dir] = Pusher{fd, to};
  ERUN_LOG_DEBUG("{}: replicating commits from {} to {} ({})", me_, commit_dir_, to, r.keeper_dir);
}

void Agent::start_persister(const std::map<std::string, std::string>& env, const std::string& cwd) {
  if (std::exchange(persister_tried_, true) || commit_dir_.empty()) return;
  auto dir = env.find("ERUN_CHECKPOINT_DIR");
  auto interval = env.find("ERUN_PERSIST_INTERVAL_MS");
  long ms = 0;
  if (dir == env.end() || dir->second.empty() || interval == env.end() || !parse_int(interval->second, ms)) return;
  PersisterOptions po;
  po.commit_dir = commit_dir_;
  po.checkpoint_dir = dir->second[0] == '/' || cwd.empty() ? dir->second : cwd + "/" + dir->second;
  po.interval = std::chrono::milliseconds(std::max(ms, 0L));
  po.me = me_;
  persister_fd_ = env_.spawn_persister(po);
  if (persister_fd_ < 0) ERUN_LOG_ERROR("{}: cannot start the persister: {}", me_, std::strerror(errno));
}


}  // namespace erun::agent::internal
