"""An elastic PyTorch program written to Horovod's documented API: the only
line that differs from a Horovod program is the import. hvd.elastic.TorchState
holds the float64 model, the optimizer (DistributedOptimizer with
named_parameters), an hvd.elastic.ElasticSampler and counters; a reset
callback scales the learning rate to the world size; every batch is
committed.

Test instrumentation beside it: the state also keeps the world size of every
committed step (`schedule`) and a fingerprint of the samples each epoch
trained (an hvd.allreduce of a metric, op=hvd.Sum), so rank 0 can say whether
every sample was trained exactly once, and prints the schedule and the final
parameters. `--replay FILE` runs the same schedule alone (one process, the
global batch of each step at once): the run it must match.

    horovod_elastic.py [--epochs 4] [--samples 144] [--batch 6] [--step-ms 0] [--out FILE] [--replay FILE]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import erun.horovod.torch as hvd

LR = 0.05


def mix(i):
    """A 64-bit mix of a sample index, folded to 52 bits (exact in a float64 sum)."""
    z = (i + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) >> 30


def data(samples):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(samples, 8, generator=g, dtype=torch.float64)
    y = (x[:, :1] * x[:, 1:2]).tanh() + 0.1 * x[:, 2:3]
    return torch.utils.data.TensorDataset(x, y, torch.arange(samples))


def make_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()


def finish(model, schedule, out):
    if hvd.rank() == 0:
        params = [p.detach().reshape(-1).tolist() for p in model.parameters()]
        text = json.dumps({"schedule": schedule, "params": params})
        if out:
            with open(out + ".tmp", "w") as f:
                f.write(text)
            os.replace(out + ".tmp", out)
        print(f"final steps={len(schedule)} sizes={sorted(set(schedule))}", flush=True)


def replay(o, dataset):
    """One process, the schedule's steps: each step's global batch at once, its lr scaled."""
    schedule = json.load(open(o.replay))["schedule"]
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=13)
    step = 0
    for epoch in range(o.epochs):
        sampler.set_epoch(epoch)
        order = list(sampler)
        begin = 0
        while begin < len(order):
            size = schedule[step]
            idx = order[begin:begin + o.batch * size]
            x, y, _ = dataset[idx]
            for g in opt.param_groups:
                g["lr"] = LR * size
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            begin += len(idx)
            step += 1
    assert step == len(schedule), (step, len(schedule))
    finish(model, schedule, o.out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--samples", type=int, default=144)
    ap.add_argument("--batch", type=int, default=6, help="per-rank batch")
    ap.add_argument("--step-ms", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--replay", default="")
    o = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    dataset = data(o.samples)
    if o.replay:
        return replay(o, dataset)

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    train_sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=13)
    train_loader = torch.utils.data.DataLoader(dataset, batch_size=o.batch, sampler=train_sampler)

    def on_state_reset():
        for param_group in optimizer.param_groups:
            param_group["lr"] = LR * hvd.size()
        print(f"pid {os.getpid()}: reset: world size {hvd.size()} lr {LR * hvd.size():g}", flush=True)

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, train_sampler=train_sampler, epoch=0,
                                   schedule=[], seen=0, fingerprint=0)
    state.register_reset_callbacks([on_state_reset])
    print(f"pid {os.getpid()} rank {hvd.rank()} started", flush=True)

    def train_batch(state, batch_idx, x, y, idx):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        mine = torch.tensor([float(len(idx)), float(sum(mix(int(i)) for i in idx))], dtype=torch.float64)
        total = hvd.allreduce(mine, op=hvd.Sum, name="samples")
        state.seen += int(total[0])
        state.fingerprint += int(total[1])
        state.schedule.append(hvd.size())
        state.train_sampler.record_batch(batch_idx, o.batch)
        if o.step_ms:
            time.sleep(o.step_ms / 1000)
        state.commit()

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, o.epochs):
            state.train_sampler.set_epoch(state.epoch)
            if state.train_sampler.processed == 0:
                state.seen, state.fingerprint = 0, 0
            for batch_idx, (x, y, idx) in enumerate(train_loader):
                try:
                    train_batch(state, batch_idx, x, y, idx)
                except hvd.HorovodInternalError as e:  # user code that catches Horovod's exceptions still works
                    print(f"pid {os.getpid()}: caught HorovodInternalError ({type(e).__name__})", flush=True)
                    raise
                except hvd.HostsUpdatedInterrupt:
                    print(f"pid {os.getpid()}: caught HostsUpdatedInterrupt", flush=True)
                    raise
            if hvd.rank() == 0:
                ok = state.seen == o.samples and state.fingerprint == sum(mix(i) for i in range(o.samples))
                print(f"epoch {state.epoch} world={hvd.size()} samples={state.seen} "
                      f"exactly-once={'yes' if ok else 'NO'}", flush=True)

    train(state)
    finish(model, state.schedule, o.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
