"""An MNIST-sized classifier (28x28 images, 10 classes, a small CNN) trained
elastically in place with erun on synthetic data: each class is a random
28x28 template, each sample its class's template plus noise, generated
identically on every rank from --seed (no download). Shows the pieces of
erun.torch together: TorchState (model, Adam state, sampler, epoch),
ElasticSampler with a DataLoader with worker processes, DistributedOptimizer
(gradients averaged through erun), and a reset callback that scales the
learning rate with the world size (it runs after the state is synced, so
the new rate is kept).

    echo localhost:2 > hosts.txt
    ERUN_HOSTS_FILE=hosts.txt erun --min-np 1 --max-np 4 --launcher local \\
        --host-discovery-script scripts/discover_hosts.sh /usr/bin/python3 examples/torch/mnist_synthetic.py

Edit hosts.txt while it runs to grow or shrink the job; kill a worker to see
in-place recovery. Runs alone as `python3 mnist_synthetic.py` too.
"""
import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import erun
import erun.torch


def synthetic_mnist(n, seed):
    g = torch.Generator().manual_seed(seed)
    templates = torch.rand(10, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = templates[labels] + 2.0 * torch.randn(n, 1, 28, 28, generator=g)
    return TensorDataset(images, labels)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, stride=2)
        self.conv2 = nn.Conv2d(16, 32, 5, stride=2)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--samples", type=int, default=12000)
    ap.add_argument("--batch", type=int, default=64, help="per-rank batch")
    ap.add_argument("--lr", type=float, default=1e-3, help="learning rate at world size 1")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-ms", type=int, default=0, help="sleep per step, to watch it")
    o = ap.parse_args()
    torch.set_num_threads(1)
    erun.init()
    data = synthetic_mnist(o.samples, o.seed)
    torch.manual_seed(o.seed)
    model = Net()
    base_opt = torch.optim.Adam(model.parameters(), lr=o.lr * erun.size())
    optimizer = erun.torch.DistributedOptimizer(base_opt)
    sampler = erun.torch.ElasticSampler(data, batch_size=o.batch, seed=o.seed)
    state = erun.torch.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)

    @state.on_reset
    def rescale(old_size, new_size):
        for group in base_opt.param_groups:
            group["lr"] = group["lr"] * new_size / old_size
        print(f"[pid {os.getpid()}] world size {old_size} -> {new_size}: lr {base_opt.param_groups[0]['lr']:.2e}",
              flush=True)

    @erun.run
    def train(state):
        while state.epoch < o.epochs:
            sampler.set_epoch(state.epoch)
            loader = DataLoader(data, batch_size=o.batch, sampler=sampler, num_workers=o.workers)
            t0, steps = time.time(), 0
            for batch in sampler.batches(loader):
                optimizer.zero_grad()
                if batch is not None:  # None: this rank has no sample in the epoch's last step
                    images, labels = batch
                    F.cross_entropy(model(images), labels, reduction="sum").div(o.batch).backward()
                optimizer.step()  # averages the gradients of all ranks first
                sampler.record_batch()
                steps += 1
                if steps % 20 == 0:
                    state.commit()
                time.sleep(o.step_ms / 1000)
            correct = torch.zeros(2, dtype=torch.int64)
            with torch.no_grad():
                for k in range(erun.rank() * 4096, len(data), 4096 * erun.size()):
                    images, labels = data[k:k + 4096]
                    correct += torch.tensor([(model(images).argmax(1) == labels).sum(), len(labels)])
            erun.allreduce_(correct, op=erun.Sum)
            if erun.rank() == 0:
                print(f"epoch {state.epoch}: world {erun.size()} accuracy {correct[0] / correct[1]:.3f} "
                      f"({steps} steps, {time.time() - t0:.1f} s)", flush=True)
            state.epoch += 1
            state.commit()

    train(state)


if __name__ == "__main__":
    main()
