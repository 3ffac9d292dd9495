"""Checks of erun.horovod.torch's semantics in a world of 2 or more (run
under erun -np N): each check asserts what Horovod documents, rank 0 prints
`check NAME ok` after each and `all checks passed` at the end."""
import sys

import torch
import torch.nn.functional as F

import erun.horovod.torch as hvd
from erun.horovod.torch.mpi_ops import comm_thread


def say(name):
    if hvd.rank() == 0:
        print(f"check {name} ok", flush=True)


def raises(exc, fn, text):
    try:
        fn()
    except exc as e:
        assert text in str(e), str(e)
        return
    raise AssertionError(f"no {exc.__name__} ({text})")


def check_async_in_order_with_names():
    r, n = hvd.rank(), hvd.size()
    handles = [hvd.allreduce_async(torch.tensor([float(r + k)]), op=hvd.Sum, name=f"t{k}") for k in range(5)]
    inplace = torch.tensor([1.0 + r])
    h = hvd.allreduce_async_(inplace, name="inplace")
    middle = hvd.allreduce(torch.tensor([2.0]), op=hvd.Sum)  # synchronous: runs after the queued ones
    assert middle.item() == 2.0 * n
    for k, handle in enumerate(handles):
        assert hvd.synchronize(handle).item() == sum(float(q + k) for q in range(n))
    assert hvd.synchronize(h) is inplace and inplace.item() == sum(1.0 + q for q in range(n)) / n
    assert hvd.poll(h)
    with comm_thread()._exec:  # no collective runs while it is held: the first "same" stays pending
        pending = hvd.allreduce_async(torch.ones(1), name="same")
        raises(ValueError, lambda: hvd.allreduce_async(torch.ones(1), name="same"), "already pending")
    hvd.synchronize(pending)
    g = hvd.grouped_allreduce_async([torch.tensor([float(r)]), torch.tensor([1.0, 2.0])], op=hvd.Max)
    out = hvd.synchronize(g)
    assert out[0].item() == n - 1 and out[1].tolist() == [1.0, 2.0]
    say("async_in_order_with_names")


def check_ops_and_scaling():
    r, n = hvd.rank(), hvd.size()
    x = torch.tensor([float(r + 1)])
    assert hvd.allreduce(x).item() == sum(range(1, n + 1)) / n
    assert hvd.allreduce(x, average=False).item() == sum(range(1, n + 1))
    assert hvd.allreduce(x, op=hvd.Min).item() == 1 and hvd.allreduce(x, op=hvd.Max).item() == n
    assert hvd.allreduce(x, op=hvd.Product).item() == float(torch.arange(1, n + 1).prod())
    assert hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5).item() == sum(range(1, n + 1))
    raises(NotImplementedError, lambda: hvd.allreduce(x, op=hvd.Adasum), "Adasum is not supported")
    raises(ValueError, lambda: hvd.allreduce(x, op=hvd.Sum, average=True), "supersedes average")
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1, dtype=torch.int64), prescale_factor=2.0),
           "floating-point")
    y = torch.full((3,), float(r), requires_grad=True)
    hvd.allreduce(y, op=hvd.Sum).sum().backward()  # the gradient of a Sum allreduce is the Sum of the gradients
    assert y.grad.tolist() == [float(n)] * 3
    z = torch.full((2,), float(r), requires_grad=True)
    hvd.allgather(z).sum().backward()
    assert z.grad.tolist() == [float(n)] * 2
    splits = [q + 1 for q in range(n)]  # rank j gets j+1 rows from everyone
    rows = torch.arange(sum(splits), dtype=torch.float32) + 100 * r
    got, received = hvd.alltoall(rows, splits=splits)
    assert received.tolist() == [r + 1] * n
    begin = sum(splits[:r])
    assert got.tolist() == [float(100 * q + begin + k) for q in range(n) for k in range(r + 1)]
    rows = torch.arange(2 * n + 1, dtype=torch.float64).unsqueeze(1) * (r + 1)
    mine = hvd.reducescatter(rows, op=hvd.Sum)  # 2n+1 rows: rank 0 gets 3, the others 2
    begin = 0 if r == 0 else 3 + 2 * (r - 1)
    full = torch.arange(2 * n + 1, dtype=torch.float64).unsqueeze(1) * sum(range(1, n + 1))
    assert torch.equal(mine, full[begin:begin + (3 if r == 0 else 2)]), (mine, begin)
    assert torch.equal(hvd.synchronize(hvd.reducescatter_async(rows, op=hvd.Average)), mine / n)
    b = torch.full((2,), float(r))
    assert hvd.broadcast(b, root_rank=n - 1).tolist() == [float(n - 1)] * 2 and b[0].item() == r
    hvd.broadcast_(b, root_rank=0)
    assert b.tolist() == [0.0, 0.0]
    say("ops_and_scaling")


