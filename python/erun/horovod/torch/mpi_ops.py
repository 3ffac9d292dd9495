"""Horovod's PyTorch collectives (``horovod.torch.mpi_ops``) over erun's.

Every operation, synchronous or not, runs in the order the program issued
it, as collectives must: an ``*_async`` call queues its operation on one
communication thread and returns a handle (``synchronize(handle)`` waits for
it and returns its result, ``poll(handle)`` says whether it is done); a
synchronous call waits until the queue is empty and then runs on the
caller's thread (no hand-over when nothing is queued). erun's collectives
release the GIL, so queued operations overlap with the program's Python.
"""
from __future__ import annotations

import collections
import os
import threading
import time
import warnings
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from erun import _core, _erun
from erun._erun import ReduceOp
from ..common.exceptions import HostsUpdatedInterrupt, translated

# Reduction operators, as Horovod names them. Adasum has no erun kernel: it is
# refused by name wherever an op is taken.
Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


class _AdasumOp:
    def __repr__(self) -> str:
        return "Adasum"


Adasum: Any = _AdasumOp()

ADASUM_REFUSED = ("erun.horovod: op=hvd.Adasum is not supported: erun reduces with Average, Sum, Min, Max or "
                  "Product; use op=hvd.Average (Horovod's default)")


class Handle:
    """An operation queued by an ``*_async`` call."""

    def __init__(self, name: Optional[str]) -> None:
        self.name = name
        self._done = threading.Event()
        self._result: Any = None
        self._error: Optional[BaseException] = None

    def _finish(self, result: Any, error: Optional[BaseException]) -> None:
        self._result, self._error = result, error
        self._done.set()


