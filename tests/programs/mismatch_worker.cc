// A small erun worker with a deliberate bug, for the tests of erun's guards
// against silent mistakes:
//   mismatch_worker rank0-commit   State::commit() on rank 0 only (its
//                                  collective meets the others' gradient allreduce)
//   mismatch_worker correct        the same loop without the bug
// Every rank fits w to a target by gradient descent on an averaged gradient
// for 40 steps; each rank prints "rank R final w[0]=<value> finite=<yes|no>". Without
// erun's check the bug trains to inf and the job ends with exit code 0.
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "erun/erun.hpp"

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "rank0-commit" && mode != "correct") {
    std::fprintf(stderr, "usage: mismatch_worker rank0-commit|correct\n");
    return 2;
  }
  try {
    erun::Context& ctx = erun::init();
    std::vector<float> w(1000, 0.0f);
    int64_t step = 0;
    erun::State state(ctx);
    state.register_vector("w", &w);
    state.register_value("step", &step);
    erun::run(state, [&](erun::State& s) {
      erun::Communicator& comm = s.context().comm();
      for (; step < 40; ++step) {
        std::vector<float> grad(w.size());
        for (size_t i = 0; i < w.size(); ++i) grad[i] = w[i] - static_cast<float>(s.context().rank() + 1);
        comm.allreduce(grad, erun::ReduceOp::kAverage);
        for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5f * grad[i];
        const bool commit = mode == "correct" || s.context().rank() == 0;
        if (step % 5 == 4 && commit) s.commit();
      }
    });
    std::printf("rank %d final w[0]=%g finite=%s\n", ctx.rank(), w[0], std::isfinite(w[0]) ? "yes" : "no");
    erun::shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mismatch_worker: %s\n", e.what());
    return 1;
  }
  return 0;
}
