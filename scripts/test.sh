#!/usr/bin/env bash
# The test command: installs what is missing, builds, installs erun into
# /usr/local (scripts/install.sh), and runs every test suite (unit, integration
# with real processes and a private sshd, fault injection, the installed package).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
took() {  # took WHAT: when WHAT ended, from the start (where the time of a CI run went)
  local now
  now=$(date +%s)
  echo "test.sh: $1 done at +$(( now - start )) s"
}
bash scripts/setup.sh --debian-only
took setup
bash scripts/build.sh
took build
# After the build: the venv's `pip install .` then takes its objects from
# ccache (scripts/venv.sh). Configuring again registers the latest-torch pass,
# which needs the venv (tests/CMakeLists.txt); it builds nothing new.
bash scripts/venv.sh
bash scripts/build.sh
took "the venv"
bash scripts/install.sh   # erun, liberun, headers, examples into /usr/local
build=${ERUN_BUILD_DIR:-build}
# Three at a time on two cores: most of the tests that start real processes
# wait on timeouts, not the CPU. They hold RESOURCE_LOCKs (tests/CMakeLists.txt):
# one C++ test of real processes (they find workers by the program's path),
# one multi-process test of each Python pass, and unit tests share the slots.
ctest --test-dir "$build" --output-on-failure --timeout 300 -j3 "$@"
took ctest
# Where CUDA is found the build above uses it; check that erun also builds
# without it and that the GPU API then fails with a clear error.
if [ -z "${ERUN_SKIP_NOCUDA:-}" ] && { [ -d /usr/local/cuda ] || [ -n "${CUDA_HOME:-}" ]; }; then
  cmake -S . -B "$build-nocuda" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DERUN_WITH_NCCL=OFF >/dev/null
  ninja -C "$build-nocuda" -j"$(nproc)" state_gpu_test train_mlp
  "$build-nocuda/tests/state_gpu_test" --gtest_color=no
  took "the build without CUDA"
fi
# The GPU machines lent to this project have no erun build dependencies: a
# bundle built here goes there (scripts/gpu_bundle.sh, docs/gpu.md). Check,
# without a GPU, that it loads, builds its Python module and passes the GPU
# unit tests.
if [ -z "${ERUN_SKIP_GPU_BUNDLE:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  # From the build above (made with CUDA here): no third build of erun.
  ERUN_GPU_BUILD_DIR=$build ERUN_GPU_REUSE_BUILD=1 bash scripts/check_gpu_bundle.sh
  took "the GPU bundle check"
fi