class _CommThread:
    """The process's queue of collectives and the thread that runs them.

    One lock (``_exec``) is held while any collective runs, queued or not.
    The thread takes the queue's head only while it holds ``_exec``; a
    synchronous call waits until the queue is empty, then takes ``_exec``:
    so operations run in the order they were issued, and a synchronous call
    with nothing queued costs one uncontended lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _queue and _pending_names
        self._queued = threading.Condition(self._lock)
        self._emptied = threading.Condition(self._lock)
        self._exec = threading.Lock()
        self._queue: Deque[Tuple[Callable[[], Any], Handle]] = collections.deque()
        self._thread: Optional[threading.Thread] = None
        self._pending_names: Dict[str, Handle] = {}

    def submit(self, fn: Callable[[], Any], name: Optional[str] = None) -> Handle:
        handle = Handle(name)
        with self._lock:
            if name is not None:
                if name in self._pending_names:
                    raise ValueError(f"erun.horovod: an operation named '{name}' is already pending; "
                                     "synchronize() it first or give this one another name")
                self._pending_names[name] = handle
            self._queue.append((fn, handle))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="erun-horovod", daemon=True)
                self._thread.start()
            self._queued.notify()
        return handle

    def call(self, fn: Callable[[], Any]) -> Any:
        """Runs fn on this thread once every queued operation has run."""
        if self._queue:
            with self._lock:
                while self._queue:
                    self._emptied.wait()
        with self._exec:
            return fn()

    def drain(self) -> None:
        """Returns when every queued operation has run (their errors stay in their handles)."""
        self.call(lambda: None)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    self._queued.wait()
            with self._exec:
                with self._lock:
                    fn, handle = self._queue.popleft()
                result: Any = None
                error: Optional[BaseException] = None
                try:
                    result = fn()
                except BaseException as e:  # handed to synchronize()
                    error = e
                with self._lock:
                    if handle.name is not None:
                        self._pending_names.pop(handle.name, None)
                    if not self._queue:
                        self._emptied.notify_all()
            handle._finish(result, error)


_comm = _CommThread()


def comm_thread() -> _CommThread:
    """The process's queue of collectives (package-internal: the optimizer and
    the elastic state run their collectives through it)."""
    return _comm


def synchronize(handle: Handle) -> Any:
    """Waits for the operation and returns its result (raises its error)."""
    if not isinstance(handle, Handle):
        raise ValueError(f"erun.horovod: synchronize() takes a handle from an *_async call, not "
                         f"{type(handle).__name__}")
    handle._done.wait()
    if handle._error is not None:
        raise _with_name(handle._error, handle.name) from handle._error
    return handle._result


def poll(handle: Handle) -> bool:
    """True once the operation is done (synchronize() then returns at once)."""
    return handle._done.is_set()


def _with_name(exc: BaseException, name: Optional[str]) -> BaseException:
    """erun's error, translated to Horovod's, naming the operation when it has a name."""
    t = translated(exc)
    if name and isinstance(t, _erun.Error) and not isinstance(t, HostsUpdatedInterrupt):
        t = type(t)(f"{t} (the operation named '{name}')")  # erun's errors take their message alone
    return t


def _sync(fn: Callable[[], Any], name: Optional[str] = None) -> Any:
    try:
        return _comm.call(fn)
    except BaseException as e:
        t = _with_name(e, name)
        if t is e:
            raise
        raise t from e


# --- start-up and topology ----------------------------------------------------

def init(comm: Optional[Any] = None, process_sets: Optional[Any] = None) -> None:
    """Connects to the launcher (erun's driver, MPI, or a world of one)."""
    if comm is not None and not (isinstance(comm, (list, tuple)) and sorted(comm) == list(range(len(comm)))):
        raise ValueError("erun.horovod: init(comm=...) with an MPI sub-communicator is not supported; "
                         "call hvd.init() (the whole job)")
    if process_sets:
        raise ValueError("erun.horovod: process sets are not supported; every collective spans the whole job")
    _core.init()


def shutdown() -> None:
    """Leaves the job (after the queued operations)."""
    if _erun.initialized():
        _comm.drain()
        _core.shutdown()


def is_initialized() -> bool:
    return _core.initialized()


def size() -> int:
    return _core.size()


def rank() -> int:
    return _core.rank()


def local_size() -> int:
    return _core.local_size()


def local_rank() -> int:
    return _core.local_rank()


def cross_size() -> int:
    return _core.cross_size()


def cross_rank() -> int:
    return _core.cross_rank()


def _launched_by_mpi() -> bool:
    # The rule of launched_by_mpi() in src/worker/mpi_context.cc, which erun.init() follows; liberun's
    # public API has no accessor for it.
    env = os.environ
    if env.get("ERUN_RDZV_ADDR"):
        return False
    if env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE") or env.get("PMIX_RANK"):
        return True
    return bool(env.get("SLURM_PROCID")) and int(env.get("SLURM_NTASKS", "0") or 0) > 1


def mpi_built() -> bool:
    """True when this erun was built with MPI (it then runs under mpirun/srun)."""
    return _erun.built_with_mpi()


def mpi_enabled() -> bool:
    """True when this process runs under MPI (mpirun or srun), not erun's driver."""
    return mpi_built() and _launched_by_mpi()


def mpi_threads_supported() -> bool:
    """False: erun starts MPI with MPI_THREAD_SERIALIZED, not MPI_THREAD_MULTIPLE."""
    return False


def gloo_built() -> bool:
    """True: erun links Gloo (one of its transports between hosts)."""
    return True


def gloo_enabled() -> bool:
    """False: under erun's driver the workers reduce over erun's own shared
    memory and TCP transports, not Horovod's Gloo controller."""
    return False


def nccl_built() -> bool:
    return _erun.built_with_nccl()


def cuda_built() -> bool:
    return _erun.built_with_cuda()


def rocm_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


_timeline_warned = False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Not supported: warns once and does nothing (erun --event-log and erun
    report give the job's history)."""
    global _timeline_warned
    if not _timeline_warned:
        warnings.warn("erun.horovod: the Horovod timeline is not supported (ignored); erun --event-log FILE "
                      "and `erun report FILE` show the job's history", stacklevel=2)
        _timeline_warned = True


def stop_timeline() -> None:
    """Not supported (see start_timeline)."""


# --- operators and arguments --------------------------------------------------

def _op_of(op: Any, average: Optional[bool]) -> ReduceOp:
    if op is not None and average is not None:
        raise ValueError("erun.horovod: the op parameter supersedes average; give only one of them")
    if op is None:
        return Average if average is None or average else Sum
    if op is Adasum:
        raise NotImplementedError(ADASUM_REFUSED)
    return _core._reduce_op(op)


def _check_process_set(process_set: Any) -> None:
    if process_set is not None and process_set is not global_process_set:
        raise ValueError("erun.horovod: process sets are not supported; leave process_set out")


class _GlobalProcessSet:
    """Horovod's global process set: the whole job (the only one erun has)."""
    process_set_id = 0

    def size(self) -> int:
        return size()

    def rank(self) -> int:
        return rank()

    def __repr__(self) -> str:
        return "global_process_set"


global_process_set = _GlobalProcessSet()


def _scaled_reduce_(t: torch.Tensor, op: ReduceOp, prescale: float, postscale: float) -> torch.Tensor:
    """Reduces t in place, multiplied by prescale before and postscale after."""
    if prescale == 1.0 and postscale == 1.0:
        return _core.allreduce_(t, op)
    if not (t.is_floating_point() or t.is_complex()):
        raise ValueError(f"erun.horovod: prescale_factor/postscale_factor need a floating-point tensor, "
                         f"not {t.dtype}")
    if prescale != 1.0:
        t.mul_(prescale)
    _core.allreduce_(t, op)
    if postscale != 1.0:
        t.mul_(postscale)
    return t


def _contiguous_copy(t: torch.Tensor) -> torch.Tensor:
    return (t.detach() if t.requires_grad else t).clone(memory_format=torch.contiguous_format)


def _reduce_into_(t: torch.Tensor, op: ReduceOp, prescale: float, postscale: float) -> torch.Tensor:
    """In place on t, through a contiguous copy when t is not contiguous."""
    if t.is_contiguous():
        return _scaled_reduce_(t, op, prescale, postscale)
    t.copy_(_scaled_reduce_(_contiguous_copy(t), op, prescale, postscale))
    return t


# --- allreduce ------------------------------------------------------------------

class _Allreduce(torch.autograd.Function):
    """Out-of-place allreduce that autograd sees through (its gradient is
    the allreduce of the output's gradient, as Horovod's)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: ReduceOp, prescale: float,  # type: ignore[override]
                postscale: float) -> torch.Tensor:
        ctx.args = (op, prescale, postscale)
        return _scaled_reduce_(_contiguous_copy(tensor), op, prescale, postscale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None, None]:  # type: ignore[override]
        return _sync(lambda: _scaled_reduce_(_contiguous_copy(grad), *ctx.args)), None, None, None


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, device_dense: str = "", device_sparse: str = "",
              compression: Any = None, op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: Optional[str] = None, process_set: Any = global_process_set) -> torch.Tensor:
    """Returns the reduction (average by default) of tensor over all ranks; tensor is unchanged."""
    rop = _op_of(op, average)
    _check_process_set(process_set)
    if compression is not None:
        compressed, ctx = compression.compress(tensor)
        out = _sync(lambda: _scaled_reduce_(_contiguous_copy(compressed), rop, prescale_factor, postscale_factor),
                    name)
        return compression.decompress(out, ctx)  # type: ignore[no-any-return]
    if tensor.requires_grad and torch.is_grad_enabled():
        out = _sync(lambda: _Allreduce.apply(tensor, rop, float(prescale_factor),  # type: ignore[no-untyped-call]
                                             float(postscale_factor)), name)
        return out  # type: ignore[no-any-return]
    return _sync(lambda: _scaled_reduce_(_contiguous_copy(tensor), rop, prescale_factor,  # type: ignore[no-any-return]
                                         postscale_factor), name)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: Any = global_process_set) -> torch.Tensor:
    """Reduces tensor over all ranks in place and returns it."""
    rop = _op_of(op, average)
    _check_process_set(process_set)
    return _sync(lambda: _reduce_into_(tensor, rop, prescale_factor, postscale_factor),  # type: ignore[no-any-return]
                 name)


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = global_process_set) -> Handle:
    """Queues an out-of-place allreduce; synchronize(handle) returns the result."""
    rop = _op_of(op, average)
    _check_process_set(process_set)
    work = _contiguous_copy(tensor)
    return _comm.submit(lambda: _scaled_reduce_(work, rop, prescale_factor, postscale_factor), name)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Any = global_process_set) -> Handle:
    """Queues an in-place allreduce of tensor; synchronize(handle) returns tensor."""
    rop = _op_of(op, average)
    _check_process_set(process_set)
    return _comm.submit(lambda: _reduce_into_(tensor, rop, prescale_factor, postscale_factor), name)


def _grouped_reduce_(tensors: Sequence[torch.Tensor], op: ReduceOp, prescale: float, postscale: float) -> None:
    """Reduces every tensor in place: one collective per device and dtype."""
    groups: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    for ts in groups.values():
        flat = torch.cat([t.detach().reshape(-1) for t in ts])
        _scaled_reduce_(flat, op, prescale, postscale)
        offset = 0
        for t in ts:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, device_dense: str = "",
                      device_sparse: str = "", compression: Any = None, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0, name: Optional[str] = None,
                      process_set: Any = global_process_set) -> List[torch.Tensor]:
    """Returns the reductions of a list of tensors, reduced together."""
    rop = _op_of(op, average)
    _check_process_set(process_set)
    if compression is not None:
        pairs = [compression.compress(t) for t in tensors]
        out = [_contiguous_copy(c) for c, _ in pairs]
        _sync(lambda: _grouped_reduce_(out, rop, prescale_factor, postscale_factor), name)
        return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, pairs)]
    out = [_contiguous_copy(t) for t in tensors]
    _sync(lambda: _grouped_reduce_(out, rop, prescale_factor, postscale_factor), name)
    return out


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = global_process_set) -> List[torch.Tensor]:
    """Reduces a list of tensors together, in place; returns them."""
    rop = _op_of(op, average)
    _check_process_set(process_set)
    _sync(lambda: _grouped_reduce_(tensors, rop, prescale_factor, postscale_factor), name)
    return list(tensors)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Any = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set: Any = global_process_set) -> Handle:
    rop = _op_of(op, average)
    _check_process_set(process_set)
    out = [_contiguous_copy(t) for t in tensors]

    def run() -> List[torch.Tensor]:
        _grouped_reduce_(out, rop, prescale_factor, postscale_factor)
        return out
    return _comm.submit(run, name)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Any = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set: Any = global_process_set) -> Handle:
    rop = _op_of(op, average)
    _check_process_set(process_set)

    def run() -> List[torch.Tensor]:
        _grouped_reduce_(tensors, rop, prescale_factor, postscale_factor)
        return list(tensors)
    return _comm.submit(run, name)


# --- allgather, broadcast, alltoall ---------------------------------------------

def _allgather(tensor: torch.Tensor) -> torch.Tensor:
    return _core.allgather(tensor.detach().contiguous())


def _first_dims(n: int) -> List[int]:
    rows = np.array([n], dtype=np.int64)
    return [int(r) for r in _core.allgather(rows)]


class _Allgather(torch.autograd.Function):
    """Its gradient is this rank's rows of the sum of every rank's output gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        return _allgather(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        def run() -> torch.Tensor:
            summed = _scaled_reduce_(_contiguous_copy(grad), Sum, 1.0, 1.0)
            begin = sum(_first_dims(ctx.rows)[:rank()])
            return summed[begin:begin + ctx.rows]
        return _sync(run)  # type: ignore[no-any-return]


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: Any = global_process_set) -> torch.Tensor:
    """Concatenates every rank's tensor along the first dimension, by rank
    (the first dimension may differ between ranks)."""
    _check_process_set(process_set)
    return _sync(lambda: _Allgather.apply(tensor), name)  # type: ignore[no-untyped-call, no-any-return]


def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: Any = global_process_set) -> Handle:
    _check_process_set(process_set)
    work = _contiguous_copy(tensor)
    return _comm.submit(lambda: _allgather(work), name)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: Any = global_process_set) -> List[torch.Tensor]:
    _check_process_set(process_set)
    return _sync(lambda: [_allgather(t) for t in tensors], name)  # type: ignore[no-any-return]


