#include "runner/launch/launcher_agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "agent/protocol.h"
#include "common/log.h"
#include "common/net.h"
#include "common/strings.h"
#include "common/subprocess.h"

#include "runner/launch/agent_connection.h"
#include "runner/launch/agent_retirer.h"

namespace erun {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

namespace {

class AgentWorker final : public WorkerHandle {
 public:
  AgentWorker(std::shared_ptr<AgentConnection> c, uint64_t id, int out_r, int err_r)
      : c_(std::move(c)), id_(id), out_r_(out_r), err_r_(err_r) {}
  ~AgentWorker() override {
    if (!poll()) {
      c_->send(agent::Kill{id_});
      (void)c_->wait_exit(id_, 3s);
    }
    c_->forget(id_);
    close_fd(out_r_);
    close_fd(err_r_);
  }

  std::optional<ExitStatus> poll() override { return c_->exit_of(id_); }
  void terminate() override {
    if (!poll()) c_->send(agent::Terminate{id_});
  }
  void kill() override {
    if (!poll()) c_->send(agent::Kill{id_});
  }
  void signal(int sig) override {
    if (!poll()) c_->send(agent::Signal{id_, sig});
  }
  int take_stdout() override { return std::exchange(out_r_, -1); }
  int take_stderr() override { return std::exchange(err_r_, -1); }
  long pid() const override { return c_->pid_of(id_); }
  std::optional<std::vector<std::string>> exit_stderr() const override { return c_->exit_stderr_of(id_); }
  TimePoint exited_at() const override { return c_->exited_at_of(id_); }
  bool host_unreachable() const override { return c_->unreachable(); }

 private:
  std::shared_ptr<AgentConnection> c_;
  uint64_t id_;
  int out_r_, err_r_;
};

}  // namespace

std::vector<std::string> agent_argv(const AgentLaunchOptions& agent) {
  auto seconds = [](Duration d) { return fmt::format("{:g}", to_ms(d) / 1000.0); };
  std::vector<std::string> argv = {agent.agent_path,     "--agent", "--heartbeat-interval",
                                   seconds(agent.heartbeat_interval), "--heartbeat-timeout",
                                   seconds(agent.heartbeat_timeout)};
  if (agent.driver_grace > Duration::zero()) {
    argv.push_back("--driver-grace");
    argv.push_back(seconds(agent.driver_grace));
  }
  if (agent.drain_timeout > Duration::zero()) {
    argv.push_back("--drain-timeout");
    argv.push_back(seconds(agent.drain_timeout));
  }
  if (agent.relay) argv.push_back("--relay");
  argv.push_back("--log-level");
  argv.push_back(log_level_name(agent.log_level));
  return argv;
}

Status validate_worker_spec(const WorkerSpec& spec) {
  if (spec.command.empty()) return Status::error("worker command is empty: give the program to run");
  for (const auto& [name, value] : spec.env) {
    if (name.empty() || name.find('=') != std::string::npos || name.find('\0') != std::string::npos ||
        name.find(' ') != std::string::npos) {
      return Status::error(fmt::format(
          "environment variable name '{}' is not valid: use letters, digits and _ (no '=', space or NUL)", name));
    }
  }
  if (spec.secret.empty() || spec.secret.find('\n') != std::string::npos || spec.secret.size() > agent::kMaxSecret) {
    return Status::error("job secret must be one non-empty line of at most 4096 bytes");
  }
  return Status::ok();
}

AgentLauncher::AgentLauncher(AgentCommand agent_command,
                             AgentLaunchOptions options, std::string via, std::string hint,
                             StderrHint stderr_hint)
    : agent_command_(std::move(agent_command)),
      options_(std::move(options)),
      via_(std::move(via)),
      hint_(std::move(hint)),
      stderr_hint_(std::move(stderr_hint)) {}

AgentLauncher::~AgentLauncher() {
  for (Released& r : released_) r.waiter.join();  // each within its agent's shutdown limit
  if (abandoned_) return;  // the connections went without a word
  for (auto& [host, c] : agents_) c->begin_shutdown();
  // The job is over: the agents lost on the way that hold workers still get
  // their tries meanwhile, for about as long as one more try takes.
  if (retirer_) retirer_->finish(std::max<Duration>(options_.heartbeat_timeout / 2, 1s) + 1s);
  // Workers still running get their grace from the agents; wait a little longer.
  for (auto& [host, c] : agents_) c->finish_shutdown(8s);
}


Result<std::unique_ptr<WorkerHandle>> AgentLauncher::launch(const WorkerSpec& spec) {
  using R = Result<std::unique_ptr<WorkerHandle>>;
  if (Status s = validate_worker_spec(spec); !s) return R(s);
  if (spec.host.empty() || spec.host[0] == '-') {
    return R::error(fmt::format("rank {}: '{}' is not a host name ({})", spec.rank, spec.host, via_));
  }
  if (options_.agent_path.empty()) {
    return R::error("no erun agent binary: pass --agent-path PATH (the erun program on the hosts)");
  }
  // The worker's output pipes first: a connection, once made, gets its reader.
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return R::error(fmt::format("pipe: {}", std::strerror(errno)));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return R::error(fmt::format("pipe: {}", std::strerror(errno)));
  }
  ::fcntl(out[1], F_SETFL, O_NONBLOCK);
  ::fcntl(err[1], F_SETFL, O_NONBLOCK);
  std::string error;
  auto c = connection(spec.host, spec.secret, &error);
  if (!c) {
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    return R::error(fmt::format("rank {} on {}: cannot start the agent: {} ({})", spec.rank, spec.host, error, hint_));
  }
  agent::Start start;
  start.id = next_id_++;
  start.generation = spec.generation;
  start.rank = spec.rank;
  start.slot = spec.local_index;
  start.argv = spec.command;
  start.env = spec.env;
  start.cwd = spec.cwd;
  start.term_grace_ms = static_cast<uint64_t>(std::max(0L, to_ms(spec.term_grace)));
  start.output_dir = spec.output_dir;
  c->start_worker(start, out[1], err[1]);
  c->start_reader();
  return std::unique_ptr<WorkerHandle>(new AgentWorker(c, start.id, out[0], err[0]));
}

