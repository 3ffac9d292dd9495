"""A light elastic worker (no torch): an erun.State step counter, one
allreduce and a commit per step, so that a test can watch a job's world
change. Rank 0 prints the world size it ends in.

    elastic_world.py [--steps 300] [--step-ms 50]
"""
import argparse
import sys
import time

import numpy as np

import erun


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-ms", type=int, default=50)
    o = ap.parse_args()
    erun.init()
    state = erun.State(step=0)

    @erun.run
    def train(state):
        while state.step < o.steps:
            time.sleep(o.step_ms / 1000)
            ones = np.ones(4)
            erun.allreduce_(ones, op=erun.Sum)
            assert ones[0] == erun.size(), ones
            state.step += 1
            state.commit()

    train(state)
    if erun.rank() == 0:
        print(f"finished at step {state.step} in a world of {erun.size()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
