#!/usr/bin/env bash
# Builds the Debian package from BUILD_DIR with `cpack -G DEB` into a scratch
# directory and checks it as an operator would meet it: the file name, the
# control fields (Depends from dpkg-shlibdeps naming the libraries liberun and
# erun link), the files under /usr, and, unpacked with dpkg -x into a scratch
# root, that the packaged erun runs the packaged example on two ranks with the
# packaged liberun; and, when the build has the Python package, that it sits
# in /usr/lib/python3/dist-packages and imports and reduces from there.
#
#   tests/install/deb_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/erun-deb-test-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }
command -v dpkg-shlibdeps >/dev/null || fail "dpkg-shlibdeps not found: install dpkg-dev (scripts/setup.sh)"

version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
major=${version%%.*}
(cd "$build" && cpack -G DEB -B "$work/out") >"$work/cpack.log" 2>&1 || { cat "$work/cpack.log" >&2; fail "cpack -G DEB"; }
deb="$work/out/erun_${version}_$(dpkg --print-architecture).deb"
[ -f "$deb" ] || { ls "$work/out" >&2; fail "no $deb"; }

info=$(dpkg-deb -f "$deb" Package Version Depends)
echo "$info" >&2
grep -q "^Package: erun$" <<<"$info" || fail "Package is not erun"
grep -q "^Version: $version$" <<<"$info" || fail "Version is not $version"
for dep in libc6 libstdc++6 libspdlog libfmt libgloo0 libssl3 libboost-program-options; do
  grep -q "^Depends:.*$dep" <<<"$info" || fail "Depends lacks $dep"
done
files=$(dpkg-deb -c "$deb" | awk '{ print $6 }')
for f in ./usr/bin/erun ./usr/bin/erun-example-train-mlp ./usr/include/erun/erun.hpp \
         "./usr/lib/liberun.so.$version" "./usr/lib/liberun.so.$major" ./usr/lib/liberun.so ./usr/lib/liberun.a \
         ./usr/lib/cmake/erun/erunConfig.cmake ./usr/lib/cmake/erun/erunConfigVersion.cmake \
         ./usr/lib/pkgconfig/erun.pc; do
  grep -qx -- "$f" <<<"$files" || fail "the package lacks $f"
done
control=$(dpkg-deb --ctrl-tarfile "$deb" | tar -t)
grep -q shlibs <<<"$control" || fail "no shlibs control file for liberun"

root="$work/root"
dpkg -x "$deb" "$root"
packaged_version=$("$root/usr/bin/erun" --version)
grep -q "$version" <<<"$packaged_version" || fail "packaged erun --version does not say $version"
PATH="$root/usr/bin:$PATH" erun -np 2 erun-example-train-mlp --epochs 1 >"$work/run.out" 2>"$work/run.err" ||
  { cat "$work/run.out" "$work/run.err" >&2; fail "packaged erun-example-train-mlp under packaged erun"; }
grep -q "checksum=" "$work/run.out" || { cat "$work/run.out" >&2; fail "no checksum from the packaged example"; }
resolved=$(ldd "$root/usr/libexec/erun/examples/train_mlp" | sed -n "s/.*liberun.so.$major => \([^ ]*\) .*/\1/p")
[ -n "$resolved" ] && [ "$(readlink -f "$resolved")" = "$(readlink -f "$root/usr/lib/liberun.so.$major")" ] ||
  fail "the packaged example resolves liberun.so.$major to '$resolved'"
# The Python package, when the build has one: where Debian's python3 finds it.
if [ -d "$build/python/erun" ]; then
  grep -qx -- ./usr/lib/python3/dist-packages/erun/__init__.py <<<"$files" ||
    fail "the package lacks ./usr/lib/python3/dist-packages/erun/__init__.py (Debian's python3 path)"
  bash "$(dirname "$0")/python_package_check.sh" "$root/usr/lib/python3/dist-packages" "$root/usr/bin/erun" \
    /usr/lib/python3/dist-packages || fail "the packaged Python package"
fi
echo "deb_test: $(basename "$deb") passed" >&2
