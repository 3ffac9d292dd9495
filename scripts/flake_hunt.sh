#!/usr/bin/env bash
# Runs the chosen tests N times with every core kept busy by a CPU hog (the
# way CI's three lanes load a 2-core machine) and reports each failure with
# its log: a test that fails now and then is a race to find, not to retry.
#
#   scripts/flake_hunt.sh [ctest args] [N]
#
# The ctest args choose the tests (-R REGEX, -L LABEL, -E REGEX, ...); the
# last argument, when it is a number, is N (default 10). Needs a build
# (scripts/build.sh; $ERUN_BUILD_DIR or ./build). Logs go to
# $ERUN_FLAKE_DIR (default build/flake-hunt/<time>): run-K.log per pass, and
# FAILED-<test>-run-K.log for each failure. Exits 1 when anything failed.
#   ERUN_FLAKE_HOGS=K   busy processes beside the tests (default: the cores)
#   ERUN_FLAKE_JOBS=J   tests at once (ctest -j; default 1)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${ERUN_BUILD_DIR:-build}
runs=10
args=("$@")
if [ ${#args[@]} -gt 0 ] && [[ "${args[-1]}" =~ ^[0-9]+$ ]]; then
  runs=${args[-1]}
  unset 'args[-1]'
fi
if [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "flake_hunt: no build in $build: run scripts/build.sh first" >&2
  exit 2
fi
out=${ERUN_FLAKE_DIR:-$build/flake-hunt/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
hogs=${ERUN_FLAKE_HOGS:-$(nproc)}
jobs=${ERUN_FLAKE_JOBS:-1}

hog_pids=()
stop_hogs() {
  [ ${#hog_pids[@]} -gt 0 ] && kill "${hog_pids[@]}" 2>/dev/null
  wait 2>/dev/null
}
trap stop_hogs EXIT INT TERM
for _ in $(seq "$hogs"); do
  ( while :; do :; done ) &
  hog_pids+=($!)
done

listed=$(ctest --test-dir "$build" -N "${args[@]}" | grep -c '^  Test *#')
echo "flake_hunt: $listed test(s) x $runs run(s), $hogs CPU hog(s), -j$jobs; logs in $out"
declare -A failed_runs=()
start=$(date +%s)
for k in $(seq "$runs"); do
  t0=$(date +%s)
  ctest --test-dir "$build" --output-on-failure --timeout 300 -j"$jobs" "${args[@]}" >"$out/run-$k.log" 2>&1
  # ctest's closing list: "<tab>  3 - Name (Failed)".
  failed=$(sed -n '/The following tests FAILED:/,$p' "$out/run-$k.log" |
           sed -nE 's/^[[:space:]]*[0-9]+ - (.*) \([^)]*\)$/\1/p')
  n=0
  while IFS= read -r name; do
    [ -z "$name" ] && continue
    n=$((n + 1))
    failed_runs["$name"]+="$k "
    safe=$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_')
    # The failing test's own lines: its result line and the output after it.
    awk -v t="$name" '/Test +#[0-9]+: / { if (on) exit; if (index($0, ": " t " ")) on = 1 }
                      on && /^ *Start +[0-9]+: / { exit }
                      on { print }' "$out/run-$k.log" >"$out/FAILED-$safe-run-$k.log"
    [ -s "$out/FAILED-$safe-run-$k.log" ] || cp "$out/run-$k.log" "$out/FAILED-$safe-run-$k.log"
  done <<<"$failed"
  echo "flake_hunt: run $k/$runs: $n failure(s) in $(( $(date +%s) - t0 )) s"
done
echo "flake_hunt: $listed test(s) x $runs run(s) in $(( $(date +%s) - start )) s"
if [ ${#failed_runs[@]} -eq 0 ]; then
  echo "flake_hunt: 0 failures"
  exit 0
fi
for name in "${!failed_runs[@]}"; do
  echo "flake_hunt: FAILED $name in run(s) ${failed_runs[$name]}(logs: $out/FAILED-*)"
done
exit 1
