#include <unistd.h>

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "common/strings.h"
#include "runner/launcher.h"
#include "runner/worker_wrapper.h"

namespace erun {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

class SshLauncher final : public Launcher {
 public:
  explicit SshLauncher(SshOptions options) : options_(std::move(options)) {}

  Result<std::unique_ptr<WorkerHandle>> launch(const WorkerSpec& spec) override {
    using R = Result<std::unique_ptr<WorkerHandle>>;
    if (Status s = validate_worker_spec(spec); !s) return R(s);
    if (spec.host.empty() || spec.host[0] == '-') {
      return R::error(fmt::format("rank {}: '{}' is not a host name ssh can reach", spec.rank, spec.host));
    }
    return launch_through(spec, command_line(spec), "ssh", "is openssh-client installed?");
  }

  std::vector<std::string> command_line(const WorkerSpec& spec) const override {
    auto secs = std::chrono::duration_cast<std::chrono::milliseconds>(options_.connect_timeout).count();
    long timeout = std::max<long>(1, (secs + 999) / 1000);
    std::vector<std::string> argv = {"ssh", "-T",
                                     "-o", "BatchMode=yes",
                                     "-o", fmt::format("ConnectTimeout={}", timeout),
                                     "-o", "StrictHostKeyChecking=no",
                                     "-o", "UserKnownHostsFile=/dev/null",
                                     "-o", "LogLevel=ERROR",
                                     // A host that vanishes without closing the
                                     // connection ends ssh (255) within ~15 s.
                                     "-o", "ServerAliveInterval=5",
                                     "-o", "ServerAliveCountMax=3"};
    if (options_.port > 0) {
      argv.push_back("-p");
      argv.push_back(std::to_string(options_.port));
    }
    if (!options_.identity_file.empty()) {
      argv.push_back("-i");
      argv.push_back(options_.identity_file);
    }
    if (!options_.user.empty()) {
      argv.push_back("-l");
      argv.push_back(options_.user);
    }
    // "Key=Value" words get their -o; raw flags ("-oKey=Value", "-F FILE") pass as given.
    bool flag_argument = false;
    for (const auto& o : options_.extra_options) {
      if (flag_argument || starts_with(o, "-")) {
        argv.push_back(o);
        flag_argument = !flag_argument && o.size() == 2;
      } else {
        argv.push_back("-o");
        argv.push_back(o);
      }
    }
    argv.push_back(spec.host);
    // One word for the remote login shell; `exec` makes the supervisor the
    // session leader sshd created, with nothing between them.
    argv.push_back("exec /bin/sh -c " + shell_quote(worker_script(spec)));
    return argv;
  }

 private:
  SshOptions options_;
};

}  // namespace

std::unique_ptr<Launcher> make_ssh_launcher(SshOptions options) {
  return std::make_unique<SshLauncher>(std::move(options));
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
