"""An HF Accelerate program as one writes it for torchrun (or `accelerate
launch`): DDP on CPU, a small MLP on synthetic data, `save_state` at the end
of every epoch and `load_state` of the newest one at start. It runs unchanged
under erun's restart mode, which starts every worker with torchrun's
variables (Accelerate reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) and starts them all again after a failure; the new
workers resume from the last saved epoch instead of starting over.

    erun -np 2 --mode restart --reset-limit 3 \\
        python3 examples/torch/accelerate_restart.py --checkpoint-dir /tmp/acc-ckpt
    torchrun --standalone --nproc-per-node 2 examples/torch/accelerate_restart.py --checkpoint-dir /tmp/acc-ckpt2

Alone (`python3 accelerate_restart.py --checkpoint-dir DIR`) it trains on one
CPU process. The checkpoint directory must be shared by all hosts (every
rank writes its RNG state there and reads it at start). The main process
ends with a line `done: epoch E global_step S world W checksum=...
digest=...`, the sum and a hash of the trained parameters.
"""
import argparse
import hashlib
import os
import re
import shutil
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed


def synthetic_data(samples, features, seed):
    """A fixed regression problem: y = tanh(x W) v + noise, from `seed`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    w = torch.randn(features, 8, generator=g)
    v = torch.randn(8, 1, generator=g)
    y = torch.tanh(x @ w) @ v + 0.05 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


def last_checkpoint(directory):
    """(epoch, path) of the newest complete `epoch_N` directory, or (None, None)."""
    if not os.path.isdir(directory):
        return None, None
    done = [(int(m.group(1)), name) for name in os.listdir(directory) if (m := re.fullmatch(r"epoch_(\d+)", name))]
    if not done:
        return None, None
    epoch, name = max(done)
    return epoch, os.path.join(directory, name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32, help="per-process batch")
    ap.add_argument("--step-ms", type=int, default=0, help="sleep after every step")
    ap.add_argument("--seed", type=int, default=1234)
    o = ap.parse_args()

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(o.seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(synthetic_data(o.samples, 16, o.seed), batch_size=o.batch, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    start_epoch, step = 0, 0
    epoch, path = last_checkpoint(o.checkpoint_dir)
    if path is not None:
        accelerator.load_state(path)
        start_epoch, step = epoch + 1, (epoch + 1) * len(loader)
        print(f"rank {accelerator.process_index}/{accelerator.num_processes}: resumed from {path}", flush=True)
    print(f"rank {accelerator.process_index}/{accelerator.num_processes} pid {os.getpid()}: training from epoch "
          f"{start_epoch} global_step {step} (restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)})", flush=True)

    for epoch in range(start_epoch, o.epochs):
        model.train()
        loader.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            step += 1
            if o.step_ms:
                time.sleep(o.step_ms / 1000)
        print(f"rank {accelerator.process_index}/{accelerator.num_processes}: epoch {epoch} done, "
              f"global_step {step}", flush=True)
        # Every process writes its part into a temporary directory; the main process
        # renames it once all are done, so a crash never leaves a partial `epoch_N`.
        tmp = os.path.join(o.checkpoint_dir, f"epoch_{epoch}.tmp")
        accelerator.save_state(tmp)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            os.replace(tmp, os.path.join(o.checkpoint_dir, f"epoch_{epoch}"))
            shutil.rmtree(os.path.join(o.checkpoint_dir, f"epoch_{epoch - 2}"), ignore_errors=True)  # keep two
        accelerator.wait_for_everyone()

    flat = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]  # bit-exact comparisons
    accelerator.print(f"done: epoch {o.epochs} global_step {step} world {accelerator.num_processes} "
                      f"checksum={flat.double().sum().item():.6f} digest={digest}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
