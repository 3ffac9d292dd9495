#include "runner/hosts/slurm_grow.h"

#include <optional>
#include <set>

#include <fmt/format.h>

#include "common/log.h"
#include "common/strings.h"
#include "common/subprocess.h"

namespace erun {

namespace {

constexpr auto kCommandTimeout = std::chrono::seconds(30);
constexpr auto kSubmitBackoff = std::chrono::seconds(30);

// Placeholder states that hold (or wait for) a node: the others are ending or gone.
bool live(const std::string& state) {
  static const std::set<std::string> states = {"PENDING",   "RUNNING",   "CONFIGURING", "REQUEUED",
                                               "REQUEUE_FED", "RESIZING", "SUSPENDED"};
  return states.count(state) > 0;
}

}  // namespace

Result<std::string> run_slurm_command(const std::vector<std::string>& argv) {
  SpawnOptions o;
  o.argv = argv;
  o.pipe_stdout = true;
  o.pipe_stderr = true;
  auto p = Subprocess::spawn(o);
  if (!p) return Result<std::string>::error(fmt::format("{}: {}", argv.front(), p.message()));
  const auto deadline = std::chrono::steady_clock::now() + kCommandTimeout;
  std::string out, err;
  read_all_until(p->stdout_fd(), out, deadline);
  read_all_until(p->stderr_fd(), err, deadline);
  auto status = p->wait_for(std::max<Duration>(deadline - std::chrono::steady_clock::now(), Duration(0)));
  if (!status) {
    p->terminate(std::chrono::seconds(1));
    return Result<std::string>::error(fmt::format("`{}` did not end within {} s", join(argv, " "),
                                                  kCommandTimeout.count()));
  }
  if (!status->ok()) {
    return Result<std::string>::error(
        fmt::format("`{}` failed with {}: {}", join(argv, " "), status->describe(), trim(err)));
  }
  return out;
}

std::string SlurmGrow::script(const std::string& allocation) {
  // Slurm signals a preempted job's steps (the agent's, which drains the
  // node), not this script, and ends the job only when its GraceTime is
  // found over (slurmctld looks every 30 s or so). So every 2 s: once the
  // job is marked preempted and the agent's step has ended, the script
  // ends the job itself and the node is free at once. It also ends when
  // the allocation has.
  return fmt::format(
      "trap '' TERM; "
      "while squeue -h -o %i -j {} 2>/dev/null | grep -q .; do "
      "sleep 2; "
      "if scontrol show job $SLURM_JOB_ID 2>/dev/null | grep -q 'PreemptTime=[0-9]' && "
      "steps=$(squeue -h -s -j $SLURM_JOB_ID -o %i 2>/dev/null) && "
      "! printf '%s\\n' \"$steps\" | grep -v -e '\\.batch$' -e '\\.extern$' | grep -q .; then exit 0; fi; "
      "done",
      allocation);
}

SlurmGrow::SlurmGrow(Options options, Runner runner)
    : o_(std::move(options)), run_(std::move(runner)), name_("erun-grow-" + o_.allocation) {}

SlurmGrow::~SlurmGrow() { cancel_all(); }

// The placeholders squeue lists now, by job id; none when squeue fails (said
// once, until it works again).
std::optional<SlurmGrow::Placeholders> SlurmGrow::list() {
  auto listed = run_({"squeue", "-h", "--name=" + name_, "-o", "%i|%T|%N|%r"});
  if (!listed) {
    if (!std::exchange(warned_, true)) {
      ERUN_LOG_WARN("--slurm-grow: cannot list the placeholder jobs ({}); the job keeps its nodes", listed.message());
    }
    return std::nullopt;
  }
  Placeholders now;
  for (const std::string& line : split(*listed, '\n')) {
    auto f = split(trim(line), '|');
    if (f.size() < 4 || f[0].empty()) continue;
    now[f[0]] = Placeholder{f[1], f[1] == "RUNNING" ? f[2] : "", f[3]};
  }
  warned_ = false;
  return now;
}

// Says which nodes joined and left since the last tick, and makes a
// placeholder requeued after a preemption eligible at once.
void SlurmGrow::follow(const Placeholders& before, const Placeholders& now) {
  for (auto& [id, p] : now) {
    auto was = before.find(id);
    const bool ran = was != before.end() && was->second.state == "RUNNING";
    if (p.state == "RUNNING" && !ran) {
      ERUN_LOG_INFO("--slurm-grow: placeholder job {} runs on {}: the node joins the job", id, p.node);
    } else if (ran && p.state != "RUNNING") {
      ERUN_LOG_INFO("--slurm-grow: placeholder job {} on {} is {} ({}): the node leaves the job", id,
                    was->second.node, p.state, p.reason);
    }
    // Requeued after a preemption: Slurm makes it wait two minutes; it may
    // run as soon as the node is idle again.
    if (p.state == "PENDING" && p.reason == "BeginTime") {
      if (auto r = run_({"scontrol", "update", "JobId=" + id, "StartTime=now"}); !r) {
        ERUN_LOG_WARN("--slurm-grow: {}", r.message());
      }
    }
  }
  for (auto& [id, p] : before) {
    if (!now.count(id) && p.state == "RUNNING") {
      ERUN_LOG_INFO("--slurm-grow: placeholder job {} on {} ended: the node leaves the job", id, p.node);
    }
  }
}

// Submits placeholders until `wanted` live (none for a while after a failed
// sbatch), then cancels pending ones beyond `wanted`; `now` follows.
void SlurmGrow::resize(int wanted, Placeholders& now) {
  int count = 0;
  for (auto& [id, p] : now) count += live(p.state) ? 1 : 0;
  const auto now_time = std::chrono::steady_clock::now();
  for (; count < wanted && now_time >= next_submit_; ++count) {
    auto id = run_({"sbatch", "--parsable", "--partition=" + o_.partition, "--nodes=1", "--exclusive", "--requeue",
                    "--job-name=" + name_, "--output=/dev/null", "--wrap=" + script(o_.allocation)});
    if (!id) {
      ERUN_LOG_ERROR("--slurm-grow {}: cannot submit a placeholder job ({}); check the partition's name "
                     "(sinfo) and that this user may submit to it; trying again in {} s",
                     o_.partition, id.message(), kSubmitBackoff.count());
      next_submit_ = now_time + kSubmitBackoff;
      break;
    }
    const std::string job(trim(split(*id, ';').front()));
    ERUN_LOG_INFO("--slurm-grow: placeholder job {} waits in partition {} for an idle node", job, o_.partition);
    now[job] = Placeholder{"PENDING", "", ""};
  }
  // More than wanted (the job found its nodes elsewhere): the pending ones go.
  for (auto it = now.begin(); it != now.end() && count > wanted;) {
    if (it->second.state == "PENDING") {
      (void)run_({"scancel", it->first});
      it = now.erase(it);
      --count;
    } else {
      ++it;
    }
  }
}

void SlurmGrow::tick(int wanted) {
  std::optional<Placeholders> now = list();
  if (!now) return;
  // Slurm's commands run without the lock: job_of() (the driver's thread,
  // launching an agent) never waits for them.
  Placeholders before;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return;
    before = jobs_;
  }
  follow(before, *now);
  resize(wanted, *now);
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) {
    // cancel_all() ran meanwhile: what this tick submitted goes too.
    for (auto& [id, p] : *now) (void)run_({"scancel", id});
    return;
  }
  jobs_ = std::move(*now);
}

