"""Recovery and scale-up peer for torchrun: the torch.distributed twin of
bench/step_worker.cc. Each step sleeps --step-ms, sum-allreduces --floats
floats over Gloo and prints, with a CLOCK_REALTIME timestamp,
    STEP pid=P host=H rank=R size=S gen=RESTART_COUNT step=N t=SECONDS
Rank 0 checkpoints the global step at the end of every epoch (temp file,
fsync, rename); every (re)start resumes from it, as torchrun's elastic
examples do. H is $BENCH_AGENT (which torchrun agent started the worker).
"""
import argparse
import datetime
import os
import time

print(f"START pid={os.getpid()} rank={os.environ.get('RANK')} "
      f"restart={os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')} t={time.time():.6f}", flush=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--checkpoint", required=True)
p.add_argument("--steps-per-epoch", type=int, default=10)
p.add_argument("--epochs", type=int, default=100000)
p.add_argument("--step-ms", type=int, default=50)
p.add_argument("--floats", type=int, default=1024)
p.add_argument("--pg-timeout", type=float, default=1800)
a = p.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.pg_timeout))
rank, size = dist.get_rank(), dist.get_world_size()
gen = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
host = os.environ.get("BENCH_AGENT", "local")
path = os.path.join(a.checkpoint, "ckpt")
step = 0
if os.path.exists(path):
    with open(path) as f:
        step = int(f.read().strip() or 0)
grad = torch.ones(a.floats)
while step < a.epochs * a.steps_per_epoch:
    time.sleep(a.step_ms / 1000.0)
    grad.fill_(1.0)
    dist.all_reduce(grad)
    step += 1
    if step % a.steps_per_epoch == 0 and rank == 0:
        os.makedirs(a.checkpoint, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(str(step))
            f.flush()
            os.fsync(f.fileno())
        os.rename(path + ".tmp", path)
    print(f"STEP pid={os.getpid()} host={host} rank={rank} size={size} gen={gen} step={step} t={time.time():.6f}",
          flush=True)
dist.destroy_process_group()
