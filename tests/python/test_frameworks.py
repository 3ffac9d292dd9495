"""The frameworks users already run, unchanged under erun's restart mode:
examples/torch/lightning_restart.py (PyTorch Lightning, DDP on CPU) and
examples/torch/accelerate_restart.py (HF Accelerate), neither of which
imports erun. Real processes under the real erun binary:

- with two workers both ranks train in a world of two (as the framework
  itself reports it) and the trained parameters are bit-identical to those
  of the same script under torchrun with two processes (same gloo
  allreduce of two ranks, same data split: no tolerance needed);
- a worker SIGKILLed mid-training after a checkpoint exists: erun restarts
  every worker, they resume from the framework's own checkpoint (not from
  step 0) and end at the same parameters as the uninterrupted run.

Skipped when the workers' interpreter (ERUN_TEST_PYTHON) lacks the
framework, e.g. Debian's python3 with torch 1.13."""
import functools
import re
import shutil
import signal
import os
import subprocess
import time

import pytest

from conftest import PYTHON, SOURCE, Workspace

EXAMPLES = SOURCE / "examples" / "torch"
EPOCHS = 6
STEPS_PER_EPOCH = 8  # 512 samples, batch 32 per process, 2 processes
ARGS = ["--epochs", str(EPOCHS), "--samples", "512", "--batch", "32"]

FRAMEWORKS = {
    # name: (module the workers must import, script, the pattern of an epoch's checkpoint)
    "lightning": ("lightning.pytorch", "lightning_restart.py", r"epoch=(\d+)-step=\d+\.ckpt"),
    "accelerate": ("accelerate", "accelerate_restart.py", r"epoch_(\d+)"),
}


