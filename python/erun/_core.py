"""The process-wide worker API: init, world info, and collectives on torch
tensors (CPU and CUDA) and numpy arrays. Collectives run on the tensor's own
memory (its data pointer goes to the C++ communicator; the GIL is released
meanwhile); CUDA tensors go through erun's GPU collectives (NCCL, or the
host-staged path when ranks share a GPU) on torch's current stream of the
tensor's device, and the call returns when the result is in the tensor. Every
collective must be called by every rank in the same order; each is bounded by
the collective timeout (erun --collective-timeout) and raises erun.CommError
when a peer dies or the deadline passes."""
import os
import pickle
import sys

import numpy as np

from . import _erun
from ._erun import Error

# Reduction operators (the codes of erun::ReduceOp).
Sum, Average, Min, Max, Product = 0, 1, 2, 3, 4
_OP_NAMES = {"sum": Sum, "average": Average, "avg": Average, "mean": Average, "min": Min, "max": Max,
             "product": Product, "prod": Product}

# erun::DataType codes.
_F32, _F64, _I32, _I64, _U8, _F16, _BF16 = range(7)
_NUMPY_TYPES = {np.dtype(np.float32): _F32, np.dtype(np.float64): _F64, np.dtype(np.int32): _I32,
                np.dtype(np.int64): _I64, np.dtype(np.uint8): _U8, np.dtype(np.float16): _F16}
_torch_types = None  # torch dtype -> code, filled on the first torch tensor


def _torch_type_map():
    global _torch_types
    if _torch_types is None:
        import torch
        _torch_types = {torch.float32: _F32, torch.float64: _F64, torch.int32: _I32, torch.int64: _I64,
                        torch.uint8: _U8, torch.float16: _F16, torch.bfloat16: _BF16}
    return _torch_types


