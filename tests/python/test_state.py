"""erun.State / erun.torch.TorchState in a world of one (this process):
round trips of a model, SGD momentum and Adam state (created lazily), a
sampler and picklable values; errors as Python exceptions; erun.run's loop."""
import copy

import numpy as np
import pytest
import torch

import erun
import erun.torch


def model_and_data(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 3))
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    return model, x, y


def train_steps(model, opt, x, y, n):
    for _ in range(n):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def snapshot(model, opt):
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    osd = opt.state_dict()
    ost = {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()} for i, s in osd["state"].items()}
    return sd, ost, [dict((k, v) for k, v in g.items() if k != "params") for g in osd["param_groups"]]


def assert_same(a, b):
    sd_a, st_a, pg_a = a
    sd_b, st_b, pg_b = b
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        assert torch.equal(sd_a[k], sd_b[k]), k
    assert st_a.keys() == st_b.keys()
    for i in st_a:
        assert st_a[i].keys() == st_b[i].keys()
        for k in st_a[i]:
            va, vb = st_a[i][k], st_b[i][k]
            assert torch.equal(va, vb) if torch.is_tensor(va) else va == vb, (i, k)
    assert pg_a == pg_b


@pytest.fixture(autouse=True, scope="module")
def world_of_one():
    erun.init()
    assert erun.size() == 1 and erun.rank() == 0 and not erun.elastic()


def fused_or_skip(cls, **kwargs):
    """cls(params, fused=True, ...), or a skip where this torch has no fused CPU kernel for it
    (before 2.4; 1.13's fused Adam is CUDA only and its AdamW has no `fused`)."""
    def make(p):
        return cls(p, fused=True, **kwargs)
    w = torch.nn.Parameter(torch.ones(2))
    try:
        opt = make([w])
        w.grad = torch.ones(2)
        opt.step()
    except (TypeError, RuntimeError, ValueError) as e:
        pytest.skip(f"torch {torch.__version__} has no fused {cls.__name__} on the CPU: {e}")
    return make


