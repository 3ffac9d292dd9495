#!/usr/bin/env python3
"""erun's benchmark harness (issue 5). Runs every benchmark against its peers
(Open MPI's mpirun, torchrun / torch.distributed) on this machine, in the same
run, and writes docs/performance.md and docs/img/*.png.

Called by bench/run.sh, which installs the peers and builds erun first:
    bench.py --build-dir DIR [--smoke] [--no-doc] [--only startup,recovery,...]
             [--reps N]

Results are kept in DIR/bench-results.json; --only re-runs some sections and
keeps the others' last results, so the doc always holds one complete set.
Every measurement prints one line starting with RESULT (the smoke test looks
for them). Standard library only; matplotlib is used for the plots when present.
"""
import argparse
import json
import os
import platform
import random
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The collective timeout (erun --collective-timeout, torch --pg-timeout) of the frozen-worker benchmark.
FROZEN_TIMEOUT_S = 5
SECTIONS = ["startup", "recovery", "frozen", "scaleup", "allreduce", "control", "commit", "hostile"]
TORCH_PY = "/usr/bin/python3"
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def result(section, name, **fields):
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"RESULT {section} {name} {text}", flush=True)


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "count": len(values),
            "all": values}


def have_torch():
    if not os.path.exists(TORCH_PY) or not shutil.which("torchrun"):
        return False
    return subprocess.run([TORCH_PY, "-c", "import torch.distributed"], capture_output=True).returncode == 0


def cmd_str(cmd):
    return " ".join(shlex.quote(c) for c in cmd)


# ---------------------------------------------------------------- processes

LINE_RES = {
    "STEP": re.compile(r"STEP pid=(\d+) host=(\S+) rank=(\d+) size=(\d+) gen=(-?\d+) step=(\d+) t=([\d.]+)"),
    "START": re.compile(r"START pid=(\d+)(?: rank=(\S*))?(?: restart=(\S*))? t=([\d.]+)"),
    # examples/restart_worker: no timestamp; stamped on arrival.
    "RW": re.compile(r"rank (\d+)/(\d+) epoch (\d+) step (\d+) restart (\d+)"),
}


class Job:
    """A launcher process in its own session; its output stamped line by line."""

    def __init__(self, cmd, env=None, steps_per_epoch=10, name="job"):
        self.cmd, self.name, self.spe = cmd, name, steps_per_epoch
        self.lines, self.steps, self.starts, self.pids = [], [], [], set()
        self.cv = threading.Condition()
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.t_spawn = time.time()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=full_env, start_new_session=True, cwd=ROOT)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.p.stdout:
            now = time.time()
            line = raw.decode(errors="replace").rstrip("\n")
            rec = self._parse(line, now)
            with self.cv:
                self.lines.append((now, line))
                if rec:
                    (self.steps if rec["kind"] == "STEP" else self.starts).append(rec)
                    if rec.get("pid"):
                        self.pids.add(rec["pid"])
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def _parse(self, line, now):
        m = LINE_RES["STEP"].search(line)
        if m:
            return {"kind": "STEP", "pid": int(m[1]), "host": m[2], "rank": int(m[3]), "size": int(m[4]),
                    "gen": int(m[5]), "step": int(m[6]), "t": float(m[7]), "arrival": now}
        m = LINE_RES["START"].search(line)
        if m:
            return {"kind": "START", "pid": int(m[1]), "rank": int(m[2]) if m[2] else None,
                    "gen": int(m[3]) if m[3] else 0, "t": float(m[4]), "arrival": now}
        m = LINE_RES["RW"].search(line)
        if m:
            return {"kind": "STEP", "pid": None, "host": "local", "rank": int(m[1]), "size": int(m[2]),
                    "gen": int(m[5]), "step": int(m[3]) * self.spe + int(m[4]) + 1, "t": now, "arrival": now}
        return None

    def wait(self, pred, timeout):
        deadline = time.time() + timeout
        with self.cv:
            while not pred(self):
                left = deadline - time.time()
                if left <= 0 or (self.p.poll() is not None and not self.reader.is_alive()):
                    return pred(self)
                self.cv.wait(min(left, 0.5))
            return True

    def output_tail(self, n=25):
        with self.cv:
            return "\n".join(line for _, line in self.lines[-n:])

    def stop(self, grace=3.0):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait()
        # Workers in their own process groups: none may outlive the benchmark.
        for pid in list(self.pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.reader.join(5)


def steady(job, world, min_steps=5):
    """Every rank of the newest generation has printed min_steps steps in it."""
    if not job.steps:
        return False
    gen = max(r["gen"] for r in job.steps)
    per_rank = {}
    for r in job.steps:
        if r["gen"] == gen and r["size"] == world:
            per_rank[r["rank"]] = per_rank.get(r["rank"], 0) + 1
    return len(per_rank) == world and min(per_rank.values()) >= min_steps


def timed_run(cmd, timeout, env=None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, env=full_env,
                       cwd=ROOT, stdin=subprocess.DEVNULL)
    el = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd_str(cmd)} exited {p.returncode}:\n{p.stdout.decode(errors='replace')[-3000:]}")
    return el, p.stdout.decode(errors="replace")


