#!/usr/bin/env python3
"""How fast a new erun drives a job whose erun was SIGKILLed (issue 33).

Runs examples/train_mlp under erun on simulated hosts (--launcher local, a
discovery script naming 127.0.0.2 and 127.0.0.3), SIGKILLs erun after
epoch 1, waits a moment, and runs the same command again. From the new
erun's exec it measures:
  attached: its log line "took the job over" (every agent attached, the
            workers adopted),
  driven:   "all N ranks joined" of the first generation it published (the
            workers reconnected and re-joined: the job is driven again),
and checks the training: every epoch printed once, the final checksum equal
to an uninterrupted run's, and no worker rolled back ("resumed at commit").
With --standby, a standby driver (erun --watch --attach NAME) watches the
job instead, nobody runs anything again, and the times count from the kill.

  python3 bench/takeover.py --build build [--runs 5] [--hosts 2] [--slots 2] [--standby]
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import discovery_script  # noqa: E402

# It reads erun's info lines ("took the job over"): erun says warnings only by default.
os.environ.setdefault("ERUN_LOG_LEVEL", "info")

ARGS = ["--samples", "8000", "--epochs", "8", "--batch", "256", "--commit-every", "5", "--step-ms", "40"]


def log_time(line):
    m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) erun", line)
    if not m:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


def wait_for(path, text, limit):
    end = time.time() + limit
    while time.time() < end:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return True
        time.sleep(0.02)
    return False


def checksum(text):
    m = re.search(r"checksum=([0-9a-f]+)", text)
    return m.group(1) if m else None


def one_run(erun, program, work, hosts, slots, reference, standby=False):
    disc = discovery_script(work, "".join(f"127.0.0.{2 + i}:{slots}\n" for i in range(hosts)))
    np = hosts * slots
    cmd = [erun, "--driver-grace", "30", "--launcher", "local", "--host-discovery-script", disc,
           "--discovery-interval", "0.2", "-np", str(np), program] + ARGS
    env = dict(os.environ, ERUN_JOB_DIR=os.path.join(work, "jobs"))
    out1, err1 = os.path.join(work, "out1"), os.path.join(work, "err1")
    with open(out1, "w") as o, open(err1, "w") as e:
        first = subprocess.Popen(cmd, stdout=o, stderr=e, env=env, cwd=work)
    out2, err2 = os.path.join(work, "out2"), os.path.join(work, "err2")
    if standby:
        if not wait_for(err1, "erun --attach job-", 60):
            first.kill()
            raise RuntimeError("the first erun named no job")
        name = re.search(r"erun --attach (job-[0-9a-f]+)", open(err1).read()).group(1)
        with open(out2, "w") as o, open(err2, "w") as e:
            again = subprocess.Popen([erun, "--watch", "--attach", name], stdout=o, stderr=e, env=env, cwd=work)
        if not wait_for(err2, "standing by for its driver", 60):
            raise RuntimeError("the standby did not start watching: " + open(err2).read()[-2000:])
    if not wait_for(out1, ":epoch 1 loss=", 120):
        first.kill()
        raise RuntimeError("the first erun did not reach epoch 1")
    if standby:
        t0 = time.time()
        first.send_signal(signal.SIGKILL)
        first.wait()
        code = again.wait(timeout=300)
    else:
        first.send_signal(signal.SIGKILL)
        first.wait()
        time.sleep(1.0)
        with open(out2, "w") as o, open(err2, "w") as e:
            t0 = time.time()
            again = subprocess.Popen(cmd, stdout=o, stderr=e, env=env, cwd=work)
            code = again.wait(timeout=300)
    err = open(err2, errors="replace").read()
    out = open(out1, errors="replace").read() + open(out2, errors="replace").read()
    attached = driven = None
    for line in err.splitlines():
        t = log_time(line)
        if t is None:
            continue
        if attached is None and "took the job over" in line:
            attached = t - t0
        if attached is not None and driven is None and re.search(r"all \d+ ranks joined", line):
            driven = t - t0
    epochs = [int(x) for x in re.findall(r":epoch (\d+) loss=", out)]
    return {
        "code": code,
        "attached": attached,
        "driven": driven,
        "epochs_once": epochs == list(range(len(epochs))) and len(epochs) == 8,
        "exact": checksum(out) == reference,
        "rolled_back": "resumed at commit" in out,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--standby", action="store_true", help="a standby driver takes over (no command typed)")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    erun = os.path.join(build, "src/runner/erun")
    ref = subprocess.run([os.path.join(build, "examples/train_mlp")] + ARGS[:-2] + ["--step-ms", "0"],
                         capture_output=True, text=True, timeout=300)
    reference = checksum(ref.stdout)
    rows = []
    for i in range(a.runs):
        work = tempfile.mkdtemp(prefix="erun-takeover-")
        program = os.path.join(work, "train_mlp_bench")
        shutil.copy(os.path.join(build, "examples/train_mlp"), program)
        try:
            r = one_run(erun, program, work, a.hosts, a.slots, reference, a.standby)
        finally:
            subprocess.run(["pkill", "-9", "-f", program])
            shutil.rmtree(work, ignore_errors=True)
        rows.append(r)
        print(f"run {i + 1}: exit {r['code']} attached {r['attached']:.3f} s driven {r['driven']:.3f} s "
              f"epochs once {r['epochs_once']} exact {r['exact']} rolled back {r['rolled_back']}", flush=True)
    ok = all(r["code"] == 0 and r["exact"] and r["epochs_once"] and not r["rolled_back"] for r in rows)
    att = statistics.median(r["attached"] for r in rows)
    drv = statistics.median(r["driven"] for r in rows)
    who = "standby takeover (from the kill)" if a.standby else "takeover (from the new erun's exec)"
    print(f"{who} of {a.hosts} hosts x {a.slots} workers, {a.runs} runs: median attached {att:.3f} s, "
          f"driven again {drv:.3f} s (max {max(r['driven'] for r in rows):.3f} s); steps lost: "
          f"{'0 (every run exact, no rollback, every epoch once)' if ok else 'SOME RUN FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