namespace {

// A connection to a local agent's attach socket, as a channel a connection
// or a retirer's try can talk through; `limit` bounds the connect.
Result<Subprocess> connect_agent_socket(const std::string& path, Duration limit) {
  using R = Result<Subprocess>;
  net::Address a;
  if (!net::unix_address(path, &a)) return R::error(fmt::format("{} is not a usable socket path", path));
  net::Socket s = net::connect_unix(a, SteadyClock::now() + limit);
  if (!s.ok()) {
    return R::error(fmt::format("cannot reach the agent at {} ({}): it ended, or its host restarted", path,
                                s.outcome.text()));
  }
  const int in = ::fcntl(s.fd.get(), F_DUPFD_CLOEXEC, 0);
  if (in < 0) return R::error(fmt::format("cannot reach the agent at {}: {}", path, std::strerror(errno)));
  return R(Subprocess::channel(in, s.fd.release()));
}

}  // namespace

std::shared_ptr<AgentConnection> AgentLauncher::spawn_connection(const std::string& host,
                                                                 const std::vector<std::string>& agent_args,
                                                                 std::string* error) {
  SpawnOptions o;
  o.argv = agent_command_(host, agent_args);
  o.pipe_stdin = true;
  o.pipe_stdout = true;
  // The agent's log lines (and ssh's errors) go to erun's stderr, through
  // the connection when it looks at them.
  o.pipe_stderr = static_cast<bool>(stderr_hint_);
  o.new_process_group = true;
  auto process = Subprocess::spawn(o);
  if (!process) {
    *error = process.message();
    return nullptr;
  }
  auto conn = std::make_shared<AgentConnection>(host, std::move(process).value(), options_, via_, stderr_hint_,
                                                paths_version_);
  watch_loss(*conn);
  return conn;
}

void AgentLauncher::watch_loss(AgentConnection& conn) {
  if (options_.driver_grace <= Duration::zero()) return;  // no agent holds its workers without a driver
  if (!retirer_) {
    // Each try: the transport's own process (`erun --agent --attach PATH`
    // over ssh or srun) or, here, the socket. Limited to half the heartbeat
    // timeout: a host that comes back is reached within about one.
    AgentRetirer::Options ro;
    ro.try_limit = std::max<Duration>(options_.heartbeat_timeout / 2, 1s);
    auto open = [command = agent_command_, local = via_ == "local",
                 agent_path = options_.agent_path](const std::string& host, const std::string& path) -> Result<Subprocess> {
      if (local) return connect_agent_socket(path, 2s);
      SpawnOptions o;
      o.argv = command(host, {agent_path, "--agent", "--attach", path});
      o.pipe_stdin = true;
      o.pipe_stdout = true;
      o.pipe_stderr = true;  // ssh's reasons: the retirer logs the last line
      o.new_process_group = true;
      return Subprocess::spawn(o);
    };
    retirer_ = std::make_shared<AgentRetirer>(open, ro);
  }
  // The connection may outlive this launcher (a worker handle holds it): the
  // callback holds the retirer, never the launcher.
  conn.on_lost([retirer = retirer_](const std::string& host, const std::string& path, const std::string& why) {
    retirer->add(host, path, fmt::format("its driver lost it: {}", why));
  });
}

