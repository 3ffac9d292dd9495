"""TorchState.commit() of a ~100 MB model vs a memcpy of its parameters
(numpy copyto into buffers allocated once), in a world of one; and with an
SGD-momentum optimizer, whose state (another 100 MB) goes through the
serialized path. Median of --reps. Under erun (`erun -np 1 /usr/bin/python3
bench/python_commit.py`) the commits go to host memory too.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_commit.py [--mb 100] [--reps 9]
"""
import argparse
import statistics
import sys
import time

import numpy as np
import torch

import erun
import erun.torch


def median_time(fn, reps):
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--reps", type=int, default=9)
    o = ap.parse_args()
    torch.set_num_threads(1)
    erun.init()
    width = 2048
    layers = max(1, round(o.mb * 1e6 / 4 / (width * width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    srcs = [p.detach().numpy() for p in model.parameters()]
    dsts = [np.empty_like(s) for s in srcs]

    def memcpy():
        for d, s in zip(dsts, srcs):
            np.copyto(d, s)

    state = erun.torch.TorchState(model=model, step=0)
    state.sync()  # as training does first: under erun, commits then go to host memory too
    t_copy = median_time(memcpy, o.reps)
    t_commit = median_time(state.commit, o.reps)
    print(f"model {nbytes / 1e6:.1f} MB: memcpy {t_copy * 1e3:.1f} ms ({nbytes / t_copy / 1e9:.2f} GB/s), "
          f"TorchState.commit {t_commit * 1e3:.1f} ms: {t_commit / t_copy:.2f}x memcpy", flush=True)

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # creates the momentum buffers
    with_opt = erun.torch.TorchState(model=model, optimizer=opt)
    with_opt.sync()
    t_commit2 = median_time(with_opt.commit, o.reps)
    print(f"model + SGD momentum {2 * nbytes / 1e6:.1f} MB: TorchState.commit {t_commit2 * 1e3:.1f} ms: "
          f"{t_commit2 / (2 * t_copy):.2f}x memcpy of the same bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
