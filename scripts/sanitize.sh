#!/usr/bin/env bash
# The unit suites under AddressSanitizer + UndefinedBehaviorSanitizer (leaks
# included): a separate Debug build in build-asan (or $ERUN_ASAN_DIR). Any
# report fails the run. Run after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${ERUN_ASAN_DIR:-build-asan}
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DERUN_SANITIZE=address,undefined >/dev/null
ninja -C "$dir" -j"$(nproc)" erun_unit_tests
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
ctest --test-dir "$dir" -L unit --output-on-failure --timeout 300 -j2 "$@"
