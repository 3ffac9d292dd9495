"""torch.distributed NCCL allreduce (float32 sum) of a CUDA tensor in a world of one
process per visible GPU, in the output format of bench/gpu_allreduce_bench.cc.
    torch_gpu_allreduce.py [--iters N=50] BYTES...
Each iteration waits for the operation (torch.cuda.synchronize), as erun's
GPU allreduce does.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, sizes, iters, store_file):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + store_file, rank=rank, world_size=world)
    for nbytes in sizes:
        t = torch.zeros(nbytes // 4, dtype=torch.float32, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
            torch.cuda.synchronize()
        sec = (time.perf_counter() - t0) / iters
        if rank == 0:
            algbw = nbytes / sec / 1e9
            busbw = algbw * 2 * (world - 1) / world
            print(f"GPUBENCH impl=torch-nccl bytes={nbytes} ranks={world} time_us={sec * 1e6:.1f} "
                  f"algbw={algbw:.2f} busbw={busbw:.2f}", flush=True)
    dist.destroy_process_group()


def main():
    args = sys.argv[1:]
    iters = 50
    if len(args) >= 2 and args[0] == "--iters":
        iters = int(args[1])
        args = args[2:]
    sizes = [int(a) for a in args] or [1 << 20, 1 << 24, 1 << 28]
    world = torch.cuda.device_count()
    if world == 0:
        sys.exit("torch_gpu_allreduce: no CUDA device")
    fd, store = tempfile.mkstemp(prefix="torch-gpu-store-")
    os.close(fd)
    os.unlink(store)
    try:
        mp.spawn(run, args=(world, sizes, iters, store), nprocs=world)
    finally:
        if os.path.exists(store):
            os.unlink(store)


if __name__ == "__main__":
    main()
