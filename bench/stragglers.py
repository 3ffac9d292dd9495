#!/usr/bin/env python3
"""What a straggler costs, and what finding it costs (issue 35).

1. Epoch time of examples/train_mlp on four simulated hosts (--launcher
   local, one worker each, --min-np 2): healthy; with one worker slowed to a
   fifth of its speed (SIGSTOP 80 ms / SIGCONT 20 ms, from epoch 1 on) under
   --stragglers off; and the same under --stragglers evict (the default).
   Reported per run: the median epoch time over epochs 3..9 (after the
   slowdown began and, with evict, after the straggler left), the time from
   the slowdown to the smaller generation, and whether the model is the
   uninterrupted run's.
2. The timing's overhead: bench/step_worker (a 4 KiB allreduce and a commit
   per step, no compute: the worst case) under erun -np 2 on this machine,
   with the per-collective timing on (default) and off (ERUN_STEP_TIMING=0),
   alternating, the median steps per second of each.

  python3 bench/stragglers.py --build build [--overhead-runs 5] [--steps 20000]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import checksum, discovery_script, slow_down, wait_for, worker_on  # noqa: E402

ARGS = ["--samples", "8000", "--epochs", "10", "--batch", "256", "--commit-every", "5", "--step-ms", "40"]








def epoch_run(erun, build, policy, slowed, reference):
    work = tempfile.mkdtemp(prefix="erun-straggler-")
    program = os.path.join(work, "train_mlp_straggler")
    shutil.copy(os.path.join(build, "examples/train_mlp"), program)
    try:
        disc = discovery_script(work, "".join(f"127.0.0.{2 + i}:1\n" for i in range(4)))
        cmd = [erun, "--driver-grace", "0", "--launcher", "local", "--host-discovery-script", disc,
               "--discovery-interval", "0.2", "-np", "4", "--min-np", "2", "--stragglers", policy,
               "--blacklist-cooldown-range", "600", "600", program] + ARGS
        out, err = os.path.join(work, "out"), os.path.join(work, "err")
        stop = threading.Event()
        thread = None
        with open(out, "w") as o, open(err, "w") as e:
            job = subprocess.Popen(cmd, stdout=o, stderr=e, cwd=work, env=dict(os.environ, ERUN_LOG_LEVEL="info"))
            if not wait_for(out, ":epoch 0 loss=", 120):
                job.kill()
                raise RuntimeError("no epoch 0")
            start = time.time()
            if slowed:
                thread = threading.Thread(target=slow_down, args=(worker_on(program, "127.0.0.5", work), stop))
                thread.start()
            smaller = None
            while job.poll() is None:
                if smaller is None and "world size 4 -> 3" in open(out, errors="replace").read():
                    smaller = time.time() - start
                time.sleep(0.05)
            stop.set()
            if thread:
                thread.join()
        text = open(out, errors="replace").read()
        times = [float(t) for t in re.findall(r":epoch \d+ loss=.* time=([0-9.]+)s", text)]
        return {"code": job.returncode, "epoch": statistics.median(times[3:]) if len(times) >= 10 else None,
                "smaller": smaller, "exact": checksum(text) == reference}
    finally:
        subprocess.run(["pkill", "-9", "-f", program])
        shutil.rmtree(work, ignore_errors=True)


def overhead_run(erun, build, timing, steps):
    env = dict(os.environ, ERUN_STEP_TIMING="1" if timing else "0", ERUN_LOG_LEVEL="info")
    cmd = [erun, "--driver-grace", "0", "-np", "2", "-x", "ERUN_STEP_TIMING", os.path.join(build, "bench/step_worker"),
           "--steps", str(steps), "--step-ms", "0", "--commit-every", "1", "--floats", "1024"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    ts = [float(t) for t in re.findall(r"STEP pid=\d+ host=\S+ rank=0 .* t=([0-9.]+)", r.stdout)]
    if r.returncode != 0 or len(ts) < steps // 2:
        raise RuntimeError(f"step_worker failed: {r.stderr[-2000:]}")
    return (len(ts) - 1) / (ts[-1] - ts[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--overhead-runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20000)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    erun = os.path.join(build, "src/runner/erun")
    ref = subprocess.run([os.path.join(build, "examples/train_mlp")] + ARGS[:-2] + ["--step-ms", "0"],
                         capture_output=True, text=True, timeout=300)
    reference = checksum(ref.stdout)
    for name, policy, slowed in (("healthy", "evict", False), ("one slowed, --stragglers off", "off", True),
                                 ("one slowed, --stragglers evict", "evict", True)):
        r = epoch_run(erun, build, policy, slowed, reference)
        smaller = f"{r['smaller']:.1f} s" if r["smaller"] is not None else "never"
        print(f"{name}: exit {r['code']}, median epoch (3-9) {r['epoch']:.2f} s, smaller generation after "
              f"{smaller}, exact {r['exact']}", flush=True)
    on, off = [], []
    for _ in range(a.overhead_runs):
        on.append(overhead_run(erun, build, True, a.steps))
        off.append(overhead_run(erun, build, False, a.steps))
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"timing overhead ({a.overhead_runs} runs each of {a.steps} steps, a 4 KiB allreduce and a commit per "
          f"step): on {m_on:.0f} steps/s, off {m_off:.0f} steps/s, overhead {100 * (m_off - m_on) / m_off:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
