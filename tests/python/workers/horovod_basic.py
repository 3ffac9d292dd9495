"""The same non-elastic data-parallel program twice: written to Horovod's API
(`--api hvd`: erun.horovod.torch) and to erun's (`--api erun`: erun and
erun.torch). Each rank starts from a different model and optimizer state,
which the root's broadcast replaces; then a few DistributedOptimizer steps, a
metric averaged with allreduce (also async), an allgather, a grouped
allreduce, broadcast_object and allgather_object. Rank 0 prints the results
as one JSON line; the two APIs must print the same.

    horovod_basic.py --api hvd|erun
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True).sin()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", choices=["hvd", "erun"], required=True)
    o = ap.parse_args()
    torch.set_num_threads(1)
    if o.api == "hvd":
        import erun.horovod.torch as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    else:
        import erun
        import erun.torch
        erun.init()
        rank, size = erun.rank(), erun.size()

    torch.manual_seed(rank + 1)  # every rank starts elsewhere: the broadcast must fix it
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1)).double()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = batch(rank, -1)
    F.mse_loss(model(x), y).backward()
    opt.step()  # an Adam state of its own on every rank
    opt.zero_grad()

    if o.api == "hvd":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    else:
        for t in model.state_dict().values():
            erun.broadcast_(t, 0)
        state = erun.broadcast_object(opt.state_dict(), 0)
        if rank != 0:
            opt.load_state_dict(state)
        opt = erun.torch.DistributedOptimizer(opt, overlap=True)

    losses, async_losses = [], []
    for step in range(6):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if o.api == "hvd":
            losses.append(hvd.allreduce(loss.detach(), name="loss").item())
            handle = hvd.allreduce_async(loss.detach() * 2, op=hvd.Sum, name="loss2")
            async_losses.append(hvd.synchronize(handle).item())
        else:
            losses.append(erun.allreduce(loss.detach()).item())
            async_losses.append(erun.allreduce(loss.detach() * 2, op=erun.Sum).item())

    mine = torch.arange(rank + 1, dtype=torch.float64) + 10 * rank  # a first dimension that differs by rank
    pair = [torch.full((2,), float(rank)), torch.full((3,), 2.0 * rank)]
    if o.api == "hvd":
        gathered = hvd.allgather(mine)
        grouped = hvd.grouped_allreduce(pair, op=hvd.Max)
        obj = hvd.broadcast_object({"from": rank, "size": size}, root_rank=size - 1)
        objs = hvd.allgather_object(rank * 2)
        last = hvd.join()
        assert 0 <= last < size, last
    else:
        gathered = erun.allgather(mine)
        grouped = [erun.allreduce(t, op=erun.Max) for t in pair]
        obj = erun.broadcast_object({"from": rank, "size": size}, root=size - 1)
        objs = erun.allgather_object(rank * 2)
        erun.barrier()
    if rank == 0:
        params = [p.detach().reshape(-1).tolist() for p in model.parameters()]
        print("RESULT " + json.dumps({"params": params, "losses": losses, "async": async_losses,
                                      "gathered": gathered.tolist(), "grouped": [t.tolist() for t in grouped],
                                      "obj": obj, "objs": objs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