def _is_tensor(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


class _Buffer:
    """A collective's view of a tensor or array: address, element count, type
    code, and for a CUDA tensor (cuda=True) its device index and the integer
    handle of torch's current stream on that device."""
    __slots__ = ("ptr", "count", "code", "nbytes", "device", "stream")

    def __init__(self, x, what, writable, cuda=False):
        self.device = self.stream = None
        if _is_tensor(x):
            if x.device.type == "cuda" and cuda:
                if not _erun.built_with_cuda():
                    raise Error(f"erun.{what}: this build of erun has no CUDA (it was built without the CUDA "
                                f"toolkit), so it cannot reduce a tensor on {x.device}; rebuild erun with CUDA "
                                f"or move the tensor to the CPU first (tensor.cpu())")
                import torch
                self.device = x.device.index if x.device.index is not None else torch.cuda.current_device()
                self.stream = torch.cuda.current_stream(self.device).cuda_stream
            elif x.device.type != "cpu":
                kinds = "CPU and CUDA" if cuda else "CPU"
                raise Error(f"erun.{what}: takes {kinds} tensors only (got a tensor on {x.device}); move it to "
                            f"the CPU first (tensor.cpu())")
            code = _torch_type_map().get(x.dtype)
            if code is None:
                raise Error(f"erun.{what}: dtype {x.dtype} is not supported; use float32/64, int32/64, uint8, "
                            f"float16 or bfloat16")
            if not x.is_contiguous():
                raise Error(f"erun.{what}: the tensor is not contiguous; call .contiguous() first (the "
                            f"collective works on the tensor's own memory)")
            self.ptr, self.count, self.nbytes = x.data_ptr(), x.numel(), x.numel() * x.element_size()
        elif isinstance(x, np.ndarray):
            code = _NUMPY_TYPES.get(x.dtype)
            if code is None:
                raise Error(f"erun.{what}: dtype {x.dtype} is not supported; use float32/64, int32/64, uint8 or "
                            f"float16")
            if not x.flags["C_CONTIGUOUS"]:
                raise Error(f"erun.{what}: the array is not C-contiguous; use np.ascontiguousarray() first")
            if writable and not x.flags["WRITEABLE"]:
                raise Error(f"erun.{what}: the array is read-only")
            self.ptr, self.count, self.nbytes = x.ctypes.data, x.size, x.nbytes
        else:
            raise Error(f"erun.{what}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
        self.code = code


def _op_code(op):
    if isinstance(op, str):
        code = _OP_NAMES.get(op.lower())
        if code is None:
            raise Error(f"erun: unknown reduce op '{op}'; use one of sum, average, min, max, product")
        return code
    if op not in (Sum, Average, Min, Max, Product):
        raise Error(f"erun: unknown reduce op {op!r}; use erun.Sum, Average, Min, Max or Product")
    return op


def _copy(x):
    if _is_tensor(x):
        import torch
        return x.clone(memory_format=torch.contiguous_format)
    if isinstance(x, np.ndarray):
        return np.array(x, order="C", copy=True)
    raise Error(f"erun: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def init():
    """Connects to the launcher (the erun driver, MPI, or nothing: a world of
    one). Idempotent. Raises erun.Error when the environment is inconsistent.
    Under the erun driver an uncaught exception other than CommError or
    HostsUpdated ends the process with erun's fatal exit code, after the
    usual traceback, so that the driver ends the job instead of retrying an
    error that would repeat."""
    if _erun.initialized():
        return
    _erun.init()
    if _erun.elastic() and not getattr(sys.excepthook, "_erun", False):
        sys.excepthook = _fatal_hook(sys.excepthook)


def _fatal_hook(previous):
    def hook(tp, value, tb):
        previous(tp, value, tb)
        if issubclass(tp, (_erun.CommError, _erun.HostsUpdated, KeyboardInterrupt)):
            return
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(_erun.FATAL_EXIT_CODE)
    hook._erun = True
    return hook


initialized = _erun.initialized


def shutdown():
    """Leaves the job (optional; also done at exit)."""
    _erun.shutdown()


def _info():
    return _erun.info()


def rank():
    return _info()["rank"]


def size():
    return _info()["size"]


def local_rank():
    return _info()["local_rank"]


def local_size():
    return _info()["local_size"]


def cross_rank():
    return _info()["cross_rank"]


def cross_size():
    return _info()["cross_size"]


def generation():
    """The generation (membership epoch) this worker is in; grows on every re-join."""
    return _info()["generation"]


def host():
    return _info()["host"]


def elastic():
    """True under the erun driver (the world can change), False under MPI or alone."""
    return _erun.elastic()


def allreduce_(x, op=Average):
    """Reduces x across ranks in place (x's own memory) and returns x.
    float16/bfloat16 are reduced through a float32 copy (the CPU kernels have
    no half precision)."""
    b = _Buffer(x, "allreduce_", writable=True, cuda=True)
    code = _op_code(op)
    if b.code in (_F16, _BF16):
        wide = x.float() if _is_tensor(x) else x.astype(np.float32)
        allreduce_(wide, code)
        if _is_tensor(x):
            x.copy_(wide)
        else:
            x[...] = wide
        return x
    if b.device is not None:
        _erun.gpu_allreduce(b.ptr, b.count, b.code, code, b.stream, b.device)
    else:
        _erun.allreduce(b.ptr, b.count, b.code, code)
    return x


def allreduce(x, op=Average):
    """Out of place: returns a new tensor/array with the reduction; x is unchanged."""
    return allreduce_(_copy(x), op)


def broadcast_(x, root=0):
    """Overwrites x on every rank with root's x (in place) and returns x."""
    b = _Buffer(x, "broadcast_", writable=True, cuda=True)
    if b.device is not None:
        _erun.gpu_broadcast(b.ptr, b.nbytes, int(root), b.stream, b.device)
    else:
        _erun.broadcast(b.ptr, b.nbytes, int(root))
    return x


def allgather(x):
    """Concatenates every rank's x along the first dimension, by rank. The
    first dimension may differ between ranks; the others must match."""
    b = _Buffer(x, "allgather", writable=False, cuda=True)
    shape = tuple(x.shape)
    n = size()
    if len(shape) == 0:
        x, shape = x.reshape(1), (1,)
    firsts = np.zeros(n, dtype=np.int64)
    mine = np.array([shape[0]], dtype=np.int64)
    _erun.allgather(mine.ctypes.data, firsts.ctypes.data, 8)
    rows = int(firsts.sum())
    if _is_tensor(x):
        import torch
        out = torch.empty((rows,) + shape[1:], dtype=x.dtype, device=x.device)
    else:
        out = np.empty((rows,) + shape[1:], dtype=x.dtype)
    if b.device is not None:
        if not (firsts == shape[0]).all():  # uneven rows: through the CPU
            return allgather(x.cpu()).to(x.device)
        _erun.gpu_allgather(b.ptr, out.data_ptr(), b.nbytes, b.stream, b.device)
        return out
    if (firsts == shape[0]).all():
        _erun.allgather(b.ptr, _Buffer(out, "allgather", True).ptr, b.nbytes)
        return out
    parts = _erun.allgatherv(_bytes_of(x).tobytes())
    _bytes_of(out)[:] = np.frombuffer(b"".join(parts), dtype=np.uint8)
    return out


def _bytes_of(x):
    """A flat uint8 numpy view of a contiguous CPU tensor or array."""
    if _is_tensor(x):
        import torch
        return x.reshape(-1).view(torch.uint8).numpy()
    return x.reshape(-1).view(np.uint8)


def barrier():
    _erun.barrier()


def broadcast_object(obj, root=0):
    """Returns root's obj (pickled) on every rank."""
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if rank() == root else None
    n = np.array([len(data) if data is not None else 0], dtype=np.int64)
    broadcast_(n, root)
    buf = data.copy() if data is not None else np.empty(int(n[0]), dtype=np.uint8)
    broadcast_(buf, root)
    return pickle.loads(buf.tobytes()) if rank() != root else obj


def allgather_object(obj):
    """Returns the list of every rank's obj (pickled), by rank."""
    return [pickle.loads(p) for p in _erun.allgatherv(pickle.dumps(obj))]
