#!/usr/bin/env python3
"""What a preemption notice costs, with the drain and without (issue 34).

Runs examples/train_mlp under erun on two simulated hosts (--launcher local,
a discovery script naming 127.0.0.2 and 127.0.0.3, one worker each,
--min-np 1), and once training runs sends the notice a scheduler sends: a
SIGTERM to the second host's agent ("agent"), or to every process of that
host at once ("host", as Slurm's preemption and a cgroup signal deliver it).
Each run is done twice, side by side:
  drain:    erun's default (--drain-timeout 20): the host leaves at its
            worker's next commit;
  no drain: --drain-timeout 0, the behaviour before issue 34: the SIGTERM
            stops the worker, a failure.
It measures rank 0's steps lost (the survivor, which runs from the start:
steps it computed minus the steps in the final model, i.e. rolled back), the
time from the signal to the first generation formed after it (every rank
joined: the job runs at its new size), the resets
by reason, and whether the final model is the uninterrupted run's.

  python3 bench/preemption.py --build build [--runs 3] [--commit-every 25] [--target agent|host]
"""
import argparse
import calendar
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import checksum, children_of, discovery_script, parent_of, wait_for, worker_on  # noqa: E402


def args_for(commit_every):
    return ["--samples", "8000", "--epochs", "6", "--batch", "256", "--commit-every", str(commit_every),
            "--step-ms", "40"]


def wall(e):
    """An event's wall-clock time ("2026-11-28T11:04:19.534Z") in Unix seconds."""
    return calendar.timegm(time.strptime(e["time"][:19], "%Y-%m-%dT%H:%M:%S")) + int(e["time"][20:23]) / 1000












def one_run(erun, program, work, drain, target, commit_every, reference, delay):
    disc = discovery_script(work, "127.0.0.2:1\n127.0.0.3:1\n")
    events = os.path.join(work, "events.jsonl")
    cmd = [erun, "--driver-grace", "0", "--launcher", "local", "--host-discovery-script", disc,
           "--discovery-interval", "0.2", "-np", "2", "--min-np", "1", "--term-grace", "2",
           "--drain-timeout", "20" if drain else "0", "--event-log", events, program] + args_for(commit_every)
    out, err = os.path.join(work, "out"), os.path.join(work, "err")
    with open(out, "w") as o, open(err, "w") as e:
        job = subprocess.Popen(cmd, stdout=o, stderr=e, cwd=work)
        if not wait_for(out, ":epoch 1 loss=", 120):
            job.kill()
            raise RuntimeError("erun did not reach epoch 1")
        time.sleep(delay)  # somewhere in the commit interval
        leaving = worker_on(program, "127.0.0.3", work)
        agent = parent_of(leaving)
        pids = [agent] + (children_of(agent) if target == "host" else [])
        start = time.time()
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        code = job.wait(timeout=300)
    text = open(out, errors="replace").read()
    ev = [json.loads(line) for line in open(events) if line.strip()]
    smaller = None
    for e in ev:  # the first generation formed after the signal (event log's wall clock)
        if e["event"] == "generation_joined" and smaller is None and wall(e) >= start - 0.001:
            smaller = wall(e) - start
    m = re.search(r"rank 0 pid \d+: steps run (\d+), in the model (\d+)", text)
    lost = int(m.group(1)) - int(m.group(2)) if m else None
    reasons = [e["reason"] for e in ev if e["event"] == "reset"]
    return {"code": code, "lost": lost, "smaller": smaller, "exact": checksum(text) == reference,
            "failed_resets": reasons.count("worker failed"), "resets": len(reasons),
            "drained": any(e["event"] == "host_drained" for e in ev)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--commit-every", type=int, default=25, help="steps of 40 ms between commits")
    ap.add_argument("--target", choices=["agent", "host"], default="agent")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    erun = os.path.join(build, "src/runner/erun")
    ref = subprocess.run([os.path.join(build, "examples/train_mlp")] + args_for(a.commit_every)[:-2] +
                         ["--step-ms", "0"], capture_output=True, text=True, timeout=300)
    reference = checksum(ref.stdout)
    interval = a.commit_every * 0.040
    rows = {True: [], False: []}
    for i in range(a.runs):
        delay = interval * (i + 0.5) / a.runs  # spread over the commit interval
        for drain in (True, False):
            work = tempfile.mkdtemp(prefix="erun-preempt-")
            program = os.path.join(work, "train_mlp_preempt")
            shutil.copy(os.path.join(build, "examples/train_mlp"), program)
            try:
                r = one_run(erun, program, work, drain, a.target, a.commit_every, reference, delay)
            finally:
                subprocess.run(["pkill", "-9", "-f", program])
                shutil.rmtree(work, ignore_errors=True)
            rows[drain].append(r)
            print(f"run {i + 1} {'drain   ' if drain else 'no drain'}: exit {r['code']} steps lost {r['lost']} "
                  f"smaller generation formed after {r['smaller']:.3f} s, resets {r['resets']} "
                  f"({r['failed_resets']} 'worker failed'), exact {r['exact']}, drained {r['drained']}", flush=True)
    for drain in (True, False):
        rs = rows[drain]
        print(f"{'drain' if drain else 'no drain'} ({a.target}, commit every {interval:.2f} s, {a.runs} runs): "
              f"steps lost median {statistics.median(r['lost'] for r in rs)} max {max(r['lost'] for r in rs)}, "
              f"signal to smaller generation median {statistics.median(r['smaller'] for r in rs):.3f} s "
              f"max {max(r['smaller'] for r in rs):.3f} s, 'worker failed' resets {sum(r['failed_resets'] for r in rs)}, "
              f"all exact {all(r['exact'] and r['code'] == 0 for r in rs)}")
    ok = all(r["lost"] == 0 and r["exact"] and r["code"] == 0 and r["failed_resets"] == 0 for r in rows[True])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
