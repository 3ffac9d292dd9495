"""torch.distributed Gloo allreduce (float32 sum) among NP local processes.
    torch_allreduce.py NP BYTES...
Same method and output as bench/allreduce_bench.cc: 3 warm-ups, then
clamp(256 MiB / bytes, 5, 1000) timed ops; the slowest rank's mean time.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, np_, sizes, store_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store_file, rank=rank, world_size=np_)
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        iters = max(5, min(1000, (256 << 20) // max(nbytes, 1)))
        for _ in range(3):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        el = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(el, op=dist.ReduceOp.MAX)
        sec = el.item()
        if rank == 0:
            algbw = nbytes / sec / 1e9
            busbw = algbw * 2 * (np_ - 1) / np_
            print(f"np={np_} bytes={nbytes} iters={iters} time={sec * 1e6:.1f} us algbw={algbw:.3f} GB/s "
                  f"busbw={busbw:.3f} GB/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    np_ = int(sys.argv[1])
    sizes = [int(s) for s in sys.argv[2:]] or [4096, 1 << 20, 64 << 20]
    fd, store = tempfile.mkstemp(prefix="torch_allreduce_")
    os.close(fd)
    os.unlink(store)
    try:
        mp.start_processes(run, args=(np_, sizes, store), nprocs=np_, start_method="fork")
    finally:
        if os.path.exists(store):
            os.unlink(store)
