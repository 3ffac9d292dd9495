#!/usr/bin/env python3
"""How long a worker whose slot left the job goes on (issue 36, point 5).

Two simulated hosts of two slots (--launcher local, 127.0.0.2:2 and
127.0.0.3:2), -np 4 --min-np 2 --standby 0, examples/train_mlp committing
every 50 steps of 40 ms (a commit every 2 s). Once training runs,
127.0.0.3 leaves discovery: its two workers retire. Then, side by side:
  planned: nothing else happens. The retiring workers are still in the
           survivors' collectives and leave at the commit the survivors
           re-join at (nothing rolled back): measured from the `reset` of
           the host change to the last 127.0.0.3 `worker_exited`.
  failure: right after the host change (before the next commit), a worker
           on 127.0.0.2 is SIGKILLed. The generation the retiring workers
           train is broken and the next one restores the last commit
           without them, so erun stops them at once: measured from the
           `worker_exited` of the kill to the last 127.0.0.3 `worker_exited`.
Every run must end with exit 0 at the same model, every epoch once.

  python3 bench/removed_slots.py --build build [--runs 3]
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import checksum, discovery_script, events, wait_events, wait_for, worker_on  # noqa: E402

ARGS = ["--samples", "8000", "--epochs", "6", "--batch", "256", "--commit-every", "50", "--step-ms", "40"]


def one_run(erun, build, work, failure):
    program = os.path.join(work, "train_mlp_removed_bench")
    shutil.copy(os.path.join(build, "examples/train_mlp"), program)
    disc = discovery_script(work, "127.0.0.2:2\n127.0.0.3:2\n")
    ev = os.path.join(work, "events.jsonl")
    cmd = [erun, "--driver-grace", "0", "--launcher", "local", "--host-discovery-script", disc,
           "--discovery-interval", "0.2", "-np", "4", "--min-np", "2", "--max-np", "4", "--term-grace", "2",
           "--standby", "0", "--event-log", ev, program] + ARGS
    out, err = os.path.join(work, "out"), os.path.join(work, "err")
    with open(out, "w") as o, open(err, "w") as e:
        job = subprocess.Popen(cmd, stdout=o, stderr=e, cwd=work)
        if not wait_for(out, "epoch 1 ", 120):
            job.kill()
            raise RuntimeError("the job did not start:\n" + open(err).read()[-2000:])
        victim = worker_on(program, "127.0.0.2", work)
        with open(os.path.join(work, "hosts"), "w") as f:
            f.write("127.0.0.2:2\n")
        if not wait_events(ev, "reset", 1, 30):
            job.kill()
            raise RuntimeError("no reset after the host change:\n" + open(err).read()[-2000:])
        if failure:
            os.kill(victim, signal.SIGKILL)
        code = job.wait(timeout=600)
    on_b = [x for x in events(ev, "worker_exited") if x["host"] == "127.0.0.3"]
    if failure:
        since = next(x for x in events(ev, "worker_exited") if x["exit_code"] == 137)["t"]
    else:
        since = events(ev, "reset")[0]["t"]
    gone = max(x["t"] for x in on_b[:2]) - since if len(on_b) >= 2 else None
    text = open(out, errors="replace").read()
    said = open(err, errors="replace").read()
    return {"code": code, "gone": gone, "checksum": checksum(text), "exactly_once": "exactly-once=NO" not in text,
            "resets": [x["reason"] for x in events(ev, "reset")],
            "stopped_at_once": said.count("stopping its worker now (its generation failed)")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    erun = os.path.join(build, "src/runner/erun")
    rows = {False: [], True: []}
    for i in range(a.runs):
        for failure in (False, True):
            work = tempfile.mkdtemp(prefix="erun-removed-")
            try:
                r = one_run(erun, build, work, failure)
            finally:
                subprocess.run(["pkill", "-9", "-f", work])
                shutil.rmtree(work, ignore_errors=True)
            rows[failure].append(r)
            gone = "never" if r["gone"] is None else f"{r['gone']:.3f} s"
            print(f"run {i + 1} {'failure' if failure else 'planned'}: exit {r['code']}, the leaving host's workers "
                  f"gone after {gone} ({r['stopped_at_once']} stopped at once), resets {r['resets']}, exactly once "
                  f"{r['exactly_once']}", flush=True)
    ok = all(r["gone"] is not None and r["code"] == 0 and r["exactly_once"] for s in rows for r in rows[s])
    same = len({r["checksum"] for s in rows for r in rows[s]}) == 1
    if ok:
        med = {s: statistics.median(r["gone"] for r in rows[s]) for s in rows}
        print(f"the leaving host's workers gone, median of {a.runs}: planned (at the next commit) {med[False]:.3f} s; "
              f"after a failure (stopped at once) {med[True]:.3f} s; same model in every run {same}")
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
