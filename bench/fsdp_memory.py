#!/usr/bin/env python3
"""Peak memory of an FSDP2 model resharded in memory (issue 49, target (e)).

bench/fsdp_memory_worker.py holds an FSDP2 model of --mib MiB of float32
parameters with Adam (three times that in state: parameters, exp_avg,
exp_avg_sq) in an erun.torch.FSDPState, 2 ranks on simulated host node-a
(--launcher local); after --grow-at steps node-b's slot is added (2 -> 3:
every survivor's pieces resharded from 1/2 to 1/3 of the state, the model
and optimizer rebuilt on the new mesh). Each survivor samples its RssAnon
every 2 ms from just before the re-join to the end of the sync and rebuild.

Target: peak <= the survivor's memory without its pieces + its old pieces +
its new pieces + 64 MiB, i.e. peak - before <= new + 64 MiB.

  python3 bench/fsdp_memory.py --build build --venv .venv [--mib 192]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import discovery_script, wait_for  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MEM = re.compile(r"MEM pid (\d+) world (\d+)->(\d+) before_kb (\d+) peak_kb (\d+) after_kb (\d+) old_kb (\d+) "
                 r"new_kb (\d+)")


def run(o, work):
    disc = discovery_script(work, "node-a:2\n")
    out_path = os.path.join(work, "out.txt")
    env = dict(os.environ, PYTHONPATH=os.path.join(o.build, "python"))
    argv = [os.path.join(o.build, "src/runner/erun"), "--launcher", "local", "--host-discovery-script", disc,
            "--discovery-interval", "0.2", "-np", "2", "--min-np", "2", "--max-np", "3",
            os.path.join(o.venv, "bin/python"), os.path.join(HERE, "fsdp_memory_worker.py"),
            "--mib", str(o.mib), "--steps", str(o.grow_at + 12), "--step-ms", "200"]
    with open(out_path, "w") as out, open(os.path.join(work, "err.txt"), "w") as err:
        p = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        if not wait_for(out_path, f"step {o.grow_at} world 2", 600):
            p.kill()
            sys.exit("fsdp_memory: training at 2 ranks did not reach step %d" % o.grow_at)
        with open(os.path.join(work, "hosts"), "w") as f:
            f.write("node-a:2\nnode-b:1\n")
        code = p.wait(timeout=900)
    text = open(out_path, errors="replace").read()
    if code != 0:
        sys.exit(f"fsdp_memory: erun exited {code}\n{text[-3000:]}")
    return [tuple(int(g) for g in m.groups()) for m in MEM.finditer(text)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--venv", default=".venv")
    ap.add_argument("--mib", type=int, default=192)
    ap.add_argument("--grow-at", type=int, default=6)
    o = ap.parse_args()
    o.build, o.venv = os.path.abspath(o.build), os.path.abspath(o.venv)
    with tempfile.TemporaryDirectory(prefix="erun-fsdp-mem-") as work:
        lines = run(o, work)
    survivors = [m for m in lines if m[1] == 2 and m[2] == 3 and m[3] > 0]  # the joiner has no "before"
    if len(survivors) != 2:
        sys.exit(f"fsdp_memory: expected the 2 survivors' MEM lines for 2->3, got {lines}")
    print(f"state: {o.mib} MiB of parameters, {3 * o.mib} MiB with Adam's two states")
    for pid, _, _, before, peak, after, old, new in survivors:
        rise = (peak - before) / 1024
        verdict = "met" if rise <= new / 1024 + 64 else "NOT met"
        print(f"RESULT fsdp_memory pid {pid}: pieces {old / 1024:.0f} -> {new / 1024:.0f} MiB, RssAnon before "
              f"{before / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB (+{rise:.1f} MiB), after {after / 1024:.0f} MiB; "
              f"target peak - before <= new + 64 MiB = {new / 1024 + 64:.0f} MiB: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
