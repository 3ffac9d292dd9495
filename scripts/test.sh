#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test suite
# (unit, integration with real processes and a private sshd, fault injection).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
build=${ERUN_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure --timeout 300 -j2 "$@"