std::shared_ptr<AgentConnection> AgentLauncher::connect_attach_socket(const std::string& host,
                                                                     const std::string& path, std::string* error) {
  auto channel = connect_agent_socket(path, std::chrono::seconds(10));
  if (!channel) {
    *error = channel.message();
    return nullptr;
  }
  auto conn = std::make_shared<AgentConnection>(host, std::move(channel).value(), options_, via_, StderrHint{},
                                                paths_version_);
  watch_loss(*conn);
  return conn;
}

std::shared_ptr<AgentConnection> AgentLauncher::connection(const std::string& host, const std::string& secret,
                                                           std::string* error) {
  auto& c = agents_[host];
  if (c && !c->lost() && !c->draining()) return c;  // a draining agent ends: the host's next worker gets a new one
  auto conn = spawn_connection(host, agent_argv(options_), error);
  if (!conn) {
    agents_.erase(host);
    return nullptr;
  }
  conn->send_secret(secret);
  if (retirer_) retirer_->set_driver(secret, term_);
  ERUN_LOG_DEBUG("agent on {}: started ({}, pid {})", host, via_, conn->process_pid());
  c = std::move(conn);
  return c;
}

bool AgentLauncher::keep(const std::string& host, const std::string& commit_dir, const std::string& secret) {
  std::string error;
  auto c = connection(host, secret, &error);
  if (!c) {
    ERUN_LOG_WARN("agent on {}: cannot start it to keep commit replicas: {} ({})", host, error, hint_);
    return false;
  }
  c->keep(commit_dir);
  c->start_reader();
  return true;
}

bool AgentLauncher::agent_alive(const std::string& host) {
  auto it = agents_.find(host);
  return it != agents_.end() && !it->second->lost();
}

std::optional<int> AgentLauncher::keeper_port(const std::string& host) {
  auto it = agents_.find(host);
  if (it == agents_.end() || it->second->lost()) return 0;
  return it->second->keeper_port();
}

void AgentLauncher::replicate(const std::string& holder, const std::string& keeper, int port,
                              const std::string& keeper_dir) {
  auto it = agents_.find(holder);
  if (it == agents_.end() || it->second->lost()) return;
  it->second->send(agent::Replicate{keeper, static_cast<uint32_t>(port), keeper_dir});
}

void AgentLauncher::unkeep(const std::string& host, bool forget) {
  auto it = agents_.find(host);
  if (it == agents_.end() || it->second->lost()) return;
  it->second->unkeep(forget);
}

void AgentLauncher::release(const std::string& host) {
  std::erase_if(released_, [](Released& r) {
    if (!r.done->load()) return false;
    r.waiter.join();
    return true;
  });
  auto it = agents_.find(host);
  if (it == agents_.end()) return;
  std::shared_ptr<AgentConnection> c = std::move(it->second);
  agents_.erase(it);
  paths_version_->fetch_add(1);  // the record names it no more
  if (abandoned_) return;
  const bool lost = c->lost();
  ERUN_LOG_INFO("agent on {}: {}: the host left discovery and runs no worker of the job", host,
                lost ? "forgotten (it was lost)" : "told to end");
  c->begin_shutdown();
  // Its workers are gone: the agent ends within a heartbeat or two; the
  // connection (its reader thread, its pipes) goes with the last reference.
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread waiter([c = std::move(c), done]() mutable {
    c->finish_shutdown(8s);
    c.reset();
    done->store(true);
  });
  released_.push_back(Released{std::move(waiter), std::move(done)});
}

