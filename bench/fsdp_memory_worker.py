"""bench/fsdp_memory.py's worker: an FSDP2 model of --mib MiB of float32
parameters (--layers square Linear layers, no bias) with Adam, in an
erun.torch.FSDPState, trained --steps steps of a tiny batch, a commit after
each. A thread samples this process's RssAnon every 2 ms. Before each
re-join (State.on_rejoin) the worker notes its RssAnon and the bytes of its
pieces (parameters, exp_avg, exp_avg_sq: what it commits); after the
re-join's sync and rebuild (on_reset) it prints one line:

    MEM pid P world OLD->NEW before_kb B peak_kb K after_kb A old_kb O new_kb N

the peak being the highest RssAnon sampled between the two.
"""
import argparse
import os
import time

import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

import erun
import erun.torch
from reshard_worker import PeakRss, rss_kib  # bench/: this script's directory


def rss_anon_kb():
    return rss_kib()[0]


def piece_kb(state):
    """This rank's committed pieces: its parameters' local shards and Adam's state of them, KiB."""
    n = 0
    for p in state.model.parameters():
        n += p.to_local().numel() * p.element_size()
    for s in state.optimizer.state.values():
        for k in ("exp_avg", "exp_avg_sq"):
            t = s.get(k)
            if t is not None:
                t = t.to_local() if hasattr(t, "to_local") else t
                n += t.numel() * t.element_size()
    return n // 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=192)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-ms", type=int, default=0)
    o = ap.parse_args()
    torch.set_num_threads(1)
    width = int((o.mib * 2 ** 20 / 4 / o.layers) ** 0.5)

    def build(mesh):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(o.layers)])
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    erun.init()
    peak = PeakRss()
    state = erun.torch.FSDPState(build, lambda m: torch.optim.Adam(m.parameters(), lr=1e-4), step=0)
    before = {}

    @state.on_rejoin
    def note():
        before.update(size=erun.size(), rss=rss_anon_kb(), pieces=piece_kb(state))
        peak.take()  # from here on

    @state.on_reset
    def report(old, new):
        high = max(peak.take(), rss_anon_kb())
        print(f"MEM pid {os.getpid()} world {old}->{new} before_kb {before.get('rss', 0)} peak_kb {high} "
              f"after_kb {rss_anon_kb()} old_kb {before.get('pieces', 0)} new_kb {piece_kb(state)}", flush=True)

    print(f"pid {os.getpid()} rank {erun.rank()} started width {width}", flush=True)
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(erun.rank()))

    @erun.run
    def train(state):
        model, opt = state.model, state.optimizer
        while state.step < o.steps:
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            state.step += 1
            state.commit()
            if erun.rank() == 0:
                print(f"step {state.step} world {erun.size()}", flush=True)
            time.sleep(o.step_ms / 1000)

    train(state)
    state.close()


if __name__ == "__main__":
    main()
