#!/bin/bash
# slurm_local.sh: a real three-node Slurm cluster on this one machine, for trying
# `erun --slurm`, `srun`, `salloc` and `--slurm-grow` without a cluster
# (Debian's Slurm 22.05).
#
#   scripts/slurm_local.sh start        install if needed, write the config, start the daemons
#   scripts/slurm_local.sh env          print `export SLURM_CONF=...` for your shell
#   scripts/slurm_local.sh stop         stop the daemons this script started
#   scripts/slurm_local.sh demo [BUILD] start, run the example under erun --slurm (salloc),
#                                       srun and mpirun-in-salloc, compare checksums, stop
#   scripts/slurm_local.sh priorities [BUILD]
#                                       start, an elastic job grows onto the idle erun-n3
#                                       (--slurm-grow spare), an urgent job takes it back
#                                       and the job shrinks in place, then grows again;
#                                       compare with the uninterrupted model, stop
#
# Three nodes, erun-n1, erun-n2 and erun-n3, all 127.0.0.1 with their own slurmd
# port and 8 CPUs each (SlurmdParameters=config_overrides lets a small machine
# advertise them). Partitions: debug (n1, n2; the default), spare (n3, the
# lowest priority tier: its jobs are preempted and requeued, with 5 s of
# GraceTime after their SIGTERM) and urgent (n3, a higher tier): what
# `erun --slurm-grow spare` grows onto and an urgent job takes back.
# erun and Gloo use node names as addresses, so start adds
# "127.0.0.1 erun-n1 erun-n2 erun-n3" to /etc/hosts when they do not resolve (stop takes
# the line out again; Slurm refuses two nodes with one hostname, and treats
# NodeName=localhost specially). Everything else lives in ERUN_SLURM_DIR
# (default /tmp/erun-slurm); munged runs as user munge. Needs root.
set -euo pipefail

dir=${ERUN_SLURM_DIR:-/tmp/erun-slurm}
conf=$dir/slurm.conf
self=$(hostname)
node1=erun-n1
node2=erun-n2
node3=erun-n3
hosts_line="127.0.0.1 $node1 $node2 $node3 # erun slurm_local.sh"

log() { echo "slurm_local.sh: $*" >&2; }

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null &&
     command -v munged >/dev/null; then
    return
  fi
  if [ -n "${ERUN_SLURM_NO_INSTALL:-}" ]; then
    log "Slurm or munge is not installed (ERUN_SLURM_NO_INSTALL is set, so not installing)"
    exit 3
  fi
  log "installing slurmctld slurmd slurm-client munge"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge >&2
}

write_config() {
  mkdir -p "$dir/state" "$dir/spool-$node1" "$dir/spool-$node2" "$dir/spool-$node3"
  cat > "$conf" <<CONF
ClusterName=erun
SlurmctldHost=$self(127.0.0.1)
SlurmctldPort=16817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/builtin
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=5
NodeName=$node1 NodeAddr=127.0.0.1 Port=17001 CPUs=8 State=UNKNOWN
NodeName=$node2 NodeAddr=127.0.0.1 Port=17002 CPUs=8 State=UNKNOWN
NodeName=$node3 NodeAddr=127.0.0.1 Port=17003 CPUs=8 State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=$node1,$node2 Default=YES MaxTime=INFINITE State=UP PriorityTier=10
PartitionName=spare Nodes=$node3 MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=5
PartitionName=urgent Nodes=$node3 MaxTime=INFINITE State=UP PriorityTier=10
CONF
  # Two slurmstepds of one step on one machine would share PMIx's client
  # directory (/tmp/spmix_appdir_UID_JOB.STEP): each slurmd gets its own copy
  # of the config with an mpi.conf that points PMIx elsewhere.
  for n in "$node1" "$node2" "$node3"; do
    mkdir -p "$dir/$n/pmix"
    cp "$conf" "$dir/$n/slurm.conf"
    echo "PMIxCliTmpDirBase=$dir/$n/pmix" > "$dir/$n/mpi.conf"
  done
}

# Runs a daemon in the background, remembering its pid for stop.
spawn() {
  local name=$1
  shift
  "$@" > "$dir/$name.out" 2>&1 &
  echo $! > "$dir/$name.daemon-pid"
}

