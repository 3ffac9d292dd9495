#!/usr/bin/env bash
# The test command: installs what is missing, builds, installs erun into
# /usr/local (scripts/install.sh), and runs every test suite (unit, integration
# with real processes and a private sshd, fault injection, the installed package).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
bash scripts/install.sh   # erun, liberun, headers, examples into /usr/local
build=${ERUN_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure --timeout 300 -j2 "$@"
