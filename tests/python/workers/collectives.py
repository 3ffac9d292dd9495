"""Every collective of the erun package on every dtype and op, checked on
every rank against a serial reference over all ranks' inputs. Rank r's
element i is a small value, so sums and products are exact in every type.
With --device cuda the torch tensors live on the GPU (this rank's device:
local rank modulo the visible devices), through erun's GPU collectives on
torch's current stream, and DistributedOptimizer averages CUDA gradients.
Every erun.ReduceOp member goes through allreduce, every dtype maps onto
the erun.DataType of its name; GradientHooks and erun.torch.ProcessGroup are
used as context managers too. Prints `collectives ok rank R checks N` (with
`device cuda:D backend B` on the GPU) or raises."""
import argparse
import sys
from datetime import timedelta

import numpy as np
import torch

import erun
import erun.torch

N = 1031  # odd, > one SIMD block, < one page of float64


def inputs(rank, dtype):
    i = np.arange(N)
    if dtype == "uint8":
        return ((rank * 37 + i * 13) % 251).astype(np.int64)
    if dtype in ("int32", "int64"):
        return ((rank * 7 + i) % 11 - 5).astype(np.int64)
    return 0.5 * ((rank * 7 + i) % 5 + 1) * np.where((i + rank) % 3 == 0, -1.0, 1.0)


def reference(size, dtype, op):
    xs = np.stack([inputs(r, dtype) for r in range(size)])
    if op in ("sum", "average"):
        acc = xs.sum(0)
    elif op == "product":
        acc = xs.prod(0)
    elif op == "min":
        acc = xs.min(0)
    else:
        acc = xs.max(0)
    if dtype == "uint8":
        acc = acc % 256
    if op == "average":
        acc = np.trunc(acc / size) if dtype in ("uint8", "int32", "int64") else acc / size
    return acc


TORCH = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32, "int64": torch.int64,
         "uint8": torch.uint8, "float16": torch.float16, "bfloat16": torch.bfloat16}
NUMPY = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
         "float16": np.float16}
# Every member of the extension's enum, by its lower-case name (what reference() takes).
OPS = {name.lower(): op for name, op in erun.ReduceOp.__members__.items()}
assert list(OPS) == ["sum", "average", "min", "max", "product"], OPS
# The old names are the same members, equal to the integer codes they were.
assert [erun.Sum, erun.Average, erun.Min, erun.Max, erun.Product] == list(OPS.values()) == [0, 1, 2, 3, 4]


# GradientHooks' hooks: post-accumulate-grad hooks where torch has them (>= 2.1).
HOOK_KIND = ("post_accumulate_grad" if hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
             else "grad_accumulator")


def as_f64(x):
    return x.double().cpu().numpy() if isinstance(x, torch.Tensor) else x.astype(np.float64)


def check(got, want, what):
    got = as_f64(got)
    if not np.allclose(got, want, rtol=1e-6 if "average" in what else 0, atol=0):
        bad = np.nonzero(~np.isclose(got, want, rtol=1e-6, atol=0))[0][:5]
        raise AssertionError(f"{what}: rank {erun.rank()} got {got[bad]} want {want[bad]} at {bad}")


def gradients_on(device, rank, size):
    """DistributedOptimizer on a model on `device`: every rank's gradient is
    rank + 1, so the averaged one is (size + 1) / 2 everywhere."""
    model = torch.nn.Linear(8, 4).to(device)
    opt = erun.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0))
    for q in model.parameters():
        q.grad = torch.full_like(q, float(rank + 1))
    opt.step()
    for q in model.parameters():
        check(q.grad.reshape(-1), np.full(q.numel(), (size + 1) / 2), f"{device} DistributedOptimizer")


