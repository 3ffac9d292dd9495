"""Gradient averaging overlapped with backward (erun.torch.GradientHooks,
DistributedOptimizer(overlap=True)) against averaging after backward
(DistributedOptimizer), same model, same ranks, same run. Run under erun:

    erun -np 2 env PYTHONPATH=build/python /usr/bin/python3 bench/python_overlap.py

The model is an MLP of --layers Linear(--width, --width) layers (float32),
big enough that the gradient allreduce costs about as much as backward. Each
mode runs twice, interleaved with the other: --warmup steps, then --steps
timed steps (forward, backward, optimizer step); rank 0 prints the better of
each mode's two medians (of the slowest rank) as `OVERLAP mode=M
step_ms=T` lines, and the ratio."""
import argparse
import statistics
import time

import numpy as np
import torch

import erun
import erun.torch


def steps(model, opt, x, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bucket-mb", type=float, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    erun.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(a.width, a.width) for _ in range(a.layers)])
    x = torch.randn(a.batch, a.width)
    bucket = int(a.bucket_mb * (1 << 20))
    results = {}
    for mode in ("after-backward", "overlapped", "after-backward", "overlapped"):  # interleaved: fair to both
        opt = erun.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-6), bucket_bytes=bucket,
                                              overlap=mode == "overlapped")
        steps(model, opt, x, a.warmup)
        t = np.array([statistics.median(steps(model, opt, x, a.steps))])
        erun.allreduce_(t, op=erun.Max)
        results.setdefault(mode, []).append(float(t[0]))
        if opt.hooks is not None:
            opt.hooks.close()
    if erun.rank() == 0:
        nbytes = sum(q.numel() * q.element_size() for q in model.parameters())
        for mode, ts in results.items():
            print(f"OVERLAP mode={mode} ranks={erun.size()} grad_mb={nbytes / 2**20:.1f} step_ms={min(ts) * 1e3:.1f}",
                  flush=True)
        ratio = min(results["after-backward"]) / min(results["overlapped"])
        print(f"OVERLAP speedup={ratio:.2f}x (after-backward / overlapped step time)", flush=True)


if __name__ == "__main__":
    main()
