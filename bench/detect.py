#!/usr/bin/python3
"""Fault detection (issue 8): from a fault to the survivors computing again.

Three faults against a running data-parallel job of 3-4 workers (bench/step_worker
under erun in place; bench/torch_train.py under torchrun, tuned as in bench.py):

  silent host   a "host" in a network namespace of its own (veth link, private
                10.77.x.y/30 addresses, its own sshd) has its link cut: no reset,
                no ICMP; its worker stays alive but unreachable. erun: 2 workers
                here (ssh to the link's outer address) + 1 in the namespace.
                torchrun (one agent here, one in the namespace, c10d rendezvous
                here, --nnodes 1:2) is not measured: torch 1.13's agent advertises the
                machine's host name as MASTER_ADDR and Gloo binds to its address, which
                a namespace host cannot reach without routing beyond the link.
  frozen worker SIGSTOP of one worker (bench.py's frozen benchmark, timeout 5 s).
                With --frozen-hosts (e.g. node-a:1,node-b:1,node-c:2) also erun with
                those simulated hosts (--launcher local -H ...): the frozen rank 1 is
                then alone on its host, reached only over erun's TCP transport.
  SIGKILL       of one worker (bench.py's recovery benchmark).

"Computing again": every rank of the survivors' new world printed a step of a newer
generation (silent host; a replaced survivor is logged as NOT in place); for the
other two, bench.py's recovery_once (every surviving process, or every rank of
torchrun's restarted group, printed a step). Needs root
(ip netns) and sshd for the silent host; the others run anywhere.

    /usr/bin/python3 bench/detect.py --build-dir build [--reps 3] [--json FILE]

Prints one RESULT line per measurement and, with --json, writes them all.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (Job, stats, recovery_once: the same peers as bench.py)

ROOT = bench.ROOT


def run(*cmd, check=True):
    p = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stdout.decode(errors='replace')}")
    return p.stdout.decode(errors="replace")


class Namespace:
    """A network namespace with a veth link to this one and an sshd on each end."""

    def __init__(self, serial):
        pid = os.getpid()
        self.name = f"erun-bench-{pid}-{serial}"
        self.outer_if, self.inner_if = f"ebo{pid}x{serial}", f"ebi{pid}x{serial}"
        block = (pid * 8 + serial) % 16384
        self.outer = f"10.77.{block // 64}.{(block % 64) * 4 + 1}"
        self.inner = f"10.77.{block // 64}.{(block % 64) * 4 + 2}"
        self.dir = tempfile.mkdtemp(prefix="erun-detect-")
        self.sshds = []
        run("ip", "netns", "add", self.name)
        run("ip", "link", "add", self.outer_if, "type", "veth", "peer", "name", self.inner_if)
        run("ip", "addr", "add", self.outer + "/30", "dev", self.outer_if)
        run("ip", "link", "set", self.inner_if, "netns", self.name)
        run("ip", "link", "set", self.outer_if, "up")
        run("ip", "-n", self.name, "addr", "add", self.inner + "/30", "dev", self.inner_if)
        run("ip", "-n", self.name, "link", "set", self.inner_if, "up")
        run("ip", "-n", self.name, "link", "set", "lo", "up")
        self.key = os.path.join(self.dir, "id")
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key)
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(self.dir, "host"))
        shutil.copy(self.key + ".pub", os.path.join(self.dir, "authorized_keys"))
        import socket
        s = socket.socket()
        s.bind((self.outer, 0))
        self.port = s.getsockname()[1]
        s.close()
        # Host keys checked (erun's default): one known_hosts line per address.
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        with open(os.path.join(self.dir, "host.pub")) as f:
            kind, key = f.read().split()[:2]
        with open(self.known_hosts, "w") as f:
            for addr in (self.outer, self.inner):
                f.write(f"[{addr}]:{self.port} {kind} {key}\n")
        self.sshds.append(self._sshd(self.outer, []))
        self.sshds.append(self._sshd(self.inner, ["ip", "netns", "exec", self.name]))

    def _sshd(self, addr, prefix):
        conf = os.path.join(self.dir, f"sshd_{addr}")
        with open(conf, "w") as f:
            f.write(f"Port {self.port}\nListenAddress {addr}\nHostKey {self.dir}/host\n"
                    f"AuthorizedKeysFile {self.dir}/authorized_keys\nPidFile none\nStrictModes no\nUsePAM no\n"
                    "PermitRootLogin yes\nPasswordAuthentication no\nPubkeyAuthentication yes\nUseDNS no\n"
                    "MaxStartups 100\nMaxSessions 100\nLogLevel ERROR\n")
        os.makedirs("/run/sshd", exist_ok=True)
        p = subprocess.Popen(prefix + ["/usr/sbin/sshd", "-D", "-e", "-f", conf], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import socket
        for _ in range(300):
            try:
                socket.create_connection((addr, self.port), 0.5).close()
                return p
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"sshd on {addr}:{self.port} did not start")

    def cut(self):
        run("ip", "-n", self.name, "link", "set", self.inner_if, "down")

    def pids(self):
        return [int(x) for x in run("ip", "netns", "pids", self.name, check=False).split()]

    def close(self):
        for p in self.sshds:
            p.kill()
            p.wait()
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        run("ip", "link", "del", self.outer_if, check=False)
        run("ip", "netns", "del", self.name, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def silent_host_once(b, mode, i, collective_timeout):
    ns = Namespace(i)
    job = None
    try:
        cmd = [b.erun, "-np", "3", "--min-np", "2", "--mode", "elastic", "--term-grace", "1",
               "-H", f"{ns.outer}:2,{ns.inner}:1", "--driver-address", ns.outer, "--ssh-port", str(ns.port),
               "--ssh-identity-file", ns.key, "--ssh-option", f"UserKnownHostsFile={ns.known_hosts}",
               "--blacklist-after", "1", "--collective-timeout",
               str(collective_timeout), b.bin("bench/step_worker"), "--step-ms", "50"]
        job = bench.Job(cmd, name=mode)
        world = 3
        if not job.wait(lambda j: bench.steady(j, world, 10), 180):
            raise RuntimeError(f"{mode}: never reached steady steps:\n{job.output_tail()}")
        with job.cv:
            gen0 = max(r["gen"] for r in job.steps)
            survivors = {r["pid"] for r in job.steps if r["gen"] == gen0 and r["rank"] != 2}
        t_cut = time.time()
        ns.cut()
        def after_cut(j):
            return [r for r in j.steps if r["gen"] > gen0 and r["t"] > t_cut]

        def recovered(j):
            # Every rank of the survivors' world computes without the lost host.
            after = after_cut(j)
            if not after:
                return False
            return len({r["rank"] for r in after if r["size"] == after[-1]["size"]}) >= after[-1]["size"]

        if not job.wait(recovered, 150):
            with job.cv:
                log_lines = [ln for _, ln in job.lines if "STEP" not in ln][:70]
            raise RuntimeError(f"{mode}: survivors did not compute within 150 s of the cut:\n" + "\n".join(log_lines))
        with job.cv:
            after = after_cut(job)
        first = {}
        for r in after:
            if r["size"] == after[-1]["size"]:
                first.setdefault(r["rank"], r["t"])
        took = max(first.values()) - t_cut
        kept = survivors <= {r["pid"] for r in after}
        cmd_s = bench.cmd_str(job.cmd)
        bench.log(f"silent host {mode} (collective timeout {collective_timeout} s) #{i}: {took:.3f} s"
                  + ("" if kept else " (NOT in place: a survivor was replaced)"))
        return {"seconds": took, "cmd": cmd_s, "in_place": kept}
    finally:
        if job:
            job.stop()
        ns.close()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", default="")
    p.add_argument("--only", default="silent,frozen,kill")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--timeouts", default="30,5", help="collective timeouts (s) of the silent-host runs")
    p.add_argument("--frozen-timeout", type=int, default=bench.FROZEN_TIMEOUT_S,
                   help="collective timeout (s) of the frozen-worker runs")
    p.add_argument("--frozen-hosts", default="",
                   help="also freeze a worker under these simulated hosts (-H, --launcher local); rank 1 "
                        "should be alone on its host, e.g. node-a:1,node-b:1,node-c:2")
    a = p.parse_args()
    # A SIGTERM still runs the finally blocks: no namespace, sshd or worker left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ba = argparse.Namespace(build_dir=a.build_dir, smoke=False, no_torch=a.no_torch, only="detect", reps=a.reps,
                            allreduce_reps=0)
    b = bench.Bench(ba)
    only = set(a.only.split(","))
    torch_modes = ["torchrun-tuned"] if b.torch else []
    out = {}

    def measure(key, once):
        """a.reps runs of once(i) -> seconds; one broken run must not lose the others."""
        runs = []
        for i in range(a.reps):
            try:
                runs.append(once(i))
            except Exception as e:
                bench.log(f"FAILED {key} #{i}: {e}")
        out[key] = bench.stats(runs)
        bench.result("detect", key, median_s=f"{out[key]['median']:.3f}" if out[key] else "none")

    if "silent" in only:
        if os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/usr/sbin/sshd"):
            bench.log("silent host: skipped (needs root, ip(8) and sshd)")
        else:
            for ct in [int(x) for x in a.timeouts.split(",")]:
                mode = "erun-inplace"  # torchrun: see the docstring
                measure(f"silent host, collective timeout {ct} s, {mode}",
                        lambda i: silent_host_once(b, mode, i, ct)["seconds"])
    if a.frozen_hosts:
        # The same job over simulated hosts: erun's own mode name ends in
        # -inplace, so recovery_once measures it as in place.
        plain_cmd = b.recovery_cmd

        def recovery_cmd(mode, ckpt, port, collective_timeout=None):
            if mode != "erun-hosts-inplace":
                return plain_cmd(mode, ckpt, port, collective_timeout)
            cmd, env = plain_cmd("erun-inplace", ckpt, port, collective_timeout)
            return cmd[:1] + ["--launcher", "local", "-H", a.frozen_hosts] + cmd[1:], env

        b.recovery_cmd = recovery_cmd
    for name, sig, ct in (("frozen", signal.SIGSTOP, a.frozen_timeout), ("kill", signal.SIGKILL, None)):
        if name not in only:
            continue
        modes = ["erun-inplace"] + (["erun-hosts-inplace"] if name == "frozen" and a.frozen_hosts else [])
        for mode in modes + torch_modes:
            measure(f"{f'SIGSTOP, collective timeout {ct} s' if name == 'frozen' else 'SIGKILL'}, {mode}",
                    lambda i: b.recovery_once(mode, i, sig=sig, collective_timeout=ct)["recovery_s"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
