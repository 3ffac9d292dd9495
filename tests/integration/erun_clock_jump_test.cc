// The system clock steps while a job runs, as NTP steps it on real clusters:
// an hour forward, then two hours back (an hour behind). erun, its agents and
// its workers run under libfaketime (LD_PRELOAD, the offset re-read from a
// file at every call, CLOCK_MONOTONIC left alone), so only their wall clock
// jumps, not the machine's. No deadline may use the wall clock: no agent is
// taken for silent when the clock jumps forward (a heartbeat timeout that
// fired early), a worker SIGKILLed after each step is recovered in place
// within seconds (no timeout that fires an hour late), and the job ends at
// exactly the uninterrupted model. The job's account (its summary) is
// computed from erun's own stamps, so its wall time and goodput are real
// ones, not an hour off or zero. Skips without libfaketime (Debian's
// faketime package).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <thread>

#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

const char* const kFaketimeLibs[] = {"/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
                                     "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
                                     "/usr/lib/faketime/libfaketimeMT.so.1"};

std::string faketime_lib() {
  for (const char* p : kFaketimeLibs) {
    if (::access(p, R_OK) == 0) return p;
  }
  return "";
}

// The worker running `program` on slot `index` of this machine, or 0.
pid_t worker_on_slot(const std::string& program, int index) {
  for (pid_t pid : pids_with_cmdline(program)) {
    if (cmdline_of(pid).rfind(program + " ", 0) != 0) continue;
    if (environ_of(pid).find("\nERUN_LOCAL_INDEX=" + std::to_string(index) + "\n") != std::string::npos) return pid;
  }
  return 0;
}

// The world size the last reset in `out` reported, or 0 before any.
int last_world_size(const std::string& out) {
  static const std::regex reset(R"(reset: world size [0-9]+ -> ([0-9]+))");
  int last = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), reset); it != std::sregex_iterator(); ++it) {
    last = std::stoi((*it)[1].str());
  }
  return last;
}

// Polls `done` every 50 ms until it holds or `timeout` passes.
template <typename F>
bool wait_for(F done, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

TEST(ErunClockJump, AWallClockSteppedBothWaysFiresNoTimeoutAndKeepsTheAccountTrue) {
  const std::string lib = faketime_lib();
  if (lib.empty()) GTEST_SKIP() << "no libfaketime (apt-get install faketime)";
  const std::string& reference = uninterrupted_checksum();
  ASSERT_FALSE(reference.empty());
  TempDir dir;
  dir.write("offset", "+0\n");
  const std::string program = build_path("examples/train_mlp");
  std::vector<std::string> args = {"-H", "localhost:3", "-np", "3", "--min-np", "2", "--term-grace", "2", "--event-log",
                                   dir.file("events.jsonl"), program};
  args.insert(args.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
  args.insert(args.end(), {"--step-ms", "80"});  // a longer run; the model does not depend on it
  const auto started = std::chrono::steady_clock::now();
  ErunProcess p(args, {"LD_PRELOAD=" + lib, "FAKETIME_TIMESTAMP_FILE=" + dir.file("offset"), "FAKETIME_NO_CACHE=1",
                       "DONT_FAKE_MONOTONIC=1"});
  ASSERT_TRUE(p.wait_output("epoch 1 ", 120s)) << p.out() << p.err();

  // An hour forward: a deadline on the wall clock would be an hour overdue.
  dir.write("offset", "+1h\n");
  std::this_thread::sleep_for(3s);
  EXPECT_EQ(p.err().find(" lost: "), std::string::npos) << "a timeout fired early\n" << p.err();
  // A kill is recovered once the survivors report a reset: either to 2 (they
  // went on alone) or straight to 3 (the replacement was in the rendezvous
  // before the smaller generation formed).
  const size_t before_first = p.count("reset: world size");
  pid_t one = worker_on_slot(program, 1);
  ASSERT_GT(one, 0);
  ::kill(one, SIGKILL);
  ASSERT_TRUE(wait_for([&] { return p.count("reset: world size") > before_first; }, 15s))
      << "no recovery after the forward step\n" << p.out() << p.err();

  // Two hours back: a deadline on the wall clock would fire an hour late.
  dir.write("offset", "-1h\n");
  std::this_thread::sleep_for(2s);
  ASSERT_TRUE(wait_for([&] { return last_world_size(p.out()) == 3; }, 30s)) << p.out() << p.err();  // replaced
  pid_t two = worker_on_slot(program, 2);
  ASSERT_GT(two, 0);
  const size_t before_second = p.count("reset: world size");
  ::kill(two, SIGKILL);
  EXPECT_TRUE(wait_for([&] { return p.count("reset: world size") > before_second; }, 15s))
      << "no recovery after the backward step\n" << p.out() << p.err();

  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, reference));
  const double real_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(p.count("epoch 0 "), 1u) << p.out();
  EXPECT_EQ(p.err().find(" lost: "), std::string::npos) << p.err();
  // The summary: its wall time within the real run's, and most of it training.
  std::smatch m;
  const std::string err = p.err();
  ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(finished with exit code 0 in ([0-9.]+) s: goodput ([0-9.]+) %)")))
      << err;
  const double wall_s = std::stod(m[1].str()), goodput = std::stod(m[2].str());
  EXPECT_GT(wall_s, real_s - 15) << err;
  EXPECT_LE(wall_s, real_s + 1) << err;
  EXPECT_GT(goodput, 50.0) << err;
}

}  // namespace
}  // namespace erun::testing
