#!/usr/bin/env python3
"""Step time of a sharded job with buddy copies against none, side by side
in one run (issue 49: "step time with and without buddies").

bench/reshard_worker.py's erun mode: one sharded float32 entry of --mib MiB
in all, 4 ranks on two simulated hosts (--launcher local, node-a:2 and
node-b:2, each host its own /dev/shm commit directory), a commit every
--commit-every steps of --step-ms (a sleep, then a barrier). With
--commit-replicas 1 (the default) each commit's piece is also pushed to a
buddy on the other host, on a thread beside training, and the next commit
waits for that push; with --commit-replicas 0 nothing leaves the host.
The rounds alternate between the two; a round's figures are rank 0's mean
step (commits included, the first two commit intervals left out) and its
median commit.

    /usr/bin/python3 bench/buddy_step.py --build build [--mib 256 1024] [--steps 200]
        [--step-ms 50] [--commit-every 10] [--rounds 3]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import discovery_script  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TIMING = re.compile(r"timing: (\d+) steps, mean step ([0-9.]+) ms, median step ([0-9.]+) ms; (\d+) commits, "
                    r"median commit ([0-9.]+) ms")


def one_run(build, python, mib, o, replicas):
    """(mean step s, median commit s) of rank 0 in one job."""
    work = tempfile.mkdtemp(prefix="erun-buddy-step-")
    try:
        disc = discovery_script(work, "node-a:2\nnode-b:2\n")
        worker = os.path.join(work, "reshard_worker.py")
        shutil.copy(os.path.join(HERE, "reshard_worker.py"), worker)
        env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
        cmd = [os.path.join(build, "src/runner/erun"), "--driver-grace", "0", "--launcher", "local",
               "--host-discovery-script", disc, "-np", "4", "--standby", "0",
               "--commit-replicas", str(replicas), python, worker, "erun", "--mib", str(mib),
               "--steps", str(o.steps), "--step-ms", str(o.step_ms), "--commit-every", str(o.commit_every),
               "--timing"]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=env, timeout=900)
        m = TIMING.search(r.stdout)
        if r.returncode != 0 or not m:
            raise RuntimeError(f"erun exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        return float(m.group(2)) / 1e3, float(m.group(5)) / 1e3
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--mib", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-ms", type=int, default=50)
    ap.add_argument("--commit-every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    o = ap.parse_args()
    o.build = os.path.abspath(o.build)
    print(f"4 ranks on 2 hosts, steps={o.steps} step-ms={o.step_ms} commit-every={o.commit_every} "
          f"rounds={o.rounds} load={os.getloadavg()[0]:.2f}")
    print("| state in all | piece per rank | no copies: mean step / median commit | buddy copies: mean step / "
          "median commit | step with / without |")
    print("|---|---|---|---|---|")
    for mib in o.mib:
        runs = {0: [], 1: []}
        for r in range(o.rounds):
            for rep in ((1, 0) if r % 2 == 0 else (0, 1)):
                runs[rep].append(one_run(o.build, o.python, mib, o, rep))
        step = {k: statistics.median(x for x, _ in v) for k, v in runs.items()}
        commit = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        print(f"| {mib} MiB | {mib / 4:.0f} MiB | {step[0] * 1e3:.1f} / {commit[0] * 1e3:.1f} ms "
              f"| {step[1] * 1e3:.1f} / {commit[1] * 1e3:.1f} ms | {step[1] / step[0]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
