"""A torch MLP trained elastically with exact gradient sums: each sample's
gradient (autograd, one sample at a time) is rounded to a fixed point of 2^-32
and summed as int64, so the allreduced gradient of a global batch does not
depend on how the batch was split among ranks. A run on any world size, or
one that grows, shrinks and loses workers mid-epoch, ends at bit-identical
parameters and prints the same checksum. Prints, per epoch, whether every
sample was processed exactly once; survivors print their pid at every reset.

With --device cuda the model, its optimizer state, the data and the summed
gradients live on the GPU (local rank modulo the visible devices): TorchState
commits and restores CUDA tensors, and the int64 sums go through erun's GPU
collectives (NCCL in a world of one, the host-staged path for ranks sharing a
GPU). Such a run ends at the checksum of an uninterrupted CUDA run (cuBLAS in
its deterministic mode), not a CPU run's.

    train_exact.py [--epochs 4] [--samples 1024] [--batch 16] [--step-ms 0] [--device cpu|cuda] [--startup-s 0]
"""
import argparse
import hashlib
import os
import sys
import time

import torch

import erun
import erun.torch

SCALE = 2.0 ** 32


def mix(i):
    """A 64-bit mix of a sample index (as in examples/train_mlp.cc), as int64."""
    z = (i + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return z - (1 << 64) if z >= 1 << 63 else z


def wrap64(v):
    v &= 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >= 1 << 63 else v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16, help="per-rank batch at world size 1 = global batch")
    ap.add_argument("--step-ms", type=int, default=0)
    ap.add_argument("--fail-at-step", type=int, default=-1, help="raise ValueError at this step (a user error)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--startup-s", type=float, default=0,
                    help="seconds spent before erun.init(), as CUDA and data loading would")
    o = ap.parse_args()
    torch.set_num_threads(1)
    time.sleep(o.startup_s)
    erun.init()
    device = torch.device("cpu")
    if o.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
        torch.use_deterministic_algorithms(True, warn_only=True)
        device = torch.device(f"cuda:{erun.local_rank() % torch.cuda.device_count()}")
        torch.cuda.set_device(device)
        print(f"pid {os.getpid()} rank {erun.rank()} device {device}", flush=True)

    g = torch.Generator().manual_seed(7)
    x = torch.randn(o.samples, 8, generator=g)
    y = (x[:, 0] * x[:, 1] > 0).long() + 2 * (x[:, 2] > 0).long()
    x, y = x.to(device), y.to(device)
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # The global batch is fixed: the sampler's per-rank batch follows the world size.
    sampler = erun.torch.ElasticSampler(o.samples, batch_size=1, seed=11)
    full = wrap64(sum(mix(i) for i in range(o.samples)))
    state = erun.torch.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=0, step=0, seen=0,
                                  fingerprint=0)

    @state.on_reset
    def _(old, new):
        print(f"pid {os.getpid()}: reset: world size {old} -> {new} (generation {erun.generation()})", flush=True)

    print(f"pid {os.getpid()} rank {erun.rank()} started", flush=True)
    params = list(model.parameters())

    @erun.run
    def train(state):
        while state.epoch < o.epochs:
            sampler.set_epoch(state.epoch)
            if sampler.processed == 0:
                state.seen, state.fingerprint = 0, 0
            while sampler.remaining > 0:
                if state.step == o.fail_at_step:
                    raise ValueError(f"user error at step {state.step}")
                global_batch = min(o.batch, sampler.remaining)
                mine = sampler.next_batch(global_batch)
                acc = [torch.zeros(p.shape, dtype=torch.int64, device=device) for p in params]
                seen = torch.zeros(2, dtype=torch.int64)
                for i in mine:
                    model.zero_grad()
                    torch.nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
                    for a, p in zip(acc, params):
                        a += torch.round(p.grad.double() * SCALE).long()
                    seen[0] += 1
                    seen[1] = wrap64(int(seen[1]) + mix(i))
                flat = torch.cat([a.reshape(-1) for a in acc] + [seen.to(device)])
                erun.allreduce_(flat, op=erun.Sum)
                off = 0
                for p in params:
                    p.grad = (flat[off:off + p.numel()].double() / (SCALE * global_batch)).float().view_as(p)
                    off += p.numel()
                opt.step()
                state.seen += int(flat[off])
                state.fingerprint = wrap64(state.fingerprint + int(flat[off + 1]))
                sampler.record_batch(global_batch)
                state.step += 1
                if o.step_ms:
                    time.sleep(o.step_ms / 1000)
                if state.step % 4 == 0:
                    state.commit()
            if erun.rank() == 0:
                ok = state.seen == o.samples and state.fingerprint == full
                print(f"epoch {state.epoch} step={state.step} world={erun.size()} samples={state.seen} "
                      f"exactly-once={'yes' if ok else 'NO'}", flush=True)
            state.epoch += 1
            state.commit()

    train(state)
    if erun.rank() == 0:
        h = hashlib.sha256()
        for p in params:
            h.update(p.detach().cpu().numpy().tobytes())
        print(f"final checksum={h.hexdigest()[:16]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