def model_and_batch():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    g = torch.Generator().manual_seed(hvd.rank())
    return model, torch.randn(4, 3, generator=g, dtype=torch.float64)


def reference_grads(model, xs):
    """Every rank's gradient of its batches, summed over its batches, averaged over ranks."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    for x in xs:
        model.zero_grad()
        model(x).square().sum().backward()
        for t, p in zip(total, model.parameters()):
            t += p.grad
    return [hvd.allreduce(t) for t in total]


def check_optimizer_options():
    model, x = model_and_batch()
    xs = [x, x * 2]
    expected = reference_grads(model, xs)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2)
    assert isinstance(opt, torch.optim.SGD)
    opt.zero_grad()
    model(xs[0]).square().sum().backward()
    assert opt._erun_hooks.launched == 0  # the first pass only accumulates
    model(xs[1]).square().sum().backward()  # the second one launches the reduction
    opt.synchronize()
    for e, p in zip(expected, model.parameters()):
        assert torch.allclose(p.grad, e, rtol=0, atol=1e-12), (p.grad, e)
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    model(x).square().sum().backward()
    model(x).square().sum().backward()  # the second pass launches the reduction
    raises(AssertionError, opt.zero_grad, "before optimizer.step() or optimizer.synchronize()")
    opt.step()

    model, x = model_and_batch()
    expected = reference_grads(model, [x])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), compression=hvd.Compression.fp16,
                                   gradient_predivide_factor=2.0, groups=1)
    opt.zero_grad()
    model(x).square().sum().backward()
    opt.synchronize()
    for e, p in zip(expected, model.parameters()):
        assert torch.allclose(p.grad, e, rtol=2e-3, atol=1e-3), (p.grad, e)  # rounded to float16 on the way
        assert not torch.equal(p.grad, e) or e.abs().max() == 0
    raises(ValueError, lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                        op=hvd.Sum, gradient_predivide_factor=2.0),
           "only supported with op=hvd.Average")
    raises(NotImplementedError, lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                                 op=hvd.Adasum), "Adasum")
    named = list(model.named_parameters())
    raises(ValueError, lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                        named_parameters=[named[0], (named[0][0], named[1][1])]),
           "duplicates")
    raises(ValueError, lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                        named_parameters=named[:1]), "not named")
    say("optimizer_options")


def check_elastic_object_state():
    state = hvd.elastic.ObjectState(epoch=3, tag="a")
    state.epoch = 4
    state.commit()
    state.epoch = 9
    state.restore()
    assert state.epoch == 4 and state.tag == "a"
    calls = []
    state.register_reset_callbacks([lambda: calls.append(hvd.size())])
    state.on_reset()
    assert calls == [hvd.size()]
    state.check_host_updates()  # nothing pending: returns on every rank
    say("elastic_object_state")


def main():
    torch.set_num_threads(1)
    hvd.init()
    assert hvd.size() >= 2, "run under erun -np 2 or more"
    assert hvd.is_initialized() and not hvd.mpi_enabled() and not hvd.mpi_threads_supported()
    assert isinstance(hvd.HorovodInternalError("x"), __import__("erun").CommError)
    check_async_in_order_with_names()
    check_ops_and_scaling()
    check_optimizer_options()
    check_elastic_object_state()
    if hvd.rank() == 0:
        print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
