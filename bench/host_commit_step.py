"""Step time with host-memory commits (erun's default) against commits kept
in worker memory only (--no-host-commits), side by side in one run: issue
20's "step time with and without the replica". Each configuration runs
bench/step_worker with a model of --state-mb MiB registered as a buffer and
committed at every step; the rounds alternate between the two, and a round's
figure is rank 0's median time between steps after the first 10.

    /usr/bin/python3 bench/host_commit_step.py [--build-dir build-bench] [--np 2]
        [--state-mb 16 64] [--steps 120] [--step-ms 20] [--rounds 4]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = re.compile(r"STEP .*rank=0 .*step=(\d+) t=([0-9.]+)$", re.M)


def worker_args(build, mb, steps, step_ms):
    """bench/step_worker committing a model of `mb` MiB at every step."""
    return [os.path.join(build, "bench/step_worker"), "--steps", str(steps), "--step-ms", str(step_ms),
            "--floats", "1024", "--state-floats", str(mb * (1 << 20) // 4)]


def median_step(cmd):
    """Runs `cmd` (erun and step_worker); rank 0's median time between steps
    after the first 10, and the run's stderr."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    t = {int(s): float(x) for s, x in STEP.findall(out.stdout)}
    ts = [t[s] for s in sorted(t) if s > 10]
    return statistics.median(b - a for a, b in zip(ts, ts[1:])), out.stderr


def step_time(build, np_, mb, steps, step_ms, host_commits):
    erun = os.path.join(build, "src/runner/erun")
    cmd = [erun, "-np", str(np_)] + ([] if host_commits else ["--no-host-commits"]) + worker_args(
        build, mb, steps, step_ms)
    return median_step(cmd)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--state-mb", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--step-ms", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=4)
    o = ap.parse_args()
    print(f"np={o.np} steps={o.steps} step-ms={o.step_ms} rounds={o.rounds} load={os.getloadavg()[0]:.2f}")
    print("| state | worker memory only (median step) | host memory (median step) | host / worker |")
    print("|---|---|---|---|")
    for mb in o.state_mb:
        runs = {True: [], False: []}
        for r in range(o.rounds):
            for host in ((True, False) if r % 2 == 0 else (False, True)):
                runs[host].append(step_time(o.build_dir, o.np, mb, o.steps, o.step_ms, host))
        off, on = statistics.median(runs[False]), statistics.median(runs[True])
        print(f"| {mb} MiB | {off * 1e3:.2f} ms | {on * 1e3:.2f} ms | {on / off:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
