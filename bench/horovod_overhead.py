"""What Horovod's API costs over erun's: the same operations through
erun.horovod.torch and through erun / erun.torch, same ranks, same run.
Run under erun:

    erun -np 2 env PYTHONPATH=build/python /usr/bin/python3 bench/horovod_overhead.py

Measured, each with --rounds rounds alternating the two APIs (the best
round's median of the slowest rank counts):
- allreduce of a float32 tensor, out of place (hvd.allreduce vs
  erun.allreduce) and in place (hvd.allreduce_ vs erun.allreduce_), at
  4 KiB and 1 MiB;
- a training step (zero_grad, forward, backward, step) of an MLP of
  --layers Linear(--width, --width) layers with hvd.DistributedOptimizer vs
  erun.torch.DistributedOptimizer(overlap=True), the same gradient hooks.
Rank 0 prints `HVD op=... erun_us=... hvd_us=... overhead=...%` lines.
"""
import argparse
import statistics
import time

import numpy as np
import torch

import erun
import erun.horovod.torch as hvd
import erun.torch


def slowest(x):
    t = np.array([x], dtype=np.float64)
    erun.allreduce_(t, op=erun.Max)
    return float(t[0])


def timed(fn, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return slowest(statistics.median(times))


def compare(name, erun_fn, hvd_fn, n, rounds):
    best = {"erun": float("inf"), "hvd": float("inf")}
    for _ in range(rounds):
        for api, fn in (("erun", erun_fn), ("hvd", hvd_fn)):
            for _ in range(max(3, n // 10)):
                fn()
            erun.barrier()
            best[api] = min(best[api], timed(fn, n))
    if erun.rank() == 0:
        overhead = (best["hvd"] / best["erun"] - 1) * 100
        print(f"HVD op={name} erun_us={best['erun'] * 1e6:.1f} hvd_us={best['hvd'] * 1e6:.1f} "
              f"overhead={overhead:+.1f}%", flush=True)


def model_and_batch(o):
    torch.manual_seed(0)
    layers = []
    for _ in range(o.layers):
        layers += [torch.nn.Linear(o.width, o.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers), torch.randn(o.batch, o.width)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    o = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    for nbytes in (4 << 10, 1 << 20):
        t = torch.ones(nbytes // 4)
        n = o.iters if nbytes < (1 << 20) else o.iters // 4
        compare(f"allreduce/{nbytes}B", lambda: erun.allreduce(t), lambda: hvd.allreduce(t), n, o.rounds)
        compare(f"allreduce_/{nbytes}B", lambda: erun.allreduce_(t), lambda: hvd.allreduce_(t), n, o.rounds)

    steps = {}
    for api in ("erun", "hvd"):
        model, x = model_and_batch(o)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        if api == "erun":
            opt = erun.torch.DistributedOptimizer(opt, overlap=True)
        else:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

        def step(model=model, opt=opt, x=x):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        steps[api] = step
    compare("optimizer_step", steps["erun"], steps["hvd"], o.steps, o.rounds)
    return 0


if __name__ == "__main__":
    main()
