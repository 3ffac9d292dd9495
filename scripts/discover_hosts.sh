#!/bin/sh
# discover_hosts.sh: an example host discovery script for erun.
#
#   erun -np 8 --min-np 4 --host-discovery-script ./scripts/discover_hosts.sh erun-example-train-mlp
#   erun ... --host-discovery-script "./scripts/discover_hosts.sh slurm" erun-example-train-mlp
#   erun ... --host-discovery-script "discover_hosts.sh k8s-service" ...   (docs/kubernetes.md)
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
#   k8s-service
#           the ready pods behind a headless Kubernetes Service: the addresses
#           `getent ahosts "$ERUN_K8S_SERVICE"` resolves (e.g.
#           train-workers.default.svc.cluster.local), each once, sorted, with
#           ERUN_K8S_SLOTS slots (default 1). No address (getent exits 2) is an
#           empty host set: no worker pod is ready yet.
#   kubectl the Running pods that match the label selector ERUN_K8S_SELECTOR
#           (e.g. app=train-workers), in ERUN_K8S_NAMESPACE when set, from
#           `kubectl get pods`: each pod IP, sorted, with ERUN_K8S_SLOTS slots
#           (default 1). A pod being deleted (evicted, preempted, scaled down:
#           it has a deletionTimestamp) is printed `ip:slots draining`, so that
#           its host leaves at the next commit; a pod without an IP is skipped.
#           Needs get/list on pods (the launcher pod's ServiceAccount).
set -eu

source=${1:-${ERUN_DISCOVERY_SOURCE:-file}}

# ERUN_K8S_SLOTS, checked: the slots of every pod (k8s-service, kubectl).
k8s_slots() {
  slots=${ERUN_K8S_SLOTS:-1}
  case "$slots" in
    '' | *[!0-9]* | 0 | 0*)
      echo "discover_hosts.sh: ERUN_K8S_SLOTS='$slots' is not a positive integer (the slots of each pod, e.g. its GPUs)" >&2
      exit 1
      ;;
  esac
}

# Reads "address[ draining]" lines sorted by address; prints each address
# once as a discovery line (IPv6 in brackets), `draining` when any of its
# lines says so.
k8s_lines() {
  awk -v slots="$slots" '
    function flush() {
      if (prev == "") return
      host = (index(prev, ":") > 0) ? "[" prev "]" : prev
      print host ":" slots (drain ? " draining" : "")
    }
    $1 != prev { flush(); prev = $1; drain = 0 }
    $2 == "draining" { drain = 1 }
    END { flush() }'
}

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
  k8s-service)
    if [ -z "${ERUN_K8S_SERVICE:-}" ]; then
      echo "discover_hosts.sh: ERUN_K8S_SERVICE is not set: set it to the headless Service's name (e.g. train-workers.default.svc.cluster.local)" >&2
      exit 1
    fi
    k8s_slots
    if ! command -v getent >/dev/null 2>&1; then
      echo "discover_hosts.sh: getent not found in PATH (it comes with libc: install libc-bin)" >&2
      exit 1
    fi
    # `getent ahosts` prints "ADDRESS STREAM|DGRAM|RAW [NAME]" lines, several
    # per address. Exit 2: the name has no address (a headless Service lists
    # only ready pods, so none is ready yet; a failing DNS looks the same):
    # an empty host set, as with no output at all.
    status=0
    out=$(getent ahosts "$ERUN_K8S_SERVICE") || status=$?
    if [ "$status" -eq 2 ]; then
      exit 0
    elif [ "$status" -ne 0 ]; then
      echo "discover_hosts.sh: getent ahosts $ERUN_K8S_SERVICE failed with exit code $status" >&2
      exit 1
    fi
    printf '%s\n' "$out" | awk '$1 ~ /^[0-9A-Fa-f.:]+(%[A-Za-z0-9_.-]+)?$/ { print $1 }' | LC_ALL=C sort -u | k8s_lines
    ;;
  kubectl)
    if [ -z "${ERUN_K8S_SELECTOR:-}" ]; then
      echo "discover_hosts.sh: ERUN_K8S_SELECTOR is not set: set it to the worker pods' label selector (e.g. app=train-workers)" >&2
      exit 1
    fi
    k8s_slots
    if ! command -v kubectl >/dev/null 2>&1; then
      echo "discover_hosts.sh: kubectl not found in PATH (install it in the launcher's image)" >&2
      exit 1
    fi
    # One "ip=IP deleting=TIMESTAMP" line per Running pod; both may be empty.
    set -- get pods -l "$ERUN_K8S_SELECTOR" --field-selector=status.phase=Running \
      -o 'jsonpath={range .items[*]}{"ip="}{.status.podIP}{" deleting="}{.metadata.deletionTimestamp}{"\n"}{end}'
    if [ -n "${ERUN_K8S_NAMESPACE:-}" ]; then
      set -- "$@" -n "$ERUN_K8S_NAMESPACE"
    fi
    status=0
    out=$(kubectl "$@") || status=$?
    if [ "$status" -ne 0 ]; then
      echo "discover_hosts.sh: kubectl get pods -l $ERUN_K8S_SELECTOR${ERUN_K8S_NAMESPACE:+ -n $ERUN_K8S_NAMESPACE} failed with exit code $status (check its message above; the pod's ServiceAccount needs get and list on pods)" >&2
      exit 1
    fi
    printf '%s\n' "$out" | awk '
      {
        ip = ""; deleting = ""
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^ip=/) ip = substr($i, 4)
          else if ($i ~ /^deleting=/) deleting = substr($i, 10)
        }
      }
      ip ~ /^[0-9A-Fa-f.:]+$/ { print ip (deleting != "" ? " draining" : "") }' | LC_ALL=C sort | k8s_lines
    ;;
  *)
    echo "discover_hosts.sh: unknown source '$source' (use file, slurm, static, k8s-service or kubectl)" >&2
    exit 2
    ;;
esac
