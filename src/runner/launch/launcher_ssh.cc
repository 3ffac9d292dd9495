#include <unistd.h>

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "common/strings.h"
#include "runner/launch/launcher.h"
#include "runner/launch/launcher_agent.h"

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

// The value of the first -o option named `key` (any case) among the extra
// options, as ssh_command() passes them ("Key=Value", "-oKey=Value" or "-o"
// "Key=Value"; "Key Value" too), empty when there is none: ssh keeps the
// first value it is given. For a list of files, the first.
std::string first_ssh_option(const std::vector<std::string>& extra, std::string_view key) {
  bool flag_argument = false;
  bool after_o = false;
  for (const auto& word : extra) {
    std::string_view w = word;
    bool is_option = !starts_with(w, "-");
    if (flag_argument) {
      is_option = after_o;
    } else if (starts_with(w, "-o") && w.size() > 2) {
      w.remove_prefix(2);
      is_option = true;
    }
    after_o = !flag_argument && w == "-o";
    flag_argument = !flag_argument && starts_with(word, "-") && word.size() == 2;
    size_t sep = w.find_first_of("= \t");
    if (!is_option || sep == std::string_view::npos || lower(trim(w.substr(0, sep))) != lower(key)) continue;
    std::string_view value = trim(w.substr(sep + 1));
    if (starts_with(value, "=")) value = trim(value.substr(1));
    return std::string(value.substr(0, value.find_first_of(" \t")));
  }
  return {};
}

}  // namespace

std::optional<std::string> ssh_failure_hint(const SshOptions& options, const std::string& host,
                                            std::string_view line) {
  bool changed = line.find("REMOTE HOST IDENTIFICATION HAS CHANGED") != std::string_view::npos;
  if (!changed && line.find("Host key verification failed") == std::string_view::npos) return std::nullopt;
  std::string name = host.substr(host.find('@') + 1);  // a user@ prefix is not part of the key's name
  std::string file = first_ssh_option(options.extra_options, "UserKnownHostsFile");
  file = file.empty() ? "~/.ssh/known_hosts" : shell_quote(file);
  std::string port = options.port > 0 ? fmt::format("-p {} ", options.port) : "";
  std::string scan = fmt::format("ssh-keyscan {}{} >> {}", port, shell_quote(name), file);
  if (changed) {
    std::string entry = options.port > 0 ? fmt::format("[{}]:{}", name, options.port) : name;
    return fmt::format("the host key of {} is not the one recorded in {}: if the host was reinstalled, remove the "
                       "old key with `ssh-keygen -f {} -R {}` and add the new one with `{}`; if not, someone may be "
                       "intercepting the connection",
                       name, file, file, shell_quote(entry), scan);
  }
  return fmt::format("ssh could not verify the host key of {} (no key for it in {}): add it with `{}`, or pass "
                     "--ssh-option StrictHostKeyChecking=accept-new to let ssh record the key of a host it has not "
                     "seen before",
                     name, file, scan);
}

std::unique_ptr<Launcher> make_ssh_launcher(SshOptions options, AgentLaunchOptions agent) {
  auto command = [options](const std::string& host, const std::vector<std::string>& agent_args) {
    // `exec`: the agent replaces the login shell, nothing between sshd and it.
    std::string remote = "exec";
    for (auto& a : agent_args) remote += " " + shell_quote(a);
    return ssh_command(options, host, remote);
  };
  // ssh's stderr comes through the launcher, which recognises a host key it
  // cannot verify and says how to add it.
  auto hint = [options](const std::string& host, std::string_view line) {
    return ssh_failure_hint(options, host, line);
  };
  return std::make_unique<AgentLauncher>(command, agent, "ssh", "is openssh-client installed?", hint);
}

std::string this_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return {};
  return name;
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
