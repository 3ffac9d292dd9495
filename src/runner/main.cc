// erun's entry point: parse the command line, build the driver's parts, run
// the job, turn the outcome into an exit code. The only place that reads the
// environment and installs signal handlers.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/log.h"
#include "discovery/discovery.h"
#include "runner/cli.h"
#include "runner/driver.h"
#include "runner/event_log.h"
#include "runner/launcher.h"
#include "runner/output.h"
#include "rendezvous/rendezvous.h"

#include <openssl/rand.h>

namespace {

std::string random_hex(size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  if (RAND_bytes(buf.data(), static_cast<int>(buf.size())) != 1) {
    std::fprintf(stderr, "erun: cannot get random bytes for the job secret (OpenSSL RAND_bytes failed)\n");
    std::exit(1);
  }
  std::string out;
  for (auto b : buf) out += fmt::format("{:02x}", b);
  return out;
}

erun::Driver* g_driver = nullptr;
volatile sig_atomic_t g_signals = 0;

void on_signal(int sig) {
  ++g_signals;
  if (g_driver) g_driver->request_stop(g_signals > 1 ? SIGKILL : sig);
}

erun::Result<std::unique_ptr<erun::HostDiscovery>> make_discovery(const erun::DriverOptions& o) {
  using R = erun::Result<std::unique_ptr<erun::HostDiscovery>>;
  int default_slots = o.slots_per_host > 0 ? o.slots_per_host : 1;
  if (!o.discovery_script.empty()) {
    return R(std::unique_ptr<erun::HostDiscovery>(
        std::make_unique<erun::ScriptDiscovery>(o.discovery_script, o.discovery_timeout, default_slots)));
  }
  if (!o.hosts.empty()) {
    auto hs = erun::parse_hosts_flag(o.hosts, default_slots);
    if (!hs) return R::error(fmt::format("-H {}: {}", o.hosts, hs.message()));
    return R(std::unique_ptr<erun::HostDiscovery>(std::make_unique<erun::StaticDiscovery>(*hs, "-H")));
  }
  if (!o.hostfile.empty()) {
    std::ifstream in(o.hostfile);
    if (!in) return R::error(fmt::format("--hostfile {}: cannot read the file", o.hostfile));
    std::stringstream text;
    text << in.rdbuf();
    auto hs = erun::parse_hostfile(text.str(), default_slots);
    if (!hs) return R::error(fmt::format("--hostfile {}: {}", o.hostfile, hs.message()));
    return R(std::unique_ptr<erun::HostDiscovery>(std::make_unique<erun::StaticDiscovery>(*hs, "--hostfile")));
  }
  int slots = o.slots_per_host > 0 ? o.slots_per_host : std::max(o.np, o.max_np);
  return R(std::unique_ptr<erun::HostDiscovery>(std::make_unique<erun::StaticDiscovery>(
      erun::HostSet({erun::Host{"localhost", slots}}), "this machine")));
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = erun::parse_cli(argc, argv);
  if (auto* info = std::get_if<erun::CliInfo>(&parsed)) {
    std::fputs(info->text.c_str(), stdout);
    return 0;
  }
  if (auto* err = std::get_if<erun::CliError>(&parsed)) {
    std::fprintf(stderr, "erun: %s\n", err->message.c_str());
    return 2;
  }
  auto options = std::get<erun::DriverOptions>(std::move(parsed));
  erun::init_logging(options.verbose);

  // -x NAME forwards erun's own value of NAME.
  for (auto& e : options.env) {
    if (e.find('=') != std::string::npos) continue;
    const char* v = std::getenv(e.c_str());
    if (!v) {
      std::fprintf(stderr, "erun: -x %s: the variable is not set in erun's environment; set it or use -x %s=VALUE\n",
                   e.c_str(), e.c_str());
      return 2;
    }
    e += "=" + std::string(v);
  }

  auto discovery = make_discovery(options);
  if (!discovery) {
    std::fprintf(stderr, "erun: %s\n", discovery.message().c_str());
    return 2;
  }

  ::signal(SIGPIPE, SIG_IGN);
  auto local = erun::make_local_launcher();
  erun::SshOptions ssh;
  ssh.port = options.ssh_port;
  ssh.identity_file = options.ssh_identity_file;
  ssh.connect_timeout = options.ssh_connect_timeout;
  auto remote = erun::make_ssh_launcher(ssh);
  erun::EventLog events;
  if (!options.event_log.empty()) {
    if (auto s = events.open(options.event_log); !s) {
      std::fprintf(stderr, "erun: %s\n", s.message().c_str());
      return 2;
    }
  }
  erun::OutputForwarder output(erun::OutputOptions{options.tag_output, options.output_dir, 1, 20});
  erun::SystemClock clock;

  std::string job_id = "erun-" + random_hex(6);
  std::string secret = random_hex(32);
  erun::ServerOptions server_options;
  server_options.job_id = job_id;
  server_options.secret = secret;
  erun::RendezvousServer rendezvous(server_options);
  if (!options.dry_run && options.mode != erun::WorkerMode::kRestart) {
    if (auto s = rendezvous.start(); !s) {
      ERUN_LOG_ERROR("cannot start the rendezvous server: {}", s.message());
      return 1;
    }
  }

  erun::DriverDeps deps;
  deps.job_id = job_id;
  deps.secret = secret;
  if (!options.dry_run && options.mode != erun::WorkerMode::kRestart) deps.rendezvous = &rendezvous;
  deps.discovery = discovery->get();
  deps.local_launcher = local.get();
  deps.remote_launcher = remote.get();
  deps.clock = &clock;
  deps.output = &output;
  deps.events = &events;
  erun::Driver driver(options, deps);

  if (options.dry_run) {
    if (auto s = driver.start(); !s) {
      ERUN_LOG_ERROR("{}", s.message());
      return 1;
    }
    return driver.dry_run(stdout);
  }

  g_driver = &driver;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);
  int code = driver.run();
  g_driver = nullptr;
  return code;
}
