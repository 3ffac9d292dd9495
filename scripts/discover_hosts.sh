#!/bin/sh
# discover_hosts.sh: an example host discovery script for erun.
#
#   erun -np 8 --min-np 4 --host-discovery-script ./scripts/discover_hosts.sh erun-example-train-mlp
#   erun ... --host-discovery-script "./scripts/discover_hosts.sh slurm" erun-example-train-mlp
#
# erun runs it through /bin/sh -c every --discovery-interval and reads its
# stdout: one `host[:slots]` per line (IPv6 as [addr]:slots); blank lines and
# `#` comments are ignored; a line without slots gets erun's default slots.
# Exit 0 on success. On a non-zero exit, junk output, or a run longer than
# --discovery-timeout, erun keeps the hosts it had and shows the last lines of
# stderr (only the very first discovery can stop the job from starting).
# Write diagnostics to stderr, never to stdout.
#
# Source, from the first argument or ERUN_DISCOVERY_SOURCE (default: file):
#   file    the hosts file an operator edits while the job runs:
#           ERUN_HOSTS_FILE (default ./hosts.txt), printed without its comments.
#           Add a line to grow the job, delete one to shrink it.
#   slurm   the nodes of the current allocation: `scontrol show hostnames
#           "$SLURM_JOB_NODELIST"`, each with SLURM_NTASKS_PER_NODE slots, or its
#           share of SLURM_TASKS_PER_NODE, or 1.
#   static  a fixed list: ERUN_STATIC_HOSTS="a:4,b:4" (default localhost:1).
set -eu

source=${1:-${ERUN_DISCOVERY_SOURCE:-file}}

case "$source" in
  file)
    file=${ERUN_HOSTS_FILE:-./hosts.txt}
    if [ ! -r "$file" ]; then
      echo "discover_hosts.sh: cannot read hosts file $file (set ERUN_HOSTS_FILE)" >&2
      exit 1
    fi
    # Strip comments and surrounding blanks; print the lines that are left.
    sed -e 's/#.*//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$file" | grep -v '^$' || true
    ;;
  slurm)
    if [ -z "${SLURM_JOB_NODELIST:-}" ]; then
      echo "discover_hosts.sh: SLURM_JOB_NODELIST is not set: run inside salloc/sbatch" >&2
      exit 1
    fi
    if ! command -v scontrol >/dev/null 2>&1; then
      echo "discover_hosts.sh: scontrol not found in PATH" >&2
      exit 1
    fi
    # Slots per node: SLURM_NTASKS_PER_NODE when given, else the allocation's
    # SLURM_TASKS_PER_NODE ("2(x3),1" -> 2 2 2 1), else 1. Filter here (e.g.
    # drop nodes `sinfo -t drain` lists) to keep erun off them.
    counts=$(printf '%s' "${SLURM_TASKS_PER_NODE:-}" | tr ',' '\n' |
      sed -n 's/^\([0-9][0-9]*\)(x\([0-9][0-9]*\))$/\1 \2/p; s/^\([0-9][0-9]*\)$/\1 1/p' |
      while read -r n times; do i=0; while [ "$i" -lt "$times" ]; do echo "$n"; i=$((i + 1)); done; done)
    hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
    i=0
    for host in $hosts; do
      i=$((i + 1))
      slots=${SLURM_NTASKS_PER_NODE:-$(printf '%s\n' "$counts" | sed -n "${i}p")}
      echo "$host:${slots:-1}"
    done
    ;;
  static)
    printf '%s\n' "${ERUN_STATIC_HOSTS:-localhost:1}" | tr ',' '\n'
    ;;
  *)
    echo "discover_hosts.sh: unknown source '$source' (use file, slurm or static)" >&2
    exit 2
    ;;
esac
