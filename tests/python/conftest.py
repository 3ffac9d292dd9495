"""Fixtures for the erun Python package tests: the built erun binary, and
jobs of real worker processes under it (tests/python/workers/*.py, copied to
a per-test directory so that a test finds its own processes in /proc)."""
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

SOURCE = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("ERUN_BUILD_DIR", SOURCE / "build"))
# The launcher: the build's, or ERUN_BIN (the pip-installed one of the venv pass,
# tests/CMakeLists.txt's pytorch_latest_* tests).
ERUN = pathlib.Path(os.environ.get("ERUN_BIN", BUILD / "src" / "runner" / "erun"))
WORKERS = pathlib.Path(__file__).resolve().parent / "workers"
# The workers' interpreter: Debian's python3, or ERUN_TEST_PYTHON (scripts/gpu_tests.sh
# passes the one whose torch has CUDA).
PYTHON = os.environ.get("ERUN_TEST_PYTHON", "/usr/bin/python3")
# Tests of erun's driver and command line, not of torch: once, in the Debian
# pass (not again in the pass with PyPI's torch and the pip-installed erun).
once = pytest.mark.skipif(bool(os.environ.get("ERUN_TEST_INSTALLED")), reason="runs once, in the Debian pass")


def pids_running(needle):
    """Pids of processes whose command line contains `needle`."""
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if needle in cmd and stat.split(") ")[-1][:1] != "Z":
            out.append(int(d.name))
    return out


def host_of(pid):
    """The host a worker runs for (its ERUN_HOSTNAME: simulated hosts under --launcher local)."""
    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"ERUN_HOSTNAME=")), None)


def wait_for(job, pattern, n=1, timeout=120):
    """True once `pattern` occurs n times in the job's stdout; False at the timeout or when it ends first."""
    deadline = time.monotonic() + timeout
    while len(re.findall(pattern, job.out)) < n and time.monotonic() < deadline and job.proc.poll() is None:
        time.sleep(0.05)
    return len(re.findall(pattern, job.out)) >= n


class Job:
    """An erun (or any launcher) process whose output goes to files."""

    def __init__(self, argv, workdir, events_path, env=None):
        self.events_path = events_path
        self.out_path = workdir / "stdout.txt"
        self.err_path = workdir / "stderr.txt"
        e = dict(os.environ)
        e.update(env or {})
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL, env=e,
                                     start_new_session=True)

    @property
    def out(self):
        return self.out_path.read_text(errors="replace")

    @property
    def err(self):
        return self.err_path.read_text(errors="replace")

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"job did not finish in {timeout} s\nstdout:\n{self.out}\nstderr:\n{self.err}")

    def wait_output(self, pattern, timeout, stream="out"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.out if stream == "out" else self.err
            if re.search(pattern, text):
                return True
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        return bool(re.search(pattern, self.out if stream == "out" else self.err))

    def events(self, name):
        path = self.events_path
        if not path.exists():
            return []
        return [e for e in (json.loads(line) for line in path.read_text().splitlines() if line.strip())
                if e.get("event") == name]

    def wait_events(self, name, n, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.events(name)) >= n:
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(15)

    def close(self):
        self.kill()
        self._out.close()
        self._err.close()


class Workspace:
    """A test's directory: worker scripts copied in, hosts file, jobs."""

    def __init__(self, path):
        self.path = path
        self.jobs = []

    def script(self, name):
        dst = self.path / name
        if not dst.exists():
            shutil.copy(WORKERS / name, dst)
        return str(dst)

    def hosts(self, text):
        tmp = self.path / "hosts.tmp"
        tmp.write_text(text)
        tmp.replace(self.path / "hosts")

    def erun(self, erun_args, script, script_args=(), discovery=False, env=None):
        # --driver-grace 0: a test that kills erun expects the workers gone with it
        # (unless it asks for a grace itself: a takeover test).
        argv = [str(ERUN), "--event-log", str(self.path / "events.jsonl"), "--term-grace", "2"]
        if "--driver-grace" not in erun_args:
            argv[1:1] = ["--driver-grace", "0"]
        # No straggler eviction and no pre-flight check unless a test asks:
        # on a loaded machine a host added mid-test could be held back as slow
        # (its check 3.4x the others' once), and the test would wait for a
        # world that never forms. The checks have tests of their own.
        if "--stragglers" not in erun_args:
            argv[1:1] = ["--stragglers", "off"]
        if discovery:
            disc = self.path / "discover.sh"
            disc.write_text(f"#!/bin/sh\ncat {self.path / 'hosts'}\n")
            disc.chmod(0o700)
            argv += ["--host-discovery-script", str(disc), "--discovery-interval", "0.2", "--launcher", "local"]
        argv += list(erun_args) + [PYTHON, self.script(script)] + list(script_args)
        return self.start(argv, env)

    def start(self, argv, env=None):
        d = self.path / f"job{len(self.jobs)}"
        d.mkdir()
        if (self.path / "events.jsonl").exists():
            (self.path / "events.jsonl").unlink()
        job = Job(argv, d, self.path / "events.jsonl", env)
        self.jobs.append(job)
        return job

    def python(self, script, script_args=(), env=None):
        """The worker alone (a world of one), as `python3 script.py`."""
        return self.start([PYTHON, self.script(script)] + list(script_args), env)

    def workers(self, script):
        return pids_running(str(self.path / script))

    def wait_no_workers(self, script, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.workers(script):
                return True
            time.sleep(0.1)
        return False


@pytest.fixture
def ws(tmp_path):
    if not ERUN.exists():
        pytest.fail(f"{ERUN} is missing: build erun first (bash scripts/build.sh)")
    w = Workspace(tmp_path)
    yield w
    for job in w.jobs:
        job.close()
    for pid in pids_running(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
