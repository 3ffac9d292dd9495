#!/usr/bin/env bash
# The unit suites under AddressSanitizer + UndefinedBehaviorSanitizer (leaks
# included): a separate Debug build in build-asan (or $ERUN_ASAN_DIR). Any
# report fails the run. Run after scripts/setup.sh.
# It is also the build without CUDA (ERUN_WITH_NCCL=OFF; scripts/test.sh
# builds with CUDA where it is found): erun, the example and every unit test
# must build without it, and state_gpu_test checks that the GPU API then
# fails with a clear error. -g1: line numbers in the reports, less to compile.
# --build-only: build, run nothing (scripts/test.sh starts that beside ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [ "${1:-}" = "--build-only" ]; then
  build_only=1
  shift
fi
dir=${ERUN_ASAN_DIR:-build-asan}
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DERUN_SANITIZE=address,undefined \
  -DERUN_WITH_NCCL=OFF >/dev/null
ninja -C "$dir" -j"$(nproc)" erun_unit_tests erun train_mlp
[ "$build_only" = 1 ] && exit 0
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
ctest --test-dir "$dir" -L unit --output-on-failure --timeout 300 -j2 "$@"