HostSet SlurmGrow::hosts() const {
  std::lock_guard<std::mutex> lock(mu_);
  HostSet out;
  for (auto& [id, p] : jobs_) {
    if (p.state == "RUNNING" && !p.node.empty()) out.add(Host{p.node, o_.slots_per_node});
  }
  return out;
}

std::string SlurmGrow::job_of(const std::string& node) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, p] : jobs_) {
    if (p.state == "RUNNING" && p.node == node) return id;
  }
  return "";
}

void SlurmGrow::cancel_all() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::exchange(cancelled_, true)) return;
    jobs_.clear();
  }
  // By name: also a placeholder submitted by a tick whose answer never came.
  if (auto r = run_({"scancel", "--name=" + name_}); !r) {
    ERUN_LOG_WARN("--slurm-grow: {}; cancel the placeholder jobs with `scancel --name={}`", r.message(), name_);
  } else {
    ERUN_LOG_INFO("--slurm-grow: placeholder jobs cancelled ({})", name_);
  }
}

SlurmGrowDiscovery::SlurmGrowDiscovery(std::unique_ptr<HostDiscovery> base, std::shared_ptr<SlurmGrow> grow,
                                       int max_np, int slots_per_node)
    : base_(std::move(base)), grow_(std::move(grow)), max_np_(max_np), slots_per_node_(std::max(slots_per_node, 1)) {}

Result<HostSet> SlurmGrowDiscovery::discover() {
  auto base = base_->discover();
  if (!base) return base;
  const int room = max_np_ - base->total_slots();
  grow_->tick(room > 0 ? (room + slots_per_node_ - 1) / slots_per_node_ : 0);
  HostSet out = *base;
  const HostSet lent = grow_->hosts();
  for (auto& h : lent.hosts()) {
    if (out.find(h.name) < 0) out.add(h);
  }
  return out;
}

std::string SlurmGrowDiscovery::describe() const {
  return base_->describe() + " and the nodes of running --slurm-grow placeholders (" + grow_->name() + ")";
}

}  // namespace erun
