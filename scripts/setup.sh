#!/usr/bin/env bash
# Installs every Debian package erun's build, tests and demo need (root or sudo).
# Idempotent: does nothing when everything is already installed. Then the
# Python venv of the tests (scripts/venv.sh: the newest torch from PyPI and erun
# installed by pip) unless --debian-only.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=1
[ "${1:-}" = "--debian-only" ] && venv=0

packages=(
  build-essential cmake ninja-build pkg-config
  ccache   # the venv's `pip install .` reuses the objects of scripts/build.sh (scripts/venv.sh)
  dpkg-dev   # dpkg-shlibdeps: the Depends of the Debian package (cpack -G DEB)
  libboost-dev libboost-program-options-dev libspdlog-dev libfmt-dev
  nlohmann-json3-dev   # erun report reads event logs (src/runner/observe/job_account.cc)
  libgtest-dev libgmock-dev googletest
  libgloo-dev libopenmpi-dev openmpi-bin
  libssl-dev openssh-client openssh-server
  procps psmisc iproute2 python3
  faketime   # libfaketime: tests/integration/erun_clock_jump_test.cc steps the wall clock of erun's processes
  python3-dev python3-pybind11 pybind11-dev python3-torch python3-numpy python3-pytest   # the erun Python package (python/)
  python3-venv   # the PyPI venv of scripts/venv.sh
  python3-matplotlib   # erun report -o job.svg|job.html (python/erun/report.py)
  python3-prometheus-client chromium-headless-shell   # tests: /metrics parses, erun report's page opens
  slurmctld slurmd slurm-client munge   # the real two-node Slurm of tests/integration/slurm_test.cc
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ "$venv" = 1 ]; then
  bash scripts/venv.sh
fi
