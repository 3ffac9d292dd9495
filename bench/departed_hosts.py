#!/usr/bin/python3
"""What a host that left discovery leaves in erun (issue 47, docs/performance.md §21).

One job of examples/train_mlp on node-a:2 (--launcher local, simulated hosts
named by a discovery script). Discovery then lists N new names one after
another (fresh-1:1, fresh-2:1, ...), each for --hold seconds beside node-a,
then drops it: the job grows onto it and shrinks back. The bench counts, right
before the first new name and --settle seconds after the last was dropped,
erun's open descriptors (the least of 5 counts 0.1 s apart: the discovery
script's pipes come and go) and threads, and the agents (`erun --agent`
children of erun), also once the first new name has left. Every host that
left should leave nothing: the same counts at the end as after the first.

    /usr/bin/python3 bench/departed_hosts.py --build build
    /usr/bin/python3 bench/departed_hosts.py --build build --hosts 4 --hold 2   # quick

Exit status 0 when the counts at the end equal those after the first new name
left and the job stopped cleanly on SIGTERM, 1 otherwise.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import children_of, discovery_script, wait_for  # noqa: E402


def fds(pid):
    least = None
    for _ in range(5):
        n = len(os.listdir(f"/proc/{pid}/fd"))
        least = n if least is None else min(least, n)
        time.sleep(0.1)
    return least


def threads(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


def agents(pid):
    out = []
    for c in children_of(pid):
        try:
            if b"--agent" in open(f"/proc/{c}/cmdline", "rb").read().split(b"\0"):
                out.append(c)
        except OSError:
            pass
    return out


def fd_targets(pid):
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def kinds(targets):
    """socket:[123] -> socket, pipe:[4] -> pipe, anon_inode:[eventfd] -> anon_inode:[eventfd], a path -> the path."""
    out = {}
    for t in targets:
        k = t.split(":[")[0] if t.startswith(("socket:", "pipe:")) else t
        out[k] = out.get(k, 0) + 1
    return out


def sample(pid):
    return {"fds": fds(pid), "threads": threads(pid), "agents": len(agents(pid)), "kinds": kinds(fd_targets(pid))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--hosts", type=int, default=12, help="new names listed one after another")
    ap.add_argument("--hold", type=float, default=3.0, help="seconds each new name is listed")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds after the last is dropped")
    args = ap.parse_args()
    erun = os.path.abspath(os.path.join(args.build, "src/runner/erun"))
    train = os.path.abspath(os.path.join(args.build, "examples/train_mlp"))
    work = tempfile.mkdtemp(prefix="erun-departed-")
    disc = discovery_script(work, "node-a:2\n")
    log = open(os.path.join(work, "erun.log"), "w+")
    cmd = [erun, "-np", "2", "--min-np", "2", "--max-np", "3", "--launcher", "local",
           "--host-discovery-script", disc, "--discovery-interval", "0.2",
           train, "--samples", "8000", "--batch", "256", "--commit-every", "5", "--step-ms", "20",
           "--epochs", "1000000"]
    env = dict(os.environ, ERUN_LOG_LEVEL="info")  # the lines that name each host's worker and agent
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    ok = True
    try:
        if not wait_for(log.name, "epoch 1 ", 120):
            print("departed_hosts: the job did not train", file=sys.stderr)
            return 1
        time.sleep(1)
        before = sample(p.pid)
        print(f"start: erun {before['fds']} fds, {before['threads']} threads; {before['agents']} agent(s)")
        first = None
        for i in range(1, args.hosts + 1):
            with open(os.path.join(work, "hosts"), "w") as f:
                f.write(f"node-a:2\nfresh-{i}:1\n")
            time.sleep(args.hold)
            with open(os.path.join(work, "hosts"), "w") as f:
                f.write("node-a:2\n")
            time.sleep(0.5)
            if i == 1:
                time.sleep(args.settle)
                first = sample(p.pid)
                print(f"after the first new name left: erun {first['fds']} fds, {first['threads']} threads; "
                      f"{first['agents']} agent(s)")
        time.sleep(args.settle)
        after = sample(p.pid)
        text = open(log.name).read()
        grown = sum(1 for i in range(1, args.hosts + 1) if f"agent on fresh-{i}: told to end" in text)
        print(f"after {args.hosts} new names ({grown} agents told to end): erun {after['fds']} fds, "
              f"{after['threads']} threads; {after['agents']} agent(s)")
        # Judged from the first host's leaving on: what the job keeps once (a
        # descriptor the first growth opens) is not what each host leaves.
        for k in ("fds", "threads", "agents"):  # not "kinds": printed below when they differ
            if after[k] != first[k]:
                ok = False
                print(f"  {k}: {first[k]} -> {after[k]} (+{after[k] - first[k]}) over {args.hosts - 1} hosts")
        for label, a in (("start", before), ("after the first", first)):
            if after["kinds"] != a["kinds"]:
                print(f"  descriptors by kind, {label} -> end: {a['kinds']} -> {after['kinds']}")
        print(f"  per host that left: {'nothing (met)' if ok else 'something (not met)'}")
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
            ok = False
        print(f"erun ended {rc} on SIGTERM")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
