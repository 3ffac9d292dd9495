"""The process-wide worker API: init, world info, and collectives on torch
tensors (CPU and CUDA) and numpy arrays. Collectives run on the tensor's own
memory (its data pointer goes to the C++ communicator; the GIL is released
meanwhile); CUDA tensors go through erun's GPU collectives (NCCL, or the
host-staged path when ranks share a GPU) on torch's current stream of the
tensor's device, and the call returns when the result is in the tensor. Every
collective must be called by every rank in the same order; each is bounded by
the collective timeout (erun --collective-timeout) and raises erun.CommError
when a peer dies or the deadline passes.

Package-internal (used by erun._state and erun.torch, not exported by
``erun``): ``Buffer`` (a collective's view of a tensor or array) and
``bytes_of`` (a flat uint8 view)."""
from __future__ import annotations

import atexit
import functools
import os
import pickle
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Type, TypeVar, Union, cast

import numpy as np

from . import _erun
from ._erun import DataType, Error, ReduceOp

if TYPE_CHECKING:
    import torch

# Reduction operators: the extension's erun.ReduceOp, under their old names too
# (they compare equal to the integer codes they were).
Sum, Average, Min, Max, Product = ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT
_OPS = {int(op): op for op in ReduceOp.__members__.values()}
_OP_NAMES = {"sum": Sum, "average": Average, "avg": Average, "mean": Average, "min": Min, "max": Max,
             "product": Product, "prod": Product}

_NUMPY_TYPES = {np.dtype(np.float32): DataType.FLOAT32, np.dtype(np.float64): DataType.FLOAT64,
                np.dtype(np.int32): DataType.INT32, np.dtype(np.int64): DataType.INT64,
                np.dtype(np.uint8): DataType.UINT8, np.dtype(np.float16): DataType.FLOAT16}
_HALF = (DataType.FLOAT16, DataType.BFLOAT16)

Tensor = Union["torch.Tensor", np.ndarray]
"""What collectives take: a torch.Tensor or a numpy.ndarray."""
T = TypeVar("T", "torch.Tensor", np.ndarray)
Op = Union[ReduceOp, str, int]
"""A reduction operator: an erun.ReduceOp, its name as a string ("sum",
"average", "avg", "mean", "min", "max", "product", "prod") or its integer code."""


@functools.lru_cache(maxsize=None)
def _torch_types() -> Dict[Any, DataType]:
    """torch dtype -> DataType (built on the first torch tensor: importing erun does not import torch)."""
    import torch
    return {torch.float32: DataType.FLOAT32, torch.float64: DataType.FLOAT64, torch.int32: DataType.INT32,
            torch.int64: DataType.INT64, torch.uint8: DataType.UINT8, torch.float16: DataType.FLOAT16,
            torch.bfloat16: DataType.BFLOAT16}


def _data_type_or_none(dtype: Any) -> Optional[DataType]:
    if dtype is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return _torch_types().get(dtype)
    try:
        return _NUMPY_TYPES.get(np.dtype(dtype))
    except TypeError:
        return None


def data_type(dtype: Any) -> DataType:
    """The erun.DataType of a torch dtype (torch.float32, ...) or of anything
    numpy.dtype() takes (np.float32, "int64", an array's .dtype); erun.Error
    when erun's collectives do not support it."""
    t = _data_type_or_none(dtype)
    if t is None:
        raise Error(f"erun: dtype {dtype} is not supported; use float32/64, int32/64, uint8, float16 or bfloat16 "
                    f"(torch only)")
    return t


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


