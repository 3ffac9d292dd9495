#!/usr/bin/env bash
# A dry run, without a GPU, of what a lent GPU machine runs (scripts/test.sh
# calls it where CUDA is installed): makes the bundle (scripts/gpu_bundle.sh),
# runs scripts/gpu_device.sh on it with GPU_TESTS_FORCE=1, and checks what
# must hold without a device: every program loads from the bundle, the Python
# module builds against its liberun and imports, the GPU unit tests pass
# (their device cases skip), and the results come back as the device tool
# returns them (summary.txt, machine.txt, logs.tar.gz). The steps that need a
# GPU (the CUDA example, the benchmarks) fail here, as expected. A second run
# with GPU_TESTS_ONLY must run only the steps it names.
#   scripts/check_gpu_bundle.sh [BUNDLE]     (default: build-gpu-bundle)
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-build-gpu-bundle}
# Its own build directory, without optimisation: the check is of what the
# scripts make and load, and a Release build of erun costs CI minutes. With
# ERUN_GPU_REUSE_BUILD=1 and ERUN_GPU_BUILD_DIR naming a build made already
# (scripts/test.sh: its own, with CUDA), that one, with no build of its own.
ERUN_GPU_BUILD_DIR=${ERUN_GPU_BUILD_DIR:-build-gpu-check} ERUN_GPU_BUILD_TYPE=${ERUN_GPU_BUILD_TYPE:-None} \
  bash scripts/gpu_bundle.sh "$bundle" >/dev/null
out=$(mktemp -d /tmp/erun-gpu-check-XXXXXX)
trap 'rm -rf "$out"' EXIT
GPU_TESTS_FORCE=1 GPU_TESTS_BUDGET=90 GPU_DEVICE_OUT="$out" GPU_TESTS_PYTHON=/usr/bin/python3 \
  bash scripts/gpu_device.sh "$bundle" >"$out/run.log" 2>&1 || true
# The second, shorter call that reruns chosen steps (GPU_TESTS_ONLY).
mkdir -p "$out/only"
GPU_TESTS_FORCE=1 GPU_TESTS_BUDGET=60 GPU_DEVICE_OUT="$out/only" GPU_TESTS_PYTHON=/usr/bin/python3 \
  GPU_TESTS_ONLY='worker_gpu_plan_test|example_world_of_one' bash scripts/gpu_device.sh "$bundle" >"$out/only/run.log" 2>&1 || true

fail=0
expect() {  # expect FILE PATTERN WHAT
  if ! grep -qE "$2" "$out/$1"; then
    echo "check_gpu_bundle: $3: no '$2' in $1"
    fail=1
  fi
}
for f in summary.txt machine.txt logs.tar.gz; do
  [ -s "$out/$f" ] || { echo "check_gpu_bundle: $f did not come back"; fail=1; }
done
expect machine.txt "^erun [0-9]" "erun does not run from the bundle"
expect summary.txt "^PASS  build " "the bundle is incomplete"
for t in collectives_nccl_test collectives_staged_test state_gpu_test worker_gpu_plan_test; do
  expect summary.txt "^PASS  $t " "$t failed without a device"
done
expect only/summary.txt "^PASS  worker_gpu_plan_test " "GPU_TESTS_ONLY did not run the step it names"
ran=$(sed -nE 's/^(PASS|FAIL)  ([a-z0-9_]+) .*/\2/p' "$out/only/summary.txt" | sort | xargs)
if [ "$ran" != "build example_world_of_one worker_gpu_plan_test" ]; then
  echo "check_gpu_bundle: with GPU_TESTS_ONLY the steps run were '$ran', not the build and the two it names"
  fail=1
fi
if grep -q "does not load\|building the Python module failed" "$out/machine.txt"; then
  grep "does not load\|building the Python module failed" "$out/machine.txt"
  fail=1
fi
ext=$(/usr/bin/python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
if [ -f "$bundle/python/erun/_erun$ext" ]; then
  LD_LIBRARY_PATH="$bundle/src/lib" PYTHONPATH="$bundle/python" /usr/bin/python3 -c \
    "import erun._erun as m; assert m.built_with_nccl()" || { echo "check_gpu_bundle: the module does not import"; fail=1; }
else
  echo "check_gpu_bundle: no Python module _erun$ext in $bundle/python/erun"
  fail=1
fi
if [ "$fail" -ne 0 ]; then
  echo "---- gpu_device.sh output"
  tail -n 60 "$out/run.log"
  exit 1
fi
echo "check_gpu_bundle: the bundle loads, builds its Python module and passes the GPU unit tests without a device ($(du -sh "$bundle" | cut -f1))"