OPTIMIZERS = {
    "sgd-momentum": lambda: lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda: lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw-amsgrad": lambda: lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True),
    "sgd-foreach": lambda: lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
    "adam-foreach": lambda: lambda p: torch.optim.Adam(p, lr=0.01, foreach=True),
    "adamw-amsgrad-foreach": lambda: lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True, foreach=True),
    "adam-fused": lambda: fused_or_skip(torch.optim.Adam, lr=0.01),
    "adamw-amsgrad-fused": lambda: fused_or_skip(torch.optim.AdamW, lr=0.01, amsgrad=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_torch_state_round_trip(name):
    make_opt = OPTIMIZERS[name]()
    model, x, y = model_and_data()
    opt = make_opt(model.parameters())
    for flag in ("foreach", "fused"):  # the optimizer really is the kind named
        assert bool(opt.param_groups[0].get(flag)) == (flag in name), (flag, opt.param_groups[0])
    state = erun.torch.TorchState(model=model, optimizer=opt, epoch=0, note="a")
    state.sync()
    train_steps(model, opt, x, y, 3)  # creates the optimizer state lazily, after registration
    state.epoch, state.note = 5, {"b": [1, 2]}
    state.commit()
    committed = snapshot(model, opt)
    # The reference optimizer starts from its own copy of the committed state: torch 2.x's
    # load_state_dict() keeps the tensors it is given (1.13 deep-copied them), so loading
    # opt.state_dict() itself would make both optimizers step the same buffers.
    committed_opt = copy.deepcopy(opt.state_dict())
    train_steps(model, opt, x, y, 2)
    for g in opt.param_groups:
        g["lr"] = 123.0
    state.epoch, state.note = 9, None
    assert not torch.equal(model[0].weight, committed[0]["0.weight"])
    state.restore()
    assert_same(snapshot(model, opt), committed)
    assert state.epoch == 5 and state.note == {"b": [1, 2]}
    # Training on from the restored state gives exactly what training on from the commit gives.
    model2, _, _ = model_and_data(seed=1)
    model2.load_state_dict(committed[0])
    opt2 = make_opt(model2.parameters())
    opt2.load_state_dict(committed_opt)
    train_steps(model, opt, x, y, 2)
    train_steps(model2, opt2, x, y, 2)
    assert_same(snapshot(model, opt), snapshot(model2, opt2))
    assert not torch.equal(model[0].weight, committed[0]["0.weight"])


needs_compile = pytest.mark.skipif(not hasattr(torch, "compile"),
                                   reason=f"torch {torch.__version__} has no torch.compile (2.0 and later)")


@needs_compile
@pytest.mark.parametrize("given", ["compiled", "original"])
def test_torch_state_round_trip_with_a_compiled_model(given):
    """Trained through torch.compile(model) (inductor, C++ on the CPU), with TorchState given the
    compiled module or the original one: commit, restore and training on match training on from
    the commit loaded with torch's own load_state_dict, exactly."""
    model, x, y = model_and_data()
    compiled = torch.compile(model)
    assert type(compiled) is not type(model) and compiled.state_dict().keys() != model.state_dict().keys()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    state = erun.torch.TorchState(model=compiled if given == "compiled" else model, optimizer=opt, epoch=0)
    assert state.model is (compiled if given == "compiled" else model)
    state.sync()
    train_steps(compiled, opt, x, y, 3)
    state.epoch = 5
    state.commit()
    committed = snapshot(model, opt)
    committed_opt = copy.deepcopy(opt.state_dict())
    train_steps(compiled, opt, x, y, 2)
    state.epoch = 9
    assert not torch.equal(model[0].weight, committed[0]["0.weight"])
    assert not torch.equal(model[1].running_mean, committed[0]["1.running_mean"])  # compiled BatchNorm, in place
    state.restore()
    assert_same(snapshot(model, opt), committed)
    assert state.epoch == 5
    with torch._dynamo.config.patch(error_on_recompile=True):  # the restore recompiles nothing
        train_steps(compiled, opt, x, y, 2)
    after_restore = snapshot(model, opt)
    # The reference: the same compiled module (a second compile could round differently) loaded
    # with the commit by torch, and a new optimizer loaded with its committed state.
    model.load_state_dict(committed[0])
    opt2 = torch.optim.Adam(model.parameters(), lr=0.01)
    opt2.load_state_dict(committed_opt)
    train_steps(compiled, opt2, x, y, 2)
    assert_same(snapshot(model, opt2), after_restore)


@needs_compile
def test_compiled_and_original_modules_give_the_same_commit(tmp_path):
    """A commit of TorchState(model=torch.compile(m)) loads into TorchState(model=m2) and the other
    way round (as when a new worker passes the other one): through a durable commit file, whose
    entries go by name. torch.compile's wrapper names its keys "_orig_mod.<key>"; TorchState
    does not."""
    for first, second in (("compiled", "original"), ("original", "compiled")):
        d = tmp_path / first
        d.mkdir()
        model, _, _ = model_and_data(seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        a = erun.torch.TorchState(model=torch.compile(model) if first == "compiled" else model, optimizer=opt)
        a.set_checkpoint_dir(d)
        a.commit()
        other, _, _ = model_and_data(seed=1)
        assert not torch.equal(other[0].weight, model[0].weight)
        b = erun.torch.TorchState(model=torch.compile(other) if second == "compiled" else other,
                                  optimizer=torch.optim.SGD(other.parameters(), lr=0.1))
        b.set_checkpoint_dir(d)  # loads the commit file
        b.restore()
        for k, v in model.state_dict().items():
            assert torch.equal(other.state_dict()[k], v), (first, second, k)


def test_restore_before_the_first_step_empties_the_optimizer_state():
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = erun.torch.TorchState(model=model, optimizer=opt)
    state.commit()
    before = snapshot(model, opt)
    train_steps(model, opt, x, y, 2)
    assert len(opt.state) > 0
    state.restore()
    assert len(opt.state) == 0
    assert_same(snapshot(model, opt), before)


def test_sampler_position_round_trip():
    sampler = erun.torch.ElasticSampler(100, batch_size=8, seed=3)
    state = erun.torch.TorchState(sampler=sampler)
    sampler.set_epoch(2)
    first = list(sampler)
    assert sorted(first) == list(range(100))
    sampler.record_batch()
    sampler.record_batch()
    state.commit()
    assert sampler.processed == 16 and list(sampler) == first[16:]
    sampler.record_batch()
    sampler.set_epoch(3)
    state.restore()
    assert sampler.epoch == 2 and sampler.processed == 16 and list(sampler) == first[16:]
    assert sampler.steps() == 11  # ceil(84 / 8)


def test_sampler_with_a_dataloader_and_workers():
    data = torch.arange(50, dtype=torch.float32).reshape(50, 1)
    ds = torch.utils.data.TensorDataset(data)
    sampler = erun.torch.ElasticSampler(ds, batch_size=8, seed=5)
    sampler.set_epoch(0)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2)
    seen = []
    for batch in sampler.batches(loader):
        seen += [int(v) for v in batch[0].reshape(-1)]
        sampler.record_batch()
    assert sorted(seen) == list(range(50))
    assert sampler.remaining == 0


def test_register_buffer_round_trip_and_moved_buffer():
    arr = np.arange(10, dtype=np.float64)
    t = torch.ones(4, dtype=torch.bfloat16)
    state = erun.State()
    state.register_buffer("arr", arr)
    state.register_buffer("t", t)
    state.commit()
    arr[:] = -1
    t.fill_(7)
    state.restore()
    assert arr.tolist() == list(range(10)) and t.tolist() == [1.0] * 4
    moving = erun.State()
    holder = {"x": torch.zeros(3)}
    moving.register_buffer("x", holder["x"])
    holder["x"].resize_(1000)  # reallocates the storage
    with pytest.raises(erun.Error, match="moved or changed size"):
        moving.commit()


def test_errors_are_python_exceptions():
    assert issubclass(erun.CommError, erun.Error) and issubclass(erun.HostsUpdated, erun.Error)
    assert issubclass(erun.Error, RuntimeError)
    with pytest.raises(erun.Error, match="not contiguous"):
        erun.allreduce_(torch.zeros(4, 4).t())
    with pytest.raises(erun.Error, match="not C-contiguous"):
        erun.broadcast_(np.zeros((4, 4))[:, 1])
    with pytest.raises(erun.Error, match=r"takes CPU and CUDA tensors only \(got a tensor on meta\)"):
        erun.allreduce_(torch.zeros(4, device="meta"))
    with pytest.raises(erun.Error, match="not supported"):
        erun.allreduce_(torch.zeros(4, dtype=torch.complex64))
    with pytest.raises(erun.Error, match="unknown reduce op"):
        erun.allreduce_(torch.zeros(4), op="median")
    with pytest.raises(erun.Error, match="expected a torch.Tensor"):
        erun.allreduce_([1, 2])
    with pytest.raises(erun.Error, match="read-only"):
        a = np.zeros(3)
        a.flags.writeable = False
        erun.allreduce_(a)
    # A C++ erun::Error (a name registered twice) arrives as erun.Error.
    s = erun.State(x=1)
    with pytest.raises(erun.Error, match="registered twice"):
        s.register_buffer("value/x", np.zeros(1))
    # Out of place leaves the input alone; in place returns the same object.
    x = torch.arange(5.0)
    y = erun.allreduce(x, op=erun.Sum)
    assert y is not x and torch.equal(y, x)
    assert erun.allreduce_(x) is x


def test_run_retries_nothing_on_a_user_error_and_restores_on_comm_error_only_when_it_can():
    state = erun.State(calls=0)
    calls = []

    @erun.run
    def fails(state):
        calls.append(1)
        raise ValueError("user error")

    with pytest.raises(ValueError, match="user error"):
        fails(state)
    assert len(calls) == 1

    @erun.run
    def lost_peer(state):
        calls.append(2)
        raise erun.CommError("peer lost")

    # A world of one cannot re-join: the loop ends with a clear erun.Error, never a hang.
    with pytest.raises(erun.Error, match="cannot re-join"):
        lost_peer(state)
    assert calls == [1, 2]

    @erun.run
    def ok(state, a, b=0):
        state.calls += 1
        return a + b

    assert ok(state, 2, b=3) == 5
    bound = erun.run(state)(lambda s, k: (s is state, k))
    assert bound(7) == (True, 7)
    with pytest.raises(erun.Error, match="first argument must be an erun.State"):
        ok(object(), 1)


def test_reset_callbacks_and_distributed_optimizer_in_a_world_of_one():
    model, x, y = model_and_data()
    opt = erun.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), bucket_bytes=64)
    ref, _, _ = model_and_data()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    train_steps(model, opt, x, y, 2)
    train_steps(ref, ref_opt, x, y, 2)
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)
    state = erun.torch.TorchState(model=model, optimizer=opt)
    assert state.optimizer is opt
