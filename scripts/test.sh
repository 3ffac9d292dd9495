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
# What runs in the background (below) goes when this script ends early.
asan_pid= asan_log=
cleanup() {
  [ -n "$asan_pid" ] && kill -- "-$asan_pid" 2>/dev/null
  rm -f "$asan_log"
  true
}
trap cleanup EXIT
bash scripts/setup.sh --debian-only
took setup
# The venv after the build, not beside it: unpacking its wheels takes the
# CPUs too (beside the build: 139 s instead of 69 s, and the build 87 s
# longer).
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
# ERUN_ASAN_BESIDE_CTEST=1 (.ci/run): the sanitizer build (scripts/sanitize.sh
# --build-only) compiles beside ctest at the idle scheduling class, so it
# takes only the CPU time the tests leave (most of them wait on timeouts,
# and the last minutes run one or two at a time) and ends before ctest does
# (docs/performance.md §14b: ctest 1,346 s with it, all passed). Its log is shown
# once ctest is done; .ci/run then runs the sanitized tests.
if [ -n "${ERUN_ASAN_BESIDE_CTEST:-}" ]; then
  asan_log=$(mktemp)
  idle=()
  command -v chrt >/dev/null && idle=(chrt --idle 0)
  # A process group of its own (setsid): a failed run stops the whole build.
  setsid "${idle[@]}" nice -n 19 bash scripts/sanitize.sh --build-only >"$asan_log" 2>&1 &
  asan_pid=$!
fi
# The order the tests start in (scripts/ctest_schedule.py): ctest's cost data,
# which a fresh clone lacks; the lanes below then end together.
mkdir -p "$build/Testing/Temporary"
cp tests/ctest_schedule.txt "$build/Testing/Temporary/CTestCostData.txt"
# Three at a time on two cores: most of the tests that start real processes
# wait on timeouts, not the CPU. They hold RESOURCE_LOCKs (tests/CMakeLists.txt):
# one C++ test of real processes (they find workers by the program's path),
# one multi-process test of each Python pass, and unit tests share the slots.
ctest_rc=0
ctest --test-dir "$build" --output-on-failure --timeout 300 -j3 "$@" || ctest_rc=$?
if [ "$ctest_rc" != 0 ]; then
  # The failures' first lines last, where the tail of a CI log shows them.
  echo "test.sh: ctest failed; where:"
  awk -f scripts/ctest_failures.awk "$build/Testing/Temporary/LastTest.log" || true
  exit "$ctest_rc"
fi
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
if [ -n "$asan_pid" ]; then
  asan_rc=0
  wait "$asan_pid" || asan_rc=$?
  asan_pid=
  tail -n 3 "$asan_log"
  rm -f "$asan_log"
  [ "$asan_rc" = 0 ] || { echo "test.sh: the sanitizer build beside ctest failed (above)" >&2; exit "$asan_rc"; }
  took "the sanitizer build (beside ctest)"
fi
