#!/usr/bin/env python3
"""Cross-host allreduce (issue 10): erun's TCP transport vs Open MPI forced onto
TCP vs Gloo, one rank per "host" on distinct loopback addresses, 2 and 4
hosts; and the hierarchical communicator with 2 hosts x 2 ranks. Every
implementation runs in the same session, interleaved round by round; the
median over rounds is reported. Prints a markdown section for
docs/performance.md (targets marked met / not met).

  /usr/bin/python3 bench/cross_bench.py [--build-dir build] [--rounds 3]
                                        [--max-bytes 268435456] [--smoke]
                                        [--only flat|hier] [--mpi-rounds N]
                                        [--sender-thread] [--hosts N]
                                        [--sizes BYTES,BYTES...]

--mpi-rounds N runs Open MPI in the first N rounds only (it is the far
reference: 4-28x slower here, and its 256 MiB cases take minutes), while erun
and Gloo run in every round. Run it under `chrt -f 1` (with --mpi-rounds 0:
Open MPI busy-polls) to keep other tenants of the machine off its CPUs.

--sender-thread adds erun-tcp with its sender thread forced on at 4 hosts
(backend tcp-thread: two threads per rank, as Gloo has), to tell the
transport's cost from the share of an oversubscribed machine its threads get.
"cores" is the CPU of all ranks per allreduce / its time: how many of the
machine's cores the implementation had while it ran.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "tcp,self",
          "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
LINE = re.compile(r"np=(\d+) bytes=(\d+) .*?time=([0-9.]+) us .*busbw=([0-9.]+) GB/s(?: cpu=([0-9.]+) us)?")


def run(cmd, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"[cross_bench] timed out: {' '.join(cmd)}", file=sys.stderr)
        return {}
    if p.returncode != 0:
        print(f"[cross_bench] failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}", file=sys.stderr)
    out = {}
    for m in LINE.finditer(p.stdout):
        cpu = float(m.group(5)) if m.group(5) else None
        out[int(m.group(2))] = (float(m.group(3)), float(m.group(4)), cpu)
    return out


def human(b):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return f"{b // s} {unit}"
    return f"{b} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--smoke", action="store_true", help="one round, 4 KiB and 64 KiB only")
    ap.add_argument("--mpi-rounds", type=int, default=None, help="run Open MPI in the first N rounds only")
    ap.add_argument("--only", choices=("flat", "hier"), help="run only one rank per host (flat) or only the "
                    "hierarchical 2x2 cases (hier; Open MPI np=4 runs with them as the reference)")
    ap.add_argument("--hosts", type=int, choices=(2, 4), help="only the flat cases with this many hosts")
    ap.add_argument("--sizes", help="comma-separated sizes in bytes instead of 4 KiB .. --max-bytes")
    ap.add_argument("--sender-thread", action="store_true", help="also run erun-tcp with its sender thread "
                    "forced on at 4 hosts (tcp-thread)")
    a = ap.parse_args()
    xbench = os.path.join(a.build_dir, "bench/cross_allreduce_bench")
    mpibench = os.path.join(a.build_dir, "bench/mpi_allreduce_bench")
    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
    sizes = [s for s in sizes if s <= a.max_bytes]
    if a.sizes:
        try:
            sizes = [int(x) for x in a.sizes.split(",")]
        except ValueError:
            ap.error(f"--sizes {a.sizes!r}: give sizes in bytes separated by commas, e.g. 16777216,67108864")
    if a.smoke:
        sizes, a.rounds = sizes[:2], 1
    args = [str(s) for s in sizes]
    have_mpi = shutil.which("mpirun") and os.path.exists(mpibench)

    cases = []  # (group, np, impl, argv)
    for np in (2, 4) if a.hosts is None else (a.hosts,):
        cases.append(("flat", np, "erun-tcp", [xbench, "tcp", str(np)] + args))
        if a.sender_thread and np == 4:
            cases.append(("flat", np, "erun-tcp-thread", [xbench, "tcp-thread", str(np)] + args))
        cases.append(("flat", np, "gloo", [xbench, "gloo", str(np)] + args))
        if have_mpi:
            cases.append(("flat", np, "openmpi-tcp", MPIRUN + ["-np", str(np), mpibench] + args))
    cases.append(("hier", 4, "hier-tcp", [xbench, "hier-tcp", "4"] + args))
    cases.append(("hier", 4, "hier-tcp-pipe", [xbench, "hier-tcp-pipe", "4"] + args))
    cases.append(("hier", 4, "hier-gloo", [xbench, "hier-gloo", "4"] + args))
    if a.only == "flat" or a.hosts:
        cases = [c for c in cases if c[0] == "flat"]
    elif a.only == "hier":
        cases = [c for c in cases if c[0] == "hier" or (c[2] == "openmpi-tcp" and c[1] == 4)]

    samples = {}  # (group, np, impl, bytes) -> [(time_us, busbw)]
    loads = []  # the 1-minute load average before each case
    for rnd in range(a.rounds):
        for group, np, impl, argv in cases:
            if impl == "openmpi-tcp" and a.mpi_rounds is not None and rnd >= a.mpi_rounds:
                continue
            loads.append(os.getloadavg()[0])
            print(f"[cross_bench] round {rnd + 1}/{a.rounds}: {impl} np={np} (load {loads[-1]:.2f})", file=sys.stderr)
            for b, v in run(argv, 1200).items():
                samples.setdefault((group, np, impl, b), []).append(v)

    def med(group, np, impl, b, i):
        # i = 0: the median time; i = 1: the busbw of that time (so that the
        # two columns agree).
        v = samples.get((group, np, impl, b))
        if not v:
            return None
        t = statistics.median(x[0] for x in v)
        if i == 2:  # the median CPU of all ranks per allreduce, in ms
            cpus = [x[2] for x in v if x[2] is not None]
            return statistics.median(cpus) / 1000 if cpus else None
        if i == 3:  # the median over rounds of CPU / time: the cores it had
            cores = [x[2] / x[0] for x in v if x[2] is not None and x[0] > 0]
            return statistics.median(cores) if cores else None
        return t if i == 0 else b / (t * 1e-6) / 1e9 * 2 * (np - 1) / np

    loads.append(os.getloadavg()[0])
    out = []
    out.append(f"1-minute load average before each case: min {min(loads):.1f}, median {statistics.median(loads):.1f}, "
               f"max {max(loads):.1f} (the machine has {os.cpu_count()} cores).\n")
    mpi_note = "" if a.mpi_rounds is None else f" (Open MPI: the first {a.mpi_rounds} round(s) only)"
    out.append(f"Median time of {a.rounds} round(s){mpi_note}; each round's time is itself the median of 5 repetitions. "
               "busbw = bytes/time x 2(n-1)/n from that time. Ratios are erun-tcp / peer (busbw) and peer / erun-tcp (time), "
               "so > 1 means erun is better.\n")
    for np in ((2, 4) if a.hosts is None else (a.hosts,)) if a.only != "hier" else ():
        out.append(f"\n**{np} hosts, one rank each** (erun-tcp: 127.0.0.2..{1 + np}; Gloo likewise; "
                   "Open MPI `--mca btl tcp,self --mca btl_tcp_if_include lo`)\n")
        thread = ("flat", np, "erun-tcp-thread", sizes[0]) in samples
        out.append("| size | erun-tcp time (µs) | busbw (GB/s) | Open MPI time | busbw | Gloo time | busbw | "
                   "busbw vs MPI | time vs MPI | busbw vs Gloo | CPU/op erun, Gloo (ms) | cores erun, Gloo | "
                   + ("sender thread: time (µs), vs Gloo, CPU/op (ms), cores | " if thread else "") + "targets |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if thread else "") + "---|")
        for b in sizes:
            et, eb = med("flat", np, "erun-tcp", b, 0), med("flat", np, "erun-tcp", b, 1)
            mt, mb = med("flat", np, "openmpi-tcp", b, 0), med("flat", np, "openmpi-tcp", b, 1)
            gt, gb = med("flat", np, "gloo", b, 0), med("flat", np, "gloo", b, 1)
            f = lambda x, d=1: "—" if x is None else f"{x:.{d}f}"
            # Same size and np: the busbw ratio is the inverse time ratio
            # (computed from times, which are not rounded to 0).
            r_mt = mt / et if et and mt else None
            r_mb = r_mt
            r_gb = gt / et if et and gt else None
            notes = []
            if b >= 64 << 10 and r_mb is not None:
                notes.append(f"busbw ≥ MPI: {'met' if r_mb >= 1 else 'not met'}")
            if b == 4 << 10 and r_mt is not None:
                notes.append(f"4 KiB within 2x of MPI: {'met' if r_mt >= 0.5 else 'not met'}")
            if r_gb is not None:
                notes.append(f"≥ Gloo: {'met' if r_gb >= 1 else 'not met'}")
            extra = ""
            if thread:
                tt = med("flat", np, "erun-tcp-thread", b, 0)
                extra = (f"{f(tt)}, {f(gt / tt if tt and gt else None, 2)}, {f(med('flat', np, 'erun-tcp-thread', b, 2), 2)}, "
                         f"{f(med('flat', np, 'erun-tcp-thread', b, 3), 2)} | ")
            out.append(f"| {human(b)} | {f(et)} | {f(eb, 3)} | {f(mt)} | {f(mb, 3)} | {f(gt)} | {f(gb, 3)} | "
                       f"{f(r_mb, 2)} | {f(r_mt, 2)} | {f(r_gb, 2)} | "
                       f"{f(med('flat', np, 'erun-tcp', b, 2), 2)}, {f(med('flat', np, 'gloo', b, 2), 2)} | "
                       f"{f(med('flat', np, 'erun-tcp', b, 3), 2)}, {f(med('flat', np, 'gloo', b, 3), 2)} | "
                       f"{extra}{'; '.join(notes)} |")
    if a.only == "flat" or a.hosts:
        print("\n".join(out))
        return
    out.append("\n**Hierarchical, 2 hosts x 2 ranks** (shared memory inside a host, the named transport between "
               "the host leaders; Open MPI: 4 ranks over TCP only; hier-tcp-pipe forces the chunked pipeline, which "
               "hier-tcp uses only when every host has a CPU to spare)\n")
    out.append("| size | hier-tcp time (µs) | busbw (GB/s) | hier-tcp-pipe time | hier-gloo time | busbw | "
               "Open MPI np=4 time | busbw | hier-tcp vs hier-gloo (busbw) | forced pipeline (hier-tcp / pipe time) |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for b in sizes:
        ht, hb = med("hier", 4, "hier-tcp", b, 0), med("hier", 4, "hier-tcp", b, 1)
        gt, gb = med("hier", 4, "hier-gloo", b, 0), med("hier", 4, "hier-gloo", b, 1)
        mt, mb = med("flat", 4, "openmpi-tcp", b, 0), med("flat", 4, "openmpi-tcp", b, 1)
        f = lambda x, d=1: "—" if x is None else f"{x:.{d}f}"
        st = med("hier", 4, "hier-tcp-pipe", b, 0)
        out.append(f"| {human(b)} | {f(ht)} | {f(hb, 3)} | {f(st)} | {f(gt)} | {f(gb, 3)} | {f(mt)} | {f(mb, 3)} | "
                   f"{f(gt / ht if ht and gt else None, 2)} | {f(ht / st if ht and st else None, 2)} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
