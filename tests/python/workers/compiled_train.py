"""A torch.compile'd model trained elastically (driven by
tests/python/test_compiled.py): the first worker gives TorchState the
compiled module (or, with --first original, the original one) and a worker
that joins later gives it the other one, so the state that syncs to the
newcomer (from the survivor's memory and from its commit in host memory)
goes between the two names of the same tensors. Each worker initializes
its model from its own seed (its pid): only the sync makes them equal.
Gradients are averaged by DistributedOptimizer(overlap=True) (GradientHooks
during the compiled backward). Every rank trains on the same batch shape
(its own data), so nothing recompiles when the world grows.

Prints `pid P initial checksum C` before the first sync, `pid P rank R size S
given G step N checksum C` at every entry of the erun.run function (after
the sync), and `pid P rank R final checksum C` at the end. It ends once the
world of 2 has trained --steps-at-2 steps.

    compiled_train.py [--first compiled|original] [--steps-at-2 6] [--step-ms 50]
"""
import argparse
import hashlib
import os
import sys
import time

import torch

import erun
import erun.torch


def checksum(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--first", choices=["compiled", "original"], default="compiled",
                    help="what the first worker gives TorchState (a worker joining later gives the other)")
    ap.add_argument("--steps-at-2", type=int, default=6)
    ap.add_argument("--step-ms", type=int, default=50)
    o = ap.parse_args()
    torch.set_num_threads(1)
    erun.init()
    pid = os.getpid()
    first = erun.generation() == 1  # started with the job, not joining a running one
    other = "original" if o.first == "compiled" else "compiled"
    given = o.first if first else other
    torch.manual_seed(pid)  # every worker's own initial model
    # The model and batch of test_state.py's compiled round trip (the inductor cache serves both).
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 3))
    compiled = torch.compile(model)
    opt = erun.torch.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), overlap=True)
    state = erun.torch.TorchState(model=compiled if given == "compiled" else model, optimizer=opt, step=0,
                                  steps_at_2=0)
    print(f"pid {pid} initial checksum {checksum(model)}", flush=True)

    @erun.run
    def train(state):
        print(f"pid {pid} rank {erun.rank()} size {erun.size()} given {given} step {state.step} "
              f"checksum {checksum(model)}", flush=True)
        while state.steps_at_2 < o.steps_at_2:
            g = torch.Generator().manual_seed(state.step * 16 + erun.rank())
            x, y = torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(compiled(x), y).backward()
            opt.step()
            state.step += 1
            if erun.size() == 2:
                state.steps_at_2 += 1
            time.sleep(o.step_ms / 1000)
            state.commit()

    train(state)
    print(f"pid {pid} rank {erun.rank()} final checksum {checksum(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
