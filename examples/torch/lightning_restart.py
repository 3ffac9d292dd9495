"""A PyTorch Lightning program as one writes it for torchrun: DDP on CPU, a
small MLP on synthetic data, a checkpoint at the end of every epoch and a
resume from the last one. It runs unchanged under erun's restart mode, which
starts every worker with torchrun's variables (Lightning's
TorchElasticEnvironment picks them up) and starts them all again after a
failure; the new workers resume from `last.ckpt` instead of starting over.

    erun -np 2 --mode restart --reset-limit 3 \\
        python3 examples/torch/lightning_restart.py --checkpoint-dir /tmp/pl-ckpt
    torchrun --standalone --nproc-per-node 2 examples/torch/lightning_restart.py --checkpoint-dir /tmp/pl-ckpt2

Alone (`python3 lightning_restart.py --checkpoint-dir DIR`) it trains on one
CPU process. The checkpoint directory must be shared by all hosts (rank 0
writes it, every rank reads it at start). Rank 0 ends with a line
`done: epoch E global_step S world W checksum=... digest=...`, the sum and a
hash of the trained parameters.
"""
import argparse
import hashlib
import os
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint


def synthetic_data(samples, features, seed):
    """A fixed regression problem: y = tanh(x W) v + noise, from `seed`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    w = torch.randn(features, 8, generator=g)
    v = torch.randn(8, 1, generator=g)
    y = torch.tanh(x @ w) @ v + 0.05 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


class Regressor(pl.LightningModule):
    def __init__(self, features=16, hidden=32, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)

    def on_train_start(self):
        # After a resume, Lightning has restored the epoch and step from the checkpoint here.
        print(f"rank {self.global_rank}/{self.trainer.world_size} pid {os.getpid()}: training from epoch "
              f"{self.current_epoch} global_step {self.global_step} "
              f"(restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)})", flush=True)

    def on_train_epoch_end(self):
        print(f"rank {self.global_rank}/{self.trainer.world_size}: epoch {self.current_epoch} done, "
              f"global_step {self.global_step}", flush=True)


class Pace(Callback):
    """Sleeps after every step, to watch (or interrupt) the run."""

    def __init__(self, step_ms):
        self.step_ms = step_ms

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.step_ms:
            time.sleep(self.step_ms / 1000)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32, help="per-process batch")
    ap.add_argument("--step-ms", type=int, default=0, help="sleep after every step")
    ap.add_argument("--seed", type=int, default=1234)
    o = ap.parse_args()

    # As for torchrun: devices per node and nodes from the launcher's variables.
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    nodes = int(os.environ.get("WORLD_SIZE", 1)) // local_world

    pl.seed_everything(o.seed, workers=True, verbose=False)
    model = Regressor()
    loader = DataLoader(synthetic_data(o.samples, 16, o.seed), batch_size=o.batch, shuffle=True)
    checkpoint = ModelCheckpoint(dirpath=o.checkpoint_dir, every_n_epochs=1, save_last=True, save_top_k=1)
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="ddp" if local_world * nodes > 1 else "auto",
        devices=local_world,
        num_nodes=nodes,
        max_epochs=o.epochs,
        callbacks=[checkpoint, Pace(o.step_ms)],
        default_root_dir=o.checkpoint_dir,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    # "last": `last.ckpt` in the checkpoint directory when there is one, else a fresh start.
    trainer.fit(model, loader, ckpt_path="last")

    if trainer.is_global_zero:
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]  # bit-exact comparisons
        print(f"done: epoch {trainer.current_epoch} global_step {trainer.global_step} world {trainer.world_size} "
              f"checksum={flat.double().sum().item():.6f} digest={digest}", flush=True)


if __name__ == "__main__":
    main()
