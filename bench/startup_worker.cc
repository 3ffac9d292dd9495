// Start-up benchmark worker: erun::init() and one barrier, then exit.
// Under erun this is a full rendezvous plus a Gloo mesh; alone, a world of one.
#include <cstdio>
#include <exception>

#include "erun/erun.hpp"

int main() {
  try {
    erun::Context& ctx = erun::init();
    ctx.comm().barrier();
    if (ctx.rank() == 0) std::printf("startup_worker: world=%d barrier done\n", ctx.size());
    erun::shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "startup_worker: %s\n", e.what());
    return 1;
  }
}