start() {
  install
  mkdir -p "$dir"
  write_config
  export SLURM_CONF=$conf
  if ! pgrep -u munge -x munged >/dev/null; then
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
    [ -s /etc/munge/munge.key ] || { log "no /etc/munge/munge.key (reinstall munge)"; exit 1; }
    su -s /bin/sh munge -c "/usr/sbin/munged" >&2
    echo started > "$dir/munged.started"
  fi
  if ! getent hosts "$node1" >/dev/null || ! getent hosts "$node2" >/dev/null || ! getent hosts "$node3" >/dev/null; then
    echo "$hosts_line" >> /etc/hosts
  fi
  # -c: no job of an earlier start is recovered (stop cancels them, but one
  # still completing when the daemons go would hold nodes at the next start).
  spawn slurmctld slurmctld -D -c -i -f "$conf"
  spawn "slurmd-$node1" slurmd -D -N "$node1" -f "$dir/$node1/slurm.conf"
  spawn "slurmd-$node2" slurmd -D -N "$node2" -f "$dir/$node2/slurm.conf"
  spawn "slurmd-$node3" slurmd -D -N "$node3" -f "$dir/$node3/slurm.conf"
  # Ready when the three nodes are idle (sinfo -N lists erun-n3 once per partition).
  local deadline=$((SECONDS + ${ERUN_SLURM_START_TIMEOUT:-60}))
  until [ "$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | grep -c ' idle$')" = 3 ]; do
    if [ $SECONDS -ge $deadline ] || ! kill -0 "$(cat "$dir/slurmctld.daemon-pid")" 2>/dev/null; then
      log "the nodes did not become idle; sinfo says:"
      sinfo -N >&2 || true
      tail -5 "$dir"/*.log >&2 || true
      stop
      exit 1
    fi
    sleep 0.5
  done
  log "ready: nodes $node1,$node2 (partition debug) and $node3 (partitions spare and urgent) with 8 CPUs each; export SLURM_CONF=$conf"
}

# Takes the line start added out of /etc/hosts in place: the lines after it
# move up over it, then the file is cut to its new length. The file is never
# empty nor without its other lines for a moment, as it was while `cat`
# rewrote it: a test beside this one that resolved localhost then could fail.
# (No rename: /etc/hosts is often a bind mount, as in containers.)
remove_hosts_line() {
  python3 - "$hosts_line" <<'PY'
import os.path
import sys

ours = sys.argv[1].encode()
with open("/etc/hosts", "r+b") as f:
    data = f.read()
    kept = b"".join(l for l in data.splitlines(keepends=True) if l.rstrip(b"\n") != ours)
    at = len(os.path.commonprefix([data, kept]))
    f.seek(at)
    f.write(kept[at:])
    f.flush()
    f.truncate(len(kept))
PY
}

stop() {
  export SLURM_CONF=$conf
  # Jobs first, so that slurmd ends their steps (KillWait=5).
  if scancel --user=root >/dev/null 2>&1; then
    for _ in $(seq 100); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
  fi
  for f in "$dir"/*.daemon-pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
  done
  if grep -qxF "$hosts_line" /etc/hosts 2>/dev/null; then
    remove_hosts_line
  fi
  if [ -e "$dir/munged.started" ]; then
    pid=$(cat /run/munge/munged.pid 2>/dev/null || true)
    if [ -n "$pid" ]; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$dir/munged.started"
  fi
}

demo() {
  local build=${1:-build}
  local erun=$build/src/runner/erun
  local example="$build/examples/train_mlp --samples 4000 --epochs 2"
  start
  trap stop EXIT
  export SLURM_CONF=$conf OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  echo "== alone"
  $example | tail -1
  echo "== salloc -N2 -n4 erun (hosts from the allocation, workers through srun, elastic)"
  salloc -N2 -n4 --immediate=30 "$erun" --slurm $example | tail -1
  echo "== srun -N2 -n4 --mpi=pmix (static, bootstrapped from MPI)"
  srun -N2 -n4 --mpi=pmix --immediate=30 $example | tail -1
}

# Priorities from Slurm, end to end (docs/mpi_slurm.md, "Growing onto idle
# nodes"): a low-priority elastic job grows onto the idle erun-n3, an urgent
# job takes that node and the elastic job shrinks in place, the urgent job
# ends and the elastic job grows back; it ends at the uninterrupted run's model.
priorities() {
  local build=${1:-build}
  local args="--samples 4000 --epochs 24"
  start
  trap stop EXIT
  export SLURM_CONF=$conf
  local want got work
  want=$("$build/examples/train_mlp" $args | grep -o 'final accuracy=.*')
  echo "== uninterrupted: $want"
  work=$(mktemp -d)
  echo "== salloc -N2 erun --slurm --slurm-grow spare -np 2 --max-np 3 (about a minute; an urgent job takes erun-n3 midway)"
  bash "$(dirname "$0")/../tests/integration/slurm_grow_scenario.sh" "$build/src/runner/erun" "$work" \
    "$build/examples/train_mlp" $args --step-ms 150 > "$work/log" 2>&1
  grep '^scenario:' "$work/log"
  grep -E 'slurm-grow: placeholder job .* (runs|leaves|ended)|host erun-n3 drain|membership grows' "$work/log" |
    sed 's/^[0-9-]* //' | cut -c1-150
  got=$(grep -o 'final accuracy=.*' "$work/log" | tail -1)
  echo "== elastic: $got"
  rm -rf "$work"
  if [ -n "$want" ] && [ "$got" = "$want" ]; then
    echo "== the same model"
  else
    echo "== the models differ"
    return 1
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) echo "export SLURM_CONF=$conf" ;;
  demo) shift; demo "$@" ;;
  priorities) shift; priorities "$@" ;;
  *) echo "usage: $0 start|stop|env|demo [BUILD_DIR]|priorities [BUILD_DIR]" >&2; exit 2 ;;
esac