def overlapped_on(device, rank, kind=HOOK_KIND):
    """GradientHooks (reduced during backward, several buckets, an unused
    parameter) give exactly the gradients of allreduce_gradients after
    backward, two steps in a row; the first bucket is launched and reduced
    while backward is still running (a hook half-way through backward waits
    for its averaged gradient)."""
    import copy
    import time
    torch.manual_seed(1)
    layers = [torch.nn.Linear(16, 16) for _ in range(4)] + [torch.nn.Linear(16, 3)]
    model = torch.nn.Sequential(*layers).to(device)
    unused = torch.nn.Parameter(torch.ones(5, device=device))
    ref = copy.deepcopy(model)
    # The unused parameter first: it lands in the last bucket (buckets go in reverse order).
    hooks = erun.torch.GradientHooks([unused] + list(model.parameters()), bucket_bytes=1200)
    assert hooks.num_buckets > 3, hooks.num_buckets
    assert hooks.hook_kind == kind, (hooks.hook_kind, kind)
    for step in range(2):
        x = torch.full((4, 16), 0.25 * (rank + 1) + step, device=device)
        ref.zero_grad()
        ref(x).square().sum().backward()
        erun.torch.allreduce_gradients(ref.parameters())
        last = (model[4].bias, ref[4].bias)  # in the first bucket
        midway = []

        def after_layer_0(grad):
            # Backward has reached the first layer: the last layers' buckets are launched and
            # the communication thread averages the first one meanwhile.
            deadline = time.monotonic() + 20
            while not torch.equal(last[0].grad, last[1].grad) and time.monotonic() < deadline:
                time.sleep(0.001)
            midway.append((hooks.launched, torch.equal(last[0].grad, last[1].grad)))

        model.zero_grad()
        h = model[0](x)
        h.register_hook(after_layer_0)
        model[1:](h).square().sum().backward()
        launched, reduced = midway[0]
        assert 1 <= launched < hooks.num_buckets - 1, (launched, hooks.num_buckets)
        assert reduced, "the first bucket was not reduced during backward"
        # Backward launched every bucket but the unused parameter's.
        assert hooks.launched == hooks.num_buckets - 1, (hooks.launched, hooks.num_buckets)
        unused.grad = None
        hooks.wait()
        for a, b in zip(model.parameters(), ref.parameters()):
            assert torch.equal(a.grad, b.grad), (step, a.grad, b.grad)
        assert torch.equal(unused.grad, torch.zeros_like(unused))
    hooks.close()  # no hook fires any more: nothing is launched
    model(x).sum().backward()
    assert hooks.launched == 0 and not hooks.registered


