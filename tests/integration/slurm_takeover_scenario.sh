#!/bin/bash
# The Slurm takeover scenario of slurm_test.cc, run by salloc inside an
# allocation of two nodes of the local Slurm (scripts/slurm_local.sh): erun
# --slurm runs each node's agent as a step; erun is SIGKILLed after epoch 1
# and the same command is run again 2 s later. The new erun reaches each
# agent through a new step (srun --overlap ... erun --agent --attach) and
# takes the job over. Prints "scenario: ..." lines for the test to check,
# then both eruns' output.
#   slurm_takeover_scenario.sh ERUN WORKDIR PROGRAM [ARGS...]
set -u
erun=$1 work=$2 program=$3
shift 2
export ERUN_JOB_DIR=$work/jobs
mkdir -p -m 700 "$ERUN_JOB_DIR"
say() { echo "scenario: $*"; }
# wait_for FILE PATTERN SECONDS
wait_for() {
  local end=$((SECONDS + $3))
  until grep -q -F -- "$2" "$1" 2>/dev/null; do
    [ $SECONDS -ge $end ] && return 1
    sleep 0.1
  done
}
workers() { pgrep -f "^$program " | sort -n | paste -sd, -; }
cmd=("$erun" --slurm -np 2 --driver-grace 60 "$@")
"${cmd[@]}" > "$work/out1" 2> "$work/err1" &
first=$!
wait_for "$work/out1" ":epoch 1 loss=" 120 || say "no epoch 1"
before=$(workers)
kill -9 "$first"
wait "$first" 2>/dev/null
say "erun killed; workers $before"
sleep 2
[ "$(workers)" = "$before" ] && say "the workers trained on without erun"
"${cmd[@]}" > "$work/out2" 2> "$work/err2" &
again=$!
wait_for "$work/err2" "took the job over at generation" 60 && say "took the job over"
[ "$(workers)" = "$before" ] && say "the same workers after the takeover"
wait "$again"
say "erun exit $?"
cat "$work/out1" "$work/out2"
echo "--- the first erun's log"
cat "$work/err1"
echo "--- the second erun's log"
cat "$work/err2"
