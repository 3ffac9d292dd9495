"""DistributedDataParallel trained in place under erun: the process group of
each generation comes from erun.torch.process_group() and DDP is re-wrapped
in the erun.run function, so a SIGKILL or a grow is recovered without
restarting the survivors. Each epoch's sample count and fingerprint are
summed with torch.distributed itself; rank 0 prints whether every sample
was processed exactly once, and every rank prints a parameter checksum at
the end (equal on all ranks).

With --grads hooks, DDP is left out and the gradients are averaged by
erun.torch.DistributedOptimizer(overlap=True) instead (GradientHooks, in
several buckets, during backward); the group still counts the samples.

With --device cuda the model and the data live on the GPU (local rank modulo
the visible devices): DDP reduces CUDA buckets over the Gloo group, or the
hooks reduce CUDA gradients through erun's GPU collectives (the host-staged
path where ranks share a GPU), and TorchState commits CUDA tensors.

    ddp_train.py [--epochs 4] [--samples 1024] [--batch 8] [--step-ms 0] [--fail-at-step N]
                 [--grads ddp|hooks] [--device cpu|cuda]
"""
import argparse
import hashlib
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import erun
import erun.torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8, help="per-rank batch")
    ap.add_argument("--step-ms", type=int, default=0)
    ap.add_argument("--fail-at-step", type=int, default=-1, help="raise ValueError at this step (a user error)")
    ap.add_argument("--grads", choices=["ddp", "hooks"], default="ddp",
                    help="who averages the gradients: DDP, or erun's DistributedOptimizer(overlap=True)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    o = ap.parse_args()
    torch.set_num_threads(1)
    erun.init()
    device = torch.device("cpu")
    if o.device == "cuda":
        device = torch.device(f"cuda:{erun.local_rank() % torch.cuda.device_count()}")
        torch.cuda.set_device(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(o.samples, 10, generator=g)
    y = (x.sum(1) > 0).long()
    x, y = x.to(device), y.to(device)
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if o.grads == "hooks":
        opt = erun.torch.DistributedOptimizer(opt, bucket_bytes=256, overlap=True)
        hooks = opt.hooks
        assert hooks is not None and hooks.num_buckets > 2, hooks
    sampler = erun.torch.ElasticSampler(o.samples, batch_size=o.batch, seed=4)
    keys = torch.randint(0, 1 << 40, (o.samples,), generator=g)
    full = int(keys.sum())
    state = erun.torch.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=0, seen=0, fingerprint=0,
                                  step=0)

    @state.on_reset
    def _(old, new):
        print(f"pid {os.getpid()}: reset: world size {old} -> {new}", flush=True)

    print(f"pid {os.getpid()} rank {erun.rank()} started", flush=True)

    @erun.run
    def train(state):
        pg = erun.torch.process_group(timeout=timedelta(seconds=10))
        ids = [device] if device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids, process_group=pg) if o.grads == "ddp" else model
        print(f"pid {os.getpid()}: ddp rank {dist.get_rank()} of {dist.get_world_size()} "
              f"(generation {erun.generation()}, gradients by {o.grads}, on {device})", flush=True)
        while state.epoch < o.epochs:
            sampler.set_epoch(state.epoch)
            if sampler.processed == 0:
                state.seen, state.fingerprint = 0, 0
            while sampler.remaining > 0:
                if state.step == o.fail_at_step:  # with the group up
                    raise ValueError(f"user error at step {state.step}")
                state.step += 1
                global_batch = min(o.batch * erun.size(), sampler.remaining)
                idx = torch.tensor(sampler.next_batch(global_batch), dtype=torch.int64)
                opt.zero_grad()
                on = idx.to(device)
                out = ddp(x[on])
                # DDP (or the hooks) average over ranks: scale a sum so the step is the global batch's mean.
                loss = torch.nn.functional.cross_entropy(out, y[on], reduction="sum") * erun.size() / global_batch
                loss.backward()
                if o.grads == "hooks":  # backward launched every bucket
                    assert hooks.launched == hooks.num_buckets, (hooks.launched, hooks.num_buckets)
                opt.step()
                counts = torch.tensor([len(idx), int(keys[idx].sum())], dtype=torch.int64)
                dist.all_reduce(counts)
                state.seen += int(counts[0])
                state.fingerprint += int(counts[1])
                sampler.record_batch(global_batch)
                if o.step_ms:
                    time.sleep(o.step_ms / 1000)
                state.commit()
            if erun.rank() == 0:
                ok = state.seen == o.samples and state.fingerprint == full
                print(f"epoch {state.epoch} world={erun.size()} samples={state.seen} "
                      f"exactly-once={'yes' if ok else 'NO'}", flush=True)
            state.epoch += 1
            state.commit()

    train(state)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    print(f"rank {erun.rank()} checksum={h.hexdigest()[:16]}", flush=True)
    erun.torch.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
