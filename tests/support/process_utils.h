// Process checks for tests that must prove no worker outlived its launcher:
// scans /proc (Linux only). Safe from any thread; every wait is bounded.
#pragma once

#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

#include "common/clock.h"

namespace erun::testing {

// pids (other than this process) whose /proc/PID/cmdline, with NULs read as
// spaces, contains `marker`. Zombies are left out: they are dead.
std::vector<pid_t> pids_with_cmdline(const std::string& marker);
// Waits until no such process remains; false (and the survivors in *left) on timeout.
bool wait_no_process(const std::string& marker, Duration timeout, std::vector<pid_t>* left = nullptr);
// True when pid exists and is not a zombie.
bool pid_alive(pid_t pid);
// Waits until pid is gone or a zombie; false on timeout.
bool wait_pid_gone(pid_t pid, Duration timeout);
// The process running `program` itself (argv[0] exactly) for `host` (its
// ERUN_HOSTNAME, as erun gives every worker), or 0.
pid_t worker_on_host(const std::string& program, const std::string& host);
// The parent pid of a live process, or 0.
pid_t parent_of(pid_t pid);
// The live children of `parent` (zombies left out).
std::vector<pid_t> children_of(pid_t parent);
// The socket inodes the given processes hold (from /proc/PID/fd).
std::set<std::string> socket_inodes(const std::vector<pid_t>& pids);
// "addr:port" (as /proc/net/tcp{,6} write them) of the listening TCP sockets,
// IPv4 and IPv6, whose inode is in `inodes`.
std::vector<std::string> listening(const std::set<std::string>& inodes);
// "PID: cmdline" of each pid, for failure messages.
std::string describe_pids(const std::vector<pid_t>& pids);
// The command line of a live process with NULs read as spaces (so it ends
// with one); empty when gone.
std::string cmdline_of(pid_t pid);
// The environment of a live process, one NAME=VALUE a line, with a newline
// before the first and after the last, so that "\nNAME=" finds a whole name;
// "\n" when unreadable or gone.
std::string environ_of(pid_t pid);
// pids (other than this process, zombies left out) whose environ_of() contains `text`.
std::vector<pid_t> pids_with_environ(const std::string& text);
// Reads a file whole; empty when missing.
std::string read_file(const std::string& path);
// Waits until `path` exists and holds at least `lines` newline-terminated lines.
bool wait_file_lines(const std::string& path, size_t lines, Duration timeout);

}  // namespace erun::testing