def _broadcast_into_(t: torch.Tensor, root: int) -> torch.Tensor:
    if t.is_contiguous():
        return _core.broadcast_(t, root)
    t.copy_(_core.broadcast_(_contiguous_copy(t), root))
    return t


class _Broadcast(torch.autograd.Function):
    """Its gradient is the sum of every rank's output gradient, on the root (zero elsewhere)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root: int) -> torch.Tensor:  # type: ignore[override]
        ctx.root = root
        return _core.broadcast_(_contiguous_copy(tensor), root)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:  # type: ignore[override]
        summed = _sync(lambda: _scaled_reduce_(_contiguous_copy(grad), Sum, 1.0, 1.0))
        if rank() != ctx.root:
            summed.zero_()
        return summed, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: Any = global_process_set) -> torch.Tensor:
    """Returns root_rank's tensor on every rank; tensor is unchanged."""
    _check_process_set(process_set)
    return _sync(lambda: _Broadcast.apply(tensor, int(root_rank)),  # type: ignore[no-untyped-call, no-any-return]
                 name)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: Any = global_process_set) -> torch.Tensor:
    """Overwrites tensor with root_rank's, in place; returns it."""
    _check_process_set(process_set)
    return _sync(lambda: _broadcast_into_(tensor, int(root_rank)), name)  # type: ignore[no-any-return]


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: Any = global_process_set) -> Handle:
    _check_process_set(process_set)
    work = _contiguous_copy(tensor)
    return _comm.submit(lambda: _core.broadcast_(work, int(root_rank)), name)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: Any = global_process_set) -> Handle:
    _check_process_set(process_set)
    return _comm.submit(lambda: _broadcast_into_(tensor, int(root_rank)), name)


