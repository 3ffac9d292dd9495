"""CUDA tensors through erun's GPU collectives (issue 11): every collective
on every dtype and op on the GPU against the serial reference, several ranks
sharing the one GPU (the host-staged path) and a world of one (NCCL), and
DistributedOptimizer on CUDA gradients. Training on CUDA in place (issue 18):
the exact model (train_exact.py --device cuda) across a grow and a SIGKILL,
and with every worker SIGKILLed at once, ends at the uninterrupted CUDA run's
checksum; DDP and erun's gradient hooks on CUDA across a SIGKILL and a grow;
FSDP2 (erun.torch.FSDPState) on CUDA over NCCL, its shards through host
memory, across a SIGKILL (and, with two GPUs, a grow).
They need torch with CUDA and a GPU, and skip with the reason otherwise
(Debian's torch is CPU-only); a GPU machine runs them through
scripts/gpu_tests.sh. The checks of the error a
non-CPU tensor gets run everywhere."""
import os
import re
import shutil
import signal
import time

import pytest
import torch

import erun

import numpy as np

from conftest import wait_for
from test_ddp import ddp_across_a_sigkill_and_a_grow
from test_fsdp import EXAMPLE as FSDP_EXAMPLE, has_fsdp2
from test_elastic import (ARGS, every_worker_killed_at_once, expect_trained_exactly, started_pids,
                          uninterrupted_checksum, wait_count)

CUDA_ARGS = ARGS + ["--device", "cuda"]

if not torch.cuda.is_available():
    why = ("torch has no CUDA (a CPU-only build)" if torch.version.cuda is None
           else "torch sees no CUDA device")
    needs_gpu = pytest.mark.skip(reason=f"{why}: the CUDA tensor tests need a GPU; run scripts/gpu_tests.sh "
                                        f"on a GPU machine")
else:
    needs_gpu = pytest.mark.skipif(False, reason="")


def passed_on_gpu(job, n):
    lines = re.findall(r"collectives ok rank (\d+) of (\d+) checks (\d+)", job.out)
    assert sorted(int(r) for r, _, _ in lines) == list(range(n)), job.out + job.err
    assert all(int(s) == n and int(c) > 100 for _, s, c in lines), job.out
    return re.findall(r"device cuda:\d+ backend (\w+)", job.out)


@needs_gpu
def test_cuda_collectives_world_of_one_nccl(ws):
    job = ws.python("collectives.py", ["--device", "cuda"])
    assert job.wait(240) == 0, job.out + job.err
    assert passed_on_gpu(job, 1) == ["nccl"] or not erun._erun.built_with_nccl(), job.out


@needs_gpu
@pytest.mark.parametrize("np_", [2, 4])
def test_cuda_collectives_ranks_sharing_the_gpu(ws, np_):
    job = ws.erun(["-np", str(np_)], "collectives.py", ["--device", "cuda"])
    assert job.wait(300) == 0, job.out + job.err
    backends = passed_on_gpu(job, np_)
    if torch.cuda.device_count() == 1:
        assert backends == ["staged"] * np_, job.out  # NCCL refuses ranks that share a GPU
    assert ws.wait_no_workers("collectives.py")


def test_a_tensor_on_another_device_is_a_clear_error():
    x = torch.zeros(4, device="meta")
    for call in (lambda: erun.allreduce_(x), lambda: erun.broadcast_(x), lambda: erun.allgather(x)):
        with pytest.raises(erun.Error, match=r"takes CPU and CUDA tensors only \(got a tensor on meta\)"):
            call()


def test_state_buffers_stay_cpu_only():
    # A State's raw buffer is copied with memcpy: a device tensor must not get there.
    x = torch.zeros(4, device="meta")
    with pytest.raises(erun.Error, match=r"State.register_buffer: takes CPU tensors only"):
        erun.State().register_buffer("x", x)


@pytest.fixture(scope="module")
def cuda_reference(tmp_path_factory):
    """The checksum of train_exact.py on CUDA, uninterrupted, in a world of one (NCCL)."""
    return uninterrupted_checksum(tmp_path_factory, CUDA_ARGS)


@needs_gpu
def test_cuda_model_in_place_across_a_grow_and_a_sigkill_ends_at_the_uninterrupted_model(ws, cuda_reference):
    ws.hosts("node-a:2\n")
    # 300 ms steps: training outlasts two waves of worker start-up (import torch, a CUDA context).
    job = ws.erun(["-np", "2", "--min-np", "1", "--max-np", "4", "--blacklist-after", "5"], "train_exact.py",
                  CUDA_ARGS + ["--step-ms", "300"], discovery=True)
    assert job.wait_output(r"epoch 0 ", 180), job.out + job.err
    first = started_pids(job, 2)
    assert len(first) == 2, job.out
    ws.hosts("node-a:2\nnode-b:2\n")  # grow to 4 ranks sharing the GPU
    assert wait_count(job, "-> 4 (generation", 4), job.out + job.err
    grown = started_pids(job, 4) - first
    assert len(grown) == 2, job.out
    os.kill(sorted(grown)[0], signal.SIGKILL)  # the survivors go on; the slot's replacement syncs
    assert wait_count(job, "world size 3 -> 4", 4), job.out + job.err
    expect_trained_exactly(job, cuda_reference, ws)
    assert "restarting all workers" not in job.err
    assert len(re.findall(r"rank \d+ device cuda:\d+", job.out)) >= 5, job.out
    for pid in first:  # survivors kept their process (and their CUDA context)
        assert len(re.findall(rf"pid {pid}: reset:", job.out)) >= 2, job.out


