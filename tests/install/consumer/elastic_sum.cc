// An out-of-tree erun program, built by tests/install/install_test.sh against an
// installed erun (find_package(erun) and pkg-config). Every step allreduces one
// int64 per rank whose sum is 6 for any world size (rank 0 gives 6 - (size - 1),
// the others 1) into `total`, kept in an erun::State and committed each step, so
// a run of N steps ends at total = 6 * N whatever failures and resizes happened,
// as long as recovery rolls back to the last commit. Prints one line per rank:
//
//   elastic_sum rank=0 size=2 total=120 liberun=/prefix/lib/liberun.so.0.1.0
//
// liberun= is the liberun this process mapped (from /proc/self/maps), so the test
// can tell an installed library from one in the build tree.
//
// Usage: elastic_sum [STEPS] [KILL_MARKER]: with KILL_MARKER, the rank 1 that
// first creates that file SIGKILLs itself halfway through.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <erun/erun.hpp>

namespace {

std::string mapped_liberun() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash != std::string::npos && line.find("liberun.so", slash) != std::string::npos) {
      return line.substr(slash);
    }
  }
  return "none";
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 20;
  const std::string kill_marker = argc > 2 ? argv[2] : "";
  try {
    erun::Context& ctx = erun::init();
    erun::State state(ctx);
    int64_t step = 0;
    int64_t total = 0;
    state.register_value("step", &step);
    state.register_value("total", &total);
    erun::run(state, [&](erun::State& s) {
      while (step < steps) {
        if (!kill_marker.empty() && ctx.rank() == 1 && step == steps / 2) {
          int fd = ::open(kill_marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
          if (fd >= 0) {
            ::close(fd);
            ::raise(SIGKILL);
          }
        }
        int64_t mine = ctx.rank() == 0 ? 6 - (ctx.size() - 1) : 1;
        total += ctx.comm().allreduce_value(mine, erun::ReduceOp::kSum);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ++step;  // before commit(): the commit must hold the step it completes
        s.commit();
      }
    });
    std::printf("elastic_sum rank=%d size=%d total=%lld liberun=%s\n", ctx.rank(), ctx.size(),
                static_cast<long long>(total), mapped_liberun().c_str());
    return total == 6 * steps ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic_sum: %s\n", e.what());
    return 1;
  }
}
