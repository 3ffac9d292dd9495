"""erun.horovod.torch end to end, real processes: a program written to
Horovod's documented API (only the import changed) runs elastic under erun,
grown 2 -> 3, a worker SIGKILLed and replaced, shrunk back, and ends within
1e-9 of the same schedule run in one process, every sample once per epoch,
survivors in their process; the same program alone and under mpirun; a
non-elastic Horovod program gives what the same program written to
erun.torch gives; and erun takes a horovodrun command line."""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import ERUN, PYTHON, host_of, once, wait_for

EPOCHS = 5
ARGS = ["--epochs", str(EPOCHS), "--samples", "144", "--batch", "6"]


def started(job, n, timeout=90):
    """The pids of workers that said they started (waits for n of them)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = {int(p) for p in re.findall(r"pid (\d+) rank \d+ started", job.out)}
        if len(pids) >= n or time.monotonic() > deadline or job.proc.poll() is not None:
            return pids
        time.sleep(0.05)


def replayed(ws, out, name):
    """The out file of the same schedule replayed in one process (--replay)."""
    ref = ws.path / name
    job = ws.python("horovod_elastic.py", ARGS + ["--replay", str(out), "--out", str(ref)])
    assert job.wait(120) == 0, job.out + job.err
    return json.loads(ref.read_text())


def max_difference(a, b):
    assert [len(p) for p in a["params"]] == [len(p) for p in b["params"]]
    return max(abs(x - y) for p, q in zip(a["params"], b["params"]) for x, y in zip(p, q))


def expect_trained_once_per_epoch(job):
    assert job.out.count("exactly-once=yes") >= EPOCHS, job.out
    assert "exactly-once=NO" not in job.out, job.out


def test_elastic_horovod_program_grows_loses_a_worker_and_shrinks_to_the_replayed_model(ws):
    out = ws.path / "final.json"
    ws.hosts("node-a:2\n")
    job = ws.erun(["-np", "2", "--min-np", "2", "--max-np", "3"], "horovod_elastic.py",
                  ARGS + ["--step-ms", "400", "--out", str(out)], discovery=True)
    first = started(job, 2)
    assert len(first) == 2, job.out + job.err
    assert wait_for(job, r"epoch 0 world=2", 1, 120), job.out + job.err

    ws.hosts("node-a:2\nnode-b:1\n")  # grow to 3
    assert wait_for(job, r"reset: world size 3", 2, 120), job.out + job.err  # both survivors in the world of 3
    grown = started(job, 3) - first
    assert len(grown) == 1, job.out
    victim = grown.pop()
    assert host_of(victim) == "node-b"
    joined = len(job.events("generation_joined"))
    os.kill(victim, signal.SIGKILL)  # node-b's slot is launched again; the survivors go on meanwhile
    assert job.wait_events("generation_joined", joined + 2, 120), job.err
    assert wait_for(job, r"pid \d+ rank \d+ started", 4, 120), job.out

    joined = len(job.events("generation_joined"))
    ws.hosts("node-a:2\n")  # shrink back to 2
    assert job.wait_events("generation_joined", joined + 1, 120), job.err

    assert job.wait(300) == 0, job.out + job.err
    expect_trained_once_per_epoch(job)
    final = json.loads(out.read_text())
    assert set(final["schedule"]) == {2, 3}, final["schedule"]
    assert max_difference(final, replayed(ws, out, "replay.json")) <= 1e-9
    for pid in first:  # the survivors kept their process through every reset
        assert len(re.findall(rf"pid {pid}: reset: world size", job.out)) >= 3, job.out
    assert "restoring commit" in job.out + job.err  # the SIGKILL: HorovodInternalError, restore, re-join
    # The program's own `except hvd.HorovodInternalError` / `except hvd.HostsUpdatedInterrupt` saw them.
    assert "caught HorovodInternalError" in job.out and "caught HostsUpdatedInterrupt" in job.out, job.out
    assert ws.wait_no_workers("horovod_elastic.py")


def test_the_same_program_alone_and_under_mpirun(ws):
    alone_out = ws.path / "alone.json"
    alone = ws.python("horovod_elastic.py", ARGS + ["--out", str(alone_out)])
    assert alone.wait(120) == 0, alone.out + alone.err
    expect_trained_once_per_epoch(alone)
    final = json.loads(alone_out.read_text())
    assert set(final["schedule"]) == {1}
    assert max_difference(final, replayed(ws, alone_out, "alone-replay.json")) <= 1e-9

    if not shutil.which("mpirun"):
        pytest.skip("no mpirun")
    mpi_out = ws.path / "mpi.json"
    mpi = ws.start(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", PYTHON,
                    ws.script("horovod_elastic.py")] + ARGS + ["--out", str(mpi_out)])
    assert mpi.wait(300) == 0, mpi.out + mpi.err
    expect_trained_once_per_epoch(mpi)
    final = json.loads(mpi_out.read_text())
    assert set(final["schedule"]) == {2}
    assert max_difference(final, replayed(ws, mpi_out, "mpi-replay.json")) <= 1e-9


def result_of(job):
    m = re.search(r"RESULT (.*)", job.out)
    assert m, job.out + job.err
    return json.loads(m.group(1))


def test_a_non_elastic_horovod_program_gives_what_erun_torch_gives(ws):
    results = {}
    for api in ("hvd", "erun"):
        job = ws.erun(["-np", "3"], "horovod_basic.py", ["--api", api])
        assert job.wait(180) == 0, job.out + job.err
        results[api] = result_of(job)
    hvd, ref = results["hvd"], results["erun"]
    assert hvd == ref
    assert ref["gathered"] == [0.0, 10.0, 11.0, 20.0, 21.0, 22.0]
    assert ref["grouped"] == [[2.0, 2.0], [4.0, 4.0, 4.0]]
    assert ref["obj"] == {"from": 2, "size": 3} and ref["objs"] == [0, 2, 4]
    assert ref["async"] == pytest.approx([3 * 2 * x for x in ref["losses"]], rel=1e-12)


def test_horovods_documented_semantics(ws):
    """Async handles in issue order, names, ops, scaling, autograd, alltoall,
    the DistributedOptimizer's options and refusals, ObjectState: each
    asserted in tests/python/workers/horovod_checks.py, in a world of 3."""
    job = ws.erun(["-np", "3"], "horovod_checks.py")
    assert job.wait(180) == 0, job.out + job.err
    assert "all checks passed" in job.out, job.out
    assert len(re.findall(r"check \w+ ok", job.out)) == 4, job.out


@once
def test_a_horovodrun_command_line_from_horovods_elastic_docs(ws):
    """`-np 8 --min-np 4 --max-np 12 --host-discovery-script ... --slots-per-host 2`,
    hosts discovered without slot counts, plus some of horovodrun's tuning
    flags (each accepted with a note) and its log level names."""
    ws.hosts("".join(f"host-{i}\n" for i in range(4)))
    disc = ws.path / "discover_hosts.sh"
    disc.write_text(f"#!/bin/sh\ncat {ws.path / 'hosts'}\n")
    disc.chmod(0o700)
    argv = [str(ERUN), "--driver-grace", "0", "--launcher", "local", "--event-log", str(ws.path / "events.jsonl"),
            "-np", "8", "--min-np", "4", "--max-np", "12", "--host-discovery-script", str(disc),
            "--slots-per-host", "2", "--discovery-interval", "0.2", "--fusion-threshold-mb", "32",
            "--cycle-time-ms", "5", "--network-interface", "eth0", "--gloo", "--start-timeout", "60",
            "--log-level", "WARNING", PYTHON, ws.script("elastic_world.py"), "--steps", "300"]
    job = ws.start(argv)
    assert job.wait_events("generation_joined", 1, 120), job.out + job.err
    started = job.events("generation_started")[0]
    assert started["size"] == 8, started
    assert re.search(r"host-0\[0-1\] host-1\[2-3\] host-2\[4-5\] host-3\[6-7\]", started["plan"]), started
    joined = len(job.events("generation_joined"))
    ws.hosts("".join(f"host-{i}\n" for i in range(7)))  # 14 slots: --max-np holds the job at 12
    assert job.wait_events("generation_joined", joined + 1, 120), job.err
    assert job.wait(300) == 0, job.out + job.err
    sizes = [e["size"] for e in job.events("generation_started")]
    assert max(sizes) == 12 and sizes[-1] == 12, sizes
    for flag in ("--fusion-threshold-mb", "--cycle-time-ms", "--network-interface", "--gloo"):
        assert re.search(rf"erun: note: {flag} is ignored: .+", job.err), job.err
    assert "--start-timeout" not in job.err  # taken as --rendezvous-timeout: no note


@once
@pytest.mark.parametrize("flags,reason", [
    (["--config-file", "horovod.yaml"], "does not read Horovod's YAML config"),
    (["--mpi-args", "--bind-to none"], "erun passes no arguments to mpirun this way"),
    (["--mpi", "--min-np", "1"], "--launcher mpirun runs a static job"),
    (["--log-level", "LOUD"], "--log-level LOUD: expected error, warn, info or debug"),
])
def test_horovodrun_flags_erun_cannot_honour_are_refused_with_the_reason(ws, flags, reason):
    r = subprocess.run([str(ERUN), "-np", "2"] + flags + ["/bin/true"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert reason in r.stderr, r.stderr


@once
def test_horovodrun_check_build_log_level_names_and_the_horovodrun_name(ws):
    r = subprocess.run([str(ERUN), "-cb"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "[X] PyTorch" in r.stdout and "erun.horovod.torch" in r.stdout, r.stdout
    link = ws.path / "horovodrun"  # the opt-in name (docs/horovod.md): a link to erun
    link.symlink_to(ERUN)
    r = subprocess.run([str(link), "-np", "2", "sh", "-c", "echo rank $ERUN_RANK of $ERUN_SIZE"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(re.findall(r"rank (\d) of 2", r.stdout)) == ["0", "1"], r.stdout
    for level in ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"):
        r = subprocess.run([str(ERUN), "--dry-run", "-np", "1", "--log-level", level, "/bin/true"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (level, r.stderr)