@needs_gpu
def test_cuda_model_every_worker_killed_at_once_resumes_from_host_memory(ws, cuda_reference):
    every_worker_killed_at_once(ws, cuda_reference, CUDA_ARGS)


@needs_gpu
@pytest.mark.parametrize("grads", ["hooks", "ddp"])  # erun's GPU path first: a cut-off run loses DDP's
def test_cuda_ddp_in_place_across_a_sigkill_and_a_grow(ws, grads):
    """DDP reduces CUDA buckets over the Gloo group (grads=ddp), or erun's
    DistributedOptimizer reduces CUDA gradients through the staged path (hooks)."""
    ddp_across_a_sigkill_and_a_grow(ws, grads, "cuda")


def fsdp_on_cuda(ws, workers, *, grow_to=0):
    """examples/torch/elastic_fsdp.py --device cuda (NCCL: one rank per GPU)
    alone, then under erun with `workers` ranks: grown to `grow_to` ranks when
    given, then a worker SIGKILLed once an epoch ended. It must end within
    1e-9 of the run alone, every epoch checked once per pass, no epoch run
    from the start again."""
    shutil.copy(FSDP_EXAMPLE, ws.path / "elastic_fsdp.py")
    args = ["--epochs", "3", "--device", "cuda"]
    alone = ws.python("elastic_fsdp.py", args + ["--out", str(ws.path / "alone.npz")])
    assert alone.wait(300) == 0, alone.out + alone.err
    assert "started on cuda:0" in alone.out, alone.out
    ws.hosts(f"node-a:{workers}\n")
    job = ws.erun(["-np", str(workers), "--min-np", "1", "--max-np", str(max(workers, grow_to)),
                   "--blacklist-after", "5"], "elastic_fsdp.py",
                  args + ["--step-ms", "150", "--out", str(ws.path / "job.npz")], discovery=True,
                  env={"ERUN_LOG_LEVEL": "info"})
    assert wait_for(job, r"rank 0 committed step 10", 1, timeout=240), job.out + job.err
    if grow_to:
        ws.hosts(f"node-a:{grow_to}\n")
        assert wait_for(job, rf"fsdp rank \d of {grow_to}", grow_to, timeout=240), job.out + job.err
    assert wait_for(job, r"epoch 0 world=", 1, timeout=240), job.out + job.err
    time.sleep(0.6)  # a few steps into epoch 1: its first commit made
    started = set(int(p) for p in re.findall(r"pid (\d+) rank \d+ started on cuda", job.out))
    os.kill(max(started), signal.SIGKILL)
    assert job.wait(600) == 0, job.out + job.err
    assert set(re.findall(r"epoch (\d) world=\d exactly-once=yes", job.out)) == {"0", "1", "2"}, job.out
    assert "exactly-once=NO" not in job.out
    assert job.out.count("epoch 0 world=") == 1, job.out  # resumed from its commit, not from the start
    assert len(re.findall(r"started on cuda", job.out)) > len(started), job.out  # the killed one came back
    want, got = np.load(ws.path / "alone.npz"), np.load(ws.path / "job.npz")
    assert sorted(want.files) == sorted(got.files)
    for name in want.files:
        assert np.max(np.abs(want[name] - got[name])) < 1e-9, name
    assert ws.wait_no_workers("elastic_fsdp.py")
    return job


@needs_gpu
@pytest.mark.skipif(not has_fsdp2(), reason="this torch has no FSDP2 (fully_shard)")
def test_cuda_fsdp2_world_of_one_resumes_its_shards_from_host_memory_after_a_sigkill(ws):
    """A world of one (NCCL takes one rank per GPU): the worker's pieces of
    the model and of Adam's state, staged into host memory at each commit,
    come back onto the GPU in its replacement."""
    fsdp_on_cuda(ws, 1)


@needs_gpu
@pytest.mark.skipif(not has_fsdp2(), reason="this torch has no FSDP2 (fully_shard)")
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL takes one rank per GPU: growing needs 2 GPUs")
def test_cuda_fsdp2_is_resharded_on_the_gpus_through_a_grow_and_a_sigkill(ws):
    job = fsdp_on_cuda(ws, 1, grow_to=2)
    assert re.search(r"resharded commit \d+ for 2 ranks", job.out + job.err), job.out + job.err