# ---------------------------------------------------------------- harness

class Bench:
    def __init__(self, a):
        self.a = a
        self.bd = os.path.abspath(a.build_dir)
        self.erun = os.path.join(self.bd, "src/runner/erun")
        self.smoke = a.smoke
        self.torch = (not a.smoke) and (not a.no_torch) and have_torch()
        self.mpi = shutil.which("mpirun") is not None
        self.tmp = tempfile.mkdtemp(prefix="erun-bench-")
        self.results_path = os.path.join(self.bd, "bench-results-smoke.json" if a.smoke else "bench-results.json")
        self.r = {}
        if os.path.exists(self.results_path) and a.only:
            with open(self.results_path) as f:
                self.r = json.load(f)
        self.failures = []

    def bin(self, rel):
        return os.path.join(self.bd, rel)

    def reps(self, full):
        return 1 if self.smoke else (self.a.reps or full)

    def save(self):
        with open(self.results_path, "w") as f:
            json.dump(self.r, f, indent=1)

    def guarded(self, section, fn):
        t0 = time.time()
        try:
            fn()
        except Exception as e:  # one broken benchmark must not lose the others
            msg = f"{section}: {type(e).__name__}: {e}"
            log("FAILED " + msg)
            self.failures.append(msg)
            self.r.setdefault("errors", {})[section] = str(e)[-1500:]
        log(f"{section}: {time.time() - t0:.1f} s")
        self.save()

    # ---- 1. start-up -------------------------------------------------------
    def startup(self):
        out = self.r["startup"] = {"rows": []}
        reps = self.reps(7)
        ns = [2] if self.smoke else [2, 4]
        cases = []
        for n in ns:
            cases.append(("erun", n, "init+barrier", [self.erun, "-np", str(n), "--mode", "elastic",
                                                      self.bin("bench/startup_worker")]))
            if self.mpi:
                cases.append(("mpirun", n, "init+barrier", MPIRUN + ["-np", str(n), self.bin("bench/mpi_startup")]))
            if self.torch:
                cases.append(("torchrun", n, "init+barrier", ["torchrun", "--standalone", "--nproc_per_node", str(n),
                                                              "--redirects", "9:0", "--tee", "9:0",
                                                              os.path.join(ROOT, "bench/torch_startup.py")]))
        n = 2 if self.smoke else 4
        cases.append(("erun", n, "/bin/true", [self.erun, "-np", str(n), "--mode", "restart", "/bin/true"]))
        if self.mpi:
            cases.append(("mpirun", n, "/bin/true", MPIRUN + ["-np", str(n), "/bin/true"]))
        for who, n, prog, cmd in cases:
            times = []
            if not self.smoke:
                timed_run(cmd, 120)  # warm-up: page cache, Python bytecode
            for _ in range(reps):
                el, _ = timed_run(cmd, 120)
                times.append(el)
            s = stats(times)
            out["rows"].append({"launcher": who, "n": n, "program": prog, "cmd": cmd_str(cmd), **s})
            result("startup", f"{who}-{prog.replace('/', '')}-np{n}", median_s=f"{s['median']:.3f}",
                   min_s=f"{s['min']:.3f}", max_s=f"{s['max']:.3f}")

    # ---- 2. recovery -------------------------------------------------------
    def recovery(self):
        out = self.r["recovery"] = {"rows": []}
        modes = ["erun-inplace", "erun-restart"]
        if self.torch:
            modes += ["torchrun-tuned", "torchrun-stock"]
            if os.path.isdir(self.bin("python/erun")):  # the same recovery from a PyTorch worker (erun.torch)
                modes += ["erun-python-inplace"]
        for mode in modes:
            reps = self.reps(1 if mode == "torchrun-stock" else 5)
            runs = []
            for i in range(reps):
                runs.append(self.recovery_once(mode, i))
            row = {"mode": mode, "cmd": runs[0]["cmd"], "runs": runs,
                   "fallbacks": sum(1 for r in runs if r.get("fallback_restart"))}
            good = [r for r in runs if not r.get("fallback_restart")] or runs
            for key in ("recovery_s", "running_s", "lost_steps", "replacement_s"):
                row[key] = stats([r.get(key) for r in good])
            if row["fallbacks"]:
                row["fallback_recovery_s"] = stats([r["recovery_s"] for r in runs if r.get("fallback_restart")])
            out["rows"].append(row)
            rs = row["recovery_s"]
            result("recovery", mode, recovery_median_s=f"{rs['median']:.3f}" if rs else "none",
                   lost_steps=row["lost_steps"]["median"] if row["lost_steps"] else "none",
                   running_median_s=f"{row['running_s']['median']:.3f}" if row["running_s"] else "n/a")

    # ---- 2b. a frozen worker ------------------------------------------------
    def frozen(self):
        """SIGSTOP instead of SIGKILL: only the collective timeout sees it."""
        timeout = 1 if self.smoke else FROZEN_TIMEOUT_S
        out = self.r["frozen"] = {"rows": [], "collective_timeout_s": timeout}
        modes = ["erun-inplace"] + (["torchrun-tuned"] if self.torch else [])
        for mode in modes:
            runs = [self.recovery_once(mode, i, sig=signal.SIGSTOP, collective_timeout=timeout)
                    for i in range(self.reps(3))]
            row = {"mode": mode, "cmd": runs[0]["cmd"], "runs": runs,
                   "fallbacks": sum(1 for r in runs if r.get("fallback_restart"))}
            for key in ("recovery_s", "lost_steps", "replacement_s"):
                row[key] = stats([r.get(key) for r in runs])
            out["rows"].append(row)
            rs = row["recovery_s"]
            result("frozen", mode, stop_to_stepped_median_s=f"{rs['median']:.3f}" if rs else "none",
                   not_in_place=row["fallbacks"])

    def recovery_cmd(self, mode, ckpt, port, collective_timeout=None):
        w = 4
        step = ["--step-ms", "50"]
        ct = ["--collective-timeout", str(collective_timeout)] if collective_timeout else []
        if mode == "erun-inplace":
            return [self.erun, "-np", str(w), "--min-np", "2", "--max-np", str(w), "--mode", "elastic",
                    "--term-grace", "1"] + ct + [self.bin("bench/step_worker")] + step, {}
        if mode == "erun-python-inplace":
            return [self.erun, "-np", str(w), "--min-np", "2", "--max-np", str(w), "--mode", "elastic",
                    "--term-grace", "1"] + ct + ["/usr/bin/python3", os.path.join(ROOT, "bench/python_step_worker.py")] + step, \
                {"PYTHONPATH": self.bin("python")}
        if mode == "erun-restart":
            wrapper = ('echo "START pid=$$ rank=$RANK restart=${TORCHELASTIC_RESTART_COUNT:-0} t=$(date +%s.%N)"; '
                       'exec "$@"')
            return [self.erun, "-np", str(w), "--mode", "restart", "--reset-limit", "100", "--term-grace", "1",
                    "sh", "-c", wrapper, "sh", self.bin("examples/restart_worker"), "--checkpoint", ckpt,
                    "--epochs", "100000", "--steps-per-epoch", "10"] + step, {}
        tuned = mode == "torchrun-tuned"
        cmd = ["torchrun", "--nnodes", "1", "--nproc_per_node", str(w), "--rdzv_backend", "c10d",
               "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", f"bench{port}", "--max_restarts", "3",
               "--redirects", "9:0", "--tee", "9:0"]
        if tuned:
            cmd += ["--monitor_interval", "0.1", "--rdzv_conf", "join_timeout=30,last_call_timeout=1,close_timeout=1"]
        cmd += [os.path.join(ROOT, "bench/torch_train.py"), "--checkpoint", ckpt, "--steps-per-epoch", "10"] + step
        if tuned:
            cmd += ["--pg-timeout", str(collective_timeout or 10)]
        return cmd, {"BENCH_AGENT": "agent0"}

    def recovery_once(self, mode, i, sig=signal.SIGKILL, collective_timeout=None):
        ckpt = os.path.join(self.tmp, f"ckpt-{mode}-{i}-{sig}")
        port = 29600 + (hash((mode, i, sig, os.getpid())) % 300)
        cmd, env = self.recovery_cmd(mode, ckpt, port, collective_timeout)
        job = Job(cmd, env, name=mode)
        try:
            if not job.wait(lambda j: steady(j, 4, 10), 180):
                raise RuntimeError(f"{mode}: 4 workers never reached steady steps:\n{job.output_tail()}")
            # Kill at a reproducible but varied point inside a 10-step epoch, so that
            # the work lost by epoch checkpoints is not always the best case.
            time.sleep(random.Random(i).uniform(0.0, 0.5))
            with job.cv:
                gen0 = max(r["gen"] for r in job.steps)
                victim_rank = 1
                if mode == "erun-restart":
                    cands = [s for s in job.starts if s["rank"] == victim_rank and s["gen"] == gen0]
                else:
                    cands = [s for s in job.steps if s["rank"] == victim_rank and s["gen"] == gen0]
                victim = cands[-1]["pid"]
            t_kill = time.time()
            os.kill(victim, sig)
            restart = not mode.endswith("-inplace")

            def recovered(j):
                after = [r for r in j.steps if r["gen"] > gen0 and r["t"] > t_kill]
                if restart:
                    if not after:
                        return False
                    g = min(r["gen"] for r in after)
                    world = after[0]["size"]
                    return len({r["rank"] for r in after if r["gen"] == g}) >= world
                survivors = {r["pid"] for r in j.steps if r["gen"] == gen0 and r["t"] <= t_kill} - {victim}
                if survivors <= {r["pid"] for r in after}:
                    return True
                # Fallback seen while in-place mode was unfinished: the driver restarted every worker.
                new = [r for r in after if r["pid"] not in survivors]
                return bool(new) and len({r["rank"] for r in new if r["gen"] == new[-1]["gen"]}) >= new[-1]["size"]

            limit = 120 if mode == "torchrun-stock" or sig == signal.SIGSTOP else 60
            if not job.wait(recovered, limit):
                with job.cv:
                    seen = sorted({(r["gen"], r["pid"], r["rank"]) for r in job.steps})
                raise RuntimeError(f"{mode}: survivors did not complete a step within {limit} s of the kill "
                                   f"(generation {gen0}, killed pid {victim}; gen/pid/rank seen: {seen}):\n"
                                   f"{job.output_tail()}")
            if not restart:  # the replacement worker, for the record
                job.wait(lambda j: any(r["t"] > t_kill and r["pid"] not in
                                       {x["pid"] for x in j.steps if x["t"] <= t_kill} for r in j.steps), 15)
            with job.cv:
                steps, starts = list(job.steps), list(job.starts)
        finally:
            if sig == signal.SIGSTOP:
                try:
                    os.kill(victim, signal.SIGCONT)  # so that a launcher that never killed it can stop it
                except ProcessLookupError:
                    pass
            job.stop()
        before = [r for r in steps if r["t"] <= t_kill]
        after = [r for r in steps if r["gen"] > gen0 and r["t"] > t_kill]
        last_before = max(r["step"] for r in before)
        res = {"cmd": cmd_str(cmd), "victim_rank": 1}
        if restart:
            g = min(r["gen"] for r in after)
            first = {}
            for r in after:
                if r["gen"] == g:
                    first.setdefault(r["rank"], r)
            res["recovery_s"] = max(r["t"] for r in first.values()) - t_kill
            res["first_step_after"] = min(r["step"] for r in first.values())
            st = {}
            for s in starts:
                if s["gen"] == g and s["t"] > t_kill:
                    st.setdefault(s["rank"], s["t"])
            if len(st) >= len(first):
                res["running_s"] = max(st.values()) - t_kill
        else:
            survivors = {r["pid"] for r in before if r["gen"] == gen0} - {victim}
            first = {}
            for r in after:
                if r["pid"] in survivors:
                    first.setdefault(r["pid"], r)
            if len(first) < len(survivors):  # every worker was restarted: not in place
                res["fallback_restart"] = True
                res["driver_log"] = [ln for _, ln in job.lines if "erun " in ln and "STEP" not in ln][-30:]
                first = {}
                g = max(r["gen"] for r in after)
                for r in after:
                    if r["gen"] == g:
                        first.setdefault(r["rank"], r)
            res["recovery_s"] = max(r["t"] for r in first.values()) - t_kill
            res["first_step_after"] = min(r["step"] for r in first.values())
            old = {r["pid"] for r in before}
            new = [r for r in steps if r["t"] > t_kill and r["pid"] not in old]
            if new:
                res["replacement_s"] = new[0]["t"] - t_kill
        res["last_step_before"] = last_before
        res["lost_steps"] = max(0, last_before - (res["first_step_after"] - 1))
        log(f"recovery {mode} {signal.Signals(sig).name} #{i}: {res['recovery_s']:.3f} s, lost {res['lost_steps']} steps"
            + (" (NOT in place: all workers restarted)" if res.get("fallback_restart") else ""))
        return res

    # ---- 3. scale-up -------------------------------------------------------
    def scaleup(self):
        out = self.r["scaleup"] = {"rows": []}
        cases = [("erun", None)]
        if self.torch:
            cases += [("torchrun-tuned", True)]
        for who, tuned in cases:
            runs = []
            for i in range(self.reps(5 if who == "erun" else 3)):
                runs.append(self.scale_erun(i) if who == "erun" else self.scale_torch(i, tuned))
            row = {"launcher": who, "cmd": runs[0]["cmd"], "runs": runs,
                   "scaleup_s": stats([r["scaleup_s"] for r in runs]), "interval_s": runs[0].get("interval_s")}
            out["rows"].append(row)
            result("scaleup", who, median_s=f"{row['scaleup_s']['median']:.3f}")

    def scale_erun(self, i):
        d = os.path.join(self.tmp, f"scale-{i}")
        os.makedirs(d, exist_ok=True)
        hosts, script = os.path.join(d, "hosts.txt"), os.path.join(d, "discover.sh")
        with open(hosts, "w") as f:
            f.write("hosta:2\n")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {shlex.quote(hosts)}\n")
        os.chmod(script, 0o755)
        interval = 1.0
        cmd = [self.erun, "-np", "2", "--min-np", "2", "--max-np", "3", "--mode", "elastic", "--launcher", "local",
               "--host-discovery-script", script, "--discovery-interval", str(interval), "--term-grace", "1",
               self.bin("bench/step_worker"), "--step-ms", "50"]
        job = Job(cmd, name="scale-erun")
        try:
            if not job.wait(lambda j: steady(j, 2, 5), 90):
                raise RuntimeError(f"erun scale-up: 2 workers never stepped:\n{job.output_tail()}")
            tmpf = hosts + ".new"
            with open(tmpf, "w") as f:
                f.write("hosta:2\nhostb:1\n")
            t_add = time.time()
            os.rename(tmpf, hosts)
            if not job.wait(lambda j: any(r["host"] == "hostb" for r in j.steps), 60):
                raise RuntimeError(f"erun scale-up: hostb never completed a step:\n{job.output_tail()}")
            with job.cv:
                t_new = min(r["t"] for r in job.steps if r["host"] == "hostb")
        finally:
            job.stop()
        res = {"cmd": cmd_str(cmd), "scaleup_s": t_new - t_add, "interval_s": interval}
        log(f"scale-up erun #{i}: {res['scaleup_s']:.3f} s")
        return res

    def scale_torch(self, i, tuned):
        port = 29900 + (hash((i, os.getpid())) % 90)
        ckpt = os.path.join(self.tmp, f"scale-torch-{i}")

        def agent(name):
            cmd = ["torchrun", "--nnodes", "1:2", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
                   "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", f"scale{port}", "--max_restarts", "3",
                   "--redirects", "9:0", "--tee", "9:0"]
            if tuned:
                cmd += ["--monitor_interval", "0.1", "--rdzv_conf", "join_timeout=30,last_call_timeout=1,close_timeout=1"]
            cmd += [os.path.join(ROOT, "bench/torch_train.py"), "--checkpoint", ckpt, "--step-ms", "50"]
            return cmd

        cmd = agent("a")
        a = Job(cmd, {"BENCH_AGENT": "agent0"}, name="agent0")
        b = None
        try:
            if not a.wait(lambda j: steady(j, 2, 5), 120):
                raise RuntimeError(f"torchrun scale-up: first agent never stepped:\n{a.output_tail()}")
            t_add = time.time()
            b = Job(cmd, {"BENCH_AGENT": "agent1"}, name="agent1")
            if not b.wait(lambda j: any(r["host"] == "agent1" for r in j.steps), 120):
                raise RuntimeError(f"torchrun scale-up: second agent never stepped:\n{b.output_tail()}\n"
                                   f"first agent:\n{a.output_tail()}")
            with b.cv:
                t_new = min(r["t"] for r in b.steps if r["host"] == "agent1")
        finally:
            if b:
                b.stop()
            a.stop()
        res = {"cmd": cmd_str(cmd), "scaleup_s": t_new - t_add}
        log(f"scale-up torchrun #{i}: {res['scaleup_s']:.3f} s")
        return res

    # ---- 4. allreduce ------------------------------------------------------
    def allreduce(self):
        sizes = [MiB] if self.smoke else [4 * KiB << (2 * k) for k in range(9)]  # 4 KiB .. 256 MiB
        nps = [2] if self.smoke else [2, 4]
        out = self.r["allreduce"] = {"sizes": sizes, "nps": nps, "impls": {}, "cmds": {}, "memcpy": {}}
        reps = 1 if self.smoke else (self.a.allreduce_reps or self.reps(3))
        size_args = [str(s) for s in sizes]
        impls = [("erun-gloo", lambda n: [self.bin("bench/allreduce_bench"), str(n)] + size_args)]
        if os.path.exists(self.bin("bench/shm_allreduce_bench")):
            impls.append(("erun-shm", lambda n: [self.bin("bench/shm_allreduce_bench"), str(n)] + size_args))
        if self.mpi and os.path.exists(self.bin("bench/mpi_allreduce_bench")):
            impls.append(("openmpi", lambda n: MPIRUN + ["-np", str(n), "--bind-to", "none",
                                                         self.bin("bench/mpi_allreduce_bench")] + size_args))
        if self.torch:
            impls.append(("torch-gloo", lambda n: [TORCH_PY, os.path.join(ROOT, "bench/torch_allreduce.py"), str(n)]
                          + size_args))
        pat = re.compile(r"bytes=(\d+).*?time=([\d.]+) us.*?algbw=([\d.]+).*?busbw=([\d.]+)")
        for name, mk in impls:
            per = out["impls"][name] = {}
            for n in nps:
                cmd = mk(n)
                out["cmds"][f"{name} np={n}"] = cmd_str(cmd)
                samples = {}
                for _ in range(reps):
                    _, text = timed_run(cmd, 900)
                    for m in pat.finditer(text):
                        samples.setdefault(int(m[1]), []).append((float(m[2]), float(m[3]), float(m[4])))
                rows = {}
                for b, vals in samples.items():
                    rows[str(b)] = {"time_us": stats([v[0] for v in vals]), "algbw": stats([v[1] for v in vals]),
                                    "busbw": stats([v[2] for v in vals])}
                per[str(n)] = rows
                if not rows:
                    raise RuntimeError(f"{name} np={n}: no result lines")
                for b in sizes:
                    if str(b) in rows:
                        r = rows[str(b)]
                        result("allreduce", f"{name}-np{n}-{b}", time_us=f"{r['time_us']['median']:.1f}",
                               busbw_gbs=f"{r['busbw']['median']:.3f}")
        for threads in (1, 2):
            _, text = timed_run([self.bin("bench/memcpy_bench"), "--threads", str(threads)] + size_args, 600)
            rows = {m[1]: float(m[2]) for m in re.finditer(r"bytes=(\d+) time=[\d.]+ us bw=([\d.]+)", text)}
            out["memcpy"][str(threads)] = rows
            result("memcpy", f"threads{threads}", gbs_at_largest=rows.get(str(sizes[-1]), "none"))

    # ---- 5. control plane --------------------------------------------------
    def control(self):
        out = self.r["control"] = {"join": [], "plan": None}
        # (workers, clients): raw connections measure the server; real RendezvousClients check it at 1,024.
        # 100,000 needs an open-file hard limit above 100,000 (the benchmark says so when it is lower).
        # "agents": through simulated host agents, 8 workers per relay connection (the invocation also runs
        # the direct peer first when it fits the open-file limit; only the relayed line is kept here).
        counts = [(64, "raw"), (64, "agents")] if self.smoke else [
            (1024, "threads"), (1024, "raw"), (10000, "raw"), (100000, "raw"), (10000, "agents"), (100000, "agents")]
        pat = re.compile(r"total=([\d.]+) s all_waiting=([-\d.]+) s publish=([-\d.]+) s after_publish=([-\d.]+)")
        for n, clients in counts:
            cmd = [self.bin("bench/rdzv_scale_bench"), "join", str(n)]
            cmd += ["--via-agents", "8"] if clients == "agents" else ["--clients", clients]
            if clients != "agents" and n > 20000 and resource.getrlimit(resource.RLIMIT_NOFILE)[1] < n + 256:
                result("control", f"join{n}", skipped="open-file hard limit below the worker count")
                continue
            vals = []
            for _ in range(self.reps(3)):
                _, text = timed_run(cmd, 600)
                if clients == "agents":
                    text = "\n".join(line for line in text.splitlines() if "via=agents" in line)
                m = pat.search(text)
                if not m:
                    raise RuntimeError(f"no JOIN line from {cmd_str(cmd)}:\n{text[-2000:]}")
                vals.append([float(x) for x in m.groups()])
            row = {"workers": n, "clients": clients, "cmd": cmd_str(cmd), "total_s": stats([v[0] for v in vals]),
                   "all_waiting_s": stats([v[1] for v in vals]), "publish_s": stats([v[2] for v in vals]),
                   "after_publish_s": stats([v[3] for v in vals])}
            out["join"].append(row)
            result("control", f"join{n}-{clients}", total_median_s=f"{row['total_s']['median']:.3f}")
        hosts = 100 if self.smoke else 10000
        cmd = [self.bin("bench/rdzv_scale_bench"), "plan", str(hosts), "--reps", "3" if self.smoke else "11"]
        _, text = timed_run(cmd, 300)
        m = re.search(r"parse=([\d.]+) ms diff=([\d.]+) ms plan=([\d.]+) ms total=([\d.]+) ms min=([\d.]+) ms "
                      r"max=([\d.]+) ms", text)
        if not m:
            raise RuntimeError(f"no PLAN line:\n{text}")
        out["plan"] = {"hosts": hosts, "cmd": cmd_str(cmd), **dict(zip(["parse_ms", "diff_ms", "plan_ms", "total_ms",
                                                                       "min_ms", "max_ms"], map(float, m.groups())))}
        result("control", f"plan{hosts}", total_ms=m[4])

    # ---- 6. commit ---------------------------------------------------------
    def commit(self):
        out = self.r["commit"] = {"rows": [], "cmds": []}
        sizes = [MiB] if self.smoke else [16 * MiB, 64 * MiB, 256 * MiB, GiB]
        durable_sizes = [MiB] if self.smoke else [16 * MiB, 64 * MiB, 256 * MiB]
        reps = "1" if self.smoke else "5"
        ddir = os.path.join(self.tmp, "durable")
        os.makedirs(ddir, exist_ok=True)
        pat = re.compile(r"COMMIT op=(\w+) bytes=(\d+) reps=\d+ median=([\d.]+) min=([\d.]+) max=([\d.]+) "
                         r"bw=([\d.]+) GB/s world=(\d+)")
        runs = [[self.bin("bench/commit_bench"), "--reps", reps] + [str(s) for s in sizes],
                [self.bin("bench/commit_bench"), "--reps", reps, "--no-local", "--durable", ddir]
                + [str(s) for s in durable_sizes],
                [self.erun, "-np", "2", "--mode", "elastic", self.bin("bench/commit_bench"), "--reps", reps,
                 "--no-local"] + [str(s) for s in sizes]]
        for cmd in runs:
            out["cmds"].append(cmd_str(cmd))
            _, text = timed_run(cmd, 900)
            found = False
            for m in pat.finditer(text):
                found = True
                row = {"op": m[1] if m[7] == "1" else f"{m[1]} (2 ranks)", "bytes": int(m[2]), "median_s": float(m[3]),
                       "min_s": float(m[4]), "max_s": float(m[5]), "gbs": float(m[6]), "world": int(m[7])}
                out["rows"].append(row)
                result("commit", f"{row['op'].replace(' ', '').replace('(', '-').replace(')', '')}-{row['bytes']}",
                       gbs=f"{row['gbs']:.3f}")
            if not found:
                raise RuntimeError(f"no COMMIT lines from {cmd_str(cmd)}:\n{text[-2000:]}")

    # ---- 7. hostile input and a big host set ------------------------------
    def _erun_job(self, extra, command):
        cmd = [self.erun, "--launcher", "local", "--mode", "restart", "-np", "2"] + extra + command
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        return cmd, p

    @staticmethod
    def _cpu_ticks(pid):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime of the process itself (not its children)

    @staticmethod
    def _rss_kib(pid):
        with open(f"/proc/{pid}/status") as f:
            m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
        return int(m[1]) if m else -1

    @staticmethod
    def _end(p):
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def hostile(self):
        out = self.r["hostile"] = {"cpu": [], "flood": None}
        counts = [1, 1000] if self.smoke else [1, 10000, 20000]
        window = 3 if self.smoke else 20
        tck = os.sysconf("SC_CLK_TCK")
        for n in counts:
            hosts = os.path.join(self.tmp, f"hosts{n}")
            with open(hosts, "w") as f:
                f.writelines(f"node{i}:4\n" for i in range(n))
            script = os.path.join(self.tmp, f"discover{n}.sh")
            with open(script, "w") as f:
                f.write(f"#!/bin/sh\ncat {shlex.quote(hosts)}\n")
            os.chmod(script, 0o755)
            cmd, p = self._erun_job(["--min-np", "1", "--max-np", "2", "--host-discovery-script", script,
                                     "--discovery-interval", "1"], ["sleep", "100000"])
            try:
                time.sleep(3)  # first discovery, plan, launch
                t0, c0 = time.monotonic(), self._cpu_ticks(p.pid)
                time.sleep(window)
                t1, c1 = time.monotonic(), self._cpu_ticks(p.pid)
            finally:
                self._end(p)
            pct = 100.0 * (c1 - c0) / tck / (t1 - t0)
            out["cpu"].append({"hosts": n, "cpu_pct": pct, "window_s": t1 - t0, "cmd": cmd_str(cmd)})
            result("hostile", f"cpu{n}", cpu_pct=f"{pct:.2f}")

        # The flood: 5,000 junk connections (one byte and close; every fifth silent and kept open).
        cmd, p = self._erun_job([], ["sh", "-c", "echo RDZV_PORT=$ERUN_RDZV_PORT; exec sleep 100000"])
        try:
            port = None
            deadline = time.monotonic() + 30
            buf = b""
            os.set_blocking(p.stdout.fileno(), False)
            while port is None and time.monotonic() < deadline:
                chunk = p.stdout.read() or b""
                buf += chunk
                m = re.search(rb"RDZV_PORT=(\d+)", buf)
                if m:
                    port = int(m[1])
                time.sleep(0.05)
            if port is None:
                raise RuntimeError(f"no rendezvous port from {cmd_str(cmd)}: {buf[-2000:]!r}")
            time.sleep(1)
            before = self._rss_kib(p.pid)
            peak = [before]
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], self._rss_kib(p.pid))
                    time.sleep(0.02)
            th = threading.Thread(target=sample)
            th.start()
            import socket
            n_conn = 500 if self.smoke else 5000
            silent = []
            t0 = time.monotonic()
            for i in range(n_conn):
                s = socket.create_connection(("127.0.0.1", port))
                if i % 5 == 0 and len(silent) < 800:
                    silent.append(s)
                    continue
                s.send(b"\x00")
                s.close()
            flood_s = time.monotonic() - t0
            time.sleep(1)
            for s in silent:
                s.close()
            time.sleep(3)
            stop.set()
            th.join()
            after = self._rss_kib(p.pid)
            alive = p.poll() is None
        finally:
            self._end(p)
        log_text = buf.decode(errors="replace") + (p.stdout.read() or b"").decode(errors="replace")
        out["flood"] = {"connections": n_conn, "silent": len(silent), "flood_s": flood_s, "rss_before_kib": before,
                        "rss_peak_kib": peak[0], "rss_after_kib": after, "driver_alive": alive,
                        "drop_lines": log_text.count("rendezvous: dropped connection"),
                        "count_lines": log_text.count("more connection"), "cmd": cmd_str(cmd)}
        result("hostile", "flood", before_kib=before, peak_kib=peak[0], after_kib=after)

    # ---- machine -----------------------------------------------------------
    def machine(self):
        def sh(cmd):
            try:
                return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
            except Exception:
                return ""
        mem = sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo")
        cpu = sh("awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo")
        self.r["machine"] = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "nproc": os.cpu_count(), "cpu": cpu, "memory": mem,
            "kernel": platform.release(), "os": sh(". /etc/os-release && echo $PRETTY_NAME"),
            "erun": sh(f"{shlex.quote(self.erun)} --version"),
            "erun_commit": sh(f"git -C {shlex.quote(ROOT)} rev-parse --short HEAD"),
            "openmpi": sh("mpirun --version 2>&1 | head -1"),
            "torch": sh(f"{TORCH_PY} -c 'import torch; print(torch.__version__)'") if self.torch else "not used",
            "compiler": sh("c++ --version | head -1"), "loadavg": sh("cat /proc/loadavg"),
        }

    def run(self):
        self.machine()
        wanted = self.a.only.split(",") if self.a.only else SECTIONS
        for s in wanted:
            if s not in SECTIONS:
                raise SystemExit(f"--only: unknown section '{s}' (choose from {','.join(SECTIONS)})")
        self.r.setdefault("errors", {})
        for s in wanted:
            self.r["errors"].pop(s, None)
            log(f"--- {s}")
            self.guarded(s, getattr(self, s))
        shutil.rmtree(self.tmp, ignore_errors=True)
        if not self.a.no_doc:
            import report
            report.write(self.r, ROOT)
        if self.failures:
            log("failed: " + "; ".join(self.failures))
            return 1
        return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--smoke", action="store_true", help="each benchmark once, tiny sizes, no torch")
    p.add_argument("--no-doc", action="store_true", help="do not write docs/performance.md")
    p.add_argument("--no-torch", action="store_true", help="skip the torchrun / torch.distributed peers")
    p.add_argument("--only", default="", help="comma-separated sections: " + ",".join(SECTIONS))
    p.add_argument("--reps", type=int, default=0, help="repetitions (default: per benchmark)")
    p.add_argument("--allreduce-reps", type=int, default=0, help="runs of each allreduce program (default 3)")
    a = p.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return Bench(a).run()


if __name__ == "__main__":
    sys.exit(main())
