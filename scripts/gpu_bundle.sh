#!/usr/bin/env bash
# Makes the build that a GPU machine without erun's build dependencies runs:
# the lent GPU machines have CUDA, NCCL (PyTorch's), CMake and a compiler, but
# no spdlog, Boost, Gloo or OpenSSL headers, so erun cannot be configured
# there. This builds the GPU targets here (Release, NCCL, no MPI) and copies
# them into BUNDLE in the layout of a build directory (src/runner/erun,
# tests/, examples/gpu/, bench/, src/lib/liberun.so), with the shared
# libraries they need, but for the C runtime, the driver and NCCL, in BUNDLE/deps.
# On the GPU machine scripts/gpu_device.sh puts BUNDLE/deps (only the
# libraries the machine lacks) and its own NCCL on the library path, builds
# the Python module against liberun there, and runs scripts/gpu_tests.sh on it.
#   scripts/gpu_bundle.sh [BUNDLE]        (default: gpu-bundle; BUILD: build-gpu)
# Then, on the GPU machine, with BUNDLE carried: bash scripts/gpu_device.sh BUNDLE
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-gpu-bundle}
build=${ERUN_GPU_BUILD_DIR:-build-gpu}
# Release for a GPU machine; scripts/check_gpu_bundle.sh, which only checks
# the bundle's making and loading without a GPU, builds faster (None: -O0).
build_type=${ERUN_GPU_BUILD_TYPE:-Release}
case $bundle in /*) ;; *) bundle=$PWD/$bundle ;; esac

if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
# ERUN_GPU_REUSE_BUILD=1: $build is a build made already (with NCCL), used
# as it is configured (scripts/check_gpu_bundle.sh in CI: the main build, so
# no third build of erun; a bundle for a GPU machine is made fresh).
if [ -n "${ERUN_GPU_REUSE_BUILD:-}" ]; then
  if [ ! -f "$build/build.ninja" ]; then
    echo "gpu_bundle: ERUN_GPU_REUSE_BUILD: no build in $build to reuse" >&2
    exit 1
  fi
else
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" -DERUN_WITH_NCCL=ON -DERUN_WITH_MPI=OFF \
    -DERUN_WITH_PYTHON=OFF -DERUN_BUILD_TESTS=ON >/dev/null
fi
. scripts/gpu_programs.sh
programs=("${gpu_programs[@]}" "${gpu_programs_nccl[@]}")
targets=(erun_shared)
for p in "${programs[@]}"; do targets+=("$(basename "$p")"); done
ninja -C "$build" "${targets[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/deps" "$bundle/src/lib" "$bundle/python/erun"
for p in "${programs[@]}"; do
  install -D -m 0755 "$build/$p" "$bundle/$p"
done
cp -a "$build"/src/lib/liberun.so* "$bundle/src/lib/"  # python/erun is filled there (gpu_device.sh)
strip --strip-unneeded "${programs[@]/#/$bundle/}" "$bundle"/src/lib/liberun.so.*.*

# The libraries to carry: every one the programs load, except the C runtime
# (the machine's own: glibc, libstdc++, libgcc_s), the driver (libcuda) and
# NCCL (the machine's, PyTorch's; 200+ MB). The CUDA runtime is small and the
# one the code was built against: it goes along, and is used only where the
# machine has none.
keep_out='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libnccl|liberun)\.so'
loaded=$(for p in "${programs[@]}"; do ldd "$build/$p"; done)
awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' <<<"$loaded" | sort -u |
  while read -r soname path; do
    if [[ $soname =~ $keep_out ]]; then continue; fi
    cp -L "$path" "$bundle/deps/$soname"
  done
missing=$(grep "not found" <<<"$loaded" | sort -u || true)
if [ -n "$missing" ]; then
  echo "gpu_bundle: $build's programs do not load here: $missing" >&2
  exit 1
fi

# What the machine must provide: the newest C library and C++ runtime
# versions these files ask for (an older machine shows in gpu_device.sh's
# ldd check as "version ... not found").
files=("${programs[@]/#/$bundle/}" "$bundle"/src/lib/liberun.so.*.* "$bundle"/deps/*)
glibc=$(objdump -T "${files[@]}" 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' | sort -V -u | tail -1)
glibcxx=$(objdump -T "${files[@]}" 2>/dev/null | grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -V -u | tail -1)
nccl=$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$(sed -n 's/^NCCL_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")/nccl.h" | paste -sd.)
{
  echo "erun GPU bundle (scripts/gpu_bundle.sh)"
  echo "commit: $(git rev-parse --short HEAD)$([ -z "$(git status --porcelain -- src include examples bench tests python)" ] || echo ' (with local changes)')"
  echo "made: $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "cuda: $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), built against NCCL $nccl"
  echo "needs: $glibc $glibcxx"
  echo "deps: $(cd "$bundle/deps" && ls | paste -sd' ')"
} >"$bundle/BUNDLE"
cat "$bundle/BUNDLE"
echo "gpu_bundle: $(du -sh "$bundle" | cut -f1) in $bundle"
