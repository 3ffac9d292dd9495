#!/usr/bin/env python3
"""How long a job runs short-handed after a SIGKILL, with a standby and
without (issue 36).

Two simulated hosts of two slots (--launcher local, a discovery script
naming 127.0.0.2:2 and 127.0.0.3:2), -np 3 --max-np 3: the fourth slot is
free. Once training runs (and, with standbys, the standby waits in its first
join), a member on 127.0.0.3 is SIGKILLed. Measured from the event log: the
time from that worker_exited to the first generation of 3 ranks that joined
after it, i.e. the job back at full size. Side by side in one run:
  standby:    erun's default (--standby 1): the standby takes the rank;
  no standby: --standby 0: a replacement is started cold and joins once
              its program reached erun.init() / erun::init().
Programs: examples/train_mlp (C++), and tests/python/workers/train_exact.py
(PyTorch on CPU) with --startup-s S before erun.init() (0: only `import
torch`; 5: as a GPU job's CUDA and data loading would take).

  python3 bench/standby.py --build build [--runs 3] [--startup-s 0 5] [--programs cpp torch]
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import checksum, discovery_script, events, wait_events, wait_for  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPP_ARGS = ["--samples", "8000", "--epochs", "8", "--batch", "256", "--commit-every", "5", "--step-ms", "40"]
TORCH_ARGS = ["--epochs", "4", "--samples", "768", "--batch", "32", "--step-ms", "200"]


def member_on(marker, host):
    """A worker (not a standby) whose command line holds `marker`, on `host`."""
    for pid in subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split():
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"--agent" in argv or not any(marker.encode() in a for a in argv[:2]):
            continue
        if f"ERUN_HOSTNAME={host}".encode() in env and b"ERUN_STANDBY=1" not in env:
            return int(pid)
    return None


def one_run(erun, command, program, work, standby):
    disc = discovery_script(work, "127.0.0.2:2\n127.0.0.3:2\n")
    ev = os.path.join(work, "events.jsonl")
    cmd = [erun, "--driver-grace", "0", "--launcher", "local", "--host-discovery-script", disc,
           "--discovery-interval", "0.2", "-np", "3", "--min-np", "2", "--max-np", "3", "--term-grace", "2",
           "--standby", "1" if standby else "0", "--event-log", ev] + command
    out, err = os.path.join(work, "out"), os.path.join(work, "err")
    with open(out, "w") as o, open(err, "w") as e:
        job = subprocess.Popen(cmd, stdout=o, stderr=e, cwd=work)
        ok = wait_events(ev, "generation_joined", 1, 180) and wait_for(out, "epoch 1 ", 180)
        if ok and standby:
            ok = wait_events(ev, "standby_ready", 1, 180)
        if not ok:
            job.kill()
            raise RuntimeError("the job did not start:\n" + open(err).read()[-2000:])
        time.sleep(0.5)
        victim = member_on(program, "127.0.0.3")
        os.kill(victim, signal.SIGKILL)
        code = job.wait(timeout=600)
    killed = next(e for e in events(ev, "worker_exited") if e["exit_code"] == 137)
    sizes = {e["generation"]: e["size"] for e in events(ev, "generation_started")}
    back = next((e["t"] - killed["t"] for e in events(ev, "generation_joined")
                 if e["t"] >= killed["t"] and sizes.get(e["generation"]) == 3), None)
    text = open(out, errors="replace").read()
    return {"code": code, "back": back, "checksum": checksum(text),
            "promoted": len(events(ev, "standby_promoted")), "exactly_once": "exactly-once=NO" not in text}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--startup-s", type=float, nargs="+", default=[0, 5])
    ap.add_argument("--programs", nargs="+", default=["cpp", "torch"])
    ap.add_argument("--python", default="/usr/bin/python3")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    erun = os.path.join(build, "src/runner/erun")
    cases = []
    if "cpp" in a.programs:
        cases.append(("C++ train_mlp", None))
    if "torch" in a.programs:
        cases += [(f"PyTorch, {s:g} s before init", s) for s in a.startup_s]
    ok = True
    for name, startup in cases:
        rows = {True: [], False: []}
        for i in range(a.runs):
            for standby in (True, False):
                work = tempfile.mkdtemp(prefix="erun-standby-")
                try:
                    if startup is None:
                        program = os.path.join(work, "train_mlp_standby_bench")
                        shutil.copy(os.path.join(build, "examples/train_mlp"), program)
                        command = [program] + CPP_ARGS
                    else:
                        program = os.path.join(work, "train_exact_standby_bench.py")
                        shutil.copy(os.path.join(ROOT, "tests/python/workers/train_exact.py"), program)
                        command = [a.python, program] + TORCH_ARGS + ["--startup-s", str(startup)]
                        os.environ["PYTHONPATH"] = os.path.join(build, "python")
                    r = one_run(erun, command, program, work, standby)
                finally:
                    subprocess.run(["pkill", "-9", "-f", work])
                    shutil.rmtree(work, ignore_errors=True)
                rows[standby].append(r)
                print(f"{name} run {i + 1} {'standby   ' if standby else 'no standby'}: exit {r['code']} back at 3 "
                      f"ranks after {r['back']:.3f} s, promoted {r['promoted']}, exactly once {r['exactly_once']}",
                      flush=True)
        med = {s: statistics.median(r["back"] for r in rows[s]) for s in (True, False)}
        same = len({r["checksum"] for r in rows[True] + rows[False]}) == 1
        print(f"{name}: back at full size after a SIGKILL, median of {a.runs}: standby {med[True]:.3f} s, "
              f"no standby {med[False]:.3f} s ({med[False] / med[True]:.1f}x); same model in every run {same}")
        ok = ok and same and all(r["code"] == 0 and r["exactly_once"] for s in rows for r in rows[s])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