std::shared_ptr<AgentConnection> AgentLauncher::send_attach(const std::string& host, const std::string& path,
                                                             const AttachRequest& request, Status& status) {
  if (abandoned_) {
    status = Status::error("this driver left the job");
    return nullptr;
  }
  std::string error;
  // A local agent's socket is on this machine: connected to straight away,
  // without an `erun --agent --attach` process in between (a thousand of
  // those cost seconds of CPU).
  auto conn = via_ == "local" ? connect_attach_socket(host, path, &error)
                              : spawn_connection(host, {options_.agent_path, "--agent", "--attach", path}, &error);
  if (!conn) {
    status = Status::error(error);
    return nullptr;
  }
  conn->send_secret(request.secret);
  term_ = std::max(term_, request.term);
  if (retirer_) retirer_->set_driver(request.secret, term_);
  conn->send(agent::Attach{request.term, request.rdzv_host, static_cast<uint32_t>(std::max(request.rdzv_port, 0))});
  return conn;
}

void AgentLauncher::adopt_agent(const std::shared_ptr<AgentConnection>& conn, TimePoint deadline, AttachOutcome& out) {
  auto adopted = conn->wait_state(std::max<Duration>(deadline - SteadyClock::now(), Duration::zero()));
  if (!adopted) {
    conn->abandon();  // never a SHUTDOWN to an agent this driver does not hold
    out.status = Status::error(adopted.message());
    return;
  }
  for (auto& a : adopted.value()) {
    // The agent refuses a START whose id it runs: new ids go above these.
    next_id_ = std::max<uint64_t>(next_id_, a.report.id + 1);
    AdoptedWorker w;
    w.host = out.host;
    w.generation = a.report.generation;
    w.rank = a.report.rank;
    w.slot = a.report.slot;
    w.pid = a.report.pid;
    w.handle.reset(new AgentWorker(conn, a.report.id, a.out_r, a.err_r));
    out.workers.push_back(std::move(w));
  }
  if (auto old = agents_.find(out.host); old != agents_.end()) old->second->abandon();
  agents_[out.host] = conn;
}

std::vector<AttachOutcome> AgentLauncher::attach(const std::vector<std::pair<std::string, std::string>>& agents,
                                                 const AttachRequest& request) {
  std::vector<AttachOutcome> out;
  std::vector<std::shared_ptr<AgentConnection>> conns;
  // Every agent's attach process first, then the answers: a thousand hosts
  // take about as long as the slowest, not as their sum.
  for (auto& [host, path] : agents) {
    out.push_back(AttachOutcome{host, Status::ok(), {}});
    conns.push_back(send_attach(host, path, request, out.back().status));
  }
  // The reader threads only now: every fork above copies this process's
  // mappings, and a thread's stack is one (with them, 1,000 attach processes
  // took 46 s here instead of a few).
  for (auto& conn : conns) {
    if (conn) conn->start_reader();
  }
  const auto deadline = SteadyClock::now() + request.timeout;
  for (size_t i = 0; i < conns.size(); ++i) {
    if (conns[i]) adopt_agent(conns[i], deadline, out[i]);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> AgentLauncher::attach_paths() {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [host, c] : agents_) {
    if (c->lost()) continue;
    std::string path = c->attach_path();
    if (!path.empty()) out.emplace_back(host, path);
  }
  return out;
}

void AgentLauncher::recorded(const std::vector<std::pair<std::string, std::string>>& agents) {
  for (auto& [host, path] : agents) {
    auto it = agents_.find(host);
    if (it != agents_.end() && !it->second->lost()) it->second->confirm_recorded(path);
  }
}

uint64_t AgentLauncher::superseded() {
  uint64_t term = 0;
  for (auto& [host, c] : agents_) term = std::max(term, c->superseded());
  return term;
}

std::vector<std::pair<std::string, std::string>> AgentLauncher::take_drains() {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [host, c] : agents_) {
    if (auto why = c->take_draining()) out.emplace_back(host, std::move(*why));
  }
  return out;
}

void AgentLauncher::abandon() {
  abandoned_ = true;
  if (retirer_) retirer_->abandon();  // the agents are the new driver's to tend
  for (auto& [host, c] : agents_) c->abandon();
}

std::unique_ptr<Launcher> make_local_launcher(AgentLaunchOptions agent) {
  auto command = [](const std::string&, const std::vector<std::string>& agent_args) { return agent_args; };
  return std::make_unique<AgentLauncher>(command, agent, "local", "is --agent-path an erun binary?");
}

}  // namespace erun