#!/usr/bin/env python3
"""How fast a new erun takes over a job of many agents (issue 33).

Simulates N hosts on this machine (--launcher local, a discovery script
naming sim0000, sim0001, ...), one worker each: a copy of `sleep` (restart
mode: the program needs no erun library, so a thousand of them fit on two
cores). Once the job record names every agent, erun is SIGKILLed and the
same command is run again. From the new erun's exec it measures the time
to its log line "took the job over" (every agent attached through its
attach socket, every worker adopted with its rank) and
checks that it adopted all N workers, their processes unchanged. The new
erun is then stopped (SIGTERM) and nothing may be left running.

  python3 bench/takeover_scale.py --build build [--agents 1000] [--runs 3]
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


def log_time(line):
    m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) erun", line)
    if not m:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


def pids_of(program):
    out = subprocess.run(["pgrep", "-f", "^" + re.escape(program) + " "], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def recorded_agents(jobs):
    n = 0
    for root, _, files in os.walk(jobs):
        if "record" in files:
            try:
                n = max(n, sum(1 for line in open(os.path.join(root, "record"), errors="replace")
                               if line.startswith("agent ")))
            except OSError:
                pass
    return n


def one_run(erun, work, agents):
    program = os.path.join(work, "sleep_takeover_bench")
    shutil.copy(shutil.which("sleep"), program)
    disc = discovery_script(work, "".join(f"sim{i:04d}:1\n" for i in range(agents)))
    jobs = os.path.join(work, "jobs")
    cmd = [erun, "--driver-grace", "120", "--launcher", "local", "--host-discovery-script", disc,
           "--discovery-interval", "1", "-np", str(agents), "--no-status", program, "3600"]
    env = dict(os.environ, ERUN_JOB_DIR=jobs)
    err1, err2 = os.path.join(work, "err1"), os.path.join(work, "err2")
    t_launch = time.time()
    with open(err1, "w") as e:
        first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=e, env=env, cwd=work)
    deadline = time.time() + 600
    while recorded_agents(jobs) < agents or len(pids_of(program)) < agents:
        if time.time() > deadline or first.poll() is not None:
            first.kill()
            raise RuntimeError(f"the first erun did not start {agents} agents: {recorded_agents(jobs)} recorded")
        time.sleep(0.2)
    launched = time.time() - t_launch
    time.sleep(2)  # every agent told RECORDED
    before = pids_of(program)
    first.send_signal(signal.SIGKILL)
    first.wait()
    time.sleep(1.0)
    with open(err2, "w") as e:
        t0 = time.time()
        again = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=e, env=env, cwd=work)
        took = None
        line = ""
        deadline = time.time() + 300
        while took is None and time.time() < deadline and again.poll() is None:
            for line in open(err2, errors="replace").read().splitlines():
                if "took the job over" in line:
                    took = line
                    break
            time.sleep(0.05)
    after = pids_of(program)
    again.send_signal(signal.SIGTERM)
    try:
        code = again.wait(timeout=120)
    except subprocess.TimeoutExpired:
        again.kill()
        code = None
    left = pids_of(program)
    t = log_time(took) if took else None
    m = re.search(r"(\d+) worker\(s\) on (\d+) host\(s\)", took or "")
    return {
        "launched": launched,
        "attached": (t - t0) if t else None,
        "adopted": int(m.group(1)) if m else 0,
        "kept": before == after and len(before) == agents,
        "left": len(left),
        "code": code,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep each run's directory (its erun logs)")
    a = ap.parse_args()
    erun = os.path.join(os.path.abspath(a.build), "src/runner/erun")
    rows = []
    for i in range(a.runs):
        work = tempfile.mkdtemp(prefix="erun-takeover-scale-")
        try:
            r = one_run(erun, work, a.agents)
        finally:
            subprocess.run(["pkill", "-9", "-f", os.path.join(work, "sleep_takeover_bench")])
            if a.keep:
                print(f"logs kept in {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
        rows.append(r)
        att = f"{r['attached']:.3f} s" if r["attached"] is not None else "never"
        print(f"run {i + 1}: {a.agents} agents launched in {r['launched']:.1f} s; taken over in {att}, "
              f"{r['adopted']} workers adopted, processes kept {r['kept']}, stopped with exit {r['code']}, "
              f"{r['left']} left", flush=True)
    ok = all(r["attached"] is not None and r["adopted"] == a.agents and r["kept"] and r["left"] == 0 for r in rows)
    if rows and all(r["attached"] is not None for r in rows):
        times = [r["attached"] for r in rows]
        print(f"takeover of {a.agents} agents, {a.runs} runs: median {statistics.median(times):.3f} s "
              f"(max {max(times):.3f} s); {'all adopted, none left' if ok else 'SOME RUN FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
