"""erun: elastic training in place, for Python programs.

A training program calls ``erun.init()`` once, keeps its training state in an
``erun.State`` (or ``erun.torch.TorchState``) and runs its loop inside a
function decorated with ``@erun.run``::

    import erun
    erun.init()
    state = erun.State(epoch=0)

    @erun.run
    def train(state):
        while state.epoch < 10:
            ...                      # erun.allreduce_(grads, op=erun.ReduceOp.AVERAGE)
            state.epoch += 1
            state.commit()

    train(state)

Under the erun driver the worker is elastic (ranks come and go; survivors keep
their process and roll back to the last commit); under mpirun/srun it is a
static world; alone it is a world of one. Collectives work on CPU torch
tensors and numpy arrays in place, on their own memory. Errors are
``erun.Error`` and its subclasses ``erun.CommError`` (a peer died or timed
out: restore and re-join) and ``erun.HostsUpdated`` (the membership changes:
re-join). See docs/python.md.

Reduction operators are ``erun.ReduceOp`` (``SUM``, ``AVERAGE``, ``MIN``,
``MAX``, ``PRODUCT``; also as ``erun.Sum``, ``erun.Average``, ...) and element
types ``erun.DataType`` (``erun.data_type(torch.float32)`` maps a torch or
numpy dtype onto it), both from the compiled extension (erun::ReduceOp,
erun::DataType).
"""
from ._preload import load_environment_cuda_libraries as _load_cuda

_load_cuda()  # before _erun: see erun/_preload.py
from ._erun import CommError, DataType, Error, HostsUpdated, ReduceOp, StateLost
from ._core import (Average, Max, Min, Product, Sum, allgather, allgather_object, allreduce, allreduce_,
                    barrier, broadcast_, broadcast_object, cross_rank, cross_size, data_type, elastic,
                    generation, host, init, initialized, local_rank, local_size, rank, reduce_scatter, shutdown,
                    size)
from ._state import State, run, shard_rows

__all__ = [
    "Error", "CommError", "HostsUpdated", "StateLost", "init", "initialized", "shutdown", "rank", "size", "local_rank",
    "local_size", "cross_rank", "cross_size", "generation", "host", "elastic", "allreduce", "allreduce_",
    "broadcast_", "allgather", "reduce_scatter", "barrier", "broadcast_object", "allgather_object", "ReduceOp", "DataType",
    "data_type", "Sum", "Average", "Min", "Max", "Product", "State", "run", "shard_rows",
]
__version__ = "0.1.0"
