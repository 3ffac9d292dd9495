"""End to end, real processes: a torch model trained in place under erun
with a discovery script (hosts simulated with --launcher local) while the job
grows 2 -> 4, loses a worker to SIGKILL, changes a host's slots and shrinks,
ends at bit-identical parameters to an uninterrupted run, with every sample
of every epoch exactly once, survivors keeping their process, and no process
left. Also: a user error ends the job, shown, without a retry; the same
script runs alone, under mpirun, and under erun's restart mode."""
import re
import shutil
import signal
import os
import threading
import time

import pytest

from conftest import PYTHON, host_of, once

ARGS = ["--epochs", "6", "--samples", "768", "--batch", "32"]
EPOCHS = 6


def checksum(text):
    m = re.search(r"final checksum=([0-9a-f]+)", text)
    return m.group(1) if m else None


def uninterrupted_checksum(tmp_path_factory, args):
    """The checksum of train_exact.py with `args`, alone and uninterrupted."""
    from conftest import Workspace
    w = Workspace(tmp_path_factory.mktemp("reference"))
    job = w.python("train_exact.py", args)
    assert job.wait(300) == 0, job.out + job.err
    job.close()
    c = checksum(job.out)
    assert c, job.out
    return c


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return uninterrupted_checksum(tmp_path_factory, ARGS)


def expect_trained_exactly(job, reference, ws, timeout=300):
    code = job.wait(timeout)
    assert code == 0, job.out + job.err
    assert checksum(job.out) == reference, job.out
    assert job.out.count("exactly-once=yes") == EPOCHS, job.out
    assert "exactly-once=NO" not in job.out
    assert ws.wait_no_workers("train_exact.py"), ws.workers("train_exact.py")


def started_pids(job, at_least=0, timeout=60):
    """Pids of the workers that printed their start line (waits for `at_least` of them)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = {int(p) for p in re.findall(r"pid (\d+) rank \d+ started", job.out)}
        if len(pids) >= at_least or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def wait_count(job, text, n, timeout=120):
    """Waits until `text` occurs n times in the job's stdout."""
    deadline = time.monotonic() + timeout
    while job.out.count(text) < n and time.monotonic() < deadline and job.proc.poll() is None:
        time.sleep(0.05)
    return job.out.count(text) >= n


def test_in_place_grow_kill_slot_change_shrink_ends_at_the_uninterrupted_model(ws, reference):
    ws.hosts("node-a:2\n")
    # 500 ms steps: training outlasts the new workers' start-up (seconds of `import torch` on a
    # loaded machine), which the survivors no longer wait for.
    job = ws.erun(["-np", "2", "--min-np", "1", "--max-np", "4", "--blacklist-after", "5"], "train_exact.py",
                  ARGS + ["--step-ms", "500"], discovery=True)
    assert job.wait_events("generation_joined", 1, 120), job.err
    assert job.wait_output(r"epoch 0 ", 120), job.out + job.err
    first = started_pids(job, 2)
    assert len(first) == 2, job.out

    ws.hosts("node-a:2\nnode-b:2\n")  # grow to 4
    assert wait_count(job, "-> 4 (generation", 4), job.out + job.err  # every rank in the world of 4
    grown = started_pids(job, 4) - first
    assert len(grown) == 2, job.out
    victim = sorted(grown)[0]
    os.kill(victim, signal.SIGKILL)  # the 3 survivors go on alone; the relaunched slot joins them
    assert wait_count(job, "world size 3 -> 4", 4), job.out + job.err

    n = len(job.events("generation_joined"))
    ws.hosts("node-a:2\nnode-b:1\n")  # node-b's slots change: 3 ranks
    assert job.wait_events("generation_joined", n + 1, 120), job.err
    assert all(p in ws.workers("train_exact.py") for p in first), "node-a's workers were replaced"

    n = len(job.events("generation_joined"))
    ws.hosts("node-b:1\n")  # node-a leaves, rank 0 with it
    assert job.wait_events("generation_joined", n + 1, 120), job.err

    expect_trained_exactly(job, reference, ws)
    assert "restarting all workers" not in job.err
    assert "recovering in place" in job.err and "the survivors go on alone" in job.err, job.err
    assert "world size 2 -> 4" in job.out and "world size 3 -> 1" in job.out, job.out
    # Survivors keep their process: node-a's two workers reset at the grow, the kill and the slot change.
    for pid in first:
        assert len(re.findall(rf"pid {pid}: reset:", job.out)) >= 3, job.out
    # The SIGKILL surfaced in Python as erun.CommError (restore + re-join); the resizes as HostsUpdated.
    logs = job.out + job.err  # workers' stderr is forwarded with a [rank] prefix
    assert "restoring commit" in logs and "hosts updated at commit" in logs, logs