def _alltoall(tensor: torch.Tensor, splits: Optional[Any]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sends rows [sum(splits[:j]), +splits[j]) of tensor to rank j; returns
    what every rank sent here, by rank, and how many rows each sent. Runs
    over one allgatherv of every rank's tensor (erun has no native
    all-to-all): each rank receives every rank's whole tensor."""
    n = size()
    t = tensor.detach().contiguous()
    rows = t.shape[0] if t.dim() else 1
    if splits is None:
        if rows % n:
            raise ValueError(f"erun.horovod: alltoall without splits needs a first dimension ({rows}) divisible "
                             f"by the world size ({n})")
        sp = [rows // n] * n
    else:
        sp = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(sp) != n or sum(sp) != rows or min(sp) < 0:
            raise ValueError(f"erun.horovod: alltoall splits {sp} must give {n} non-negative row counts "
                             f"summing to the tensor's first dimension ({rows})")
    payload = np.asarray(sp, dtype=np.int64).tobytes() + _core.bytes_of(t.cpu()).tobytes()
    parts = _erun.allgatherv(payload)
    row_bytes = t[0].numel() * t.element_size() if rows else 0
    me = rank()
    pieces, received = [], []
    for part in parts:
        their = np.frombuffer(part[:8 * n], dtype=np.int64)
        begin = int(their[:me].sum()) * row_bytes
        count = int(their[me])
        received.append(count)
        pieces.append(np.frombuffer(part, dtype=np.uint8, count=count * row_bytes, offset=8 * n + begin))
    flat = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.uint8)
    out = torch.from_numpy(flat.copy()).view(t.dtype).reshape((sum(received),) + tuple(t.shape[1:]))
    return out.to(t.device), torch.tensor(received, dtype=torch.int32)


