#!/usr/bin/python3
"""Fault soak for in-place elastic training: N random faults against one running job.

Runs examples/train_mlp under erun (--launcher local, simulated hosts from a
discovery script) and, while it trains, injects random faults one after another:
SIGKILL or SIGSTOP of a worker, a host removed or added, a host's slots changed,
discovery failing or printing junk for a while, every worker killed at once, an
agent or a watchdog killed, and a host lost whole (its agent SIGKILLed and the
host gone from discovery at once; when it is the only host with members, only
once a spare host holds a whole replica: run with --max-np 2 --min-np 1 so that
one host runs every worker and the others are spares), and erun itself SIGKILLed and the same
command run again at once (the new erun takes the job over in place). After each fault it waits until
the survivors compute again (their "reset: ... at=<unix time>" line) and records
the time from the fault to that line. At the end it checks that erun exited 0,
that the model equals an uninterrupted run's bit for bit, that every epoch saw
every sample exactly once, that training never restarted from epoch 0, and that
no worker process and no host-memory directory is left.

    /usr/bin/python3 bench/soak.py --build build --faults 100 --seed 1

Prints one line per fault and a summary (JSON with --json FILE). Exit status 0
when every check passed, 1 otherwise. Uses only the standard library.
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TRAIN = ["--samples", "8000", "--batch", "256", "--commit-every", "5"]
RESET = re.compile(r"reset: world size \d+ -> \d+ \(generation \d+\) at=([0-9.]+)")
# train_mlp's rank 0 after every worker died: the new workers start at a commit.
RESUMED = re.compile(r"resumed at commit \d+ in epoch=\d+ \(generation \d+\) at=([0-9.]+)")
CHECKSUM = re.compile(r"final accuracy=[0-9.]+ loss=[0-9.]+ checksum=([0-9a-f]+)")


def parent_of(pid):
    """The parent pid of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def is_agent(pid):
    """Whether `pid` is a live erun agent (a worker's parent while its host is in the job)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"\0--agent\0" in f.read()
    except (OSError, TypeError):
        return False


def children_of(pid):
    """The live children of `pid`."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit() and parent_of(int(p)) == pid:
            out.append(int(p))
    return out


