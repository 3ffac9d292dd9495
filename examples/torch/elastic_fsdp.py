"""An FSDP2 (fully_shard) model trained in place with erun: each rank holds
and commits only its shard of the parameters and of Adam's state; when a
worker dies or the host list changes, the survivors keep their process, the
shards are moved between the ranks in memory (no checkpoint on disk) to the
new world's layout, and training goes on from the last commit. The lines that
differ from a torchrun FSDP2 script are marked `# erun`.

    echo localhost:2 > hosts.txt
    ERUN_HOSTS_FILE=hosts.txt erun --min-np 1 --max-np 4 --launcher local \\
        --host-discovery-script scripts/discover_hosts.sh .venv/bin/python examples/torch/elastic_fsdp.py

Edit hosts.txt while it runs (`localhost:3` grows it, `localhost:1` shrinks
it) or SIGKILL a worker. Needs torch >= 2.6 (FSDP2). A float64 MLP learns a
fixed function with Adam over a fixed global batch; every sample of an epoch
is used exactly once (counted in the committed state), and --out writes the
final parameters (gathered, for the check only) to an .npz file: a run that
grows, shrinks and loses workers ends within rounding of a run alone.

    elastic_fsdp.py [--epochs 3] [--samples 512] [--global-batch 32] [--step-ms 0] [--out params.npz]
                    [--device cpu|cuda]

--device cuda trains on the GPU of the worker's local rank over NCCL (which
takes one rank per GPU): the pieces are staged through host memory at each
commit and go back to the GPU when the model is rebuilt.
"""
import argparse
import hashlib
import os
import time

import numpy as np
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

import erun  # erun
import erun.torch  # erun

IN, HIDDEN = 16, 48


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, 1)])

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.layers[-1](x)


def build(mesh):  # erun: the model for a mesh (erun calls it again, on "meta", for a new world)
    torch.manual_seed(0)
    model = MLP().double()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--step-ms", type=int, default=0, help="sleep per step, to watch it")
    ap.add_argument("--out", help="write the final parameters here (.npz)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: one GPU per rank (NCCL)")
    o = ap.parse_args()
    torch.set_num_threads(1)
    erun.init()  # erun: instead of dist.init_process_group
    device = "cpu"
    if o.device == "cuda":
        device = f"cuda:{erun.local_rank() % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(o.samples, IN, generator=g, dtype=torch.float64)
    y = torch.sin(x @ torch.linspace(-1, 1, IN, dtype=torch.float64))[:, None]
    x, y = x.to(device), y.to(device)
    sampler = erun.torch.ElasticSampler(o.samples, seed=4)
    state = erun.torch.FSDPState(build, lambda model: torch.optim.Adam(model.parameters(), lr=3e-3),  # erun
                                 sampler=sampler, device=device, epoch=0, step=0,
                                 seen=np.zeros(o.samples, dtype=np.int64))

    @state.on_reset
    def report(old_size, new_size):
        print(f"pid {os.getpid()}: reset: world size {old_size} -> {new_size} at step {state.step}", flush=True)

    print(f"pid {os.getpid()} rank {erun.rank()} started on {device}", flush=True)

    @erun.run  # erun: the loop survives failures and resizes
    def train(state):
        model, opt = state.model, state.optimizer  # erun: this generation's, resharded
        print(f"pid {os.getpid()}: fsdp rank {erun.rank()} of {erun.size()} (generation {erun.generation()})",
              flush=True)
        while state.epoch < o.epochs:
            sampler.set_epoch(state.epoch)
            if sampler.processed == 0:
                state.seen = np.zeros(o.samples, dtype=np.int64)
            while sampler.remaining > 0:
                global_batch = min(o.global_batch, sampler.remaining)
                idx = torch.tensor(sampler.next_batch(global_batch), dtype=torch.int64, device=device)
                opt.zero_grad()
                # FSDP averages the gradients over the ranks: scale a sum to the global batch's mean.
                loss = ((model(x[idx]) - y[idx]) ** 2).sum() * erun.size() / global_batch
                loss.backward()
                opt.step()
                seen = state.seen.copy()
                for part in erun.allgather_object(idx.tolist()):
                    seen[part] += 1
                state.seen = seen
                sampler.record_batch(global_batch)
                state.step += 1
                if o.step_ms:
                    time.sleep(o.step_ms / 1000)
                state.commit()  # erun: each rank's shards, in host memory and on a buddy host
                if state.step == 10:
                    print(f"rank {erun.rank()} committed step 10", flush=True)
            if erun.rank() == 0:
                once = bool((state.seen == 1).all())
                print(f"epoch {state.epoch} world={erun.size()} exactly-once={'yes' if once else 'NO'}", flush=True)
            state.epoch += 1
            state.commit()

    train(state)
    full = {name: p.detach().full_tensor().cpu().numpy() for name, p in state.model.named_parameters()}
    if erun.rank() == 0:
        h = hashlib.sha256()
        for name in sorted(full):
            h.update(full[name].tobytes())
        print(f"done: {state.step} steps world {erun.size()} checksum={h.hexdigest()[:16]}", flush=True)
        if o.out:
            np.savez(o.out, **full)
    state.close()  # erun: the model, optimizer and mesh, then the process group


if __name__ == "__main__":
    main()