def hooks_as_context_on(device, rank, size):
    """``with GradientHooks(...)``: inside the block backward averages the
    gradients; after it the hooks are gone and backward leaves each rank its
    own gradient (which differs from the average when size > 1); entering
    the block again averages again."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to(device)
    x = torch.full((3, 8), float(rank + 1), device=device)

    def backward():
        model.zero_grad()
        model(x).square().sum().backward()

    backward()
    mine = [p.grad.clone() for p in model.parameters()]
    averaged = [erun.allreduce(g) for g in mine]
    if size > 1:
        assert not all(torch.equal(a, b) for a, b in zip(mine, averaged))
    hooks = erun.torch.GradientHooks(model.parameters(), bucket_bytes=64)
    for _ in range(2):  # the constructor's hooks, then hooks registered again by `with`
        with hooks as h:
            assert h is hooks and hooks.registered and hooks.num_buckets > 1
            backward()
            assert hooks.launched == hooks.num_buckets, (hooks.launched, hooks.num_buckets)
            hooks.wait()
            for p, a in zip(model.parameters(), averaged):
                assert torch.allclose(p.grad, a, rtol=1e-6, atol=0), (p.grad, a)
        assert not hooks.registered
        backward()
        assert hooks.launched == 0
        for p, m in zip(model.parameters(), mine):
            assert torch.equal(p.grad, m), (p.grad, m)


def process_group_as_context(rank, size):
    """``with erun.torch.ProcessGroup()`` builds torch.distributed's group and
    destroys it at the end; process_group() still works afterwards."""
    import torch.distributed as dist
    want = size * (size + 1) // 2
    with erun.torch.ProcessGroup(timeout=timedelta(seconds=60)) as pg:
        assert dist.is_initialized() and dist.get_world_size(pg) == size and dist.get_rank(pg) == rank
        t = torch.tensor([rank + 1])
        dist.all_reduce(t, group=pg)
        assert int(t) == want, int(t)
    assert not dist.is_initialized()
    pg = erun.torch.process_group(timeout=timedelta(seconds=60))
    t = torch.tensor([rank + 1])
    dist.all_reduce(t, group=pg)
    assert int(t) == want, int(t)
    erun.torch.destroy_process_group()
    assert not dist.is_initialized()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = p.parse_args()
    erun.init()
    rank, size = erun.rank(), erun.size()
    device = "cpu"
    if a.device == "cuda":
        device = f"cuda:{erun.local_rank() % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    checks = 0
    libs = (("torch", TORCH),) if a.device == "cuda" else (("torch", TORCH), ("numpy", NUMPY))
    for lib, types in libs:
        for name, dt in types.items():
            make = (lambda a: torch.from_numpy(a).to(dt).to(device)) if lib == "torch" else (lambda a: a.astype(dt))
            # The dtype maps onto the extension's DataType of the same name and size.
            one = make(np.zeros(1))
            code = erun.data_type(dt)
            assert code.name == name.upper(), (name, code)
            assert code.itemsize == (one.element_size() if lib == "torch" else one.itemsize), (name, code)
            for opname, op in OPS.items():
                if name in ("float16", "bfloat16") and opname == "product":
                    continue  # products of 4 halves overflow float16's exact range
                # The exact result rounded to the type (halves round the average).
                want = as_f64(make(reference(size, name, opname)))
                x = make(inputs(rank, name))
                before = as_f64(x).copy()
                out = erun.allreduce(x, op=op)
                check(out, want, f"{lib} {name} allreduce {opname}")
                check(x, before, f"{lib} {name} allreduce {opname} leaves its input")
                ptr = x.data_ptr() if lib == "torch" else x.ctypes.data
                y = erun.allreduce_(x, op=opname)
                assert y is x and (x.data_ptr() if lib == "torch" else x.ctypes.data) == ptr
                check(x, want, f"{lib} {name} allreduce_ {opname}")
                checks += 2
                if device == "cpu":  # reduce_scatter: this rank's rows of the same reduction
                    for split in ("chunk", "even"):
                        begin, end = erun.shard_rows(N, rank, size, split)
                        part = erun.reduce_scatter(make(inputs(rank, name)), op=op, split=split)
                        assert tuple(part.shape) == (end - begin,), (part.shape, begin, end)
                        check(part, want[begin:end], f"{lib} {name} reduce_scatter {opname} {split}")
                        checks += 1
            # broadcast_ from every root, in place
            for root in range(size):
                x = make(inputs(rank, name))
                erun.broadcast_(x, root=root)
                check(x, as_f64(make(inputs(root, name))), f"{lib} {name} broadcast_ root {root}")
                checks += 1
            # allgather: equal shapes, then a different first dimension per rank
            x = make(inputs(rank, name)).reshape(-1)[: 6 * 10].reshape(6, 10)
            g = erun.allgather(x)
            assert tuple(g.shape) == (6 * size, 10), g.shape
            for r in range(size):
                check(g[6 * r:6 * (r + 1)].reshape(-1), as_f64(make(inputs(r, name)))[:60], f"{lib} {name} allgather")
            x = make(inputs(rank, name))[: rank + 1]
            g = erun.allgather(x)
            want = np.concatenate([as_f64(make(inputs(r, name)))[: r + 1] for r in range(size)])
            check(g, want, f"{lib} {name} allgather uneven")
            checks += 2
    erun.barrier()
    objs = erun.allgather_object({"rank": rank})
    assert objs == [{"rank": r} for r in range(size)], objs
    assert erun.broadcast_object(["x", rank], root=size - 1) == ["x", size - 1]
    # A zero-length tensor is fine.
    erun.allreduce_(torch.zeros(0, device=device))
    gradients_on(device, rank, size)
    overlapped_on(device, rank)
    hooks_as_context_on(device, rank, size)
    if HOOK_KIND == "post_accumulate_grad":  # the hooks of older torch work on this one too
        erun.torch._HAS_POST_ACCUMULATE_GRAD_HOOK = False
        overlapped_on(device, rank, "grad_accumulator")
        hooks_as_context_on(device, rank, size)
        erun.torch._HAS_POST_ACCUMULATE_GRAD_HOOK = True
        checks += 2
    process_group_as_context(rank, size)
    checks += 4
    if a.device == "cuda":
        # The work ran on torch's current stream: a side stream works too.
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.full((1 << 20,), float(rank + 1), device=device)
            erun.allreduce_(x, op=erun.Sum)
        check(x[:16], np.full(16, size * (size + 1) / 2), "cuda allreduce_ on a side stream")
        checks += 1
        print(f"device {device} backend {erun._erun.gpu_backend(torch.cuda.current_device())}", flush=True)
    print(f"collectives ok rank {rank} of {size} checks {checks}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
