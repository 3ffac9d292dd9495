"""Sharded State entries from Python: each rank keeps its rows of two global
arrays, a float64 numpy array split as torch.chunk splits (FSDP2's Shard(0))
and a float32 torch tensor split evenly (a flat ZeRO buffer), and updates
only its rows, element by element, each step. The arithmetic does not
depend on the layout, so a run that grows, shrinks and loses workers ends
at the same bytes as a run alone. At the end the ranks gather the arrays
(for this check only) and rank 0 prints their checksum; survivors print
each reset.

    sharded.py [--steps 400] [--step-ms 20]
"""
import argparse
import hashlib
import os
import time

import numpy as np
import torch

import erun

ROWS_W, COLS_W = 37, 5
ROWS_M, COLS_M = 101, 3


def rows_of(rows, split):
    return erun.shard_rows(rows, erun.rank(), erun.size(), split)


def fresh(rows, cols, split, make):
    b, e = rows_of(rows, split)
    return make(b, e, cols)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--step-ms", type=int, default=20)
    o = ap.parse_args()
    torch.set_num_threads(1)
    erun.init()
    held = {
        "w": fresh(ROWS_W, COLS_W, "chunk", lambda b, e, c: np.arange(b * c, e * c, dtype=np.float64).reshape(e - b, c)),
        "m": fresh(ROWS_M, COLS_M, "even", lambda b, e, c: torch.arange(b * c, e * c, dtype=torch.float32).reshape(e - b, c)),
    }
    state = erun.State(step=0)
    state.register_shard("w", ROWS_W, lambda: held["w"], lambda x: held.__setitem__("w", x), split="chunk")
    state.register_shard("m", ROWS_M, lambda: held["m"], lambda x: held.__setitem__("m", x), split="even")
    state.on_reset(lambda old, new: print(f"rank {erun.rank()} pid {os.getpid()}: reset {old} -> {new}", flush=True))
    print(f"pid {os.getpid()} rank {erun.rank()} started", flush=True)

    @erun.run
    def train(state):
        while state.step < o.steps:
            s = state.step
            b, e = rows_of(ROWS_W, "chunk")
            assert held["w"].shape == (e - b, COLS_W), (held["w"].shape, b, e)
            rows = np.arange(b, e, dtype=np.float64)[:, None]
            held["w"][:] = held["w"] * 0.5 + s + 0.25 * rows
            b, e = rows_of(ROWS_M, "even")
            assert tuple(held["m"].shape) == (e - b, COLS_M), (held["m"].shape, b, e)
            held["m"].mul_(0.9).add_(torch.arange(b, e, dtype=torch.float32)[:, None] * 0.1 + s % 7)
            erun.barrier()
            state.step = s + 1
            if o.step_ms:
                time.sleep(o.step_ms / 1000)
            state.commit()
            if state.step == 10:
                print(f"rank {erun.rank()} committed step 10", flush=True)

    train(state)
    pieces = erun.allgather_object((erun.rank(), held["w"].tobytes(), held["m"].numpy().tobytes()))
    if erun.rank() == 0:
        h = hashlib.sha256()
        for _, w, _ in sorted(pieces):
            h.update(w)
        for _, _, m in sorted(pieces):
            h.update(m)
        print(f"done: {state.step} steps world {erun.size()} final checksum={h.hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    main()
