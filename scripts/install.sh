#!/usr/bin/env bash
# Installs what `cmake --install` covers from ./build (or $ERUN_BUILD_DIR) into
# $ERUN_PREFIX (default /usr/local; root, or sudo otherwise): the erun binary,
# liberun, the headers, the CMake package, the pkg-config files, the examples
# (erun-example-*) and whatever other components the build defines. Afterwards
# `erun` is on the PATH. Run scripts/build.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${ERUN_BUILD_DIR:-build}
prefix=${ERUN_PREFIX:-/usr/local}
[ -f "$build/cmake_install.cmake" ] || { echo "install: $build is not a configured build; run scripts/build.sh first" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ] && ! [ -w "$prefix" ]; then SUDO="sudo"; fi
$SUDO cmake --install "$build" --prefix "$prefix" >/dev/null
# liberun.so.0 may land in a directory of the loader's cache: refresh it (only
# possible as root; a private prefix needs no cache, its programs use rpaths).
if [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; then $SUDO ldconfig; fi
echo "install: erun $("$prefix/bin/erun" --version | awk '{ print $2 }') in $prefix"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "install: $prefix/bin is not on your PATH: export PATH=\"$prefix/bin:\$PATH\"" >&2 ;;
esac
