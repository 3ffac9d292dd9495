"""erun.torch.process_group(): DistributedDataParallel trained in place
across a SIGKILL and a grow. The process group is rebuilt for each generation
and DDP re-wrapped; survivors keep their process; every sample of every epoch
is processed exactly once (counted with torch.distributed itself); all ranks
end with the same parameters; no process is left. A user error raised while
the group is up ends the job with its traceback shown."""
import os
import re
import signal
import time

import pytest

EPOCHS = 5


def wait_count(job, pattern, n, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = set(re.findall(pattern, job.out))
        if len(found) >= n:
            return found
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} matches of {pattern}:\n{job.out}\n{job.err}")


@pytest.mark.parametrize("grads", ["ddp", "hooks"])
def test_ddp_in_place_across_a_sigkill_and_a_grow(ws, grads):
    """grads=hooks: erun's DistributedOptimizer(overlap=True) averages the gradients instead of
    DDP (GradientHooks, post-accumulate-grad hooks on torch >= 2.1), across the same events."""
    ddp_across_a_sigkill_and_a_grow(ws, grads, "cpu")


def ddp_across_a_sigkill_and_a_grow(ws, grads, device):
    """The test above with the model on `device` (test_gpu.py runs it on CUDA)."""
    ws.hosts("node-a:2\n")
    job = ws.erun(["-np", "2", "--min-np", "1", "--max-np", "4", "--blacklist-after", "5"], "ddp_train.py",
                  ["--epochs", str(EPOCHS), "--samples", "1024", "--step-ms", "100", "--grads", grads,
                   "--device", device], discovery=True)
    first = {int(p) for p in wait_count(job, r"pid (\d+) rank \d+ started", 2)}
    assert job.wait_output(r"ddp rank 1 of 2", 120), job.out + job.err

    ws.hosts("node-a:2\nnode-b:2\n")  # grow to 4
    wait_count(job, r"pid (\d+): ddp rank \d of 4", 4)  # every rank wrapped DDP in the world of 4
    started = {int(p) for p in wait_count(job, r"pid (\d+) rank \d+ started", 4)}
    victim = sorted(started - first)[0]
    os.kill(victim, signal.SIGKILL)
    # In place: the survivors go on alone at once (100 ms steps leave the replacement the time to
    # start); the slot is relaunched and its replacement trains in DDP over a new group of 4.
    replacement = {int(p) for p in wait_count(job, r"pid (\d+) rank \d+ started", 5)} - started
    assert len(replacement) == 1, job.out
    assert job.wait_output(rf"pid {replacement.pop()}: ddp rank \d of 4", 120), job.out + job.err

    code = job.wait(300)
    assert code == 0, job.out + job.err
    assert job.out.count("exactly-once=yes") == EPOCHS, job.out
    assert "exactly-once=NO" not in job.out
    sums = set(re.findall(r"rank \d+ checksum=([0-9a-f]+)", job.out))
    assert len(sums) == 1, job.out
    assert len(re.findall(r"rank \d+ checksum=", job.out)) == 4, job.out
    for pid in first:  # survivors of both resets kept their process
        assert len(re.findall(rf"pid {pid}: reset:", job.out)) >= 2, job.out
        assert len(re.findall(rf"pid {pid}: ddp rank", job.out)) >= 3, job.out
    assert "restarting all workers" not in job.err
    assert len(re.findall(rf"gradients by {grads}, on {device}", job.out)) >= 7, job.out
    assert ws.wait_no_workers("ddp_train.py")


def test_a_user_error_with_the_group_up_ends_the_job_with_the_error_shown(ws):
    """torch >= 2.2's init_process_group() wraps sys.excepthook in a hook that prints into a
    buffer, calls the hook it wrapped (erun's, which ends the process with exit code 121) and
    only then writes the buffer: the traceback was lost until erun.torch kept the hook as it was."""
    job = ws.erun(["-np", "2"], "ddp_train.py", ["--epochs", "2", "--samples", "256", "--fail-at-step", "3"])
    code = job.wait(120)
    assert code == 121, (code, job.out, job.err)
    assert "ValueError: user error at step 3" in job.err, job.out + job.err
    assert 'raise ValueError(f"user error at step {state.step}")' in job.err, job.err
    assert "a restart would repeat" in job.err
    assert len(job.events("generation_started")) == 1, job.err
    assert ws.wait_no_workers("ddp_train.py")


def test_a_user_error_with_the_programs_own_group_up_ends_the_job_with_the_error_shown(ws):
    """The same with a group the program made itself (dist.init_process_group): erun's hook
    writes out what torch's wrapping hook buffered before it ends the process."""
    job = ws.erun(["-np", "1"], "own_group_error.py")
    code = job.wait(120)
    assert code == 121, (code, job.out, job.err)
    assert "own group up, sum 3.0" in job.out, job.out + job.err
    assert "ValueError: user error with its own group up" in job.err, job.out + job.err
    assert 'raise ValueError("user error with its own group up")' in job.err, job.err
    assert ws.wait_no_workers("own_group_error.py")
