#!/usr/bin/env bash
# Installs the build into a scratch prefix and builds tests/install/consumer (an
# out-of-tree elastic program) against it four ways: find_package(erun) with
# erun::erun and with erun::erun_static, and plain g++ with `pkg-config erun`
# and `pkg-config erun-static`. Each runs under the installed erun, -np 2, and
# must print total=6*STEPS on both ranks; the shared builds must have mapped the
# installed liberun (not the build tree's). The CMake build also runs through a
# SIGKILLed rank 1 and must end at the same total. The installed example
# erun-example-train-mlp must resolve liberun from the prefix too and train
# when started by its name. With the Python package built, /usr/bin/python3
# imports it from the prefix's lib/python3.X/dist-packages (/usr/local's
# layout) and reduces alone and on two ranks.
#
#   tests/install/install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
consumer="$src/tests/install/consumer"
steps=20
want="total=$((6 * steps))"

work=$(mktemp -d /tmp/erun-install-test-XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
step() { echo "install_test: $*" >&2; }

step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log" >&2; fail "cmake --install"; }
erun="$prefix/bin/erun"
[ -x "$erun" ] || fail "no $erun after install"
version=$("$erun" --version | awk '{ print $2 }')
[ -n "$version" ] || fail "$erun --version printed no version"
major=${version%%.*}
libdir=$(dirname "$(find "$prefix" -name 'liberun.so.*.*.*' -print -quit)")
[ -n "$libdir" ] && [ "$libdir" != . ] || fail "no liberun.so.X.Y.Z under $prefix"
[ -f "$libdir/liberun.so.$version" ] || fail "no liberun.so.$version in $libdir"
[ -L "$libdir/liberun.so" ] && [ -L "$libdir/liberun.so.$major" ] || fail "liberun.so / liberun.so.$major links missing in $libdir"
soname=$(readelf -d "$libdir/liberun.so" | sed -n 's/.*SONAME.*\[\(.*\)\].*/\1/p')
[ "$soname" = "liberun.so.$major" ] || fail "liberun's SONAME is '$soname', expected liberun.so.$major"
# Only erun:: symbols leave the library (src/lib/liberun.map).
leaked=$(nm -DC --defined-only "$libdir/liberun.so" | awk '{ $1 = ""; $2 = ""; print }' |
  grep -v -E '^ *((typeinfo|typeinfo name|vtable|VTT) for |(non-)?virtual thunk to )?erun::' || true)
[ -z "$leaked" ] || fail "liberun exports non-erun symbols: $(echo "$leaked" | head -5)"
# And of those only the API that the installed headers declare (ERUN_API).
python3 "$src/scripts/check_exports.py" "$libdir/liberun.so" "$prefix/include/erun" >"$work/exports.log" 2>&1 ||
  { cat "$work/exports.log" >&2; fail "liberun exports more or less than the installed include/erun declares"; }

# Runs PROGRAM under the installed erun; checks both ranks' totals and, for a
# shared build, that the mapped liberun is the installed one.
run_checked() {
  local name=$1 shared=$2; shift 2
  step "$name: $erun -np 2 ... $*"
  "$erun" -np 2 "$@" >"$work/$name.out" 2>"$work/$name.err" || {
    cat "$work/$name.out" "$work/$name.err" >&2; fail "$name: erun exited non-zero"; }
  for r in 0 1; do
    line=$(grep "elastic_sum rank=$r " "$work/$name.out" | tail -1 || true)
    [ -n "$line" ] || { cat "$work/$name.out" >&2; fail "$name: no result line from rank $r"; }
    case "$line" in *" $want "*) ;; *) fail "$name: rank $r printed '$line', expected $want";; esac
    if [ "$shared" = shared ]; then
      case "$line" in *"liberun=$libdir/liberun.so."*) ;; *) fail "$name: rank $r did not map $libdir/liberun.so: '$line'";; esac
    else
      case "$line" in *"liberun=none"*) ;; *) fail "$name: a static build mapped a liberun: '$line'";; esac
    fi
  done
}

