"""The erun package's API in a world of one (this process): the extension's
ReduceOp and DataType enums and the mapping of dtypes onto them. Several
ranks: tests/python/workers/collectives.py."""
import numpy as np
import pytest
import torch

import erun


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
