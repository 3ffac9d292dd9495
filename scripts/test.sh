#!/usr/bin/env bash
# The test command: installs what is missing, builds, installs erun into
# /usr/local (scripts/install.sh), and runs every test suite (unit, integration
# with real processes and a private sshd, fault injection, the installed package).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
bash scripts/install.sh   # erun, liberun, headers, examples into /usr/local
build=${ERUN_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure --timeout 300 -j2 "$@"
# Where CUDA is found the build above uses it; check that erun also builds
# without it and that the GPU API then fails with a clear error.
if [ -z "${ERUN_SKIP_NOCUDA:-}" ] && { [ -d /usr/local/cuda ] || [ -n "${CUDA_HOME:-}" ]; }; then
  cmake -S . -B "$build-nocuda" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DERUN_WITH_NCCL=OFF >/dev/null
  ninja -C "$build-nocuda" -j"$(nproc)" state_gpu_test train_mlp
  "$build-nocuda/tests/state_gpu_test" --gtest_color=no
fi
# The GPU machines lent to this project have no erun build dependencies: a
# bundle built here goes there (scripts/gpu_bundle.sh, docs/gpu.md). Check,
# without a GPU, that it loads, builds its Python module and passes the GPU
# unit tests.
if [ -z "${ERUN_SKIP_GPU_BUNDLE:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  bash scripts/check_gpu_bundle.sh
fi