def test_every_worker_killed_at_once_resumes_at_the_last_commit_from_host_memory(ws, reference):
    """No survivor holds the last commit: the new workers restore it from the
    host's memory (TorchState: model, optimizer, sampler) instead of starting
    at epoch 0, and the run ends at the uninterrupted model."""
    every_worker_killed_at_once(ws, reference, ARGS)


def every_worker_killed_at_once(ws, reference, args):
    """The test above with train_exact.py's `args` (test_gpu.py passes --device cuda)."""
    ws.hosts("node-a:2\n")
    job = ws.erun(["-np", "2", "--min-np", "1", "--blacklist-after", "5"], "train_exact.py",
                  args + ["--step-ms", "100"], discovery=True)
    assert job.wait_output(r"epoch 1 ", 180), job.out + job.err
    first = started_pids(job, 2)
    assert len(first) == 2, job.out
    for pid in first:
        os.kill(pid, signal.SIGKILL)
    expect_trained_exactly(job, reference, ws)
    logs = job.out + job.err
    assert re.search(r"restored commit [1-9][0-9]* from host memory", logs), logs
    assert job.out.count("epoch 0 ") == 1, job.out  # epoch 0 never ran again
    assert job.out.count("epoch 1 ") == 1, job.out


@once
def test_a_sigterm_to_a_worker_drains_its_host_in_place(ws, reference):
    """A preemption as Slurm and Kubernetes deliver it, a SIGTERM to one host's
    worker: erun's library takes it as a notice (docs/python.md), so that host
    leaves at the next commit; the survivor keeps its process, nothing is
    rolled back, no failure is counted, and TorchState ends bit-identical to
    the uninterrupted run."""
    ws.hosts("node-a:1\nnode-b:1\n")
    job = ws.erun(["-np", "2", "--min-np", "1"], "train_exact.py", ARGS + ["--step-ms", "100"], discovery=True)
    assert job.wait_output(r"epoch 0 ", 180), job.out + job.err
    by_host = {host_of(p): p for p in started_pids(job, 2)}
    assert set(by_host) == {"node-a", "node-b"}, by_host
    os.kill(by_host["node-b"], signal.SIGTERM)
    assert wait_count(job, "world size 2 -> 1", 1), job.out + job.err
    assert by_host["node-a"] in ws.workers("train_exact.py"), "the survivor did not keep its process"
    expect_trained_exactly(job, reference, ws)
    drains = job.events("host_draining")
    assert [d["host"] for d in drains] == ["node-b"] and "SIGTERM to" in drains[0]["reason"], drains
    assert job.events("host_drained"), job.err
    assert all(r["reason"] != "worker failed" for r in job.events("reset")), job.events("reset")
    assert all(r["reason"] != "peer lost" for r in job.events("rejoined")), job.events("rejoined")
    assert "restoring commit" not in job.out + job.err


def slow_down(pid, stop):
    """SIGSTOP 80 ms, SIGCONT 20 ms until `stop` is set: a fifth of its speed."""
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


