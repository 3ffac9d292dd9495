"""erun.torch.FSDPState end to end: examples/torch/elastic_fsdp.py (an FSDP2
float64 MLP, Adam, a fixed global batch, ElasticSampler) under erun on
simulated hosts is grown from 2 to 3 ranks, loses a whole host (agent and
worker SIGKILLed: its shards come back from its buddy copy), loses a worker
to SIGKILL and is relaunched; it ends within 1e-9 of the same script run
alone, every sample once per epoch, survivors in their process. On a torch
without FSDP2 (Debian's 1.13), FSDPState says so."""
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import PYTHON, SOURCE, host_of, wait_for

EXAMPLE = SOURCE / "examples" / "torch" / "elastic_fsdp.py"


def has_fsdp2():
    probe = subprocess.run([PYTHON, "-c", "from torch.distributed.fsdp import fully_shard"], capture_output=True)
    return probe.returncode == 0


def fsdp_job_args(out):
    return ["--epochs", "4", "--step-ms", "120", "--out", str(out)]


@pytest.mark.skipif(not has_fsdp2(), reason="this torch has no FSDP2 (fully_shard); see the test below")
def test_fsdp2_is_resharded_in_place_through_a_grow_a_lost_host_and_a_kill(ws):
    shutil.copy(EXAMPLE, ws.path / "elastic_fsdp.py")
    alone = ws.python("elastic_fsdp.py", ["--epochs", "4", "--out", str(ws.path / "alone.npz")])
    assert alone.wait(180) == 0, alone.out + alone.err

    ws.hosts("node-a:2\n")
    job = ws.erun(["-np", "2", "--min-np", "1", "--max-np", "3", "--blacklist-after", "2"], "elastic_fsdp.py",
                  fsdp_job_args(ws.path / "job.npz"), discovery=True, env={"ERUN_LOG_LEVEL": "info"})
    assert wait_for(job, r"rank \d committed step 10", 2), job.out + job.err
    first = {p for p in ws.workers("elastic_fsdp.py") if host_of(p) == "node-a"}  # not erun itself
    assert len(first) == 2, first

    ws.hosts("node-a:2\nnode-b:1\n")  # grow: 2 -> 3, each rank's rows move
    assert wait_for(job, r"fsdp rank \d of 3", 3), job.out + job.err
    on_b = [p for p in ws.workers("elastic_fsdp.py") if host_of(p) == "node-b"]
    assert len(on_b) == 1, on_b
    time.sleep(1.5)  # a few commits of the world of 3, each pushed to a buddy on the next host
    agent = int(open(f"/proc/{on_b[0]}/stat").read().rsplit(")", 1)[1].split()[1])
    ws.hosts("node-a:2\n")
    os.kill(agent, signal.SIGKILL)  # node-b lost whole: its rows come from its buddy on node-a
    os.kill(on_b[0], signal.SIGKILL)
    assert wait_for(job, r"reset: world size 3 -> 2"), job.out + job.err

    resets = len(re.findall(r"reset: world size", job.out))
    os.kill(sorted(first)[1], signal.SIGKILL)  # a worker: the survivor goes on alone, the slot is relaunched
    assert wait_for(job, r"reset: world size", resets + 1), job.out + job.err

    assert job.wait(300) == 0, job.out + job.err
    assert "3 -> 2" in job.out and "2 -> 3" in job.out
    # Every epoch checked (an epoch's line comes again when a failure rolls back its last commit).
    assert set(re.findall(r"epoch (\d) world=\d exactly-once=yes", job.out)) == {"0", "1", "2", "3"}, job.out
    assert "exactly-once=NO" not in job.out
    survivor = sorted(first)[0]
    assert len(re.findall(rf"pid {survivor}: fsdp rank", job.out)) >= 4, job.out  # rebuilt in its process
    assert "restarting all workers" not in job.err
    logs = job.out + job.err
    assert re.search(r"resharded commit \d+ for 2 ranks", logs), logs

    want, got = np.load(ws.path / "alone.npz"), np.load(ws.path / "job.npz")
    assert sorted(want.files) == sorted(got.files)
    for name in want.files:
        assert np.max(np.abs(want[name] - got[name])) < 1e-9, name
    assert ws.wait_no_workers("elastic_fsdp.py")


@pytest.mark.skipif(not has_fsdp2(), reason="this torch has no FSDP2 (fully_shard)")
def test_an_fsdp2_job_started_again_resumes_from_its_checkpoint_dir_in_another_world(ws):
    """Every rank's pieces of the model and of Adam's state, and the whole entries, in
    --checkpoint-dir: a job of 2 ranks that ran 2 epochs, started again for 3 epochs with
    3 ranks, goes on at epoch 2 and ends within 1e-9 of 3 epochs alone."""
    shutil.copy(EXAMPLE, ws.path / "elastic_fsdp.py")
    alone = ws.python("elastic_fsdp.py", ["--epochs", "3", "--out", str(ws.path / "alone.npz")])
    assert alone.wait(180) == 0, alone.out + alone.err
    ckpt = ws.path / "ckpt"
    first = ws.erun(["-np", "2", "--checkpoint-dir", str(ckpt)], "elastic_fsdp.py", ["--epochs", "2"])
    assert first.wait(180) == 0, first.out + first.err
    again = ws.erun(["-np", "3", "--checkpoint-dir", str(ckpt)], "elastic_fsdp.py",
                    ["--epochs", "3", "--out", str(ws.path / "again.npz")])
    assert again.wait(180) == 0, again.out + again.err
    logs = again.out + again.err
    assert re.search(r"goes on from durable commit \d+", logs), logs
    assert "epoch 0 " not in again.out and "epoch 1 " not in again.out, again.out
    assert "epoch 2 world=3 exactly-once=yes" in again.out, again.out
    want, got = np.load(ws.path / "alone.npz"), np.load(ws.path / "again.npz")
    for name in want.files:
        assert np.max(np.abs(want[name] - got[name])) < 1e-9, name


@pytest.mark.skipif(has_fsdp2(), reason="this torch has FSDP2: the test above runs")
def test_without_fsdp2_fsdp_state_says_what_it_needs(ws):
    script = ws.path / "needs_fsdp2.py"
    script.write_text("import erun, erun.torch\n"
                      "erun.init()\n"
                      "erun.torch.FSDPState(lambda mesh: None, lambda model: None)\n")
    run = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert run.returncode != 0
    assert "FSDPState needs FSDP2" in run.stderr and "TorchState" in run.stderr, run.stderr
