#!/bin/bash
# The --slurm-grow scenario of slurm_test.cc, in the local three-node Slurm
# (scripts/slurm_local.sh; SLURM_CONF set by the caller): an elastic job of
# two nodes (partition debug) grows onto the idle erun-n3 through a
# placeholder in partition spare; an urgent job (partition urgent, a higher
# priority tier) takes erun-n3, which drains in place; the urgent job ends
# and the job grows back. Prints "scenario: ..." lines for the test to check,
# then erun's output.
#   slurm_grow_scenario.sh ERUN WORKDIR PROGRAM [ARGS...]
set -u
erun=$1 work=$2
shift 2
ev=$work/events.jsonl
say() { echo "scenario: $*"; }
# seen PATTERN: erun's output or event log has it (fixed string).
seen() { cat "$work/out" "$work/err" "$ev" 2>/dev/null | grep -c -F -- "$1"; }
# wait_count PATTERN N SECONDS: until PATTERN was seen N times (or erun ended).
wait_count() {
  local end=$((SECONDS + $3))
  until [ "$(seen "$1")" -ge "$2" ]; do
    [ $SECONDS -ge $end ] && return 1
    kill -0 "$job" 2>/dev/null || return 1
    sleep 0.2
  done
}

salloc -N2 -p debug --immediate=60 "$erun" --slurm --slurm-grow spare -np 2 --min-np 2 --max-np 3 \
  --discovery-interval 0.5 --event-log "$ev" "$@" > "$work/out" 2> "$work/err" &
job=$!
if wait_count "placeholder job" 1 60 && wait_count '"size":3' 1 90; then
  say "grew onto the idle node"
else
  say "did not grow"
fi
urgent=$(sbatch --parsable -p urgent --exclusive -J erun-urgent -o /dev/null --wrap "sleep 6")
say "urgent job $urgent submitted"
wait_count '"event":"host_draining"' 1 60 && say "the lent node drains"
wait_count "the node leaves the job" 1 60 && say "the placeholder was preempted"
end=$((SECONDS + 90))
while [ -n "$(squeue -h -j "$urgent" 2>/dev/null)" ] && [ $SECONDS -lt $end ]; do sleep 0.5; done
say "urgent job ended"
wait_count '"size":3' 2 90 && say "grew back"
wait "$job"
say "erun exit $?"
say "resets: $(grep -o '"event":"reset"[^}]*"reason":"[^"]*"' "$ev" | sed 's/.*"reason":"//; s/"$//' | paste -sd, -)"
# Slurm takes a moment to forget a cancelled job.
end=$((SECONDS + 30))
while squeue -h -o %j 2>/dev/null | grep -q '^erun-grow-' && [ $SECONDS -lt $end ]; do sleep 0.5; done
say "placeholders left: $(squeue -h -o %j 2>/dev/null | grep -c '^erun-grow-')"
cat "$work/out"
echo "--- erun's log"
cat "$work/err"