def log(msg):
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Soak:
    def __init__(self, a):
        a.build = os.path.abspath(a.build)
        self.a = a
        self.kinds = ["kill", "kill", "stop", "remove_host", "add_host", "slots", "discovery_fail", "discovery_junk",
                      "kill_agent", "kill_watchdog", "kill_all", "kill_lone_agent", "lose_host", "restart_erun"]
        for w in a.weight:
            kind, _, n = w.partition("=")
            if kind not in self.kinds or not n.isdigit():
                raise SystemExit(f"--weight {w}: expected KIND=N with KIND one of {sorted(set(self.kinds))}")
            self.kinds = [k for k in self.kinds if k != kind] + [kind] * int(n)
        self.rng = random.Random(a.seed)
        self.dir = tempfile.mkdtemp(prefix="erun-soak-")
        self.train = os.path.join(a.build, "examples", "train_mlp")
        self.erun = os.path.join(a.build, "src", "runner", "erun")
        self.hosts = {"node-a": 2, "node-b": 2}
        self.spare = ["node-c", "node-d"]
        self.mode = "ok"
        self.write_discovery()
        self.out_path = os.path.join(self.dir, "out")
        self.err_path = os.path.join(self.dir, "err")
        self.results = []  # (kind, seconds or None)
        self.alone = set()  # indices in results of SIGSTOPs of a worker alone on its simulated host
        self.replica_losses = 0  # hosts lost whole that were the only ones with members
        self.base = None  # the job's host-memory directory without its host part
        self.takeovers = 0  # restart_erun faults
        self.cmd = None

    # ---- discovery ---------------------------------------------------------
    def write_discovery(self):
        script = os.path.join(self.dir, "discover.sh")
        with open(script + ".tmp", "w") as f:
            f.write("#!/bin/sh\n")
            f.write(f'mode=$(cat {self.dir}/mode 2>/dev/null)\n')
            f.write('[ "$mode" = fail ] && { echo "discovery down" >&2; exit 3; }\n')
            f.write('[ "$mode" = junk ] && { echo "host:notanumber"; echo "::::"; exit 0; }\n')
            f.write(f"cat {self.dir}/hosts\n")
        os.chmod(script + ".tmp", 0o700)
        os.rename(script + ".tmp", script)
        self.set_hosts()
        self.set_mode("ok")

    def set_hosts(self):
        tmp = os.path.join(self.dir, "hosts.tmp")
        with open(tmp, "w") as f:
            for h, n in self.hosts.items():
                f.write(f"{h}:{n}\n")
        os.rename(tmp, os.path.join(self.dir, "hosts"))

    def set_mode(self, mode):
        tmp = os.path.join(self.dir, "mode.tmp")
        with open(tmp, "w") as f:
            f.write(mode)
        os.rename(tmp, os.path.join(self.dir, "mode"))

    # ---- processes -----------------------------------------------------------
    def workers(self, stopped=False):
        """(pid, age in s) of this job's train_mlp processes (the stopped ones too when `stopped`)."""
        out = []
        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv0 = f.read().split(b"\0")[0].decode(errors="replace")
                if argv0 != self.train:
                    continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"ERUN_JOB_ID={self.job_id}\0".encode() not in f.read():
                        continue
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[0] == "Z" or (fields[0] == "T" and not stopped):
                    continue
                start = int(fields[19]) / ticks
                out.append((int(pid), uptime - start))
            except OSError:
                continue
        return out

    @staticmethod
    def env_of(pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                items = f.read().decode(errors="replace").split("\0")
        except OSError:
            return {}
        return dict(i.split("=", 1) for i in items if "=" in i)

    def commit_base(self, ws):
        """The job's host-memory directory without its host part (ERUN_COMMIT_DIR is BASE-HOST)."""
        if self.base:
            return self.base
        for pid, _ in ws:
            env = self.env_of(pid)
            d, h = env.get("ERUN_COMMIT_DIR", ""), env.get("ERUN_HOSTNAME", "")
            if d and h and d.endswith("-" + h):
                self.base = d[:-len(h) - 1]
                break
        return self.base

    @staticmethod
    def whole_replica(directory):
        """Whether DIR/replica.a or .b holds a whole commit (header claim == trailer id)."""
        for name in ("replica.a", "replica.b"):
            try:
                with open(os.path.join(directory, name), "rb") as f:
                    head = f.read(40)
                    if len(head) < 40 or head[:8] != b"ERUNSTAT":
                        continue
                    claim = int.from_bytes(head[16:24], "little")
                    f.seek(int.from_bytes(head[32:40], "little"))
                    if claim and int.from_bytes(f.read(8), "little") == claim:
                        return True
            except OSError:
                continue
        return False

    def is_worker(self, pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().split(b"\0")[0].decode(errors="replace") == self.train
        except OSError:
            return False

    def out(self):
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def resets_after(self, t):
        out = self.out()
        return [float(m.group(1)) for r in (RESET, RESUMED) for m in r.finditer(out) if float(m.group(1)) > t]

    def reference(self, epochs):
        r = subprocess.run([self.train, *TRAIN, "--epochs", str(epochs), "--step-ms", "0"], capture_output=True,
                           text=True, timeout=600)
        m = CHECKSUM.search(r.stdout)
        if not m:
            raise SystemExit(f"reference run failed: {r.stdout}{r.stderr}")
        return m.group(1)

    # ---- faults --------------------------------------------------------------
    def fault(self):
        kind = self.rng.choice(self.kinds)
        total = sum(self.hosts.values())
        victim_host = self.rng.choice(sorted(self.hosts))
        if kind == "remove_host" and (len(self.hosts) < 2 or total - self.hosts[victim_host] < self.a.min_np):
            kind = "add_host" if self.spare else "kill"
        # With a small --max-np the hosts offer more slots than the job
        # takes: a host is added while fewer than two are listed (a spare
        # for the one running the workers).
        if kind == "add_host" and (not self.spare or (total + 2 > self.a.max_np and len(self.hosts) >= 2)):
            kind = "kill"
        # Members, not fresh replacements, and not the workers of an agent
        # already lost: its watchdog is stopping them (SIGTERM, then up to
        # --term-grace), and erun counted them failed when the agent went.
        ws = [w for w in self.workers() if w[1] > 1.5 and is_agent(parent_of(w[0]))]
        if kind in ("kill", "stop") and not ws:
            kind = "discovery_junk"
        # A frozen worker is seen by the peers that wait for it in a
        # collective: the only worker of a job has none.
        if kind == "stop" and len(ws) < 2:
            kind = "kill"
        # A host's agent is its workers' parent. Killing one fails every worker
        # of that host: only where another host's members survive it.
        agents = {}
        for pid, _ in ws:
            agents.setdefault(parent_of(pid), []).append(pid)
        agents.pop(None, None)
        if kind in ("kill_agent", "kill_watchdog") and len(agents) < 2:
            kind = "kill" if ws else "discovery_junk"
        # Faults that leave no worker holding the last commit: every worker at
        # once, or the agent of the only host with members (its watchdog stops
        # them). The next generation restores it from host memory.
        # A host lost whole: its agent SIGKILLed (its watchdog stops its
        # workers) and the host gone from discovery at once. When it is the
        # only host with members, the job can go on only from a replica on a
        # host that stays (--commit-replicas, a spare host): only then.
        lost = None
        if kind == "lose_host":
            by_host = {}
            for agent, pids in agents.items():
                h = self.env_of(pids[0]).get("ERUN_HOSTNAME")
                if h in self.hosts:
                    by_host[h] = agent
            base = self.commit_base(ws)
            for h in sorted(by_host):
                if len(self.hosts) < 2 or total - self.hosts[h] < self.a.min_np:
                    continue
                if len(by_host) == 1 and not (base and any(self.whole_replica(f"{base}-{o}")
                                                            for o in self.hosts if o != h)):
                    continue
                # Alone: no other host runs a worker, not even one younger
                # than the members counted above (a replacement that just
                # started there holds the commit in its own files).
                others = {self.env_of(pid).get("ERUN_HOSTNAME") for pid, _ in self.workers()} - {h}
                lost = (h, by_host[h], len(by_host) == 1 and not others)
                break
            if lost is None:
                kind = "kill_lone_agent" if len(agents) == 1 else "kill" if ws else "discovery_junk"
        if kind == "kill_lone_agent" and len(agents) != 1:
            kind = "kill_all"
        if kind == "kill_all" and not ws:
            kind = "discovery_junk"
        t = time.time()
        what = kind
        expect_reset = True
        maybe_reset = False
        if kind in ("kill", "stop"):
            pid = self.rng.choice(ws)[0]
            os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            what = f"{kind} pid {pid}"
            if kind == "stop" and len(agents.get(parent_of(pid), [])) == 1:
                # Its peers reach it only over the network: no one sees its process.
                self.alone.add(len(self.results))
                what += " (alone on its host)"
        elif kind == "restart_erun":
            # The driver lost (SIGKILL): the same command again takes the job
            # over, its output appended to the same files.
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            time.sleep(self.rng.uniform(0.1, 1.5))
            self.start_erun("a")
            what = "kill erun and run it again"
            self.takeovers += 1
        elif kind == "kill_all":
            for pid, _ in self.workers():
                os.kill(pid, signal.SIGKILL)
            what = f"kill every worker ({len(ws)} members)"
        elif kind == "kill_lone_agent":
            agent = next(iter(agents))
            os.kill(agent, signal.SIGKILL)
            what = f"kill agent pid {agent}, alone in the job (its {len(agents[agent])} workers)"
        elif kind == "lose_host":
            h, agent, alone = lost
            del self.hosts[h]
            self.spare.append(h)
            self.set_hosts()
            os.kill(agent, signal.SIGKILL)
            what = f"lose {h} whole (agent pid {agent}" + (", the only host with members: a spare holds a replica)"
                                                           if alone else ")")
            if alone:
                self.replica_losses += 1
        elif kind == "kill_agent":
            agent = self.rng.choice(sorted(agents))
            os.kill(agent, signal.SIGKILL)
            what = f"kill agent pid {agent} (its {len(agents[agent])} workers)"
        elif kind == "kill_watchdog":
            # The agent's one child that is not a worker: the agent starts
            # another; no worker may be lost, so no membership change.
            agent = self.rng.choice(sorted(agents))
            dogs = [c for c in children_of(agent) if c not in agents[agent] and not self.is_worker(c)]
            for d in dogs:
                os.kill(d, signal.SIGKILL)
            what = f"kill watchdog of agent {agent} (pids {dogs})"
            expect_reset = False
        elif kind == "remove_host":
            h = victim_host
            members = {self.env_of(pid).get("ERUN_HOSTNAME") for pid, _ in self.workers()}
            del self.hosts[h]
            self.spare.append(h)
            self.set_hosts()
            what = f"remove {h}"
            if h not in members:  # a spare (a small --max-np): the job goes on as it was
                what += " (a spare)"
                maybe_reset = True
        elif kind == "add_host":
            h = self.spare.pop(0)
            self.hosts[h] = self.rng.randint(1, 2)
            self.set_hosts()
            what = f"add {h}:{self.hosts[h]}"
            if total >= self.a.max_np:  # it can only be a spare
                what += " (a spare)"
                maybe_reset = True
        elif kind == "slots":
            h = self.rng.choice(sorted(self.hosts))
            # Within --max-np when it can be (with a small --max-np, hosts
            # offer more slots than the job takes anyway).
            choices = ([n for n in (1, 2, 3) if n != self.hosts[h] and
                        self.a.min_np <= total - self.hosts[h] + n <= self.a.max_np] or
                       [n for n in (1, 2, 3) if n != self.hosts[h] and self.a.min_np <= total - self.hosts[h] + n])
            old_world = min(total, self.a.max_np)
            self.hosts[h] = self.rng.choice(choices)
            self.set_hosts()
            what = f"slots {h}:{self.hosts[h]}"
            if old_world == min(sum(self.hosts.values()), self.a.max_np):
                # --max-np caps the world either way: a reset only when the
                # ranks move (a host of the job lost a slot it used).
                maybe_reset = True
        else:
            self.set_mode("fail" if kind == "discovery_fail" else "junk")
            time.sleep(1.0)
            self.set_mode("ok")
            expect_reset = False
        took = None
        if expect_reset:
            limit = 5 if maybe_reset else self.a.collective_timeout + 30
            while time.time() - t < limit and self.proc.poll() is None:
                after = self.resets_after(t)
                if after:
                    took = min(after) - t
                    break
                time.sleep(0.02)
        self.results.append((kind, took))
        log(f"fault {len(self.results)}: {what}: " +
            (f"computing again after {took:.2f} s" if took is not None else
             ("no membership change expected" if not expect_reset else
              "no membership change" if maybe_reset else "NO recovery seen")))
        return expect_reset and not maybe_reset and took is None

    def run(self):
        a = self.a
        epochs = 10 + 3 * a.faults
        log(f"reference run ({epochs} epochs)")
        ref = self.reference(epochs)
        cmd = [self.erun, "--host-discovery-script", os.path.join(self.dir, "discover.sh"),
               "--discovery-interval", "0.2", "--launcher", "local", "--event-log", os.path.join(self.dir, "events.jsonl"),
               "--term-grace", "2", "-np", str(min(4, a.max_np)), "--min-np", str(a.min_np), "--max-np", str(a.max_np),
               "--collective-timeout", str(a.collective_timeout), "--rendezvous-timeout", "10",
               "--blacklist-after", "1000", self.train, *TRAIN, "--epochs", str(epochs), "--step-ms", "40"]
        log(" ".join(cmd))
        self.cmd = cmd
        self.start_erun("w")
        ok = True
        deadline = time.time() + 120
        self.job_id = None
        while self.job_id is None and time.time() < deadline:
            with open(self.err_path, errors="replace") as f:
                m = re.search(r"job ([A-Za-z0-9][A-Za-z0-9._-]*): ", f.read())  # the job's name is its id
            self.job_id = m.group(1) if m else None
            time.sleep(0.05)
        while "epoch 0 " not in self.out():
            if time.time() > deadline or self.proc.poll() is not None:
                log("the job did not start training")
                return self.finish(ref, False)
            time.sleep(0.1)
        self.commit_base(self.workers())
        for _ in range(a.faults):
            if self.proc.poll() is not None:
                log("the job ended before all faults were injected")
                ok = False
                break
            if self.fault():
                ok = False
            time.sleep(self.rng.uniform(0.3, 1.0))
        return self.finish(ref, ok)

    def start_erun(self, mode):
        # ERUN_LOG_LEVEL=info: the soak reads erun's info lines (its default says warnings only).
        env = dict(os.environ, ERUN_JOB_DIR=os.path.join(self.dir, "jobs"), ERUN_LOG_LEVEL="info")
        with open(self.out_path, mode) as out, open(self.err_path, mode) as err:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=err, env=env)

    def finish(self, ref, ok):
        try:
            code = self.proc.wait(timeout=max(600, 6 * self.a.faults))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
            log("erun did not finish in time")
        out = self.out()
        m = CHECKSUM.search(out)
        checks = {
            "exit 0": code == 0,
            "exact model": bool(m) and m.group(1) == ref,
            "exactly once": "exactly-once=NO" not in out,
            "no restart from epoch 0": out.count("epoch 0 ") == 1,
        }
        time.sleep(1)
        checks["no process left"] = not self.workers(stopped=True)
        # The watchdog of a host lost whole removes its directory 10 s after.
        base = self.base
        left_dirs = []
        for _ in range(150):
            left_dirs = [d for d in os.listdir("/dev/shm") if base and d.startswith(os.path.basename(base))]
            if not left_dirs:
                break
            time.sleep(0.1)
        checks["no host memory left"] = bool(base) and not left_dirs
        for w in self.workers(stopped=True):
            os.kill(w[0], signal.SIGKILL)
        recov = [t for k, t in self.results if t is not None]
        stops = [t for k, t in self.results if k == "stop" and t is not None]
        others = [t for k, t in self.results if k != "stop" and t is not None]
        total_loss = [t for k, t in self.results if k in ("kill_all", "kill_lone_agent") and t is not None]
        with open(self.err_path, errors="replace") as f:
            said = f.read() + out  # a worker's lines come through erun's stdout
        from_replica = len(re.findall(r"restored commit \d+ from host memory on \S+ \(\S+/replica", said))
        checks["a replica restored after each lone host lost"] = from_replica >= self.replica_losses
        took_over = said.count("took the job over at generation")
        checks["every erun run again took the job over"] = took_over == self.takeovers
        alone = [t for i, (k, t) in enumerate(self.results) if i in self.alone and t is not None]
        summary = {
            "faults": len(self.results),
            "by_kind": {k: sum(1 for kk, _ in self.results if kk == k) for k in sorted({k for k, _ in self.results})},
            "median_fault_to_computing_s": statistics.median(recov) if recov else None,
            "max_fault_to_computing_s": max(recov) if recov else None,
            "median_without_sigstop_s": statistics.median(others) if others else None,
            "sigstop_median_s": statistics.median(stops) if stops else None,
            "sigstop_max_s": max(stops) if stops else None,
            "sigstop_alone_on_host": {"count": len(alone), "median_s": statistics.median(alone) if alone else None,
                                      "max_s": max(alone) if alone else None},
            "total_loss": {"count": len(total_loss),
                           "median_fault_to_computing_s": statistics.median(total_loss) if total_loss else None,
                           "max_s": max(total_loss) if total_loss else None},
            "hosts_lost_whole_alone": self.replica_losses,
            "erun_restarts": self.takeovers,
            "restores_from_a_replica": from_replica,
            "collective_timeout_s": self.a.collective_timeout,
            "restarts_from_epoch_0": max(0, out.count("epoch 0 ") - 1),
            "checks": checks,
            "passed": ok and all(checks.values()),
            "logs": self.dir,
        }
        log(json.dumps(summary, indent=1))
        if self.a.json:
            with open(self.a.json, "w") as f:
                json.dump(summary, f, indent=1)
        if not summary["passed"]:
            with open(self.err_path, errors="replace") as f:
                sys.stdout.write("--- erun stderr (tail) ---\n" + "".join(f.readlines()[-60:]))
        return 0 if summary["passed"] else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--build", default=os.path.join(os.path.dirname(here), "build"), help="the build directory")
    p.add_argument("--faults", type=int, default=20)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--collective-timeout", type=float, default=2.0)
    p.add_argument("--min-np", type=int, default=2)
    p.add_argument("--max-np", type=int, default=12)
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--weight", action="append", default=[], metavar="KIND=N",
                   help="draw the fault KIND N times in each round of draws (0: never), e.g. lose_host=4")
    a = p.parse_args()
    log(f"seed {a.seed}, {a.faults} faults")
    soak = Soak(a)
    try:
        return soak.run()
    finally:
        # A soak that failed midway takes its job down with it.
        proc = getattr(soak, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