@once
def test_a_slowed_worker_is_left_out_at_a_commit_and_the_model_is_exact(ws, reference):
    """A straggler (docs/design.md, "Stragglers"): one of three torch workers
    slowed to a fifth of its speed is found from the commit intervals the
    library reports, leaves at a commit, and the others go on in place with
    nothing rolled back; TorchState ends bit-identical to the uninterrupted run."""
    ws.hosts("node-a:1\nnode-b:1\nnode-c:1\n")
    job = ws.erun(["-np", "3", "--min-np", "2", "--blacklist-cooldown-range", "600", "600", "--stragglers", "evict"],
                  "train_exact.py", ARGS + ["--step-ms", "50"], discovery=True)
    assert job.wait_output(r"epoch 0 ", 180), job.out + job.err
    by_host = {host_of(p): p for p in started_pids(job, 3)}
    assert set(by_host) == {"node-a", "node-b", "node-c"}, by_host
    stop = threading.Event()
    slowing = threading.Thread(target=slow_down, args=(by_host["node-c"], stop))
    slowing.start()
    try:
        assert job.wait_events("straggler", 1, 60), job.err
        assert wait_count(job, "world size 3 -> 2", 2), job.out + job.err
    finally:
        stop.set()
        slowing.join()
    assert by_host["node-a"] in ws.workers("train_exact.py") and by_host["node-b"] in ws.workers("train_exact.py")
    expect_trained_exactly(job, reference, ws)
    found = job.events("straggler")
    assert found[0]["host"] == "node-c" and found[0]["action"] == "evict", found
    assert all(r["reason"] != "worker failed" for r in job.events("reset")), job.events("reset")
    assert all(r["reason"] != "peer lost" for r in job.events("rejoined")), job.events("rejoined")


@once
def test_a_user_error_ends_the_job_with_the_error_shown(ws):
    ws.hosts("node-a:2\n")
    job = ws.erun(["-np", "2", "--min-np", "1", "--max-np", "4"], "train_exact.py",
                  ["--epochs", "2", "--samples", "256", "--fail-at-step", "5"], discovery=True)
    code = job.wait(120)
    assert code == 121, (code, job.err)
    assert "ValueError: user error at step 5" in job.err
    assert "a restart would repeat" in job.err
    assert len(job.events("generation_started")) == 1, job.err
    assert ws.wait_no_workers("train_exact.py")


def test_alone_under_mpirun_and_in_restart_mode(ws, reference):
    alone = ws.python("train_exact.py", ARGS)
    assert alone.wait(300) == 0 and checksum(alone.out) == reference, alone.out + alone.err

    restart = ws.erun(["-np", "3", "--mode", "restart"], "train_exact.py", ARGS)
    assert restart.wait(300) == 0, restart.out + restart.err
    assert checksum(restart.out) == reference, restart.out

    if shutil.which("mpirun"):
        mpi = ws.start(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", PYTHON,
                        ws.script("train_exact.py")] + ARGS)
        assert mpi.wait(300) == 0, mpi.out + mpi.err
        assert checksum(mpi.out) == reference, mpi.out


@once
def test_a_lost_worker_is_replaced_by_a_warm_standby(ws, reference):
    """A script that spends 5 s before erun.init() (CUDA and data loading,
    say): the free fourth slot runs it up to its first join as a standby, and
    a SIGKILLed member's place goes to that process at once, without the 5 s."""
    ws.hosts("node-a:2\nnode-b:2\n")
    job = ws.erun(["-np", "3", "--min-np", "2", "--max-np", "3"], "train_exact.py",
                  ARGS + ["--step-ms", "300", "--startup-s", "5"], discovery=True)
    assert job.wait_events("standby_ready", 1, 120), job.err
    standby = job.events("standby_ready")[0]
    assert job.wait_output(r"epoch 0 ", 120), job.out + job.err
    members = started_pids(job, 3)
    assert len(members) == 3, job.out
    on_b = [p for p in members if b"\0ERUN_HOSTNAME=node-b\0" in b"\0" + open(f"/proc/{p}/environ", "rb").read()]
    assert on_b, "no member on node-b"
    os.kill(on_b[0], signal.SIGKILL)
    assert job.wait_events("standby_promoted", 1, 60), job.err
    promoted = job.events("standby_promoted")[0]
    assert (promoted["host"], promoted["slot"]) == (standby["host"], standby["slot"])
    gen = promoted["generation"]
    assert job.wait_events("generation_joined", 1, 60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(e["generation"] == gen for e in job.events("generation_joined")):
        time.sleep(0.05)
    killed = next(e for e in job.events("worker_exited") if e["exit_code"] == 137)
    back = next(e for e in job.events("generation_joined") if e["generation"] == gen)
    size = next(e for e in job.events("generation_started") if e["generation"] == gen)["size"]
    assert size == 3, job.events("generation_started")
    took = back["t"] - killed["t"]
    print(f"standby: back at 3 ranks {took:.3f} s after the SIGKILL (the script's start-up: 5 s)")
    # A cold replacement pays the 5 s before erun.init(); the standby paid it before the kill.
    assert took < 3.0, took
    expect_trained_exactly(job, reference, ws)
