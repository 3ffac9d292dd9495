#!/usr/bin/env bash
# The whole GPU check in one call on a lent GPU machine, with the bundle that
# scripts/gpu_bundle.sh made here carried along (the machine has no registry
# and none of erun's build dependencies):
#   1. records the machine (GPU, driver, CUDA, python3's torch, C library),
#   2. puts the bundle's libraries that the machine lacks, then the machine's
#      own NCCL (PyTorch's), on the library path and checks that every program
#      loads,
#   3. builds the Python module (_erun) for the machine's python3 against the
#      bundle's liberun (pybind11 and a C++ compiler are there),
#   4. runs scripts/gpu_tests.sh on the bundle within GPU_TESTS_BUDGET seconds
#      (default 530: one device command may run 600),
#   5. leaves in $OUT (or GPU_DEVICE_OUT, default BUNDLE/results) summary.txt,
#      machine.txt and logs.tar.gz: few files, as the device tool returns at
#      most eight.
#   bash scripts/gpu_device.sh [BUNDLE]        (default: gpu-bundle)
# Exits as gpu_tests.sh does (0: every step passed or the machine has no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bundle=${1:-gpu-bundle}
case $bundle in /*) ;; *) bundle=$root/$bundle ;; esac
out=${OUT:-${GPU_DEVICE_OUT:-$bundle/results}}
budget=${GPU_TESTS_BUDGET:-530}
t0=$SECONDS
mkdir -p "$out"
if [ ! -f "$bundle/BUNDLE" ]; then
  echo "gpu_device: $bundle is not a GPU bundle: make it with scripts/gpu_bundle.sh and carry it" | tee "$out/summary.txt"
  exit 1
fi
work=$(mktemp -d /tmp/erun-gpu-device-XXXXXX)
py=${GPU_TESTS_PYTHON:-python3}

# ---- 1. the machine
{
  cat "$bundle/BUNDLE"
  head=$(git -C "$root" rev-parse --short HEAD 2>/dev/null)
  if [ -n "$head" ] && ! grep -q "^commit: $head\b" "$bundle/BUNDLE"; then
    echo "WARNING: the bundle was not made from this tree's commit $head: remake it (scripts/gpu_bundle.sh)"
  fi
  echo "---- machine"
  nvidia-smi 2>&1 || echo "nvidia-smi: none"
  command -v nvcc >/dev/null && nvcc --version | tail -2
  (. /etc/os-release && echo "$PRETTY_NAME"); uname -r; ldd --version | head -1
  echo "cores: $(nproc); /dev/shm: $(df -h --output=size /dev/shm | tail -1)"
  "$py" -c "import sys, torch; print(sys.executable, sys.version.split()[0], 'torch', torch.__version__,
            'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); print('NCCL', torch.cuda.nccl.version())" 2>&1
} >"$out/machine.txt" 2>&1

# ---- 2. libraries: the machine's NCCL; the bundle's libraries only where the machine has none
nccl_dir=
# PyTorch's first: the one its own collectives use (a system libnccl2 may be older).
for d in $("$py" -c "import nvidia; print(' '.join(nvidia.__path__))" 2>/dev/null) \
         $(ldconfig -p | sed -n 's/.*libnccl\.so\.2 .*=> \(.*\)\/libnccl\.so\.2$/\1/p') /usr/local/cuda/lib64; do
  f=$(find "$d" -maxdepth 3 -name 'libnccl.so.2*' 2>/dev/null | head -1)
  if [ -n "$f" ]; then nccl_dir=$(dirname "$f"); break; fi
done
mkdir -p "$work/lib"
used=()
for f in "$bundle"/deps/*; do
  soname=$(basename "$f")
  if ! ldconfig -p | grep -q "^[[:space:]]*$soname "; then
    ln -s "$f" "$work/lib/$soname"
    used+=("$soname")
  fi
done
export LD_LIBRARY_PATH="$work/lib:$bundle/src/lib${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  echo "---- libraries"
  echo "NCCL: ${nccl_dir:-none found} $(ls "$nccl_dir"/libnccl.so.2* 2>/dev/null | head -1 | xargs -r basename)"
  echo "from the bundle: ${used[*]:-none}"
  . scripts/gpu_programs.sh
  for p in "${gpu_programs[@]}" "${gpu_programs_nccl[@]}"; do
    ldd "$bundle/$p" 2>&1 | grep "not found" | sed "s|^|$p does not load: |"
  done
  "$bundle/src/runner/erun" --version
} >>"$out/machine.txt" 2>&1

# ---- 3. the Python module for this python3 (the package's Python files from this tree)
mkdir -p "$bundle/python/erun"
cp "$root"/python/erun/*.py "$root"/python/erun/*.pyi "$root"/python/erun/py.typed "$bundle/python/erun/"
ext=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))" 2>/dev/null)
if [ -n "$ext" ] && includes=$("$py" -m pybind11 --includes 2>/dev/null) && command -v c++ >/dev/null; then
  # shellcheck disable=SC2086
  c++ -O2 -std=c++20 -shared -fPIC $includes -I"$root/include" "$root/python/src/module.cc" \
    -o "$bundle/python/erun/_erun$ext" -L"$bundle/src/lib" -lerun -Wl,-rpath,'$ORIGIN/../../src/lib' \
    >"$work/python_module.log" 2>&1 ||
    echo "gpu_device: building the Python module failed (python_module.log)" >>"$out/machine.txt"
else
  echo "gpu_device: no Python module: $py lacks pybind11 or its headers, or there is no c++" >>"$out/machine.txt"
fi
cat "$out/machine.txt"

# ---- 4. the checks
left=$((budget - (SECONDS - t0)))
# Bounded as a whole too, so that the logs are packed even if a step overruns.
GPU_TESTS_OUT="$work/logs" GPU_TESTS_BUDGET=$left GPU_TESTS_PYTHON=$py \
  timeout -k 5 $((left + 30)) bash scripts/gpu_tests.sh "$bundle"
status=$?

# ---- 5. what comes back
mkdir -p "$work/logs"
cp "$work/python_module.log" "$work/logs/" 2>/dev/null
cp "$out/machine.txt" "$work/logs/"
if [ -f "$work/logs/summary.txt" ]; then
  cp "$work/logs/summary.txt" "$out/summary.txt"
else
  echo "gpu_tests.sh ended without a summary (exit $status): see logs.tar.gz" >"$out/summary.txt"
fi
tar -czf "$out/logs.tar.gz" -C "$work" logs
rm -rf "$work"
echo "gpu_device: $((SECONDS - t0)) s; results in $out (summary.txt, machine.txt, logs.tar.gz)"
exit "$status"