@functools.lru_cache(maxsize=None)
def importable(module):
    return subprocess.run([PYTHON, "-c", f"import torch, {module}"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def require(name):
    module, script, pattern = FRAMEWORKS[name]
    if not importable(module):
        pytest.skip(f"{PYTHON} cannot import {module} (set ERUN_TEST_PYTHON to an interpreter that has it)")
    return script, pattern


def checkpointed_epochs(directory, pattern):
    """The epochs whose checkpoint is in `directory` now."""
    names = os.listdir(directory) if directory.is_dir() else []
    return {int(m.group(1)) for m in (re.fullmatch(pattern, n) for n in names) if m}


def done_line(text):
    """(epoch, global_step, world, digest) of the `done:` line, or None."""
    m = re.search(r"done: epoch (\d+) global_step (\d+) world (\d+) checksum=\S+ digest=([0-9a-f]+)", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)) if m else None


def starts(text):
    """{(rank, restart): (pid, epoch, global_step)} from the scripts' start lines."""
    return {(int(m[0]), int(m[5])): (int(m[2]), int(m[3]), int(m[4]))
            for m in re.findall(r"rank (\d+)/(\d+) pid (\d+): training from epoch (\d+) global_step (\d+) "
                                r"\(restart (\d+)\)", text)}


def place(ws, script):
    """The example copied into the test's directory, so that its processes are found by path."""
    shutil.copy(EXAMPLES / script, ws.path / script)
    return script


@pytest.fixture(scope="module")
def torchrun_reference(tmp_path_factory):
    """Each framework's `done:` line under torchrun with two processes (run once, on first use)."""
    results = {}

    def get(name):
        if name not in results:
            script, _ = require(name)
            w = Workspace(tmp_path_factory.mktemp(f"torchrun-{name}"))
            # --standalone: a rendezvous on a free port, so parallel test runs do not collide on 29500.
            # The peer itself is the reference, not what is tested: torch 2.x's gloo has aborted a worker at
            # exit ("terminate called without an active exception") after training ended, now and then, so a
            # failed reference run is run once more, from a fresh checkpoint directory.
            for attempt in range(2):
                job = w.start([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               str(EXAMPLES / script), "--checkpoint-dir", str(w.path / f"ckpt{attempt}")] + ARGS)
                code = job.wait(180)
                job.close()
                if code == 0:
                    break
            assert code == 0, job.out + job.err
            results[name] = done_line(job.out)
            assert results[name] == (EPOCHS, EPOCHS * STEPS_PER_EPOCH, 2, results[name][3]), job.out
        return results[name]

    return get


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_two_workers_in_restart_mode_train_as_under_torchrun(ws, name, torchrun_reference):
    script, _ = require(name)
    job = ws.erun(["-np", "2", "--mode", "restart"], place(ws, script),
                  ["--checkpoint-dir", str(ws.path / "ckpt")] + ARGS)
    assert job.wait(180) == 0, job.out + job.err
    # Both ranks, each seeing a world of two through the framework, from epoch 0, and every epoch.
    assert set(starts(job.out)) == {(0, 0), (1, 0)}, job.out
    assert all(epoch == 0 and step == 0 for _, epoch, step in starts(job.out).values()), job.out
    for rank in (0, 1):
        assert len(re.findall(rf"rank {rank}/2: epoch \d+ done", job.out)) == EPOCHS, job.out
    got = done_line(job.out)
    assert got == torchrun_reference(name), (got, job.out)
    assert len(job.events("generation_started")) == 1, job.err
    assert ws.wait_no_workers(script), ws.workers(script)


# Lightning loses rank 1: rank 0, the checkpoint writer, is left in a collective with a dead
# peer (and Lightning's SIGTERM handler broadcasts to it) until erun stops it. Accelerate loses
# rank 0: the writer and the host of the rendezvous store die, possibly while saving.
VICTIM = {"lightning": 1, "accelerate": 0}


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_a_sigkilled_worker_restarts_all_from_the_last_checkpoint(ws, name, torchrun_reference):
    script, pattern = require(name)
    ckpt = ws.path / "ckpt"
    job = ws.erun(["-np", "2", "--mode", "restart", "--reset-limit", "2"], place(ws, script),
                  ["--checkpoint-dir", str(ckpt), "--step-ms", "150"] + ARGS)
    # Mid-training, once a checkpoint past epoch 0 exists: a couple of steps later.
    deadline = time.monotonic() + 120
    while not max(checkpointed_epochs(ckpt, pattern), default=0) and time.monotonic() < deadline \
            and job.proc.poll() is None:
        time.sleep(0.05)
    assert max(checkpointed_epochs(ckpt, pattern), default=0) >= 1, job.out + job.err
    time.sleep(0.3)
    first = starts(job.out)
    assert set(first) == {(0, 0), (1, 0)}, job.out
    assert done_line(job.out) is None, job.out  # still training
    os.kill(first[(VICTIM[name], 0)][0], signal.SIGKILL)

    assert job.wait(180) == 0, job.out + job.err
    assert re.search(rf"gen 1 \S+ rank {VICTIM[name]}: failed with signal 9", job.err), job.err
    assert re.search(rf"gen 1: \S+ rank {VICTIM[name]} failed; restarting all workers", job.err), job.err
    assert len(job.events("generation_started")) == 2, job.err
    # Both new workers resumed from the same checkpoint, at an epoch boundary, not at step 0 (Lightning's
    # last.ckpt is written just after the per-epoch file, so the kill may come before epoch 1's is).
    after = {rank: v for (rank, restart), v in starts(job.out).items() if restart == 1}
    assert set(after) == {0, 1}, job.out
    assert {pid for pid, _, _ in after.values()}.isdisjoint(pid for pid, _, _ in first.values())
    (_, epoch, step), (_, epoch1, step1) = after[0], after[1]
    assert (epoch, step) == (epoch1, step1), job.out
    assert 1 <= epoch < EPOCHS and step == epoch * STEPS_PER_EPOCH, job.out
    if name == "lightning":
        # Lightning's own message (forwarded, tagged, on erun's stdout).
        assert f"Restored all states from the checkpoint at {ckpt / 'last.ckpt'}" in job.out, job.out
    else:
        assert job.out.count(f"resumed from {ckpt / f'epoch_{epoch - 1}'}") == 2, job.out
    # Epochs before the resume point ran once, and the parameters equal the uninterrupted run's.
    for e in range(epoch):
        assert job.out.count(f"rank 0/2: epoch {e} done") == 1, job.out
    assert done_line(job.out) == torchrun_reference(name), job.out
    assert ws.wait_no_workers(script), ws.workers(script)
