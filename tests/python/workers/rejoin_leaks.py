"""A worker that re-joins many times in one process (driven by
tests/python/test_rejoin_leaks.py): every generation builds its gloo group
with erun.torch.process_group(), wraps DistributedDataParallel over it and
trains with TorchState commits until the membership changes (a peer killed,
a host removed or added), as docs/python.md recommends. At every entry of
the erun.run function (its first, then one per re-join), once the
generation's group is up and one DDP step and one commit went through, it
prints

    pid P: rejoin K size S generation G fds F threads T rss_kb R ddp D excepthooks E

with the process's open fds (/proc/self/fd), threads (/proc/self/task),
resident memory (VmRSS of /proc/self/status, after gc.collect()), how many
DistributedDataParallel objects are alive (1: this generation's) and how
many sys.excepthook wrappers of torch.distributed are alive (torch >= 2.2
adds one at every init_process_group(); erun.torch keeps the hook as it
was, so 0). Python warnings are all shown (not once each) and printed to
stdout as `pid P: warning: ...` (one at the start on purpose, to show that
they are). It ends, alone (world size 1), once the file given by --stop
exists, printing `pid P: done ...; sys.excepthook unchanged` when the hook
is still the one erun.init() set.

    rejoin_leaks.py --stop PATH [--step-ms 20]
"""
import argparse
import gc
import os
import sys
import time
import types
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import erun
import erun.torch

PID = os.getpid()


def usage():
    """(open fds, threads, VmRSS in kB) of this process."""
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    fds = len(os.listdir("/proc/self/fd")) - 1  # minus listdir's own
    threads = len(os.listdir("/proc/self/task"))
    return fds, threads, rss


def live_objects():
    """(DistributedDataParallel objects, torch.distributed's sys.excepthook wrappers) alive. type(), not
    isinstance(): DDP is an ABC (Joinable), whose instance check reads __class__ of every object,
    torch.distributed's deprecated reduce_op too, which warns."""
    wrapped = hooks = 0
    for obj in gc.get_objects():
        if type(obj) is DDP:
            wrapped += 1
        elif type(obj) is types.FunctionType and obj.__name__ == "_distributed_excepthook":
            hooks += 1
    return wrapped, hooks


def show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"pid {PID}: warning: {category.__name__}: {message} ({filename}:{lineno})", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stop", required=True, help="end (alone) once this file exists")
    ap.add_argument("--step-ms", type=int, default=20)
    o = ap.parse_args()
    warnings.simplefilter("always")
    warnings.showwarning = show_warning
    warnings.warn("rejoin_leaks: warnings are shown")  # the test checks that this one is the only one
    torch.set_num_threads(1)
    erun.init()
    excepthook = sys.excepthook  # erun's (it ends the process after a fatal error)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = erun.torch.TorchState(model=model, optimizer=opt, step=0)
    entries = [0]

    def step(ddp):
        x = torch.randn(8, 16)
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        t = torch.ones(1)
        dist.all_reduce(t)  # the generation's gloo group, directly too
        assert int(t) == erun.size(), (int(t), erun.size())
        state.step += 1

    @erun.run
    def train(state):
        pg = erun.torch.process_group(timeout=timedelta(seconds=10))
        ddp = DDP(model, process_group=pg)
        k = entries[0]
        entries[0] += 1
        step(ddp)
        state.commit()
        gc.collect()
        fds, threads, rss = usage()
        wrapped, hooks = live_objects()
        print(f"pid {PID}: rejoin {k} size {erun.size()} generation {erun.generation()} fds {fds} "
              f"threads {threads} rss_kb {rss} ddp {wrapped} excepthooks {hooks}", flush=True)
        while not (erun.size() == 1 and os.path.exists(o.stop)):
            step(ddp)
            time.sleep(o.step_ms / 1000)
            state.commit()  # HostsUpdated here when a worker comes or goes

    train(state)
    erun.torch.destroy_process_group()
    fds, threads, rss = usage()
    hook = "unchanged" if sys.excepthook is excepthook else f"changed to {sys.excepthook!r}"
    print(f"pid {PID}: done after {entries[0] - 1} re-joins, {state.step} steps; fds {fds} threads {threads} "
          f"rss_kb {rss}; sys.excepthook {hook}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
