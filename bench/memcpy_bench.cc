// The ceiling for allreduce and commit: memcpy bandwidth of this machine.
//   memcpy_bench [--threads T] BYTES...
// Each size: T threads each copy BYTES/T between two pre-faulted buffers;
// prints the median of 7 timed repetitions after 2 warm-ups, as bytes copied
// per second (one read + one write of BYTES).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  int threads = 1;
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  }
  if (sizes.empty()) sizes = {size_t{1} << 20, size_t{64} << 20};
  for (size_t bytes : sizes) {
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    const size_t chunk = (bytes + threads - 1) / threads;
    auto copy_once = [&] {
      std::vector<std::thread> ts;
      for (int t = 1; t < threads; ++t) {
        size_t off = std::min(bytes, chunk * t), n = std::min(chunk, bytes - off);
        ts.emplace_back([&, off, n] { std::memcpy(dst.data() + off, src.data() + off, n); });
      }
      std::memcpy(dst.data(), src.data(), std::min(chunk, bytes));
      for (auto& t : ts) t.join();
    };
    const int inner = static_cast<int>(std::clamp<size_t>((size_t{64} << 20) / bytes, 1, 10000));
    for (int w = 0; w < 2; ++w) copy_once();
    std::vector<double> times;
    for (int r = 0; r < 7; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < inner; ++k) copy_once();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / inner);
    }
    std::sort(times.begin(), times.end());
    double t = times[times.size() / 2];
    std::printf("memcpy threads=%d bytes=%zu time=%.1f us bw=%.3f GB/s\n", threads, bytes, t * 1e6, bytes / t / 1e9);
    std::fflush(stdout);
  }
  return 0;
}
