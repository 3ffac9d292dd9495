"""CUDA tensors through erun's GPU collectives (issue 11): every collective
on every dtype and op on the GPU against the serial reference, several ranks
sharing the one GPU (the host-staged path) and a world of one (NCCL), and
DistributedOptimizer on CUDA gradients. They need torch with CUDA and a GPU,
and skip with the reason otherwise (Debian's torch is CPU-only); a GPU
machine runs them through scripts/gpu_tests.sh. The checks of the error a
non-CPU tensor gets run everywhere."""
import re

import pytest
import torch

import erun

from conftest import PYTHON

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
