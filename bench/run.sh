#!/usr/bin/env bash
# erun's benchmarks against Open MPI and torchrun (issue 5); see docs/performance.md.
#
#   bash bench/run.sh [--smoke] [--no-install] [--no-doc] [--no-torch] [--build-dir DIR]
#                     [--only startup,recovery,frozen,scaleup,allreduce,control,commit] [--reps N]
#                     [--allreduce-reps N]
#
# 1. installs the peers from Debian when missing (openmpi-bin libopenmpi-dev, python3-torch,
#    python3-matplotlib for the plots); a failed install skips that peer, it does not stop the run;
# 2. builds erun and the benchmark programs (Release, in DIR, default build-bench);
# 3. runs bench/bench.py, which writes docs/performance.md and docs/img/perf-*.png.
# --smoke: each benchmark once at a tiny size, no torch, under a minute; uses DIR as it is
# configured (CI passes its own build dir) and, with --no-doc, writes nothing under docs/.
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=0 install=1 build_dir=${ERUN_BUILD_DIR:-build-bench}
pass=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --smoke) smoke=1; pass+=("$1") ;;
    --no-install) install=0 ;;
    --no-doc|--no-torch) pass+=("$1") ;;
    --build-dir) build_dir=$2; shift ;;
    --only|--reps|--allreduce-reps) pass+=("$1" "$2"); shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "bench/run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { echo "[bench] $*" >&2; }

if [[ $install == 1 ]]; then
  want=()
  command -v mpirun >/dev/null || want+=(openmpi-bin)
  [[ -e /usr/include/x86_64-linux-gnu/openmpi/include/mpi.h || -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ]] \
    || want+=(libopenmpi-dev)
  if [[ $smoke == 0 ]]; then
    /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null || want+=(python3-torch)
    /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || want+=(python3-matplotlib)
  fi
  if [[ ${#want[@]} -gt 0 ]]; then
    say "installing ${want[*]}"
    if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
      say "not root or no apt-get: install ${want[*]} yourself; the missing peers are skipped"
    else
      for p in "${want[@]}"; do
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$p" >/dev/null \
          || say "could not install $p; the benchmarks that need it are skipped"
      done
    fi
  fi
fi

targets=(erun restart_worker allreduce_bench startup_worker step_worker commit_bench rdzv_scale_bench memcpy_bench)
if [[ $smoke == 0 || ! -f "$build_dir/build.ninja" ]]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
known=$(ninja -C "$build_dir" -t targets all 2>/dev/null | cut -d: -f1)
for t in mpi_startup shm_allreduce_bench ompi_allreduce_bench; do
  grep -qx "bench/$t\|$t" <<<"$known" && targets+=("$t")
done
say "building ${targets[*]} in $build_dir"
ninja -C "$build_dir" -j"$(nproc)" "${targets[@]}" >/dev/null

py=/usr/bin/python3
[[ -x $py ]] || py=python3
exec "$py" bench/bench.py --build-dir "$build_dir" "${pass[@]}"
