#!/usr/bin/env bash
# The elastic demo: installs what is missing, builds and installs erun (into
# /usr/local, so that `erun` is on the PATH afterwards), and trains the
# example MLP (examples/train_mlp.cc) under erun on this machine while the
# host set grows and shrinks and a worker is SIGKILLed. Hosts are simulated
# with --launcher local: "node-a" and "node-b" are two groups of local slots
# named by the discovery script, so no SSH keys or cluster are needed.
#
#   bash scripts/demo.sh            # about a minute
#   ERUN_DEMO_RESTART=1 bash scripts/demo.sh   # the same in restart mode (torchrun-style program)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bash scripts/setup.sh --debian-only   # the demo needs no PyPI torch
bash scripts/build.sh
bash scripts/install.sh   # erun, liberun, headers, examples into /usr/local
build=${ERUN_BUILD_DIR:-build}
erun="$root/$build/src/runner/erun"

work=$(mktemp -d /tmp/erun-demo-XXXXXX)
trap 'rm -rf "$work"' EXIT
export ERUN_HOSTS_FILE="$work/hosts.txt"
echo "node-a:2" > "$ERUN_HOSTS_FILE"

if [ -n "${ERUN_DEMO_RESTART:-}" ]; then
  program=("$root/$build/examples/restart_worker" --checkpoint "$work" --epochs 40 --steps-per-epoch 5 --step-ms 100)
  pattern="^$root/$build/examples/restart_worker"
else
  program=("$root/$build/examples/train_mlp" --epochs 14 --step-ms 15)
  pattern="^$root/$build/examples/train_mlp"
fi

say() { printf '\n\033[1m[demo %s] %s\033[0m\n' "$(date +%T)" "$*" >&2; }

say "starting: erun -np 2 --min-np 1 --max-np 4 with discovery from $ERUN_HOSTS_FILE (node-a:2)"
"$erun" -np 2 --min-np 1 --max-np 4 --launcher local \
  --host-discovery-script "$root/scripts/discover_hosts.sh" --discovery-interval 0.5 \
  --event-log "$work/events.jsonl" "${program[@]}" &
erun_pid=$!

# Waits (at most 60 s) until the job has started its Nth generation, then
# lets it train for a moment, so that each step of the demo is seen.
generations() { grep -c '"event":"generation_started"' "$work/events.jsonl" 2>/dev/null || true; }
wait_generations() {
  for _ in $(seq 600); do
    [ "$(generations)" -ge "$1" ] && break
    kill -0 "$erun_pid" 2>/dev/null || return 0
    sleep 0.1
  done
  sleep 2
}

wait_generations 1
say "growing: node-b:2 appears in the hosts file"
echo "node-b:2" >> "$ERUN_HOSTS_FILE"
wait_generations 2
victim=$(pgrep -f "$pattern" -n || true)
if [ -n "$victim" ]; then
  seen=$(generations)
  say "killing worker pid $victim with SIGKILL"
  kill -9 "$victim"
  # In place the survivors go on at once and the replacement joins them once
  # started (two generations); restart mode restarts everyone (one).
  if [ -n "${ERUN_DEMO_RESTART:-}" ]; then wait_generations $((seen + 1)); else wait_generations $((seen + 2)); fi
fi
say "shrinking: node-a leaves the hosts file"
echo "node-b:2" > "$ERUN_HOSTS_FILE"

status=0
wait "$erun_pid" || status=$?
say "erun exited with $status; generations:"
grep -o '"event":"generation_started".*' "$work/events.jsonl" | sed 's/"event":"generation_started",/  /' >&2
picture=/tmp/erun-demo-timeline.html
if "$erun" report "$work/events.jsonl" -o "$picture" 2>/dev/null; then
  say "the job's picture: $picture (erun report EVENTS.jsonl -o FILE.html|FILE.svg)"
fi
if pgrep -f "$pattern" >/dev/null; then
  say "ERROR: workers left behind"; exit 1
fi
say "no worker process left behind"
exit "$status"
