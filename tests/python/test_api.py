"""The erun package's API in a world of one (this process): the extension's
ReduceOp and DataType enums and the mapping of dtypes onto them, the context
managers of GradientHooks and erun.torch.ProcessGroup, and the loop's
callbacks and peer-loss checks kept per State (a fresh State carries none of
another's). Several ranks: tests/python/workers/collectives.py."""
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

import erun
import erun.torch


@pytest.fixture(autouse=True, scope="module")
def world_of_one():
    erun.init()
    assert erun.size() == 1 and erun.rank() == 0 and not erun.elastic()


def test_reduce_ops_are_the_extensions_enum_under_their_old_names_too():
    assert erun.ReduceOp is erun._erun.ReduceOp
    members = erun.ReduceOp.__members__
    assert list(members) == ["SUM", "AVERAGE", "MIN", "MAX", "PRODUCT"]
    assert [erun.Sum, erun.Average, erun.Min, erun.Max, erun.Product] == list(members.values())
    assert erun.Sum is erun.ReduceOp.SUM and erun.Product is erun.ReduceOp.PRODUCT
    # Equal (and hashing equal) to the integer codes they were, and to nothing else.
    assert [int(op) for op in members.values()] == [0, 1, 2, 3, 4]
    assert erun.Average == 1 and 1 == erun.Average and erun.Average != 0 and {1: "avg"}[erun.Average] == "avg"
    assert erun.ReduceOp.SUM != erun.DataType.FLOAT32 and erun.Sum != "sum" and erun.Sum is not None
    x = torch.tensor([3.0, -2.0])
    for op in list(members.values()) + ["sum", "Mean", "prod", 0, 4]:
        assert torch.equal(erun.allreduce(x, op=op), x), op  # a world of one reduces to itself
    for bad in (5, -1, 1.0, None, erun.DataType.FLOAT32):
        with pytest.raises(erun.Error, match="unknown reduce op"):
            erun.allreduce_(x, op=bad)


def test_dtypes_map_onto_the_extensions_data_type():
    assert erun.DataType is erun._erun.DataType
    torch_types = {torch.float32: "FLOAT32", torch.float64: "FLOAT64", torch.int32: "INT32", torch.int64: "INT64",
                   torch.uint8: "UINT8", torch.float16: "FLOAT16", torch.bfloat16: "BFLOAT16"}
    assert sorted(torch_types.values()) == sorted(erun.DataType.__members__)
    for dt, name in torch_types.items():
        code = erun.data_type(dt)
        assert code is erun.DataType.__members__[name] and code.itemsize == torch.empty(0, dtype=dt).element_size()
    for dt in (np.float32, np.float64, np.int32, np.int64, np.uint8, np.float16):
        assert erun.data_type(dt).name == np.dtype(dt).name.upper()
        assert erun.data_type(np.dtype(dt)) is erun.data_type(np.dtype(dt).name)
        assert erun.data_type(dt).itemsize == np.dtype(dt).itemsize
    for bad in (torch.complex64, np.int16, "not a dtype", None):
        with pytest.raises(erun.Error, match="not supported"):
            erun.data_type(bad)


def test_gradient_hooks_as_a_context_manager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4)
    hooks = erun.torch.GradientHooks(model.parameters(), bucket_bytes=32)
    assert hooks.registered and hooks.num_buckets > 1
    with hooks as h:
        assert h is hooks and hooks.registered
        model(x).sum().backward()
        assert hooks.launched == hooks.num_buckets  # backward launched every bucket
        hooks.wait()
        assert hooks.launched == 0
    assert not hooks.registered
    model(x).sum().backward()
    assert hooks.launched == 0  # no hook fired
    hooks.wait()  # nothing launched: wait() reduces every bucket itself, as before
    # A block that raises removes the hooks too; entering again puts them back.
    with pytest.raises(ValueError):
        with hooks:
            model(x).sum().backward()
            raise ValueError("in the block")
    assert not hooks.registered
    with hooks:
        model(x).sum().backward()
        assert hooks.launched == hooks.num_buckets
        hooks.wait()
    assert not hooks.registered
    hooks.close()  # closing twice is fine


def test_process_group_as_a_context_manager():
    assert not dist.is_initialized()
    group = erun.torch.ProcessGroup(timeout=timedelta(seconds=20))
    with group as pg:
        assert dist.is_initialized() and dist.get_world_size(pg) == 1
        assert group.generation == erun.generation()
        t = torch.tensor([5.0])
        dist.all_reduce(t, group=pg)
        assert t.item() == 5.0
    assert not dist.is_initialized() and group.generation is None
    # A RuntimeError that does not come from a lost peer (the erun barrier
    # works) leaves the block unchanged, and the group is destroyed.
    with pytest.raises(RuntimeError, match="not a lost peer"):
        with group:
            raise RuntimeError("not a lost peer")
    assert not dist.is_initialized()
    # Only one group at a time: torch.distributed has one default group.
    with group:
        with pytest.raises(erun.Error, match="already initialized"):
            erun.torch.process_group()
    assert not dist.is_initialized()


def test_a_group_built_in_erun_run_is_destroyed_before_the_rejoin():
    state = erun.State()
    seen = []

    @erun.run
    def train(state):
        erun.torch.process_group(timeout=timedelta(seconds=20))
        assert dist.is_initialized()
        raise erun.CommError("peer lost")

    @state.on_rejoin
    def rejoining():
        seen.append(1)

    # A world of one cannot re-join: the loop ends with erun.Error, after the
    # callbacks: the group's (registered by process_group()) destroyed it.
    with pytest.raises(erun.Error, match="cannot re-join"):
        train(state)
    assert seen == [1] and not dist.is_initialized()
    erun.torch.destroy_process_group()  # nothing left to destroy: fine


def test_loop_callbacks_and_peer_loss_checks_belong_to_their_state():
    checked, rejoined = [], []
    state = erun.State()
    state.add_peer_loss_check(lambda e: checked.append(type(e).__name__) or isinstance(e, KeyError))
    state.on_rejoin(lambda: rejoined.append(1))

    @erun.run
    def fails(state, exc):
        raise exc

    # A KeyError that the check calls a lost peer: handled as a CommError (restore, re-join).
    with pytest.raises(erun.Error, match="cannot re-join"):
        fails(state, KeyError("k"))
    assert checked == ["KeyError"] and rejoined == [1]
    # Any other error leaves the loop unchanged, without a re-join.
    with pytest.raises(ValueError):
        fails(state, ValueError("v"))
    assert checked == ["KeyError", "ValueError"] and rejoined == [1]
    # A fresh State has none of them: the KeyError goes through.
    with pytest.raises(KeyError):
        fails(erun.State(), KeyError("k"))
    assert checked == ["KeyError", "ValueError"] and rejoined == [1]


def test_a_sampler_registers_with_a_plain_state():
    sampler = erun.torch.ElasticSampler(40, batch_size=4, seed=1)
    state = erun.State()
    sampler.register_with(state)
    sampler.set_epoch(1)
    sampler.record_batch()
    state.commit()
    sampler.record_batch()
    state.restore()
    assert sampler.epoch == 1 and sampler.processed == 4