# 1. CMake package, shared and static.
for kind in shared static; do
  flag=OFF; [ "$kind" = static ] && flag=ON
  step "find_package(erun) ($kind): configure and build"
  cmake -S "$consumer" -B "$work/cmake-$kind" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DERUN_STATIC=$flag >"$work/cmake-$kind.log" 2>&1 &&
    cmake --build "$work/cmake-$kind" >>"$work/cmake-$kind.log" 2>&1 || { cat "$work/cmake-$kind.log" >&2; fail "cmake consumer ($kind)"; }
  grep -q "erun $version from $prefix/" "$work/cmake-$kind.log" || { cat "$work/cmake-$kind.log" >&2; fail "find_package(erun) did not use $prefix"; }
  run_checked "cmake-$kind" "$kind" "$work/cmake-$kind/elastic_sum" "$steps"
done
# (ldd's output is read whole first: grep -q in a pipe would end ldd by SIGPIPE,
# which pipefail reports as a failure.)
deps=$(ldd "$work/cmake-shared/elastic_sum")
grep -q "liberun.so.$major => $libdir/liberun.so.$major" <<<"$deps" || fail "ldd: cmake-shared does not resolve $libdir/liberun.so.$major"

# 2. pkg-config and a plain g++ line.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion erun)" = "$(pkg-config --modversion erun-static)" ] || fail "erun.pc and erun-static.pc versions differ"
step "pkg-config: g++ $(pkg-config --cflags --libs erun)"
g++ -O2 -o "$work/pc-shared" "$consumer/elastic_sum.cc" $(pkg-config --cflags --libs erun) \
  -Wl,-rpath,"$(pkg-config --variable=libdir erun)" || fail "g++ with pkg-config erun"
run_checked pc-shared shared "$work/pc-shared" "$steps"
step "pkg-config: g++ $(pkg-config --cflags --libs erun-static)"
g++ -O2 -o "$work/pc-static" "$consumer/elastic_sum.cc" $(pkg-config --cflags --libs erun-static) || fail "g++ with pkg-config erun-static"
deps=$(ldd "$work/pc-static")
! grep -q liberun <<<"$deps" || fail "pc-static links liberun.so"
run_checked pc-static static "$work/pc-static" "$steps"

# 3. Elastic: rank 1 SIGKILLs itself once; the job recovers in place and ends
#    at the same total. Rank 0 goes on alone at once and its replacement joins
#    at a later commit: 200 steps (100 after the kill, 2 s) leave it the time
#    to, so both ranks print the total.
want="total=$((6 * 200))"
run_checked cmake-shared-killed shared --min-np 1 --max-np 2 "$work/cmake-shared/elastic_sum" 200 "$work/kill-marker"
[ -e "$work/kill-marker" ] || fail "the kill run never killed rank 1"
# The driver reaps the exit (137 from its own SIGKILL), or a survivor reports
# the dead rank first and the driver's kill reaches it (signal 9); either way
# the exit is logged.
grep -Eq "rank 1: failed with (exit code 137|signal 9)" "$work/cmake-shared-killed.err" || {
  cat "$work/cmake-shared-killed.err" >&2; fail "erun did not report the killed rank"; }

# 4. The installed example (a link into libexec) resolves the installed liberun
#    and runs by its name on the PATH, as the README runs it.
example="$prefix/bin/erun-example-train-mlp"
[ -x "$example" ] || fail "no $example"
resolved=$(ldd "$(readlink -f "$example")" | sed -n "s/.*liberun.so.$major => \([^ ]*\) .*/\1/p")
[ -n "$resolved" ] && [ "$(readlink -f "$resolved")" = "$(readlink -f "$libdir/liberun.so.$major")" ] ||
  fail "$example resolves liberun.so.$major to '$resolved', not $libdir/liberun.so.$major"
step "PATH=$prefix/bin:\$PATH erun -np 2 erun-example-train-mlp --epochs 1"
PATH="$prefix/bin:$PATH" erun -np 2 erun-example-train-mlp --epochs 1 >"$work/example.out" 2>"$work/example.err" ||
  { cat "$work/example.out" "$work/example.err" >&2; fail "erun-example-train-mlp under erun"; }
grep -q "checksum=" "$work/example.out" || { cat "$work/example.out" >&2; fail "erun-example-train-mlp printed no checksum"; }
if [ -d "$build/python/erun" ]; then
  pyver=$(/usr/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  step "the Python package in $prefix/lib/python$pyver/dist-packages (/usr/local's layout) for /usr/bin/python3"
  bash "$src/tests/install/python_package_check.sh" "$prefix/lib/python$pyver/dist-packages" "$erun" \
    "/usr/local/lib/python$pyver/dist-packages" || fail "the installed Python package"
fi
step "all checks passed"