def alltoall(tensor: torch.Tensor, splits: Optional[Any] = None, name: Optional[str] = None,
             process_set: Any = global_process_set) -> Any:
    """Scatters the rows of tensor to the ranks (splits[j] rows to rank j;
    equal parts without splits) and gathers what they sent here. Returns
    the gathered tensor, and with splits also the rows received from each
    rank (as Horovod)."""
    _check_process_set(process_set)
    return _sync(lambda: _alltoall_result(tensor, splits), name)


def alltoall_async(tensor: torch.Tensor, splits: Optional[Any] = None, name: Optional[str] = None,
                   process_set: Any = global_process_set) -> Handle:
    _check_process_set(process_set)
    work = _contiguous_copy(tensor)
    return _comm.submit(lambda: _alltoall_result(work, splits), name)


def _alltoall_result(tensor: torch.Tensor, splits: Optional[Any]) -> Any:
    """Horovod's result: the gathered tensor, and with splits the rows received from each rank too."""
    out, received = _alltoall(tensor, splits)
    return (out, received) if splits is not None else out


# --- reducescatter -------------------------------------------------------------------

def _reducescatter(t: torch.Tensor, op: ReduceOp, prescale: float, postscale: float) -> torch.Tensor:
    work = t.detach().contiguous().cpu()  # only read: no copy of a contiguous CPU tensor
    if prescale != 1.0:
        work = work * prescale
    out = _core.reduce_scatter(work, op, split="even").to(t.device)
    if postscale != 1.0:
        out.mul_(postscale)
    return out


def reducescatter(tensor: torch.Tensor, op: Any = Average, name: Optional[str] = None,
                  process_set: Any = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduces tensor over all ranks and returns this rank's rows of the
    result: the first dimension split as evenly as it goes, the first
    (rows % size) ranks one row more. tensor is unchanged."""
    rop = _op_of(op, None)
    _check_process_set(process_set)
    return _sync(lambda: _reducescatter(tensor, rop, prescale_factor, postscale_factor),  # type: ignore[no-any-return]
                 name)


def reducescatter_async(tensor: torch.Tensor, op: Any = Average, name: Optional[str] = None,
                        process_set: Any = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Handle:
    rop = _op_of(op, None)
    _check_process_set(process_set)
    work = _contiguous_copy(tensor)
    return _comm.submit(lambda: _reducescatter(work, rop, prescale_factor, postscale_factor), name)


# --- barrier and join -------------------------------------------------------------

def barrier(process_set: Any = global_process_set) -> None:
    """Returns when every rank has called it."""
    _check_process_set(process_set)
    _sync(_core.barrier)


def join(device: int = -1) -> int:
    """Every rank calls it when it has no more data; returns the rank that
    called it last. Unlike Horovod's, a rank that joins does not stand in
    for the others' remaining collectives (with zeros): every rank must
    call join() after the same collectives, as erun's ElasticSampler's equal
    steps give; a rank that joins while another still reduces gets erun's
    collective-mismatch error naming both calls."""
    when = time.time()

    def run() -> int:
        times = _core.allgather(np.array([when], dtype=np.float64))
        return int(np.argmax(times))
    return _sync(run)  # type: ignore[no-any-return]

