#!/usr/bin/env bash
# Configures and builds erun into ./build (or $ERUN_BUILD_DIR). Extra arguments go to cmake.
# Release, the build type of `pip install .` (pyproject.toml), through ccache
# where it is installed: the venv's erun (scripts/venv.sh) then compiles
# nothing that this build compiled already. The test programs compile at -Og
# -g1 (tests/CMakeLists.txt), so a failing test still has line numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${ERUN_BUILD_DIR:-build}
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# The compilers by the same names as in scripts/venv.sh: ccache keys on them.
CC=${CC:-cc} CXX=${CXX:-c++} cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DERUN_BUILD_TESTS=ON \
  "${launcher[@]}" "$@" >/dev/null
ninja -C "$build" -j"$(nproc)"
