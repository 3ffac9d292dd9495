#!/usr/bin/env bash
# The Python environment of the second test pass: a venv ($ERUN_VENV, default
# ./.venv) on Debian's python3 with the newest PyTorch from PyPI (its CUDA
# wheel, which runs on the CPU too), numpy, pytest, mypy, Lightning and
# Accelerate, and erun itself installed by `pip install .` (liberun, _erun and
# the erun launcher in .venv/bin). Debian's python3-torch 1.13 stays the first
# torch (scripts/setup.sh); scripts/test.sh runs the Python suite against both.
# The PyPI packages are installed once; erun is re-installed on every run,
# incrementally (pyproject.toml keeps its build in build-pip/).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ERUN_VENV:-.venv}
packages=(torch numpy pytest mypy lightning accelerate scikit-build-core pybind11)
modules="torch, numpy, pytest, mypy, lightning, accelerate, scikit_build_core, pybind11"

if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import $modules" 2>/dev/null; then
  start=$(date +%s)
  "$venv/bin/pip" install -q --upgrade "${packages[@]}"
  echo "venv: ${packages[*]} installed from PyPI in $(( $(date +%s) - start )) s"
fi
start=$(date +%s)
# Through ccache where it is installed, with the compilers scripts/build.sh
# uses (Python's sysconfig would name x86_64-linux-gnu-g++, a different key):
# after scripts/build.sh, whose Release objects have the same flags, the
# compile is nearly all cache hits (3 min 45 s -> 17 s here).
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CC=${CC:-cc} CXX=${CXX:-c++}
fi
# --no-build-isolation: scikit-build-core and pybind11 come from the venv, so a
# re-install needs no download and reuses build-pip/.
"$venv/bin/pip" install -q --no-build-isolation .
echo "venv: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'), erun $("$venv/bin/erun" --version | awk '{ print $2 }') installed by pip in $(( $(date +%s) - start )) s ($venv)"
