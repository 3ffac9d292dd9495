#!/usr/bin/env bash
# erun's GPU checks in one call, on a machine with an NVIDIA GPU:
#   1. build (or reuse an already configured build directory),
#   2. the GPU unit tests: NCCL in a world of one (and one GPU per rank with
#      2+ GPUs: ncclCommShrink, State::sync() of device buffers over NCCL),
#      the host-staged path with 2-4 ranks sharing the GPU, device state
#      (commit/restore/sync, async),
#   3. the CUDA example elastic under erun (a worker SIGKILLed, a host added;
#      every worker SIGKILLed at once) against an uninterrupted run and a
#      world of one: same checksum,
#   4. benchmarks: erun's GPU allreduce against raw NCCL (and torch.distributed
#      NCCL when torch is importable), device-state commit against cudaMemcpy,
#      in worker and in host memory, and (2+ GPUs) shrinking an NCCL communicator against a new init,
#   5. the Python package's tests on CUDA tensors (tests/python/test_gpu.py:
#      NCCL in a world of one, 2 and 4 ranks sharing the GPU through the staged
#      path; the exact model and DDP trained in place on CUDA across SIGKILLs
#      and a grow) when python3 (GPU_TESTS_PYTHON) has torch with CUDA and pytest,
# then prints a summary (also in OUT/summary.txt). Where no GPU is visible it
# prints "no GPU: skipped" and exits 0. Exits 1 when a step failed.
#   scripts/gpu_tests.sh [build-dir]     (default: build-gpu)
# build-dir may be a GPU bundle (scripts/gpu_bundle.sh): its programs are used
# as they are (scripts/gpu_device.sh sets the library path for them).
# Logs and results go to $GPU_TESTS_OUT (default: BUILD/gpu-results).
# GPU_TESTS_BUDGET=SECONDS: every step gets what is left of that time and a
# step that would start with under 20 s left is skipped ("out of time"), so
# the summary is written inside one bounded device command.
# GPU_TESTS_FORCE=1 runs the steps without a GPU (a dry run of this script:
# the device tests skip, the CUDA example fails).
# GPU_TESTS_ONLY=REGEX runs only the steps whose names match it (the build
# always), e.g. 'example_.*|python_gpu' for a second, shorter call that reruns
# what failed or was cut (example_same_checksum compares the logs of the other
# example_ steps: name them with it); GPU_TESTS_PYTEST_K=EXPR is pytest's -k
# for python_gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
# The checks read erun's and the workers' info lines ("restored commit N from host memory"):
# erun says warnings only by default.
export ERUN_LOG_LEVEL=info
root=$(pwd)
build=${1:-build-gpu}
case $build in /*) ;; *) build=$root/$build ;; esac
deadline=$((SECONDS + ${GPU_TESTS_BUDGET:-100000}))

if [ -z "${GPU_TESTS_FORCE:-}" ] && { ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; }; then
  echo "gpu_tests: no GPU: skipped (nvidia-smi sees no NVIDIA GPU; run this on a GPU machine)"
  exit 0
fi
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
out=${GPU_TESTS_OUT:-$build/gpu-results}
mkdir -p "$out"
rm -f "$out/unit_summary.txt" "$out/numbers.txt" "$out/summary.txt"
nvidia-smi -L 2>&1 | tee "$out/gpus.txt"

summary=()
failures=0
# left CAP: seconds left of GPU_TESTS_BUDGET, at most CAP (so that one hung step leaves time to the rest).
left() {
  local l=$((deadline - SECONDS))
  echo $((l < $1 ? (l < 1 ? 1 : l) : $1))
}
# Pids of the processes whose command line starts with $1 (from /proc: no procps needed).
pids_of() {
  local p cmd
  for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    [[ $cmd == "$1 "* || $cmd == "$1" ]] && echo "${p#/proc/}"
  done
}
# wanted NAME: whether GPU_TESTS_ONLY (if set) names step NAME; the build always is.
wanted() {
  [ -z "${GPU_TESTS_ONLY:-}" ] || [ "$1" = build ] || [[ $1 =~ ^(${GPU_TESTS_ONLY})$ ]]
}
# skip NAME WHY: records step NAME as skipped for WHY, or as left out by GPU_TESTS_ONLY.
skip() {
  if wanted "$1"; then summary+=("SKIP  $1 ($2)"); else summary+=("SKIP  $1 (not in GPU_TESTS_ONLY)"); fi
}
# step NAME CMD...: runs CMD with its output in $out/NAME.log; records PASS/FAIL,
# or SKIP when GPU_TESTS_ONLY leaves it out or under 20 s of the budget are left.
step() {
  local name=$1
  shift
  local t0=$SECONDS
  if ! wanted "$name" || [ $((deadline - SECONDS)) -lt 20 ]; then
    skip "$name" "out of time: GPU_TESTS_BUDGET"
    return
  fi
  if "$@" >"$out/$name.log" 2>&1; then
    summary+=("PASS  $name ($((SECONDS - t0)) s)")
  else
    summary+=("FAIL  $name ($((SECONDS - t0)) s, log: $out/$name.log)")
    failures=$((failures + 1))
    echo "--- $name failed; last lines:"
    tail -n 25 "$out/$name.log"
  fi
}
finish() {
  {
    echo
    echo "==== gpu_tests summary (${gpu_name:-no GPU}, erun $(git -C "$root" rev-parse --short HEAD 2>/dev/null)) ===="
    printf '%s\n' "${summary[@]}"
    [ -f "$out/numbers.txt" ] && cat "$out/numbers.txt"
    echo "logs: $out"
  } | tee "$out/summary.txt"
  [ "$failures" -eq 0 ] && exit 0 || exit 1
}

# ---- 1. build
. scripts/gpu_programs.sh
build_erun() {
  local home missing=0 f
  home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null)
  if [ -f "$build/BUNDLE" ] || { [ -n "$home" ] && [ "$home" != "$root" ]; }; then
    # A bundle, or a build carried from another machine: its programs as they are.
    if [ -f "$build/BUNDLE" ]; then cat "$build/BUNDLE"; else echo "gpu_tests: the build in $build was configured in $home"; fi
    for f in "${gpu_programs[@]}"; do
      [ -x "$build/$f" ] || { echo "gpu_tests: $build/$f is missing"; missing=1; }
    done
    "$build/src/runner/erun" --version || missing=1
    return "$missing"
  fi
  if [ ! -f "$build/CMakeCache.txt" ]; then
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
    cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DERUN_WITH_NCCL=ON -DERUN_BUILD_TESTS=ON || return 1
  fi
  local t=()
  for f in "${gpu_programs[@]}" "${gpu_programs_nccl[@]}"; do t+=("$(basename "$f")"); done
  # The Python package too when the build has it (pybind11 found at configure).
  cmake --build "$build" --target help 2>/dev/null | grep -qw erun_python && t+=(erun_python)
  cmake --build "$build" -j "$(nproc)" --target "${t[@]}"
}
step build build_erun
if [ "$failures" -ne 0 ]; then
  summary+=("      (a missing library? scripts/setup.sh lists erun's build dependencies)")
  finish
fi
erun="$build/src/runner/erun"
example="$build/examples/gpu/train_mlp_gpu"

# ---- 2. unit tests (the device tests skip only without a device)
for t in collectives_nccl_test collectives_staged_test state_gpu_test worker_gpu_plan_test; do
  step "$t" timeout -k 10 "$(left 150)" "$build/tests/$t" --gtest_color=no
  grep -E "^\[  (PASSED|SKIPPED|FAILED) +\] [0-9]+ tests?" "$out/$t.log" 2>/dev/null | sed "s/^/      $t: /" >>"$out/unit_summary.txt"
done
[ -f "$out/unit_summary.txt" ] && summary+=("$(cat "$out/unit_summary.txt")")

# ---- 3. the CUDA example: elastic run == uninterrupted run == world of one
args=(--epochs 8 --samples 8000 --batch 128 --commit-every 5)
checksum_of() { grep -o 'checksum=[0-9a-f]*' "$1" | tail -1; }
step example_world_of_one timeout -k 10 "$(left 120)" "$example" "${args[@]}"
step example_np2 timeout -k 10 "$(left 120)" "$erun" -np 2 --launcher local --collective-timeout 10 "$example" "${args[@]}"
# The CUDA example under erun, elastic, from 2 ranks on host node-a, in the
# background: sets $work (its hosts file is $ERUN_HOSTS_FILE) and $pid.
start_elastic() {
  work=$(mktemp -d /tmp/erun-gpu-XXXXXX)
  export ERUN_HOSTS_FILE="$work/hosts.txt"
  echo "node-a:2" >"$ERUN_HOSTS_FILE"
  timeout -k 10 "$(left 150)" "$erun" -np 2 --min-np 1 --max-np "$1" --launcher local --collective-timeout 10 --elastic-timeout 60 \
    --host-discovery-script "$root/scripts/discover_hosts.sh" --discovery-interval 0.5 \
    --event-log "$work/events.jsonl" "$example" "${args[@]}" --step-ms 40 --async-commit &
  pid=$!
}
elastic() {
  local work pid status=0 victim
  start_elastic 4
  sleep 5
  victim=$(pids_of "$example" | sort -n | tail -1)
  echo "gpu_tests: SIGKILL worker ${victim:-none}"
  [ -n "$victim" ] && kill -9 "$victim"
  sleep 5
  echo "gpu_tests: growing: node-b:2"
  echo "node-b:2" >>"$ERUN_HOSTS_FILE"
  wait "$pid" || status=$?
  grep -c generation_started "$work/events.jsonl" | sed 's/^/gpu_tests: generations: /'
  rm -rf "$work"
  return "$status"
}
step example_elastic elastic
# Every worker SIGKILLed at once: the next generation resumes at the last
# commit, which only the host-memory commit files (device copies landed
# there straight) still hold.
total_loss() {
  local work pid status=0
  start_elastic 2
  sleep 6
  local victims
  victims=$(pids_of "$example")
  echo "gpu_tests: SIGKILL every worker: $(echo $victims)"
  [ -n "$victims" ] && kill -9 $victims
  wait "$pid" || status=$?
  rm -rf "$work"
  return "$status"
}
step example_total_loss total_loss
restored_from_host_memory() {
  grep -h "restored commit [0-9]* from host memory" "$out/example_total_loss.log" | head -2
  grep -q "restored commit [1-9][0-9]* from host memory" "$out/example_total_loss.log"
}
step example_total_loss_resumed restored_from_host_memory
same_checksum() {
  local a b c d
  a=$(checksum_of "$out/example_world_of_one.log")
  b=$(checksum_of "$out/example_np2.log")
  c=$(checksum_of "$out/example_elastic.log")
  d=$(checksum_of "$out/example_total_loss.log")
  echo "world of one: $a; np 2: $b; elastic (SIGKILL + grow): $c; every worker SIGKILLed: $d"
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$b" = "$c" ] && [ "$c" = "$d" ]
}
step example_same_checksum same_checksum
[ -f "$out/example_same_checksum.log" ] && summary+=("      $(tail -1 "$out/example_same_checksum.log")")
grep -q "exactly-once=NO" "$out"/example_*.log && summary+=("FAIL  a sample was processed twice or never") &&
  failures=$((failures + 1))

# ---- 4. benchmarks
gpu_python=${GPU_TESTS_PYTHON:-python3}
torch_cuda=0  # importing torch takes seconds: asked once, and only for bench_torch or python_gpu
if wanted bench_torch || wanted python_gpu; then
  "$gpu_python" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null && torch_cuda=1
fi
sizes=(4096 65536 1048576 16777216 268435456 1073741824)  # 4 KiB to 1 GiB
step bench_erun_vs_nccl timeout -k 10 "$(left 120)" "$build/bench/gpu_allreduce_bench" --iters 50 "${sizes[@]}"
step bench_staged_np2 timeout -k 10 "$(left 120)" "$erun" -np 2 --launcher local "$build/bench/gpu_allreduce_bench" --iters 20 "${sizes[@]}"
step bench_commit timeout -k 10 "$(left 120)" "$build/bench/gpu_commit_bench" --reps 10 1073741824
# The same under erun: commits land in the host-memory commit file.
step bench_commit_host timeout -k 10 "$(left 120)" "$erun" -np 1 --launcher local "$build/bench/gpu_commit_bench" --reps 10 1073741824
if [ -x "$build/bench/nccl_shrink_bench" ]; then
  step bench_shrink timeout -k 10 "$(left 120)" "$build/bench/nccl_shrink_bench" --repeat 5
else
  skip bench_shrink "no nccl_shrink_bench in $build: built without NCCL?"
fi
if [ "$torch_cuda" = 1 ]; then
  step bench_torch timeout -k 10 "$(left 120)" "$gpu_python" bench/torch_gpu_allreduce.py --iters 50 "${sizes[@]}"
else
  skip bench_torch "no torch with CUDA in $gpu_python"
fi
# ---- 5. the Python package on CUDA tensors (last: the longest step)
if [ ! -d "$build/python/erun" ]; then
  skip python_gpu "the build has no Python package: pybind11 missing at configure"
elif [ "$torch_cuda" = 0 ] || ! "$gpu_python" -c "import pytest, numpy" 2>/dev/null; then
  skip python_gpu "$gpu_python has no torch with CUDA, or no pytest/numpy"
else
  # -v: each test's outcome is in the log as it ends, also when the budget cuts the step off.
  step python_gpu timeout -k 10 "$(left 1200)" env PYTHONPATH="$build/python" ERUN_BUILD_DIR="$build" \
    ERUN_TEST_PYTHON="$(command -v "$gpu_python")" "$gpu_python" -m pytest -v -p no:cacheprovider -rs --durations=0 \
    --basetemp "$out/pytest" ${GPU_TESTS_PYTEST_K:+-k "$GPU_TESTS_PYTEST_K"} tests/python/test_gpu.py
  # A step cut off by the budget leaves its jobs (own sessions) running.
  leftover=$(pids_of "$erun")
  [ -n "$leftover" ] && kill -9 $leftover 2>/dev/null
  if grep -qE "[0-9]+ (passed|failed)" "$out/python_gpu.log" 2>/dev/null; then
    summary+=("      python_gpu: $(grep -E "[0-9]+ (passed|failed)" "$out/python_gpu.log" | tail -1)")
  elif [ -f "$out/python_gpu.log" ]; then
    summary+=("      python_gpu: cut off: $(grep -c " PASSED" "$out/python_gpu.log") passed, $(grep -c " FAILED" "$out/python_gpu.log") failed before")
  fi
fi

# compare LOG A B: per size of LOG's GPUBENCH lines, A's time against B's.
compare() {
  awk -v a="$2" -v b="$3" '/^GPUBENCH/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); f[kv[1]] = kv[2] }
                                        t[f["impl"] "," f["bytes"]] = f["time_us"]; sz[f["bytes"]] = 1 }
       END { for (s in sz) if (t[a "," s] > 0 && t[b "," s] > 0)
               printf "%10d B: %s %8.1f us, %s %8.1f us: %.2fx (%+.1f%%)\n", s, a, t[a "," s], b, t[b "," s],
                      t[a "," s] / t[b "," s], 100 * (t[a "," s] / t[b "," s] - 1) }' "$1" 2>/dev/null | sort -n
}
{
  echo "---- numbers"
  # erun (NCCL backend) against raw NCCL waiting for each call; the staged
  # path (2 ranks sharing the GPU) against its floor, a copy down and up.
  compare "$out/bench_erun_vs_nccl.log" erun-nccl nccl
  compare "$out/bench_staged_np2.log" erun-staged copy-d2h2d
  grep -h "^GPUBENCH" "$out"/bench_erun_vs_nccl.log "$out"/bench_staged_np2.log "$out"/bench_torch.log 2>/dev/null
  grep -h "^GPUCOMMIT" "$out/bench_commit.log" "$out/bench_commit_host.log" 2>/dev/null
  grep -q "host-memory commit [0-9]* was not written" "$out/bench_commit_host.log" 2>/dev/null &&
    echo "bench_commit_host: /dev/shm could not hold 2 GiB of commit files: its where=host-memory lines are worker memory"
  grep -q "cannot register a host-memory commit file" "$out/bench_commit_host.log" 2>/dev/null &&
    echo "bench_commit_host: the commit files could not be registered with CUDA (staged copies)"
  grep -h "^SHRINKBENCH \(median\|skipped\)" "$out/bench_shrink.log" 2>/dev/null
} >"$out/numbers.txt"
finish
