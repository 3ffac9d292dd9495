"""The ToyModel DDP script of PyTorch's torchrun tutorial, made elastic in
place with erun: survivors keep their process when a worker dies or the host
list changes; they roll back to the last commit, get a new process group and
carry on. The changes from the torchrun version are marked `# erun`.

    echo localhost:2 > hosts.txt
    ERUN_HOSTS_FILE=hosts.txt erun --min-np 1 --max-np 4 --launcher local \\
        --host-discovery-script scripts/discover_hosts.sh /usr/bin/python3 examples/torch/elastic_ddp.py

Edit hosts.txt while it runs (`localhost:4` grows it, `localhost:1` shrinks
it) or kill a worker with SIGKILL. It also runs under torchrun-free mpirun, or
alone (`python3 elastic_ddp.py`, a world of one).
"""
import argparse
import os
import time

import torch
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

import erun  # erun
import erun.torch  # erun


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--step-ms", type=int, default=20, help="sleep per step, to watch it")
    o = ap.parse_args()
    erun.init()  # erun: instead of dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = ToyModel()
    optimizer = optim.SGD(model.parameters(), lr=0.001)
    state = erun.torch.TorchState(model=model, optimizer=optimizer, step=0)  # erun

    @state.on_reset
    def report(old_size, new_size):
        print(f"[pid {os.getpid()}] world size {old_size} -> {new_size} at step {state.step}", flush=True)

    @erun.run  # erun: the loop survives failures and resizes
    def train(state):
        ddp_model = DDP(model, process_group=erun.torch.process_group())  # erun: this generation's group
        loss_fn = nn.MSELoss()
        while state.step < o.steps:
            optimizer.zero_grad()
            outputs = ddp_model(torch.randn(20, 10))
            labels = torch.randn(20, 5)
            loss_fn(outputs, labels).backward()
            optimizer.step()
            state.step += 1
            if state.step % 10 == 0:
                state.commit()  # erun: a point to roll back to; membership changes happen here
            if state.step % 200 == 0 and erun.rank() == 0:
                print(f"step {state.step} world {erun.size()} loss {loss_fn(outputs, labels).item():.4f}", flush=True)
            time.sleep(o.step_ms / 1000)

    train(state)
    erun.torch.destroy_process_group()
    if erun.rank() == 0:
        print(f"done: {state.step} steps", flush=True)


if __name__ == "__main__":
    main()
