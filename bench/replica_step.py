"""Step time with a commit replica on a spare host against none, side by side
in one run: issue 20's "step time with and without the replica". A one-host
job (-np 2 on 127.0.0.2, --launcher local) with a second host, 127.0.0.3, in
its host list: with --commit-replicas 1 (the default) the spare's agent keeps
a replica that 127.0.0.2's pusher sends it in the background; with
--commit-replicas 0 nothing is pushed. Each run is bench/step_worker with a
model of --state-mb MiB registered as a buffer and committed at every step;
the rounds alternate between the two, and a round's figure is rank 0's median
time between steps after the first 10. Also prints how many commits were
replicated and how long the pusher spent copying (its closing log line).

    /usr/bin/python3 bench/replica_step.py [--build-dir build-bench] [--state-mb 16 64]
        [--steps 120] [--step-ms 20] [--rounds 4]
"""
import argparse
import os
import re
import statistics

from host_commit_step import median_step, worker_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUSHED = re.compile(r"(\d+) commit\(s\) replicated to 127\.0\.0\.3 \(([0-9.]+) MiB, ([0-9.]+) s copying\)")


def step_time(build, mb, steps, step_ms, replicas):
    """Median step, and the commits replicated and seconds spent copying
    (the pusher's closing line)."""
    cmd = [os.path.join(build, "src/runner/erun"), "-np", "2", "-H", "127.0.0.2:2,127.0.0.3:2", "--launcher", "local",
           "--commit-replicas", str(replicas)] + worker_args(build, mb, steps, step_ms)
    step, err = median_step(cmd)
    m = PUSHED.search(err)
    return step, (int(m.group(1)) if m else 0), (float(m.group(3)) if m else 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--state-mb", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--step-ms", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=4)
    o = ap.parse_args()
    print(f"np=2 steps={o.steps} step-ms={o.step_ms} rounds={o.rounds} load={os.getloadavg()[0]:.2f}")
    print("| state | no replica (median step) | replica on the spare (median step) | with / without "
          "| commits replicated per run | pusher's copying per run |")
    print("|---|---|---|---|---|---|")
    for mb in o.state_mb:
        runs = {1: [], 0: []}
        pushed, busy = [], []
        for r in range(o.rounds):
            for rep in ((1, 0) if r % 2 == 0 else (0, 1)):
                t, n, b = step_time(o.build_dir, mb, o.steps, o.step_ms, rep)
                runs[rep].append(t)
                if rep:
                    pushed.append(n)
                    busy.append(b)
        off, on = statistics.median(runs[0]), statistics.median(runs[1])
        print(f"| {mb} MiB | {off * 1e3:.2f} ms | {on * 1e3:.2f} ms | {on / off:.3f}x "
              f"| {statistics.median(pushed):.0f} | {statistics.median(busy):.2f} s |", flush=True)


if __name__ == "__main__":
    main()
