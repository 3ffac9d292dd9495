#!/usr/bin/python3
"""A week in an hour (issue 47): one erun job driven through N generations.

Runs examples/train_mlp under ONE erun job (--launcher local, simulated hosts
named by a discovery script) and keeps changing its membership with real
processes until the driver's generation counter (the event log's
`generation_started`, erun's "gen N:" lines) reaches --generations (2,000):

  kill        SIGKILL of a worker (never the tracked one, below): recovered in
              place, a replacement grows the job back
  slots       a host's slots changed in discovery (node-b 1-3, node-c..e 1-2)
  add_host    a spare host (node-c, node-d, node-e) listed
  remove_host one of them dropped from discovery
  drain       one of them listed `host:slots draining` (leaves at a commit)
  undrain     a draining host listed again without the mark
  takeover    every --takeover-every (100) generations: erun SIGKILLed and the
              same command run again (--driver-grace 60): the agents wait and
              the new erun takes the job over in place

node-a:2 is listed throughout and never changed: its first worker is the
tracked "surviving worker" (never killed on purpose; if it ends anyway, the
bench picks another and says so). node-a and node-b are never removed or
drained, so their agents live the whole run.

Every --sample-every (25) generations, and right before and after each
takeover, the bench lists the base host set again (node-a:2 node-b:2: four
ranks, no spare, no standby), waits until the job has settled there, and
records VmRSS, VmHWM, threads and open descriptors (with their kinds: sockets,
pipes, anon inodes, files) of: the erun driver, every agent (`erun --agent`,
and each agent's watchdog), and the tracked worker. The same state at every
sample makes the descriptor counts comparable (an agent's count depends on
its workers). The driver is a new process after each takeover: its growth is
measured per driver process, from its first sample after taking over to its
last before it is killed (shown) and from its second sample on (judged: a new
driver opens its connection to an agent's relay only once workers run on that
host again, 3 descriptors for the 3 spare hosts), and across drivers (the last
sample of each, a like-for-like comparison of what each new driver carries).
`--takeover-every 0` keeps one driver for the whole run instead.

Goal (issue 47): over the last 1,000 generations RSS grows by under 1 MiB and
descriptors by 0, for erun (each driver process) and for every agent; the
tracked worker is reported separately. At the end the job is stopped with
SIGTERM and the bench checks that no worker, agent or host-memory directory
is left.

    /usr/bin/python3 bench/long_run.py --build build --json docs/img/long_run.json --plot docs/img/long_run.png
    /usr/bin/python3 bench/long_run.py --build build --quick      # 200 generations, a takeover every 50

Prints progress and a summary; exit status 0 when the job ran through and
stopped cleanly and the goal was met, 1 otherwise. The measurement uses only
the standard library; the plot uses matplotlib (this python's, or the
repository's .venv), else a hand-written SVG.
"""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TRAIN = ["--samples", "8000", "--batch", "256", "--commit-every", "5", "--step-ms", "20", "--epochs", "1000000"]
BASE = {"node-a": 2, "node-b": 2}
BASE_PLAN = "4 ranks: node-a[0-1] node-b[2-3]"
SPARES = ["node-c", "node-d", "node-e"]
MAX_NP = 7
KINDS = ["kill"] * 8 + ["slots"] * 3 + ["add_host"] * 3 + ["remove_host"] * 2 + ["drain"] * 3 + ["undrain"] * 2
MIB = 1024.0


