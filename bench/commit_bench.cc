// erun::State cost against memcpy.
//   commit_bench [--reps R=5] [--durable DIR] [--no-local] [--host-memory] [--pause-ms MS] BYTES...
// For each size, one raw buffer is registered in a fresh State and timed:
// commit (deep copy into the snapshot), restore (copy back), a plain memcpy of
// the same bytes, and sync (under erun with 2+ ranks: the root broadcasts its
// snapshot; alone it is a world of one). With --durable DIR, a State with a
// checkpoint dir is committed too (temp file, fsync, rename). With
// --host-memory (under erun, which names the job's host-memory directory), a
// State that synced first commits into worker memory and host memory
// (commit-host), beside the plain commit and memcpy of the same run; under
// erun --checkpoint-dir that State also hands its commits to the host side's
// background persistence (the stall is what commit-host measures). With
// --pause-ms, each timed commit-host follows MS of idle time (a training
// step, in which the host side writes the last commit). Two untimed commits
// come first: each maps and reserves one of the worker's two files. One line per
// measurement from rank 0:
//   COMMIT op=OP bytes=B reps=R median=S min=S max=S bw=GB/s
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "erun/erun.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  double median, min, max;
};

Stats time_it(int reps, const std::function<void()>& fn, int pause_ms = 0, int warm = 1) {
  for (int i = 0; i < warm; ++i) fn();  // warm-up: first-touch page faults are not what we measure
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), t.back()};
}

void report(const erun::Context& ctx, const char* op, size_t bytes, int reps, Stats s) {
  if (ctx.rank() != 0) return;
  std::printf("COMMIT op=%s bytes=%zu reps=%d median=%.6f min=%.6f max=%.6f bw=%.3f GB/s world=%d\n", op, bytes, reps,
              s.median, s.min, s.max, bytes / s.median / 1e9, ctx.size());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  bool local = true;
  bool host_memory = false;
  int pause_ms = 0;
  std::string durable;
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--durable" && i + 1 < argc) durable = argv[++i];
    else if (a == "--no-local") local = false;
    else if (a == "--host-memory") host_memory = true;
    else if (a == "--pause-ms" && i + 1 < argc) pause_ms = std::max(0, std::atoi(argv[++i]));
    else sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  }
  if (sizes.empty()) sizes = {size_t{16} << 20};
  try {
    erun::Context& ctx = erun::init();
    for (size_t bytes : sizes) {
      std::vector<char> data(bytes, 1), other(bytes, 2);
      {
        erun::State state(ctx);
        state.register_buffer("data", data.data(), bytes);
        if (local) {
          report(ctx, "commit", bytes, reps, time_it(reps, [&] { state.commit(); }));
          report(ctx, "restore", bytes, reps, time_it(reps, [&] { state.restore(); }));
          report(ctx, "memcpy", bytes, reps, time_it(reps, [&] { std::memcpy(other.data(), data.data(), bytes); }));
        }
        if (ctx.size() > 1 || local) report(ctx, "sync", bytes, reps, time_it(reps, [&] { state.sync(); }));
      }
      if (host_memory) {
        erun::State state(ctx);
        state.register_buffer("data", data.data(), bytes);
        state.sync();  // the first sync opens this worker's host-memory files
        report(ctx, "commit-host", bytes, reps, time_it(reps, [&] { state.commit(); }, pause_ms, 2));
      }
      if (!durable.empty()) {
        std::string dir = durable + "/size-" + std::to_string(bytes);
        std::filesystem::remove_all(dir);
        std::filesystem::create_directories(dir);
        erun::State state(ctx);
        state.register_buffer("data", data.data(), bytes);
        state.set_checkpoint_dir(dir);
        report(ctx, "durable", bytes, reps, time_it(reps, [&] { state.commit(); }));
        std::filesystem::remove_all(dir);
      }
    }
    erun::shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "commit_bench: %s\n", e.what());
    return 1;
  }
}
