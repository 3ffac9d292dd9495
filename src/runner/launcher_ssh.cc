#include <unistd.h>

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "common/strings.h"
#include "runner/launcher.h"
#include "runner/launcher_agent.h"

namespace erun {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// ssh's argv that runs `remote` (one word for the remote login shell) on `host`.
std::vector<std::string> ssh_command(const SshOptions& options, const std::string& host, const std::string& remote) {
  auto secs = std::chrono::duration_cast<std::chrono::milliseconds>(options.connect_timeout).count();
  long timeout = std::max<long>(1, (secs + 999) / 1000);
  // Host keys are checked as the user's ssh configuration says (known_hosts);
  // --ssh-option StrictHostKeyChecking=no turns that off for throwaway clusters.
  std::vector<std::string> argv = {"ssh", "-T",
                                   "-o", "BatchMode=yes",
                                   "-o", fmt::format("ConnectTimeout={}", timeout),
                                   "-o", "LogLevel=ERROR",
                                   // A host that vanishes without closing the
                                   // connection ends ssh (255) within ~15 s;
                                   // the agents' heartbeats notice it sooner.
                                   "-o", "ServerAliveInterval=5",
                                   "-o", "ServerAliveCountMax=3"};
  if (options.port > 0) {
    argv.push_back("-p");
    argv.push_back(std::to_string(options.port));
  }
  if (!options.identity_file.empty()) {
    argv.push_back("-i");
    argv.push_back(options.identity_file);
  }
  if (!options.user.empty()) {
    argv.push_back("-l");
    argv.push_back(options.user);
  }
  // "Key=Value" words get their -o; raw flags ("-oKey=Value", "-F FILE") pass as given.
  bool flag_argument = false;
  for (const auto& o : options.extra_options) {
    if (flag_argument || starts_with(o, "-")) {
      argv.push_back(o);
      flag_argument = !flag_argument && o.size() == 2;
    } else {
      argv.push_back("-o");
      argv.push_back(o);
    }
  }
  argv.push_back("--");
  argv.push_back(host);
  argv.push_back(remote);
  return argv;
}

}  // namespace

std::unique_ptr<Launcher> make_ssh_launcher(SshOptions options, AgentLaunchOptions agent) {
  auto command = [options, agent](const std::string& host) {
    // `exec`: the agent replaces the login shell, nothing between sshd and it.
    std::string remote = "exec";
    for (auto& a : agent_argv(agent)) remote += " " + shell_quote(a);
    return ssh_command(options, host, remote);
  };
  return std::make_unique<AgentLauncher>(command, agent, "ssh", "is openssh-client installed?");
}

bool is_local_host(const std::string& host) {
  std::string h = lower(host);
  if (h == "localhost" || h == "localhost.localdomain" || h == "127.0.0.1" || h == "::1" ||
      h == "ip6-localhost") {
    return true;
  }
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return false;
  std::string self = lower(buf);
  if (self.empty()) return false;
  // The short name of an FQDN hostname, or the FQDN of a short one.
  return h == self || starts_with(h, self + ".") || starts_with(self, h + ".");
}

}  // namespace erun
