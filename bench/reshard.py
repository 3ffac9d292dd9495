#!/usr/bin/env python3
"""Resharding from memory against the peer path (issue 49).

erun: bench/reshard_worker.py keeps one sharded float32 entry of --mib MiB
in all (erun.State.register_shard), 4 ranks on two simulated hosts
(--launcher local: node-a:2, node-b:2; each host its own /dev/shm commit
directory, the hosts talking over loopback TCP). A worker of node-b is
SIGKILLed as node-b's slots drop to 1 (4 -> 3 ranks), then node-b's second
slot comes back (3 -> 4). Measured: from the kill (or the hosts file's
change) to the last rank training again (its reset line), the reshard's
own time and the bytes read over the network (the workers' "resharded"
lines).

Peer path, in the same run (the venv's torch, gloo on the CPU, torchrun):
the same rows as a DTensor Shard(0) over 4 ranks written with
torch.distributed.checkpoint.save, then read with resharding into 3 ranks
by dcp.load (torchtitan's way to change the data-parallel degree), to
/dev/shm and to disk; and the wall time of torchrun's restart of 3
processes up to the end of that load. Each rank also samples its RssAnon
every 2 ms: the peak around each reset, against its old piece plus its new
one (the host-memory files are shared memory, not counted there).

  python3 bench/reshard.py --build build [--mib 256 2048] [--venv .venv]
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import discovery_script, wait_for, worker_on  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "reshard_worker.py")


def count(path, pattern):
    return len(re.findall(pattern, open(path, errors="replace").read())) if os.path.exists(path) else 0


def wait_count(path, pattern, n, limit):
    end = time.time() + limit
    while time.time() < end:
        if count(path, pattern) >= n:
            return True
        time.sleep(0.01)
    return False


def text_since(path, offset):
    with open(path, errors="replace") as f:
        f.seek(offset)
        return f.read()


def size_of(path):
    return os.path.getsize(path) if os.path.exists(path) else 0


def phase(out, err, change, pattern, n):
    """Applies `change`, then waits for `n` reset lines matching `pattern`
    (after it); returns seconds to the last of them, the bytes the reshard
    read over the network (all ranks) and its longest time (ms)."""
    o0, e0 = size_of(out), size_of(err)
    t0 = time.time()
    change()
    end = time.time() + 300
    while len(re.findall(pattern, text_since(out, o0))) < n:
        if time.time() > end:
            raise RuntimeError(f"no '{pattern}' x{n}:\n" + text_since(err, e0)[-3000:])
        time.sleep(0.01)
    times = [float(t) for t in re.findall(pattern + r" at=([0-9.]+)", text_since(out, o0))]
    time.sleep(0.5)  # the ranks' "resharded" lines come through the agents, on erun's stdout
    found = re.findall(r"resharded commit \d+ for \d+ ranks \((\d+) bytes from other hosts, ([0-9.]+) ms\)",
                       text_since(out, o0))
    peaks = re.findall(pattern + r" at=[0-9.]+ peak anon above the start ([0-9.]+) MiB; old piece ([0-9.]+) MiB, "
                       r"new piece ([0-9.]+) MiB", text_since(out, o0))
    return {"s": max(times) - t0, "net": sum(int(b) for b, _ in found),
            "ms": max((float(ms) for _, ms in found), default=float("nan")),
            # The most a rank's anonymous memory rose above its old piece + its new piece.
            "over": max((float(p) - float(a) - float(b) for p, a, b in peaks), default=float("nan")),
            "peak": max((float(p) for p, _, _ in peaks), default=float("nan"))}


def write_hosts(work, text):
    tmp = os.path.join(work, "hosts.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(work, "hosts"))


def erun_run(build, python, mib, work):
    disc = discovery_script(work, "node-a:2\nnode-b:2\n")
    worker = os.path.join(work, "reshard_worker.py")
    shutil.copy(WORKER, worker)
    out, err = os.path.join(work, "out"), os.path.join(work, "err")
    env = dict(os.environ, ERUN_LOG_LEVEL="info", PYTHONPATH=os.path.join(build, "python"))
    cmd = [os.path.join(build, "src/runner/erun"), "--driver-grace", "0", "--launcher", "local",
           "--host-discovery-script", disc, "--discovery-interval", "0.2", "-np", "4", "--min-np", "2",
           "--max-np", "4", "--term-grace", "2", "--standby", "0", python, worker, "erun", "--mib", str(mib)]
    res = {}
    with open(out, "w") as o, open(err, "w") as e:
        job = subprocess.Popen(cmd, stdout=o, stderr=e, cwd=work, env=env)
        try:
            if not wait_count(out, r"rank \d ready", 4, 300):
                raise RuntimeError("the job did not start:\n" + open(err).read()[-3000:])
            time.sleep(1.0)
            # A planned shrink: node-b's second slot leaves (its worker commits and goes).
            res["shrink"] = phase(out, err, lambda: write_hosts(work, "node-a:2\nnode-b:1\n"), r"reset 4 -> 3", 3)
            time.sleep(1.0)
            # A failure: node-b's worker is SIGKILLed; the others go on (alone, then with its replacement).
            victim = worker_on(python, "node-b", work)
            res["kill"] = phase(out, err, lambda: os.kill(victim, signal.SIGKILL), r"reset 3 -> \d", 2)
            wait_count(out, r"-> 3 at=", 3 + 3, 300)
            time.sleep(1.0)
            # A grow: node-b's second slot comes back.
            res["grow"] = phase(out, err, lambda: write_hosts(work, "node-a:2\nnode-b:2\n"), r"reset 3 -> 4", 4)
        finally:
            job.send_signal(signal.SIGINT)
            try:
                job.wait(60)
            except subprocess.TimeoutExpired:
                job.kill()
    return res


def torchrun(venv, n, mode, mib, ckpt, work):
    cmd = [os.path.join(venv, "bin", "torchrun"), "--standalone", f"--nproc_per_node={n}", WORKER, mode,
           "--mib", str(mib), "--dir", ckpt]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=work, timeout=1800,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        raise RuntimeError(f"torchrun {mode} failed:\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
    m = re.search(r": ([0-9.]+) s; started at ([0-9.]+) done at ([0-9.]+)", r.stdout)
    return float(m.group(1)), float(m.group(3)) - t0


def dcp_run(venv, mib, where, work):
    ckpt = tempfile.mkdtemp(prefix="erun-dcp-", dir=where)
    try:
        save, _ = torchrun(venv, 4, "dcp-save", mib, ckpt, work)
        load, wall = torchrun(venv, 3, "dcp-load", mib, ckpt, work)
        return {"save": save, "load": load, "restart_load": wall}
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--venv", default=".venv")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--mib", type=int, nargs="+", default=[256, 2048])
    ap.add_argument("--disk", default="/var/tmp")
    o = ap.parse_args()
    build, venv = os.path.abspath(o.build), os.path.abspath(o.venv)
    for mib in o.mib:
        work = tempfile.mkdtemp(prefix="erun-reshard-")
        try:
            e = erun_run(build, o.python, mib, work)
            shm = dcp_run(venv, mib, "/dev/shm", work)
            disk = dcp_run(venv, mib, o.disk, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"{mib} MiB of sharded state, 4 ranks on 2 hosts:")
        for name, what in (("shrink", "4 -> 3, a slot leaves"), ("kill", "3 -> 2, a worker SIGKILLed"),
                           ("grow", "3 -> 4, a slot comes back")):
            r = e[name]
            print(f"  erun {what}: training again after {r['s']:.3f} s; reshard {r['ms']:.1f} ms (longest rank); "
                  f"{r['net'] / 2**20:.1f} MiB over the network; peak anonymous memory {r['peak']:.0f} MiB above "
                  f"the start, {r['over']:+.1f} MiB beyond old + new piece (worst rank)")
        for name, d in (("/dev/shm", shm), ("disk", disk)):
            total = d["save"] + d["load"]
            print(f"  DCP to {name}: save (4 ranks) {d['save']:.3f} s + load resharded (3 ranks) {d['load']:.3f} s = "
                  f"{total:.3f} s ({total / (e['shrink']['ms'] / 1000):.0f}x erun's 4 -> 3 reshard); torchrun "
                  f"restart of 3 + load {d['restart_load']:.3f} s")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
