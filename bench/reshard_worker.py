"""bench/reshard.py's programs. `erun` mode: one sharded float32 entry of
--mib MiB in all (rows of 4 KiB, torch.chunk's split), registered with
erun.State.register_shard and committed every --commit-every steps of
--step-ms; each rank prints the wall time at which it trains again after a
reset. `dcp-save` / `dcp-load` modes (under torchrun, gloo on the CPU): the
same rows as a DTensor sharded Shard(0) over the world, written with
torch.distributed.checkpoint.save to --dir, and read back with resharding
into the world of the load (as torchtitan resumes), each timed between
barriers."""
import argparse
import os
import threading
import time

import numpy as np

ROW = 1024  # float32 per row: 4 KiB


def rss_kib():
    """(RssAnon, RssShmem) of this process, KiB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            fields[k] = v
    return int(fields["RssAnon"].split()[0]), int(fields.get("RssShmem", "0 kB").split()[0])


class PeakRss:
    """The highest RssAnon seen since the last take(), sampled every 2 ms."""

    def __init__(self):
        self.peak = 0
        self.lock = threading.Lock()
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            anon, _ = rss_kib()
            with self.lock:
                self.peak = max(self.peak, anon)
            time.sleep(0.002)

    def take(self):
        with self.lock:
            p, self.peak = self.peak, rss_kib()[0]
        return p


def erun_mode(o):
    import erun
    erun.init()
    rows = o.mib * 1024 * 1024 // (ROW * 4)
    b, e = erun.shard_rows(rows, erun.rank(), erun.size())
    base = rss_kib()[0]  # before the piece
    peak = PeakRss()
    held = {"w": np.full((e - b, ROW), float(erun.rank()), dtype=np.float32)}
    state = erun.State(step=0)
    state.register_shard("w", rows, lambda: held["w"], lambda x: held.__setitem__("w", x))
    before = {"kib": held["w"].nbytes // 1024}

    @state.on_reset
    def reset(old, new):
        now = held["w"].nbytes // 1024
        print(f"rank {erun.rank()}: reset {old} -> {new} at={time.time():.6f} peak anon above the start "
              f"{(peak.take() - base) / 1024:.1f} MiB; old piece {before['kib'] / 1024:.1f} MiB, new piece "
              f"{now / 1024:.1f} MiB", flush=True)
        before["kib"] = now

    steps, commits = [], []  # seconds a step took (its commit included), and its commit alone

    @erun.run
    def train(state):
        if state.commit_id == 0:
            state.commit()
            print(f"rank {erun.rank()} ready", flush=True)
        while state.step < o.steps:
            t0 = time.perf_counter()
            time.sleep(o.step_ms / 1000)
            erun.barrier()
            state.step += 1
            if state.step % o.commit_every == 0:
                c0 = time.perf_counter()
                state.commit()
                commits.append(time.perf_counter() - c0)
            steps.append(time.perf_counter() - t0)

    train(state)
    if o.timing and erun.rank() == 0:
        # The first commit interval aside: the first commit of each file
        # allocates its pages.
        skip = 2 * o.commit_every
        s, c = sorted(steps[skip:]), sorted(commits[2:])
        print(f"timing: {len(s)} steps, mean step {1e3 * sum(s) / len(s):.2f} ms, median step "
              f"{1e3 * s[len(s) // 2]:.2f} ms; {len(c)} commits, median commit {1e3 * c[len(c) // 2]:.2f} ms, "
              f"slowest {1e3 * c[-1]:.2f} ms", flush=True)


def dcp_mode(o, load):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    start = time.time()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (size,))
    rows = o.mib * 1024 * 1024 // (ROW * 4)
    each = (rows + size - 1) // size
    b, e = min(rows, rank * each), min(rows, (rank + 1) * each)
    local = torch.full((e - b, ROW), float(rank), dtype=torch.float32)
    dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size([rows, ROW]),
                            stride=(ROW, 1))
    dist.barrier()
    t0 = time.time()
    if load:
        dcp.load({"w": dt}, checkpoint_id=o.dir)
    else:
        dcp.save({"w": dt}, checkpoint_id=o.dir)
    dist.barrier()
    t1 = time.time()
    if rank == 0:
        print(f"dcp {'load' if load else 'save'} {size} ranks: {t1 - t0:.3f} s; started at {start:.6f} "
              f"done at {t1:.6f}", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["erun", "dcp-save", "dcp-load"])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--step-ms", type=int, default=50)
    ap.add_argument("--commit-every", type=int, default=10)
    ap.add_argument("--dir", default="")
    ap.add_argument("--timing", action="store_true", help="rank 0 prints its step and commit times at the end")
    o = ap.parse_args()
    if o.mode == "erun":
        erun_mode(o)
    else:
        dcp_mode(o, o.mode == "dcp-load")


if __name__ == "__main__":
    main()
