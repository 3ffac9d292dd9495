#!/usr/bin/env bash
# Configures and builds erun into ./build (or $ERUN_BUILD_DIR). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${ERUN_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DERUN_BUILD_TESTS=ON "$@" >/dev/null
ninja -C "$build" -j"$(nproc)"
