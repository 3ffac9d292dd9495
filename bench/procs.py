"""Helpers the fault benchmarks share (bench/preemption.py, bench/stragglers.py, bench/standby.py,
bench/removed_slots.py): waiting for a line, reading erun's event log, the discovery script, the model
checksum, finding a worker by its host, and slowing a process down."""
import json
import os
import re
import signal
import subprocess
import time


def wait_for(path, text, limit):
    """Waits up to `limit` seconds for `text` in the file at `path`."""
    end = time.time() + limit
    while time.time() < end:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return True
        time.sleep(0.01)
    return False


def events(path, name):
    """The events named `name` in erun's event log at `path` (--event-log), in order."""
    out = []
    if os.path.exists(path):
        for line in open(path):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == name:
                out.append(e)
    return out


def wait_events(path, name, n, limit):
    """Waits up to `limit` seconds for `n` events named `name` in the log at `path`."""
    end = time.time() + limit
    while time.time() < end:
        if len(events(path, name)) >= n:
            return True
        time.sleep(0.01)
    return False


def discovery_script(work, hosts):
    """Writes `hosts` (discovery lines) to WORK/hosts and a script that prints
    that file, WORK/discover.sh: a benchmark changes the hosts by rewriting
    the file. Returns the script's path."""
    with open(os.path.join(work, "hosts"), "w") as f:
        f.write(hosts)
    disc = os.path.join(work, "discover.sh")
    with open(disc, "w") as f:
        f.write(f"#!/bin/sh\ncat {work}/hosts\n")
    os.chmod(disc, 0o755)
    return disc


def checksum(text):
    """train_mlp's final model checksum in `text`, or None."""
    m = re.search(r"checksum=([0-9a-f]+)", text)
    return m.group(1) if m else None


def worker_on(program, host, cwd):
    """The pid of the process running `program` for `host` (its ERUN_HOSTNAME) in the directory `cwd` (the job's
    own, where erun ran: never a process of another job on the machine, a test's or another benchmark's), or None."""
    for pid in subprocess.run(["pgrep", "-f", program], capture_output=True, text=True).stdout.split():
        try:
            if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].decode() != program:
                continue
            if os.path.realpath(f"/proc/{pid}/cwd") != os.path.realpath(cwd):
                continue
            if f"ERUN_HOSTNAME={host}".encode() in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                return int(pid)
        except OSError:
            continue
    return None


def parent_of(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def children_of(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if parent_of(int(d)) == pid:
                    out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def slow_down(pid, stop):
    """SIGSTOP 80 ms, SIGCONT 20 ms until the event `stop` is set: a fifth of its speed."""
    while not stop.is_set():
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.08)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.02)
        except ProcessLookupError:
            return
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
