"""``import erun.horovod.torch as hvd``: Horovod's PyTorch API over erun.

A program written for ``horovod.torch`` runs unchanged but for its import,
under ``erun`` (elastic, with the same command line as ``horovodrun``),
under ``mpirun``/``srun``, or alone. What is supported, what differs and
what is not: docs/horovod.md.
"""
from __future__ import annotations

from ..common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from . import elastic
from .compression import Compression
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .mpi_ops import (Adasum, Average, Handle, Max, Min, Product, Sum, allgather, allgather_async, allreduce,
                      allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier, broadcast,
                      broadcast_, broadcast_async, broadcast_async_, ccl_built, cross_rank, cross_size, cuda_built,
                      ddl_built, global_process_set, gloo_built, gloo_enabled, grouped_allgather, grouped_allreduce,
                      grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, init, is_initialized,
                      join, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, poll,
                      rank, reducescatter, reducescatter_async, rocm_built, shutdown, size, start_timeline,
                      stop_timeline, synchronize)
from .optimizer import DistributedOptimizer

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled", "nccl_built", "cuda_built",
    "rocm_built", "ddl_built", "ccl_built", "start_timeline", "stop_timeline",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression", "Handle", "global_process_set",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "synchronize", "poll", "join", "barrier",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "DistributedOptimizer", "elastic", "HorovodInternalError", "HostsUpdatedInterrupt",
]


def __getattr__(name: str) -> object:
    refused = {
        "SyncBatchNorm": "hvd.SyncBatchNorm is not supported; use torch.nn.SyncBatchNorm over "
                         "erun.torch.process_group() (docs/python.md)",
        "ProcessSet": "process sets are not supported; every collective spans the whole job",
        "add_process_set": "process sets are not supported; every collective spans the whole job",
        "remove_process_set": "process sets are not supported; every collective spans the whole job",
        "grouped_reducescatter": "hvd.grouped_reducescatter is not supported yet",
        "sparse_allreduce_async": "sparse allreduce is not supported; pass sparse_as_dense=True",
    }
    if name in refused:
        raise AttributeError(f"erun.horovod.torch: {refused[name]}")
    raise AttributeError(f"module 'erun.horovod.torch' has no attribute '{name}'")