class Buffer:
    """A collective's view of a tensor or array: address (ptr), element count,
    byte count, erun.DataType (dtype), and for a CUDA tensor (cuda=True) its
    device index and the integer handle of torch's current stream on that
    device (both None otherwise). Raises erun.Error, naming erun.<what>, for
    what a collective cannot take. Package-internal (erun._state, erun.torch)."""
    __slots__ = ("ptr", "count", "dtype", "nbytes", "device", "stream")

    def __init__(self, x: Any, what: str, writable: bool, cuda: bool = False) -> None:
        # x: a tensor or an array, told apart at run time (hence Any).
        self.device: Optional[int] = None
        self.stream: Optional[int] = None
        self.ptr: int
        self.count: int
        self.nbytes: int
        if _is_tensor(x):
            if x.device.type == "cuda" and cuda:
                if not _erun.built_with_cuda():
                    raise Error(f"erun.{what}: this build of erun has no CUDA (it was built without the CUDA "
                                f"toolkit), so it cannot reduce a tensor on {x.device}; rebuild erun with CUDA "
                                f"or move the tensor to the CPU first (tensor.cpu())")
                import torch
                self.device = x.device.index if x.device.index is not None else torch.cuda.current_device()
                self.stream = int(torch.cuda.current_stream(self.device).cuda_stream)
            elif x.device.type != "cpu":
                kinds = "CPU and CUDA" if cuda else "CPU"
                raise Error(f"erun.{what}: takes {kinds} tensors only (got a tensor on {x.device}); move it to "
                            f"the CPU first (tensor.cpu())")
            dtype = _torch_types().get(x.dtype)
            if dtype is None:
                raise Error(f"erun.{what}: dtype {x.dtype} is not supported; use float32/64, int32/64, uint8, "
                            f"float16 or bfloat16")
            if not x.is_contiguous():
                raise Error(f"erun.{what}: the tensor is not contiguous; call .contiguous() first (the "
                            f"collective works on the tensor's own memory)")
            self.ptr, self.count, self.nbytes = x.data_ptr(), x.numel(), x.numel() * x.element_size()
        elif isinstance(x, np.ndarray):
            dtype = _NUMPY_TYPES.get(x.dtype)
            if dtype is None:
                raise Error(f"erun.{what}: dtype {x.dtype} is not supported; use float32/64, int32/64, uint8 or "
                            f"float16")
            if not x.flags["C_CONTIGUOUS"]:
                raise Error(f"erun.{what}: the array is not C-contiguous; use np.ascontiguousarray() first")
            if writable and not x.flags["WRITEABLE"]:
                raise Error(f"erun.{what}: the array is read-only")
            self.ptr, self.count, self.nbytes = x.ctypes.data, x.size, x.nbytes
        else:
            raise Error(f"erun.{what}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
        self.dtype: DataType = dtype


def _reduce_op(op: Op) -> ReduceOp:
    if isinstance(op, str):
        found = _OP_NAMES.get(op.lower())
        if found is None:
            raise Error(f"erun: unknown reduce op '{op}'; use one of sum, average, min, max, product")
        return found
    if isinstance(op, ReduceOp) and int(op) in _OPS:
        return op
    if isinstance(op, int) and op in _OPS:  # the integer codes erun.Sum, ... were
        return _OPS[op]
    raise Error(f"erun: unknown reduce op {op!r}; use an erun.ReduceOp (erun.ReduceOp.SUM, AVERAGE, MIN, MAX, "
                f"PRODUCT; also erun.Sum, Average, Min, Max, Product)")


def _copy(x: T) -> T:
    v: Any = x
    if _is_tensor(v):
        import torch
        return cast(T, v.clone(memory_format=torch.contiguous_format))
    if isinstance(v, np.ndarray):
        out: Any = np.array(v, order="C", copy=True)
        return cast(T, out)
    raise Error(f"erun: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def init() -> None:
    """Connects to the launcher (the erun driver, MPI, or nothing: a world of
    one). Idempotent. Raises erun.Error when the environment is inconsistent.
    Under the erun driver an uncaught exception other than CommError or
    HostsUpdated ends the process with erun's fatal exit code, after the
    usual traceback, so that the driver ends the job instead of retrying an
    error that would repeat."""
    if _erun.initialized():
        return
    _erun.init()
    global _shutdown_registered
    if not _shutdown_registered:
        # Leave the job while the interpreter still runs: before the C
        # runtime's exit handlers, among them the CUDA runtime's teardown,
        # which NCCL and the device state still need.
        atexit.register(_shutdown_at_exit)
        _shutdown_registered = True
    if _erun.elastic() and not getattr(sys.excepthook, "_erun", False):
        sys.excepthook = _fatal_hook(sys.excepthook)


_shutdown_registered = False


def _shutdown_at_exit() -> None:
    if _erun.initialized():
        _erun.shutdown()


_ExceptHook = Callable[[Type[BaseException], BaseException, Optional[TracebackType]], Any]


def _fatal_hook(previous: _ExceptHook) -> _ExceptHook:
    def hook(tp: Type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
        previous(tp, value, tb)
        if issubclass(tp, (_erun.CommError, _erun.HostsUpdated, KeyboardInterrupt)):
            return
        try:
            sys.stdout.flush()
            _write_buffered_stderr()
            sys.stderr.flush()
        finally:
            os._exit(_erun.FATAL_EXIT_CODE)
    setattr(hook, "_erun", True)
    return hook


def _write_buffered_stderr() -> None:
    """A hook that wraps ours may have swapped sys.stderr for a buffer that it
    writes out only after ours returns (torch >= 2.2's init_process_group()
    installs such a hook, for a group the program made itself). Ours does not
    return: write what the buffer holds (the traceback) to the real stderr now."""
    err, real = sys.stderr, sys.__stderr__
    getvalue = getattr(err, "getvalue", None)
    if err is real or real is None or getvalue is None:
        return
    text = getvalue()
    if isinstance(text, str) and text:
        real.write(text)
        real.flush()


def initialized() -> bool:
    """True once init() has connected this worker (and until shutdown())."""
    return _erun.initialized()


def shutdown() -> None:
    """Leaves the job (optional: done at exit, before the C runtime's exit handlers)."""
    _erun.shutdown()


def _info() -> Dict[str, Any]:
    return _erun.info()


def rank() -> int:
    """This worker's rank in the current generation."""
    return int(_info()["rank"])


def size() -> int:
    """The number of ranks in the current generation."""
    return int(_info()["size"])


def local_rank() -> int:
    return int(_info()["local_rank"])


def local_size() -> int:
    return int(_info()["local_size"])


def cross_rank() -> int:
    return int(_info()["cross_rank"])


def cross_size() -> int:
    return int(_info()["cross_size"])


def generation() -> int:
    """The generation (membership epoch) this worker is in; grows on every re-join."""
    return int(_info()["generation"])


def host() -> str:
    return str(_info()["host"])


def elastic() -> bool:
    """True under the erun driver (the world can change), False under MPI or alone."""
    return _erun.elastic()


def allreduce_(x: T, op: Op = Average) -> T:
    """Reduces x across ranks in place (x's own memory) and returns x.
    float16/bfloat16 are reduced through a float32 copy (the CPU kernels have
    no half precision)."""
    b = Buffer(x, "allreduce_", writable=True, cuda=True)
    rop = _reduce_op(op)
    if b.dtype in _HALF:
        v: Any = x
        wide = v.float() if _is_tensor(v) else v.astype(np.float32)
        allreduce_(wide, rop)
        if _is_tensor(v):
            v.copy_(wide)
        else:
            v[...] = wide
        return x
    if b.device is not None and b.stream is not None:
        _erun.gpu_allreduce(b.ptr, b.count, b.dtype, rop, b.stream, b.device)
    else:
        _erun.allreduce(b.ptr, b.count, b.dtype, rop)
    return x


def allreduce(x: T, op: Op = Average) -> T:
    """Out of place: returns a new tensor/array with the reduction; x is unchanged."""
    return allreduce_(_copy(x), op)


def reduce_scatter(x: T, op: Op = Average, split: str = "chunk") -> T:
    """Reduces x (the same shape on every rank) across ranks and returns
    this rank's rows of the result, a new tensor/array: the rows [begin,
    end) of x's first dimension that erun.shard_rows(rows, rank, size,
    split) names ("chunk": as torch.chunk and FSDP2's Shard(0); "even": the
    first rows % size ranks one more row). Each rank receives only its rows
    (shared memory, TCP and MPI reduce only those). CPU tensors and arrays;
    float16/bfloat16 go through a float32 copy, as allreduce_'s."""
    if split not in ("chunk", "even"):
        raise Error(f"erun.reduce_scatter: split must be 'chunk' or 'even', not {split!r}")
    b = Buffer(x, "reduce_scatter", writable=False)
    v: Any = x
    if len(v.shape) == 0:
        raise Error("erun.reduce_scatter: needs a tensor or array with a first dimension to split, not a scalar")
    rop = _reduce_op(op)
    if b.dtype in _HALF:
        wide = v.float() if _is_tensor(v) else v.astype(np.float32)
        part = reduce_scatter(wide, rop, split)
        return cast(T, part.to(v.dtype) if _is_tensor(v) else part.astype(v.dtype))
    rows, n, me = int(v.shape[0]), size(), rank()
    per_row = b.count // rows if rows else 0
    spans = [_erun.shard_rows(rows, r, n, split == "even") for r in range(n)]
    counts = [(end - begin) * per_row for begin, end in spans]
    shape = (spans[me][1] - spans[me][0],) + tuple(v.shape[1:])
    if _is_tensor(v):
        import torch
        out: Any = torch.empty(shape, dtype=v.dtype)
    else:
        out = np.empty(shape, dtype=v.dtype)
    _erun.reduce_scatter(b.ptr, Buffer(out, "reduce_scatter", writable=True).ptr, counts, b.dtype, rop)
    return cast(T, out)


def broadcast_(x: T, root: int = 0) -> T:
    """Overwrites x on every rank with root's x (in place) and returns x."""
    b = Buffer(x, "broadcast_", writable=True, cuda=True)
    if b.device is not None and b.stream is not None:
        _erun.gpu_broadcast(b.ptr, b.nbytes, int(root), b.stream, b.device)
    else:
        _erun.broadcast(b.ptr, b.nbytes, int(root))
    return x


def allgather(x: T) -> T:
    """Concatenates every rank's x along the first dimension, by rank. The
    first dimension may differ between ranks; the others must match."""
    b = Buffer(x, "allgather", writable=False, cuda=True)
    v: Any = x
    shape = tuple(v.shape)
    n = size()
    if len(shape) == 0:
        v, shape = v.reshape(1), (1,)
    firsts = np.zeros(n, dtype=np.int64)
    mine = np.array([shape[0]], dtype=np.int64)
    _erun.allgather(mine.ctypes.data, firsts.ctypes.data, 8)
    rows = int(firsts.sum())
    out: Any
    if _is_tensor(v):
        import torch
        out = torch.empty((rows,) + shape[1:], dtype=v.dtype, device=v.device)
    else:
        out = np.empty((rows,) + shape[1:], dtype=v.dtype)
    if b.device is not None and b.stream is not None:
        if not (firsts == shape[0]).all():  # uneven rows: through the CPU
            return cast(T, allgather(v.cpu()).to(v.device))
        _erun.gpu_allgather(b.ptr, out.data_ptr(), b.nbytes, b.stream, b.device)
        return cast(T, out)
    if (firsts == shape[0]).all():
        _erun.allgather(b.ptr, Buffer(out, "allgather", True).ptr, b.nbytes)
        return cast(T, out)
    parts = _erun.allgatherv(bytes_of(v).tobytes())
    bytes_of(out)[:] = np.frombuffer(b"".join(parts), dtype=np.uint8)
    return cast(T, out)


def bytes_of(x: Tensor) -> np.ndarray:
    """A flat uint8 numpy view of a contiguous CPU tensor or array. Package-internal."""
    v: Any = x
    if _is_tensor(v):
        import torch
        return cast(np.ndarray, v.reshape(-1).view(torch.uint8).numpy())
    return v.reshape(-1).view(np.uint8)  # type: ignore[no-any-return]


def barrier() -> None:
    """Returns when every rank has called it."""
    _erun.barrier()


def broadcast_object(obj: Any, root: int = 0) -> Any:
    """Returns root's obj (pickled) on every rank."""
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if rank() == root else None
    n = np.array([len(data) if data is not None else 0], dtype=np.int64)
    broadcast_(n, root)
    buf = data.copy() if data is not None else np.empty(int(n[0]), dtype=np.uint8)
    broadcast_(buf, root)
    return pickle.loads(buf.tobytes()) if rank() != root else obj


def allgather_object(obj: Any) -> List[Any]:
    """Returns the list of every rank's obj (pickled), by rank."""
    return [pickle.loads(p) for p in _erun.allgatherv(pickle.dumps(obj))]
