#!/usr/bin/env bash
# Builds erun with NCCL and runs the GPU collective tests, in one call, on a
# machine with at least one NVIDIA GPU. Exits non-zero when the build or a
# test fails, or when no GPU is visible (the tests would only skip).
#   scripts/gpu_tests.sh [build-dir]     (default: build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}

if [[ -x scripts/setup.sh ]]; then
  scripts/setup.sh
fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L; then
  echo "gpu_tests: no NVIDIA GPU visible (nvidia-smi failed); run this on a GPU machine" >&2
  exit 2
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DERUN_WITH_NCCL=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" --target collectives_nccl_test -j "$(nproc)"
"$build"/tests/collectives_nccl_test --gtest_color=no
