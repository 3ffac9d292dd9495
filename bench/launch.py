#!/usr/bin/python3
"""Launch cost of erun's per-host agents against Open MPI's mpirun (issue 8).

    /usr/bin/python3 bench/launch.py [--build DIR] [--reps N] [--hosts 16] [--slots 16] [--smoke]

Same run, same machine, alternating erun and mpirun for every repetition:
  1. `-np 64 /bin/true` on this machine;
  2. `-np 256 /bin/true` on this machine;
  3. HOSTS loopback hosts (127.0.1.1, ...) x SLOTS slots over a private sshd
     (its own host key, in a known_hosts file; nothing of the system's sshd).
Prints a Markdown table (median wall time [min-max] and the ratio erun/mpirun,
target: erun <= mpirun). Needs /usr/sbin/sshd, ssh-keygen and mpirun.
"""
import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port(addresses):
    for _ in range(50):
        s = socket.socket()
        s.bind((addresses[0], 0))
        port = s.getsockname()[1]
        s.close()
        ok = True
        for a in addresses[1:]:
            t = socket.socket()
            try:
                t.bind((a, port))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok:
            return port
    raise RuntimeError("no port free on every address")


class Sshd:
    def __init__(self, addresses):
        self.dir = tempfile.mkdtemp(prefix="erun-bench-sshd-")
        self.addresses = addresses
        host_key = os.path.join(self.dir, "host_ed25519")
        self.key = os.path.join(self.dir, "client_ed25519")
        for k in (host_key, self.key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", k], check=True)
        shutil.copy(self.key + ".pub", os.path.join(self.dir, "authorized_keys"))
        self.port = free_port(addresses)
        kind, blob = open(host_key + ".pub").read().split()[:2]
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        with open(self.known_hosts, "w") as f:
            for a in addresses:
                f.write(f"[{a}]:{self.port} {kind} {blob}\n")
        config = os.path.join(self.dir, "sshd_config")
        with open(config, "w") as f:
            f.write(f"Port {self.port}\n")
            for a in addresses:
                f.write(f"ListenAddress {a}\n")
            f.write(f"HostKey {host_key}\nAuthorizedKeysFile {self.dir}/authorized_keys\n"
                    f"PidFile {self.dir}/sshd.pid\nStrictModes no\nUsePAM no\nPermitRootLogin yes\n"
                    "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUseDNS no\n"
                    "MaxStartups 1000\nMaxSessions 1000\nX11Forwarding no\nPrintMotd no\nLogLevel ERROR\n")
        os.makedirs("/run/sshd", exist_ok=True)
        self.proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", config],
                                     stderr=open(os.path.join(self.dir, "sshd.log"), "w"))
        deadline = time.time() + 15
        for a in addresses:
            while True:
                try:
                    socket.create_connection((a, self.port), timeout=1).close()
                    break
                except OSError:
                    if time.time() > deadline or self.proc.poll() is not None:
                        raise RuntimeError("sshd did not start: " + open(os.path.join(self.dir, "sshd.log")).read())
                    time.sleep(0.05)

    def ssh_options(self):
        return ["-p", str(self.port), "-i", self.key, "-o", "IdentitiesOnly=yes",
                "-o", "UserKnownHostsFile=" + self.known_hosts, "-o", "BatchMode=yes"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def timed(argv, timeout=120, tries=3):
    """Wall time of one successful run; a run that fails or hangs (mpirun
    occasionally never exits on this shared VM) is retried and counted."""
    for attempt in range(tries):
        start = time.perf_counter()
        try:
            r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"[launch] {argv[0]} hung for {timeout} s (attempt {attempt + 1}); killed", file=sys.stderr)
            FAILURES[os.path.basename(argv[0])] = FAILURES.get(os.path.basename(argv[0]), 0) + 1
            continue
        took = time.perf_counter() - start
        if r.returncode == 0:
            return took
        print(f"[launch] {argv[0]} failed ({r.returncode}): {r.stderr.decode()[-1500:]}", file=sys.stderr)
        FAILURES[os.path.basename(argv[0])] = FAILURES.get(os.path.basename(argv[0]), 0) + 1
    raise RuntimeError(f"{argv[0]} failed {tries} times")


FAILURES = {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--smoke", action="store_true", help="one rep, 8 ranks, 2 hosts x 2")
    a = ap.parse_args()
    if a.smoke:
        a.reps, a.hosts, a.slots = 1, 2, 2
    erun = os.path.abspath(os.path.join(a.build, "src/runner/erun"))
    mpirun = ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    local_np = [8] if a.smoke else [64, 256]
    cases = []
    for np in local_np:
        cases.append((f"`-np {np} /bin/true`, this machine",
                      [erun, "-np", str(np), "--launcher", "local", "/bin/true"],
                      mpirun + ["-np", str(np), "/bin/true"]))
    sshd = Sshd([f"127.0.1.{i + 1}" for i in range(a.hosts)]) if a.hosts > 0 else None
    rows = []
    try:
        if sshd:
            hosts = ",".join(f"{h}:{a.slots}" for h in sshd.addresses)
            np = a.hosts * a.slots
            erun_ssh = [erun, "-np", str(np), "-H", hosts, "--ssh-port", str(sshd.port), "--ssh-identity-file",
                        sshd.key, "--ssh-option", "IdentitiesOnly=yes", "--ssh-option",
                        "UserKnownHostsFile=" + sshd.known_hosts, "/bin/true"]
            mpi_ssh = mpirun + ["-np", str(np), "-H", hosts, "--mca", "plm_rsh_agent",
                                "ssh " + " ".join(sshd.ssh_options()), "--mca", "btl", "self,tcp", "/bin/true"]
            cases.append((f"{a.hosts} hosts x {a.slots} slots over sshd (`-np {np} /bin/true`)", erun_ssh, mpi_ssh))
        for name, e, m in cases:
            try:
                timed(e)  # warm-up
                timed(m)
                te, tm = [], []
                for _ in range(a.reps):
                    te.append(timed(e))
                    tm.append(timed(m))
            except RuntimeError as err:
                print(f"[launch] {name}: skipped: {err}", file=sys.stderr)
                continue
            rows.append((name, te, tm))
            print(f"[launch] {name}: erun {te} s, mpirun {tm} s", file=sys.stderr)
    finally:
        if sshd:
            sshd.stop()
    print(f"| case | erun (s) | mpirun (s) | erun / mpirun | target erun <= mpirun |")
    print("|---|---|---|---|---|")
    for name, te, tm in rows:
        me, mm = statistics.median(te), statistics.median(tm)
        ratio = me / mm
        print(f"| {name} | {me:.3f} [{min(te):.3f}-{max(te):.3f}] | {mm:.3f} [{min(tm):.3f}-{max(tm):.3f}] | "
              f"{ratio:.2f}x | {'met' if ratio <= 1.0 else 'not met'} |")
    print(f"\n{a.reps} repetitions each after one warm-up, erun and mpirun alternating; "
          f"load average {os.getloadavg()[0]:.2f}; failed or hung runs (retried): {FAILURES or 'none'}.")


if __name__ == "__main__":
    main()