def log(msg):
    print(f"[long_run {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- /proc -------------------------------------------------------------------
def read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def stat_fields(pid):
    s = read(f"/proc/{pid}/stat")
    if not s:
        return None
    return s.rsplit(")", 1)[1].split()  # [0] state, [1] ppid, [19] start time


def ppid_of(pid):
    f = stat_fields(pid)
    return int(f[1]) if f else None


def environ(pid):
    raw = read(f"/proc/{pid}/environ", "rb")
    if not raw:
        return {}
    items = raw.decode(errors="replace").split("\0")
    return dict(i.split("=", 1) for i in items if "=" in i)


def fd_kinds(pid):
    """The kinds of `pid`'s open descriptors (None when it is gone)."""
    kinds = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith("socket:"):
            k = "socket"
        elif t.startswith("pipe:"):
            k = "pipe"
        elif t.startswith("anon_inode:"):
            k = t.split(":", 1)[1].strip("[]")
        elif t.startswith("/dev/shm/"):
            k = "/dev/shm"
        elif t.startswith("/dev/"):
            k = t
        else:
            k = "file"
        kinds[k] = kinds.get(k, 0) + 1
    return kinds


def proc_info(pid, reads=5):
    """RSS (and its anon/file parts), HWM (KiB), threads, open descriptors and
    their kinds of `pid`; None when it is gone. The descriptors are counted
    `reads` times 0.1 s apart and the smallest count kept: the driver runs
    the discovery script every 0.2 s, and its pipes are open while it runs."""
    best = None
    for i in range(reads):
        if i:
            time.sleep(0.1)
        kinds = fd_kinds(pid)
        if kinds is None:
            return None
        if best is None or sum(kinds.values()) < sum(best.values()):
            best = kinds
    st = read(f"/proc/{pid}/status")
    if st is None:
        return None
    vals = {}
    for line in st.splitlines():
        k, _, v = line.partition(":")
        vals[k] = v.strip()
    if "VmRSS" not in vals:  # a zombie
        return None

    def kib(k):
        return int(vals.get(k, "0 kB").split()[0])
    return {"rss_kib": kib("VmRSS"), "anon_kib": kib("RssAnon"), "file_kib": kib("RssFile"), "hwm_kib": kib("VmHWM"),
            "threads": int(vals.get("Threads", "0")), "fds": sum(best.values()), "fd_kinds": best}


def all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


class LongRun:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.dir = tempfile.mkdtemp(prefix="erun-long-run-")
        build = os.path.abspath(a.build)
        # Private copies: the build tree may be rebuilt while the job runs,
        # and the job's processes are found by these paths.
        self.erun = os.path.join(self.dir, "erun")
        self.train = os.path.join(self.dir, "train_long_run")
        shutil.copy2(os.path.join(build, "src", "runner", "erun"), self.erun)
        shutil.copy2(os.path.join(build, "examples", "train_mlp"), self.train)
        os.mkdir(os.path.join(self.dir, "lib"))
        lib = os.path.join(build, "src", "lib", "liberun.so.0")
        if os.path.exists(lib):
            shutil.copy2(os.path.realpath(lib), os.path.join(self.dir, "lib", "liberun.so.0"))
        self.binaries = {}
        for name, path in (("erun", os.path.join(build, "src", "runner", "erun")),
                           ("train_mlp", os.path.join(build, "examples", "train_mlp")), ("liberun.so.0", lib)):
            if os.path.exists(path):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()[:16]
                self.binaries[name] = {"path": path, "sha256": digest, "mtime": time.strftime(
                    "%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(path)))}
        r = subprocess.run(["git", "-C", os.path.dirname(build), "describe", "--always", "--dirty"],
                           capture_output=True, text=True)
        self.binaries["source_tree"] = r.stdout.strip() or None
        os.mkdir(os.path.join(self.dir, "jobs"), 0o700)
        self.hosts = {}  # listed host -> slots
        self.draining = set()
        self.events_path = os.path.join(self.dir, "events.jsonl")
        self.out_path = os.path.join(self.dir, "out")
        self.err_path = os.path.join(self.dir, "err")
        self.disc = os.path.join(self.dir, "discover.sh")
        with open(self.disc, "w") as f:
            f.write(f"#!/bin/sh\ncat {self.dir}/hosts\n")
        os.chmod(self.disc, 0o700)
        self.set_hosts(dict(BASE))
        self.ev_offset = 0
        self.ev_partial = b""
        self.gen = 0  # the newest generation_started
        self.joined = 0  # the newest generation_joined
        self.gen_size = {}
        self.gen_plan = {}
        self.last_gen_time = time.time()
        self.events = {}  # event name -> count
        self.takeover_log = []
        self.faults = {}
        self.no_generation = {}  # fault kind -> how many brought no new generation
        self.samples = []
        self.tracked = None  # pid of the surviving worker
        self.tracked_history = []  # (generation, pid, why)
        self.drivers = []  # {"pid", "from_gen", "to_gen"}
        self.proc = None
        self.job_id = None
        self.commit_base = None
        self.problems = []

    # ---- discovery -----------------------------------------------------------
    def set_hosts(self, hosts, draining=()):
        self.hosts = dict(hosts)
        self.draining = set(draining) & set(hosts)
        tmp = os.path.join(self.dir, "hosts.tmp")
        with open(tmp, "w") as f:
            for h, n in self.hosts.items():
                f.write(f"{h}:{n}{' draining' if h in self.draining else ''}\n")
        os.rename(tmp, os.path.join(self.dir, "hosts"))

    # ---- the event log -------------------------------------------------------
    def poll_events(self):
        try:
            with open(self.events_path, "rb") as f:
                f.seek(self.ev_offset)
                data = f.read()
        except OSError:
            return
        self.ev_offset += len(data)
        data = self.ev_partial + data
        lines = data.split(b"\n")
        self.ev_partial = lines.pop()
        for line in lines:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            name = e.get("event")
            self.events[name] = self.events.get(name, 0) + 1
            if name == "generation_started":
                g = e["generation"]
                self.gen_size[g] = e.get("size")
                self.gen_plan[g] = e.get("plan")
                if g > self.gen:
                    self.gen = g
                    self.last_gen_time = time.time()
            elif name == "generation_joined":
                self.joined = max(self.joined, e["generation"])
            elif name == "job_started" and self.job_id is None:
                self.job_id = e.get("job_id")

    # ---- processes -----------------------------------------------------------
    def exe_of(self, pid):
        try:
            return os.readlink(f"/proc/{pid}/exe")
        except OSError:
            return None

    def job_processes(self):
        """(workers, agents, watchdogs): this job's live processes by role."""
        workers, agents, dogs = [], [], []
        for pid in all_pids():
            exe = self.exe_of(pid)
            if exe not in (self.erun, self.train):
                continue
            f = stat_fields(pid)
            if not f or f[0] == "Z":
                continue
            if exe == self.train:
                workers.append(pid)
                continue
            cmd = read(f"/proc/{pid}/cmdline", "rb") or b""
            if b"\0--agent\0" not in cmd:
                continue
            parent = int(f[1])
            pcmd = read(f"/proc/{parent}/cmdline", "rb") or b""
            if self.exe_of(parent) == self.erun and b"\0--agent\0" in pcmd:
                dogs.append(pid)
            else:
                agents.append(pid)
        return sorted(workers), sorted(agents), sorted(dogs)

    def agent_host(self, pid, workers):
        for w in workers:
            if ppid_of(w) == pid:
                h = environ(w).get("ERUN_HOSTNAME")
                if h:
                    return h
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
                m = re.match(r"/dev/shm/erun-commits-[0-9a-f]+-(.+?)/", t)
                if m:
                    return m.group(1)
        except OSError:
            pass
        return "?"

    def members(self, workers, agents):
        """Workers of a live agent older than 1.5 s that are no standby."""
        ticks = os.sysconf("SC_CLK_TCK")
        up = float(read("/proc/uptime").split()[0])
        out = []
        for w in workers:
            f = stat_fields(w)
            if not f or ppid_of(w) not in agents:
                continue
            if up - int(f[19]) / ticks < 1.5:
                continue
            if environ(w).get("ERUN_STANDBY") == "1":
                continue
            out.append(w)
        return out

    def pick_tracked(self, why):
        workers, agents, _ = self.job_processes()
        cands = [w for w in workers if environ(w).get("ERUN_HOSTNAME") == "node-a" and ppid_of(w) in agents
                 and environ(w).get("ERUN_STANDBY") != "1"]
        if not cands:
            return False
        self.tracked = min(cands)
        self.tracked_history.append({"generation": self.gen, "pid": self.tracked, "why": why})
        log(f"tracked worker: pid {self.tracked} on node-a ({why})")
        return True

    # ---- erun ----------------------------------------------------------------
    def command(self):
        return [self.erun, "--host-discovery-script", self.disc, "--discovery-interval", "0.2",
                "--launcher", "local", "--event-log", self.events_path, "--job-name", "long-run",
                "--driver-grace", "60", "--term-grace", "2", "--collective-timeout", "2",
                "--rendezvous-timeout", "10", "--blacklist-after", "1000000", "--stragglers", "off",
                "-np", "4", "--min-np", "2", "--max-np", str(MAX_NP), "-x", "LD_LIBRARY_PATH",
                self.train, *TRAIN]

    def start_erun(self):
        # ERUN_LOG_LEVEL: the bench reads erun's info lines ("gen N:", "took
        # the job over"); erun says warnings only by default.
        env = dict(os.environ, ERUN_JOB_DIR=os.path.join(self.dir, "jobs"),
                   LD_LIBRARY_PATH=os.path.join(self.dir, "lib"))
        env.setdefault("ERUN_LOG_LEVEL", "info")
        with open(self.out_path, "a") as out, open(self.err_path, "a") as err:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=err, env=env, cwd=self.dir)
        self.drivers.append({"pid": self.proc.pid, "from_generation": self.gen, "to_generation": None})

    def err_text(self):
        return read(self.err_path) or ""

    def wait(self, cond, limit, step=0.02):
        end = time.time() + limit
        while time.time() < end:
            self.poll_events()
            if cond():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(step)
        self.poll_events()
        return cond()

    def takeover(self):
        g0 = self.gen
        old = self.proc
        old.send_signal(signal.SIGKILL)
        old.wait()
        self.drivers[-1]["to_generation"] = g0
        time.sleep(self.rng.uniform(0.2, 1.0))
        attached_before = self.events.get("driver_attached", 0)
        t = time.time()
        self.start_erun()
        ok = self.wait(lambda: self.events.get("driver_attached", 0) > attached_before, 60)
        attached = time.time() - t
        ok = ok and self.wait(lambda: self.gen > g0 and self.joined >= self.gen, 60)
        driven = time.time() - t
        self.takeover_log.append({"generation": g0, "old_pid": old.pid, "new_pid": self.proc.pid,
                                  "attached_s": round(attached, 3), "driven_s": round(driven, 3), "ok": ok})
        self.faults["takeover"] = self.faults.get("takeover", 0) + 1
        if not ok:
            self.problems.append(f"takeover at generation {g0} did not drive the job again")
        log(f"takeover at gen {g0}: erun {old.pid} -> {self.proc.pid}, attached {attached:.2f} s, "
            f"driven again {driven:.2f} s")
        return ok

    # ---- faults --------------------------------------------------------------
    def cpu_ticks(self, pids):
        out = {}
        for pid in pids:
            f = stat_fields(pid)
            if f:
                out[pid] = int(f[11]) + int(f[12])
        return out

    def victims(self):
        """Members one may SIGKILL: not the tracked worker, and no standby
        still waiting (one idles in the rendezvous; a promoted one computes)."""
        workers, agents, _ = self.job_processes()
        ms = [w for w in self.members(workers, agents) if w != self.tracked]
        maybe = [w for w in ms if environ(w).get("ERUN_STANDBY") == "1"]
        if maybe:
            t0 = self.cpu_ticks(maybe)
            time.sleep(0.3)
            t1 = self.cpu_ticks(maybe)
            idle = {w for w in maybe if t1.get(w, 0) - t0.get(w, 0) == 0}
            ms = [w for w in ms if w not in idle]
        return ms

    def listed_slots(self, hosts, draining):
        return sum(n for h, n in hosts.items() if h not in draining)

    def fault(self):
        cap = MAX_NP + 1  # listed slots: the plan's and at most one for a standby
        listed_spares = [h for h in SPARES if h in self.hosts]
        unlisted = [h for h in SPARES if h not in self.hosts]
        hosts, draining = dict(self.hosts), set(self.draining)
        active = [h for h in listed_spares if h not in draining]
        total = self.listed_slots(hosts, draining)
        kind = self.rng.choice(KINDS)
        cands = []
        if kind == "kill":
            cands = self.victims()
            if len(cands) < 2:
                kind = "add_host" if unlisted else "slots"
        if kind == "add_host" and (not unlisted or total + 1 > cap):
            kind = "remove_host" if listed_spares else "slots"
        if kind == "remove_host" and not listed_spares:
            kind = "add_host" if total + 1 <= cap else "slots"
        if kind == "drain" and not active:
            kind = "add_host" if unlisted and total + 1 <= cap else "slots"
        if kind == "undrain" and not [h for h in draining if total + hosts[h] <= cap]:
            kind = "drain" if active else "slots"
        what = kind
        if kind == "kill":
            pid = self.rng.choice(cands)
            host = environ(pid).get("ERUN_HOSTNAME", "?")
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            what = f"kill worker {pid} ({host})"
        elif kind == "slots":
            opts = []
            for h in ["node-b"] + active:
                for n in ((1, 2, 3) if h == "node-b" else (1, 2)):
                    if n != hosts[h] and total - hosts[h] + n <= cap:
                        opts.append((h, n))
            h, n = self.rng.choice(opts)
            hosts[h] = n
            self.set_hosts(hosts, draining)
            what = f"slots {h}:{n}"
        elif kind == "add_host":
            h = self.rng.choice(unlisted)
            hosts[h] = self.rng.randint(1, min(2, cap - total))
            self.set_hosts(hosts, draining)
            what = f"add {h}:{hosts[h]}"
        elif kind == "remove_host":
            h = self.rng.choice(listed_spares)
            del hosts[h]
            self.set_hosts(hosts, draining - {h})
            what = f"remove {h}" + (" (draining)" if h in draining else "")
        elif kind == "drain":
            h = self.rng.choice(active)
            self.set_hosts(hosts, draining | {h})
            what = f"drain {h}"
        elif kind == "undrain":
            h = self.rng.choice(sorted(h for h in draining if total + hosts[h] <= cap))
            self.set_hosts(hosts, draining - {h})
            what = f"undrain {h}"
        # A change the plan does not see: a draining host dropped, a slot
        # beyond --max-np (a standby's).
        expect = not (kind == "remove_host" and "(draining)" in what)
        self.faults[kind] = self.faults.get(kind, 0) + 1
        g0 = self.gen
        # Until a new generation has joined (or none comes), then a moment of
        # training.
        self.wait(lambda: self.gen > g0 and self.joined >= self.gen, 4 if expect else 1.0)
        if self.gen == g0:
            self.no_generation[kind] = self.no_generation.get(kind, 0) + 1
        time.sleep(self.rng.uniform(0.1, 0.4))
        self.poll_events()
        if self.a.verbose:
            log(f"{what}: gen {g0} -> {self.gen}")

    # ---- samples -------------------------------------------------------------
    def settle(self, limit=45):
        """Lists the base hosts and waits until the job runs there alone: the
        base plan joined, its four workers and no other, 1.5 s without a new
        generation. (Agents of hosts that left discovery stay: see the
        agents' count in each sample.)"""
        if self.hosts != BASE or self.draining:
            self.set_hosts(dict(BASE))
        t0 = time.time()
        state = {}

        def settled():
            workers, agents, _ = self.job_processes()
            base_plan = self.gen_plan.get(self.gen) == BASE_PLAN and self.joined >= self.gen
            ok_workers = len(workers) == 4 and all(ppid_of(w) in agents for w in workers)
            state.update(workers=len(workers), agents=len(agents), plan=self.gen_plan.get(self.gen))
            return base_plan and ok_workers and time.time() - self.last_gen_time > 1.5

        ok = self.wait(settled, limit, step=0.1)
        if not ok:
            self.problems.append(f"not settled at generation {self.gen}: {state}")
            log(f"WARNING: not settled at gen {self.gen}: {state}")
        return ok, round(time.time() - t0, 2)

    def sample(self, when):
        ok, took = self.settle()
        workers, agents, dogs = self.job_processes()
        if self.tracked not in workers:
            old = self.tracked
            if self.pick_tracked(f"the tracked worker {old} was gone at generation {self.gen}" if old else "start"):
                if old:
                    self.problems.append(f"tracked worker {old} replaced by {self.tracked} at generation {self.gen}")
        procs = []
        d = proc_info(self.proc.pid)
        if d:
            procs.append(dict(d, role="driver", pid=self.proc.pid, host="-"))
        for a in agents:
            i = proc_info(a)
            if i:
                procs.append(dict(i, role="agent", pid=a, host=self.agent_host(a, workers)))
        for w in dogs:
            i = proc_info(w)
            if i:
                procs.append(dict(i, role="watchdog", pid=w, host=self.agent_host(ppid_of(w), workers)))
        if self.tracked:
            i = proc_info(self.tracked)
            if i:
                procs.append(dict(i, role="worker", pid=self.tracked, host="node-a"))
        shm = []
        if self.commit_base:
            shm = [x for x in os.listdir("/dev/shm") if x.startswith(self.commit_base)]
        s = {"generation": self.gen, "when": when, "t": round(time.time() - self.t0, 1), "settled": ok,
             "settle_s": took, "workers": len(workers), "agents": len(agents), "watchdogs": len(dogs),
             "shm_dirs": len(shm), "relay_dirs": len([x for x in os.listdir("/tmp") if x.startswith("erun-relay-")]),
             "event_log_bytes": os.path.getsize(self.events_path), "procs": procs}
        self.samples.append(s)
        drv = next((p for p in procs if p["role"] == "driver"), None)
        ags = " ".join(f"{p['host']}:{p['rss_kib'] / MIB:.1f}M/{p['fds']}fd" for p in procs if p["role"] == "agent")
        wk = next((p for p in procs if p["role"] == "worker"), None)
        log(f"gen {self.gen} ({when}): driver {drv['rss_kib'] / MIB:.1f} MiB {drv['fds']} fds" if drv else
            f"gen {self.gen} ({when}): driver gone")
        log(f"    agents {ags}; worker " + (f"{wk['rss_kib'] / MIB:.1f} MiB {wk['fds']} fds" if wk else "-") +
            f"; {len(workers)} workers, {len(agents)} agents, {len(dogs)} watchdogs, settled in {took} s")
        return s

    # ---- the run -------------------------------------------------------------
    def run(self):
        a = self.a
        self.t0 = time.time()
        self.relay_before = len([x for x in os.listdir("/tmp") if x.startswith("erun-relay-")])
        log(f"work dir {self.dir}; seed {a.seed}; {a.generations} generations, a takeover every "
            f"{a.takeover_every}, a sample every {a.sample_every}")
        log(" ".join(self.command()))
        self.start_erun()
        if not self.wait(lambda: self.joined >= 1, 120):
            log("the job did not start")
            self.problems.append("the job did not start")
            return False
        self.wait(lambda: False, 2)  # its workers' first commits
        for w in self.job_processes()[0]:
            env = environ(w)
            d, h = env.get("ERUN_COMMIT_DIR", ""), env.get("ERUN_HOSTNAME", "")
            if d and h and d.endswith("-" + h):
                self.commit_base = os.path.basename(d[:-len(h) - 1])
                break
        self.pick_tracked("start")
        self.sample("start")
        next_sample = a.sample_every
        next_takeover = a.takeover_every
        last_report = time.time()
        while self.gen < a.generations:
            if self.proc.poll() is not None:
                self.problems.append(f"erun exited with {self.proc.returncode} at generation {self.gen}")
                log(f"erun exited with {self.proc.returncode}")
                return False
            if a.takeover_every and self.gen >= next_takeover:
                self.sample("before takeover")
                if not self.takeover():
                    return False
                self.sample("after takeover")
                while next_takeover <= self.gen:
                    next_takeover += a.takeover_every
                while next_sample <= self.gen:
                    next_sample += a.sample_every
                continue
            if self.gen >= next_sample:
                self.sample("periodic")
                while next_sample <= self.gen:
                    next_sample += a.sample_every
                continue
            self.fault()
            if time.time() - last_report > 60:
                last_report = time.time()
                log(f"gen {self.gen}, {time.time() - self.t0:.0f} s, faults {self.faults}")
        self.sample("end")
        return True

    def stop(self):
        """SIGTERM to erun; checks that nothing of the job is left."""
        res = {}
        if self.proc is None:
            return res
        t = time.time()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                res["exit_code"] = self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                res["exit_code"] = self.proc.wait()
                self.problems.append("erun did not stop within 90 s of SIGTERM")
        else:
            res["exit_code"] = self.proc.returncode
        res["stop_s"] = round(time.time() - t, 2)
        self.drivers[-1]["to_generation"] = self.gen
        left = []
        for _ in range(150):
            w, ag, dg = self.job_processes()
            left = w + ag + dg
            if not left:
                break
            time.sleep(0.1)
        res["processes_left"] = [{"pid": p, "cmd": (read(f"/proc/{p}/cmdline", "rb") or b"").replace(b"\0", b" ")
                                  .decode(errors="replace")[:120]} for p in left]
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        shm = []
        for _ in range(150):
            shm = [x for x in os.listdir("/dev/shm") if self.commit_base and x.startswith(self.commit_base)]
            if not shm:
                break
            time.sleep(0.1)
        res["shm_dirs_left"] = shm
        res["relay_dirs_before"] = self.relay_before
        res["relay_dirs_after"] = len([x for x in os.listdir("/tmp") if x.startswith("erun-relay-")])
        self.poll_events()
        return res


# ---- analysis -------------------------------------------------------------------
def series(samples):
    """process key -> [(generation, proc)] over the samples."""
    out = {}
    for s in samples:
        for p in s["procs"]:
            if p["role"] == "driver":
                key = f"driver pid {p['pid']}"
            elif p["role"] in ("agent", "watchdog"):
                key = f"{p['role']} {p['host']} pid {p['pid']}"
            else:
                key = f"worker node-a pid {p['pid']}"
            out.setdefault(key, []).append((s["generation"], p, s["when"]))
    return out


def growth(points, lo):
    """(first, last) of `points` at or after generation `lo`."""
    pts = [p for p in points if p[0] >= lo]
    if len(pts) < 2:
        return None
    return pts[0], pts[-1]


def analyse(samples, generations, window):
    lo = generations - window
    ser = series(samples)
    rows = []
    verdict = {"driver": True, "agents": True, "worker": True}
    for key, pts in ser.items():
        role = pts[0][1]["role"]
        first, last = pts[0], pts[-1]
        row = {"process": key, "role": role, "host": first[1]["host"], "pid": first[1]["pid"],
               "first_generation": first[0], "last_generation": last[0],
               "rss_first_mib": round(first[1]["rss_kib"] / MIB, 2), "rss_last_mib": round(last[1]["rss_kib"] / MIB, 2),
               "fds_first": first[1]["fds"], "fds_last": last[1]["fds"],
               "threads_first": first[1]["threads"], "threads_last": last[1]["threads"], "samples": len(pts)}
        g = growth(pts, lo)
        if role == "driver":
            # A driver lives from one takeover to the next: its own growth,
            # from its first sample (right after it took over) to its last
            # (right before it is killed); "steady": from its second.
            if first[0] >= lo and len(pts) >= 2:
                row["in_window"] = True
                row["rss_growth_mib"] = round((last[1]["rss_kib"] - first[1]["rss_kib"]) / MIB, 3)
                row["fd_growth"] = last[1]["fds"] - first[1]["fds"]
                if len(pts) >= 3:
                    row["steady_rss_growth_mib"] = round((last[1]["rss_kib"] - pts[1][1]["rss_kib"]) / MIB, 3)
                    row["steady_fd_growth"] = last[1]["fds"] - pts[1][1]["fds"]
                g = (first, last)
            elif g:  # no takeover in the window: the window's growth, as for the others
                row["in_window"] = True
                row["window_from_generation"] = g[0][0]
                row["rss_growth_mib"] = round((g[1][1]["rss_kib"] - g[0][1]["rss_kib"]) / MIB, 3)
                row["fd_growth"] = g[1][1]["fds"] - g[0][1]["fds"]
        elif g:
            row["in_window"] = True
            row["window_from_generation"] = g[0][0]
            row["rss_growth_mib"] = round((g[1][1]["rss_kib"] - g[0][1]["rss_kib"]) / MIB, 3)
            row["fd_growth"] = g[1][1]["fds"] - g[0][1]["fds"]
            row["window_spans_generations"] = g[1][0] - g[0][0]
        if row.get("in_window"):
            row["rss_anon_growth_mib"] = round((g[1][1]["anon_kib"] - g[0][1]["anon_kib"]) / MIB, 3)
            row["threads_growth"] = g[1][1]["threads"] - g[0][1]["threads"]
            ka, kb = g[0][1]["fd_kinds"], g[1][1]["fd_kinds"]
            row["fd_kinds_change"] = {k: kb.get(k, 0) - ka.get(k, 0) for k in sorted(set(ka) | set(kb))
                                      if kb.get(k, 0) != ka.get(k, 0)}
            if "steady_rss_growth_mib" in row:
                # A new driver connects to an agent's relay only once workers
                # run there again: a driver is judged from its second sample.
                met = row["steady_rss_growth_mib"] < 1.0 and row["steady_fd_growth"] <= 0
            else:
                met = row["rss_growth_mib"] < 1.0 and row["fd_growth"] <= 0
            row["met"] = met
            cat = {"driver": "driver", "agent": "agents", "watchdog": "agents", "worker": "worker"}[role]
            if not met:
                verdict[cat] = False
        rows.append(row)
    # Across drivers: each driver's last sample (before its takeover) in the
    # window: what a new driver takes over (the job record, the agents) must
    # not grow either.
    ends = [(pts[-1][0], pts[-1][1]) for k, pts in ser.items() if pts[0][1]["role"] == "driver" and pts[0][0] >= lo]
    ends.sort(key=lambda x: x[0])
    across = None
    if len(ends) >= 2:
        across = {"drivers": len(ends),
                  "first": {"generation": ends[0][0], "rss_mib": round(ends[0][1]["rss_kib"] / MIB, 2),
                            "fds": ends[0][1]["fds"]},
                  "last": {"generation": ends[-1][0], "rss_mib": round(ends[-1][1]["rss_kib"] / MIB, 2),
                           "fds": ends[-1][1]["fds"]},
                  "rss_growth_mib": round((ends[-1][1]["rss_kib"] - ends[0][1]["rss_kib"]) / MIB, 3),
                  "fd_growth": ends[-1][1]["fds"] - ends[0][1]["fds"],
                  "min_rss_mib": round(min(e[1]["rss_kib"] for e in ends) / MIB, 2),
                  "max_rss_mib": round(max(e[1]["rss_kib"] for e in ends) / MIB, 2),
                  "fds": sorted({e[1]["fds"] for e in ends})}
        across["met"] = across["rss_growth_mib"] < 1.0 and across["fd_growth"] <= 0
        if not across["met"]:
            verdict["driver"] = False
    counts = {"agents": [(s["generation"], s["agents"]) for s in samples if s["generation"] >= lo],
              "watchdogs": [(s["generation"], s["watchdogs"]) for s in samples if s["generation"] >= lo]}
    return rows, verdict, across, counts, lo


# ---- the plot -------------------------------------------------------------------
def plot(results, path):
    samples = results["samples"]
    ser = series(samples)
    takeovers = [t["generation"] for t in results["takeovers"]]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return plot_elsewhere(results, path)
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5), sharex=True)
    cols = {"driver": 0, "agent": 1, "watchdog": 1, "worker": 2}
    colors = {"agent node-a": "tab:blue", "agent node-b": "tab:green", "watchdog node-a": "tab:cyan",
              "watchdog node-b": "tab:olive"}
    labelled = set()
    for key, pts in sorted(ser.items()):
        role, host = pts[0][1]["role"], pts[0][1]["host"]
        if role == "watchdog":  # 3 MiB and 4 descriptors each: in the results, not drawn
            continue
        col = cols[role]
        if role == "driver":
            c, label = "tab:red", "erun driver: one line per process"
        elif role == "worker":
            c, label = "tab:purple", f"tracked worker (node-a, pid {pts[0][1]['pid']})"
        else:
            c = colors.get(f"{role} {host}", "tab:gray")
            label = f"{role} {host}" if f"{role} {host}" in colors else "agents of node-c, -d, -e"
        if label in labelled:
            label = None
        else:
            labelled.add(label)
        xs = [p[0] for p in pts]
        axes[0][col].plot(xs, [p[1]["rss_kib"] / MIB for p in pts], "-o", ms=2.5, color=c, label=label, lw=1.2)
        axes[1][col].plot(xs, [p[1]["fds"] for p in pts], "-o", ms=2.5, color=c, lw=1.2)
    lo = results["window_from_generation"]
    for row in axes:
        for ax in row:
            for g in takeovers:
                ax.axvline(g, color="0.85", lw=0.6, zorder=0)
            ax.axvspan(lo, samples[-1]["generation"], color="0.94", zorder=-1)
            ax.grid(alpha=0.3)
    for col, title in enumerate(("erun (driver)", "agents (erun --agent)", "a surviving worker")):
        axes[0][col].set_title(title, fontsize=10)
        axes[0][col].legend(fontsize=7, loc="lower right")
        axes[1][col].set_xlabel("generation")
        # Within 1 MiB must show: at least a 2 MiB range.
        lo_y, hi_y = axes[0][col].get_ylim()
        if hi_y - lo_y < 2:
            mid = (hi_y + lo_y) / 2
            axes[0][col].set_ylim(mid - 1, mid + 1)
        lo_y, hi_y = axes[1][col].get_ylim()
        axes[1][col].set_ylim(0, hi_y + 2)
    axes[0][0].set_ylabel("RSS (MiB)")
    axes[1][0].set_ylabel("open file descriptors")
    fig.suptitle(f"One erun job through {samples[-1]['generation']} generations: {results['faults_total']} "
                 f"faults (kills, resizes, drains) and {len(takeovers)} takeovers (grey lines); shaded: the last "
                 f"{results['window_generations']:,} generations", fontsize=10.5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def plot_elsewhere(results, path):
    """No matplotlib here: the repository's .venv may have it; else an SVG."""
    here = os.path.dirname(os.path.abspath(__file__))
    for py in (os.environ.get("ERUN_PYTHON"), os.path.join(os.path.dirname(here), ".venv", "bin", "python")):
        if py and os.path.exists(py):
            r = subprocess.run([py, "-c", "import matplotlib"], capture_output=True)
            if r.returncode == 0:
                tmp = os.path.join(tempfile.mkdtemp(prefix="erun-long-run-plot-"), "results.json")
                with open(tmp, "w") as f:
                    json.dump(results, f)
                r = subprocess.run([py, os.path.abspath(__file__), "--plot-only", tmp, "--plot", path])
                if r.returncode == 0:
                    return path
    return plot_svg(results, os.path.splitext(path)[0] + ".svg")


def plot_svg(results, path):
    samples = results["samples"]
    ser = series(samples)
    W, H, L, R, T = 900, 560, 70, 230, 30
    ph = (H - 3 * T) / 2
    gmax = max(1, samples[-1]["generation"])
    colors = {"driver": "#d62728", "agent": "#1f77b4", "watchdog": "#17becf", "worker": "#9467bd"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    for i, (metric, label) in enumerate((("rss", "RSS (MiB)"), ("fds", "open file descriptors"))):
        top = T + i * (ph + T)
        vals = [(p[1]["rss_kib"] / MIB if metric == "rss" else p[1]["fds"]) for pts in ser.values() for p in pts]
        vmax = max(vals) * 1.1 if vals else 1
        out.append(f'<rect x="{L}" y="{top}" width="{W - L - R}" height="{ph}" fill="none" stroke="#888"/>')
        out.append(f'<text x="10" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})">{label}</text>')
        for k in range(5):
            v = vmax * k / 4
            y = top + ph - ph * k / 4
            out.append(f'<text x="{L - 5}" y="{y + 4}" text-anchor="end">{v:.0f}</text>')
        for key, pts in ser.items():
            c = colors.get(pts[0][1]["role"], "#888")
            d = " ".join(f"{L + (W - L - R) * p[0] / gmax:.1f},"
                         f"{top + ph - ph * (p[1]['rss_kib'] / MIB if metric == 'rss' else p[1]['fds']) / vmax:.1f}"
                         for p in pts)
            out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="1.2"/>')
    for j, (role, c) in enumerate(colors.items()):
        out.append(f'<text x="{W - R + 10}" y="{T + 15 * j + 10}" fill="{c}">{role}</text>')
    out.append(f'<text x="{L}" y="{H - 5}">generation (0-{gmax})</text></svg>')
    with open(path, "w") as f:
        f.write("\n".join(out))
    return path


def write_json(path, results):
    """One line per top-level key, and per sample: small, and diffable."""
    items = list(results.items())
    with open(path, "w") as f:
        f.write("{\n")
        for i, (k, v) in enumerate(items):
            if k == "samples":
                body = "[\n" + ",\n".join(json.dumps(s, separators=(",", ":")) for s in v) + "\n]"
            else:
                body = json.dumps(v, separators=(",", ":"))
            f.write(f"{json.dumps(k)}: {body}{',' if i < len(items) - 1 else ''}\n")
        f.write("}\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--build", default=os.path.join(os.path.dirname(here), "build"), help="the build directory")
    p.add_argument("--generations", type=int, default=2000, help="run until the driver's generation N (2000)")
    p.add_argument("--quick", action="store_true",
                   help="a short trial: 200 generations, a takeover every 50, a sample every 25")
    p.add_argument("--takeover-every", type=int, default=100, help="generations between takeovers (0: none)")
    p.add_argument("--sample-every", type=int, default=25, help="generations between samples (25)")
    p.add_argument("--window", type=int, default=1000, help="the goal's window: the last N generations (1000)")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--json", help="write the results here")
    p.add_argument("--plot", help="draw RSS and descriptors per process here (.png; .svg without matplotlib)")
    p.add_argument("--plot-only", metavar="RESULTS", help="only draw --plot from a results file")
    p.add_argument("--rewrite-json", metavar="RESULTS", help="only rewrite a results file in this bench's layout")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, event log)")
    p.add_argument("-v", "--verbose", action="store_true", help="a line per fault")
    a = p.parse_args()
    if a.rewrite_json:
        with open(a.rewrite_json) as f:
            write_json(a.rewrite_json, json.load(f))
        return 0
    if a.plot_only:
        with open(a.plot_only) as f:
            res = json.load(f)
        print(plot(res, a.plot))
        return 0
    if a.quick:
        a.generations, a.takeover_every, a.sample_every = 200, 50, 25
    a.window = min(a.window, a.generations // 2)
    lr = LongRun(a)
    ok = False
    try:
        ok = lr.run()
    except KeyboardInterrupt:
        lr.problems.append("interrupted")
    finally:
        stop = lr.stop()
    wall = time.time() - lr.t0
    rows, verdict, across, counts, lo = analyse(lr.samples, a.generations, a.window) if len(lr.samples) > 1 else \
        ([], {"driver": False, "agents": False, "worker": False}, None, {}, 0)
    clean = stop.get("exit_code") in (0, 128 + signal.SIGTERM) and not stop.get("processes_left") and \
        not stop.get("shm_dirs_left")
    err = lr.err_text()
    gens_said = [int(g) for g in re.findall(r"erun info: gen (\d+): ", err)]
    took_over = len(re.findall(r"took the job over at generation", err))
    if took_over != len(lr.takeover_log):
        lr.problems.append(f"{len(lr.takeover_log)} takeovers, {took_over} 'took the job over' lines")
    results = {
        "command": " ".join(sys.argv),
        "erun_command": " ".join(lr.command()),
        "binaries": lr.binaries,
        "seed": a.seed,
        "generations_target": a.generations,
        "generations_reached": lr.gen,
        "generation_in_eruns_log": max(gens_said) if gens_said else None,
        "took_the_job_over_lines": took_over,
        "wall_s": round(wall, 1),
        "takeover_every": a.takeover_every,
        "sample_every": a.sample_every,
        "window_generations": a.window,
        "window_from_generation": lo,
        "faults": lr.faults,
        "faults_total": sum(lr.faults.values()),
        "faults_without_a_new_generation": lr.no_generation,
        "events": lr.events,
        "takeovers": lr.takeover_log,
        "drivers": lr.drivers,
        "tracked_worker": lr.tracked_history,
        "stop": stop,
        "stopped_cleanly": clean,
        "problems": lr.problems,
        "processes": rows,
        "drivers_across_window": across,
        "process_counts_in_window": counts,
        "goal": {"driver_each_process": verdict["driver"], "agents": verdict["agents"],
                 "met": verdict["driver"] and verdict["agents"], "surviving_worker": verdict["worker"]},
        "samples": lr.samples,
        "work_dir": lr.dir,
    }
    log(f"reached generation {lr.gen} in {wall:.0f} s; faults {lr.faults}")
    log(f"stop: {json.dumps(stop)}")
    print(f"{'process':<34} {'gens':>11} {'RSS MiB first->last':>20} {'fds':>9} {'dRSS MiB':>9} {'dfd':>4} "
          f"{'steady':>14}  goal (window: generation {lo} on; a driver: its own life)")
    for r in rows:
        if r["role"] == "watchdog" and not a.verbose and r.get("met", True):
            continue
        gw = f"{r['rss_growth_mib']:+.3f}" if "rss_growth_mib" in r else "-"
        fw = f"{r['fd_growth']:+d}" if "fd_growth" in r else "-"
        st = (f"{r['steady_rss_growth_mib']:+.3f}/{r['steady_fd_growth']:+d}" if "steady_rss_growth_mib" in r else "")
        met = "-" if "met" not in r else ("met" if r["met"] else "NOT MET " + json.dumps(r["fd_kinds_change"]))
        print(f"{r['process']:<34} {r['first_generation']:>5}-{r['last_generation']:<5} "
              f"{r['rss_first_mib']:>9.2f}->{r['rss_last_mib']:<9.2f} {r['fds_first']:>4}->{r['fds_last']:<4} "
              f"{gw:>9} {fw:>4} {st:>14}  {met}")
    if across:
        print(f"drivers' last samples across the window ({across['drivers']} drivers): RSS {across['first']['rss_mib']}"
              f" MiB (gen {across['first']['generation']}) -> {across['last']['rss_mib']} MiB (gen "
              f"{across['last']['generation']}), range {across['min_rss_mib']}-{across['max_rss_mib']} MiB; fds "
              f"{across['first']['fds']} -> {across['last']['fds']} (all: {across['fds']}): "
              f"{'met' if across['met'] else 'NOT MET'}")
    print(f"goal over the last {a.window} generations (RSS < 1 MiB, fds +0), erun per driver process: "
          f"{'met' if verdict['driver'] else 'NOT MET'}; every agent: {'met' if verdict['agents'] else 'NOT MET'}; "
          f"surviving worker (separately): {'met' if verdict['worker'] else 'NOT MET'}")
    print(f"stopped cleanly: {'yes' if clean else 'NO'} (exit {stop.get('exit_code')}, "
          f"{len(stop.get('processes_left', []))} processes left, {len(stop.get('shm_dirs_left', []))} shm dirs left)")
    if lr.problems:
        print("problems: " + "; ".join(lr.problems))
    path = a.json or os.path.join(lr.dir, "results.json")
    write_json(path, results)
    log(f"results: {path}")
    if a.plot:
        log(f"plot: {plot(results, a.plot)}")
    if not a.keep and ok and clean:
        for f in ("erun", "train_long_run"):
            os.unlink(os.path.join(lr.dir, f))
    return 0 if ok and clean and results["goal"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
