"""erun.torch: in-place elastic PyTorch training.

- ``TorchState(model=, optimizer=, sampler=, **values)``: an erun.State holding
  the model's state_dict tensors (committed by memcpy of their own memory), the
  optimizer's state (lazily created momentum/Adam buffers included: it is
  serialized as it is at each commit, its tensors as raw bytes), an
  ElasticSampler's position and picklable values.
- ``FSDPState(build, optimizer, sampler=, **values)``: the same for an FSDP2
  (``fully_shard``) model: each rank commits only its pieces, which are
  resharded in memory when the world changes, and the model and optimizer are
  rebuilt over the new mesh (erun/_fsdp.py, docs/python.md "FSDP2").
- ``ElasticSampler``: a torch Sampler over this rank's share of an epoch; every
  sample of an epoch is processed exactly once across resizes and failures.
- ``DistributedOptimizer(opt)`` / ``allreduce_gradients(params)``: gradient
  averaging through erun, in buckets; ``DistributedOptimizer(opt,
  overlap=True)`` / ``GradientHooks``: the same, each bucket reduced on a
  communication thread as soon as backward has produced it; ``with
  GradientHooks(params) as hooks:`` removes the hooks at the end.
- ``process_group()``: a torch.distributed process group for the current
  generation (for DDP and dist.* calls), rebuilt after every re-join;
  ``with ProcessGroup() as pg:`` builds one and destroys it at the end.
"""
from __future__ import annotations

import math
import os
import pickle
import queue
import socket
import sys
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.utils.data

from . import _core, _erun
from ._core import Average, Op, bytes_of
from ._erun import CommError, Error
from ._state import State, running_state

if TYPE_CHECKING:
    import torch.autograd.graph
    import torch.distributed
    import torch.utils.hooks

__all__ = ["TorchState", "FSDPState", "ElasticSampler", "DistributedOptimizer", "GradientHooks", "allreduce_gradients",
           "ProcessGroup", "process_group", "destroy_process_group"]


# An entry's callbacks (erun.State.register_callbacks): save() returns the
# pieces of the commit (bytes-like), load(view) reads them back.
_Save = Callable[[], List[Any]]
_Load = Callable[[memoryview], None]
_TensorRefState = Tuple["torch.dtype", Tuple[int, ...], int, int]


class _TensorRef:
    """Where an optimizer-state tensor lies in a commit's raw section."""
    __slots__ = ("dtype", "shape", "offset", "nbytes")

    def __init__(self, dtype: torch.dtype, shape: Tuple[int, ...], offset: int, nbytes: int) -> None:
        self.dtype, self.shape, self.offset, self.nbytes = dtype, shape, offset, nbytes

    def __getstate__(self) -> _TensorRefState:
        return (self.dtype, self.shape, self.offset, self.nbytes)

    def __setstate__(self, s: _TensorRefState) -> None:
        self.dtype, self.shape, self.offset, self.nbytes = s


def _optimizer_entry(opt: torch.optim.Optimizer) -> Tuple[_Save, _Load]:
    """save/load callbacks of an optimizer's state_dict: a pickled header
    (param_groups, non-tensor state, tensor layout) then the tensors' bytes,
    taken from their own memory without pickling."""

    def save() -> List[Any]:
        sd = opt.state_dict()
        pieces: List[Any] = []
        offset = 0
        state: Dict[int, Dict[str, Any]] = {}
        for idx, entries in sd["state"].items():
            out: Dict[str, Any] = {}
            for key, value in entries.items():
                if isinstance(value, torch.Tensor):
                    t = value.detach()
                    if t.device.type != "cpu" or not t.is_contiguous():
                        t = t.contiguous().cpu()
                    raw = bytes_of(t)
                    out[key] = _TensorRef(t.dtype, tuple(t.shape), offset, raw.nbytes)
                    pieces.append(raw)
                    offset += raw.nbytes
                else:
                    out[key] = value
            state[idx] = out
        header = pickle.dumps({"state": state, "param_groups": sd["param_groups"]}, protocol=5)
        return [len(header).to_bytes(8, "little"), header] + pieces

    def raw(view: memoryview, base: int, ref: _TensorRef) -> torch.Tensor:
        if ref.nbytes == 0:
            return torch.empty(ref.shape, dtype=ref.dtype)
        flat = torch.frombuffer(view, dtype=torch.uint8, count=ref.nbytes, offset=base + ref.offset)
        return flat.view(ref.dtype).reshape(ref.shape)

    def load_in_place(view: memoryview, base: int, header: Dict[str, Any]) -> bool:
        """Copies into the optimizer's current state tensors when the commit has
        the same structure (the usual restore): no allocation."""
        params = [p for group in opt.param_groups for p in group["params"]]
        groups = header["param_groups"]
        if len(groups) != len(opt.param_groups) or any(
                len(g["params"]) != len(og["params"]) for g, og in zip(groups, opt.param_groups)):
            return False
        if set(header["state"]) != {i for i, p in enumerate(params) if p in opt.state}:
            return False
        for idx, entries in header["state"].items():
            current = opt.state[params[idx]]
            if set(entries) != set(current):
                return False
            for key, value in entries.items():
                if isinstance(value, _TensorRef) != isinstance(current[key], torch.Tensor):
                    return False
                if isinstance(value, _TensorRef) and (current[key].dtype != value.dtype or
                                                      tuple(current[key].shape) != value.shape):
                    return False
        with torch.no_grad():
            for idx, entries in header["state"].items():
                current = opt.state[params[idx]]
                for key, value in entries.items():
                    if isinstance(value, _TensorRef):
                        current[key].copy_(raw(view, base, value))
                    else:
                        current[key] = value
        for g, og in zip(groups, opt.param_groups):
            og.update({k: v for k, v in g.items() if k != "params"})
        return True

    def load(view: memoryview) -> None:
        hlen = int.from_bytes(view[:8], "little")
        header: Dict[str, Any] = pickle.loads(view[8:8 + hlen])
        base = 8 + hlen
        if load_in_place(view, base, header):
            return
        state: Dict[int, Dict[str, Any]] = {}
        for idx, entries in header["state"].items():
            out: Dict[str, Any] = {}
            for key, value in entries.items():
                if isinstance(value, _TensorRef):
                    out[key] = raw(view, base, value).clone()
                else:
                    out[key] = value
            state[idx] = out
        opt.load_state_dict({"state": state, "param_groups": header["param_groups"]})

    return save, load


def _tensor_entry(t: torch.Tensor) -> Tuple[_Save, _Load]:
    """save/load callbacks for a model tensor that cannot be registered by
    address (on a GPU, or not contiguous): copied through the CPU."""

    def save() -> List[Any]:
        return [bytes_of(t.detach().contiguous().cpu())]

    def load(view: memoryview) -> None:
        src = torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)
        with torch.no_grad():
            t.copy_(src.view(t.dtype).reshape(t.shape))

    return save, load


def _uncompiled_key(key: str) -> str:
    """A state_dict key without the "_orig_mod." that torch.compile's wrapper
    (OptimizedModule, whose parameters are the wrapped module's) puts in front
    of its module's keys, at any depth (a compiled submodule): a commit's
    entries are named the same whether the compiled or the original module
    was given, so the workers of a job, and a checkpoint, agree."""
    return ".".join(part for part in key.split(".") if part != "_orig_mod")


class TorchState(State):
    """State of a PyTorch training job: ``TorchState(model=m, optimizer=opt,
    sampler=s, epoch=0, ...)``. The model's parameters and buffers must be
    updated in place (as optimizers and load_state_dict do). The model may be
    a ``torch.compile``d module or the module it compiled: both give the same
    entries."""

    def __init__(self, model: Optional[torch.nn.Module] = None,
                 optimizer: Union[torch.optim.Optimizer, DistributedOptimizer, None] = None,
                 sampler: Optional[ElasticSampler] = None, **values: Any) -> None:
        super().__init__(**values)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "optimizer", optimizer)
        object.__setattr__(self, "sampler", sampler)
        if model is not None:
            for key, t in model.state_dict(keep_vars=True).items():
                t = t.detach()
                name = "model/" + _uncompiled_key(key)
                if t.device.type == "cpu" and t.is_contiguous():
                    self.register_buffer(name, t)
                else:
                    self.register_callbacks(name, *_tensor_entry(t))
        if optimizer is not None:
            opt = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
            self.register_callbacks("optimizer", *_optimizer_entry(opt))
        if sampler is not None:
            if not isinstance(sampler, ElasticSampler):
                raise Error(f"erun: TorchState(sampler=) takes an erun.torch.ElasticSampler, got "
                            f"{type(sampler).__name__}")
            sampler.register_with(self)


class ElasticSampler(torch.utils.data.Sampler[int]):
    """This rank's share of an epoch's samples, for a DataLoader (workers
    allowed). ``batch_size`` is the per-rank batch the DataLoader uses; a step
    of all ranks together takes ``batch_size * world size`` samples. After each
    step call ``record_batch()`` (before ``commit()``); ``set_epoch(e)`` starts
    epoch e (calling it again with the same epoch keeps the progress, so a
    loop re-entered after a failure resumes mid-epoch). Ranks must run the
    same number of steps: iterate ``sampler.batches(loader)``, which yields
    None for a rank without a sample in the epoch's last step. Same order and
    split as erun::ElasticSampler (C++)."""

    def __init__(self, dataset: Union[int, Sequence[Any]], batch_size: int = 1, shuffle: bool = True,
                 seed: int = 0) -> None:
        n = dataset if isinstance(dataset, int) else len(dataset)
        if batch_size < 1:
            raise Error(f"erun: ElasticSampler batch_size {batch_size} must be at least 1")
        _core.init()
        self.num_samples = n
        self.batch_size = int(batch_size)
        self._c = _erun.ElasticSampler(n, int(seed), bool(shuffle))
        self._reset_world()

    def _reset_world(self) -> None:
        self._c.reset(_core.rank(), _core.size())

    def register_with(self, state: State, name: str = "erun.sampler") -> None:
        """Commits this sampler's position (epoch, samples processed) in
        `state` and re-splits the epoch over the world after every
        state.sync(). TorchState(sampler=) calls it."""
        self._c.register_with(state.native, name)
        state.on_sync(self._reset_world)

    def set_epoch(self, epoch: int) -> None:
        self._c.set_epoch(int(epoch))

    @property
    def epoch(self) -> int:
        return self._c.epoch

    @property
    def processed(self) -> int:
        """Samples of this epoch already processed by all ranks together."""
        return self._c.processed

    @property
    def remaining(self) -> int:
        return self._c.remaining

    def __iter__(self) -> Iterator[int]:
        return iter(self._c.indices())

    def __len__(self) -> int:
        return len(self._c.indices())

    def steps(self) -> int:
        """Steps left in this epoch (the same on every rank)."""
        return math.ceil(self._c.remaining / (self.batch_size * _core.size()))

    def record_batch(self, global_batch: Optional[int] = None) -> None:
        """Marks the current step's samples (of all ranks: batch_size * world
        size unless given) as processed."""
        self._c.record_batch(int(global_batch) if global_batch else self.batch_size * _core.size())

    def next_batch(self, global_batch: int) -> List[int]:
        """This rank's share of the next `global_batch` samples of the epoch
        (for loops that fix the global batch rather than the per-rank one)."""
        return self._c.next_batch(int(global_batch))

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Yields this rank's batch of each remaining step of the epoch from
        `loader` (a DataLoader over this sampler), or None when this rank has
        no sample in that step."""
        batch_size = getattr(loader, "batch_size", self.batch_size)
        if batch_size != self.batch_size:
            raise Error(f"erun: the DataLoader's batch_size {batch_size} differs from the sampler's "
                        f"{self.batch_size}")
        it = iter(loader)
        for _ in range(self.steps()):
            yield next(it, None)


def allreduce_gradients(parameters: Iterable[torch.Tensor], op: Op = Average, bucket_bytes: int = 25 << 20) -> None:
    """Reduces the .grad of every parameter across ranks (average by default),
    in buckets of up to bucket_bytes flattened per device and dtype (CUDA
    gradients through the GPU collectives). A missing grad counts
    as zeros (so every rank reduces the same buckets)."""
    groups: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
    for p in parameters:
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        groups.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
    for grads in groups.values():
        bucket: List[torch.Tensor] = []
        nbytes = 0
        for g in grads:
            size = g.numel() * g.element_size()
            if bucket and nbytes + size > bucket_bytes:
                _reduce_bucket(bucket, op)
                bucket, nbytes = [], 0
            bucket.append(g)
            nbytes += size
        if bucket:
            _reduce_bucket(bucket, op)


def _buckets(params: List[torch.Tensor], bucket_bytes: int) -> List[List[torch.Tensor]]:
    """Parameters in buckets of up to bucket_bytes, one (device, dtype) per
    bucket, in reverse order of `params` (about the order backward produces
    their gradients), the same on every rank."""
    open_: Dict[Tuple[torch.device, torch.dtype], int] = {}  # the open bucket of each, by index
    out: List[List[torch.Tensor]] = []
    nbytes: List[int] = []
    for p in reversed(params):
        key = (p.device, p.dtype)
        size = p.numel() * p.element_size()
        i = open_.get(key)
        if i is None or (nbytes[i] and nbytes[i] + size > bucket_bytes):
            i = open_[key] = len(out)
            out.append([])
            nbytes.append(0)
        out[i].append(p)
        nbytes[i] += size
    return out


def _grad_of(p: torch.Tensor) -> torch.Tensor:
    """p.grad, which backward (or GradientHooks.wait()) has set."""
    if p.grad is None:
        raise Error("erun: a parameter's gradient was set to None while GradientHooks reduced it")
    return p.grad


def _reduce_bucket(grads: List[torch.Tensor], op: Op) -> None:
    if len(grads) == 1 and grads[0].is_contiguous():
        _core.allreduce_(grads[0], op)
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    _core.allreduce_(flat, op)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


# torch >= 2.1: a hook that runs once a leaf's .grad is accumulated. Older torch:
# GradientHooks hooks the parameter's AccumulateGrad node instead. (Module-level
# so that tests can take the old path on a new torch.)
_HAS_POST_ACCUMULATE_GRAD_HOOK = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


class GradientHooks:
    """Gradient averaging overlapped with backward. A hook on each parameter
    (post-accumulate-grad hooks on torch >= 2.1, hooks on the gradient
    accumulators before) marks a bucket ready once backward has accumulated
    all of its gradients; ready buckets are reduced, in a fixed order (the
    same on every rank, as collectives require), on a communication thread
    while backward goes on (erun's collectives release the GIL). ``wait()``
    before the optimizer step: it reduces the buckets whose parameters got no
    gradient (as zeros, so every rank reduces the same buckets), waits for
    all, and raises the first error (e.g. erun.CommError) in the caller.
    One backward per wait(); no other erun collective between a backward and
    its wait().

    The hooks are registered on construction and removed by ``close()``
    (``register()`` puts them back); as a context manager, ``with
    GradientHooks(params) as hooks:`` registers them (if they are not) and
    removes them when the block ends."""

    def __init__(self, parameters: Iterable[torch.Tensor], op: Op = Average, bucket_bytes: int = 25 << 20) -> None:
        self.op = op
        self._params = [p for p in parameters if p.requires_grad]
        self._buckets = _buckets(self._params, bucket_bytes)
        self._where: Dict[int, int] = {}
        for i, ps in enumerate(self._buckets):
            for p in ps:
                self._where[id(p)] = i
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue[Optional[int]] = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._accumulators: List[torch.autograd.graph.Node] = []  # the hooked autograd nodes, kept alive
        self._handles: List[torch.utils.hooks.RemovableHandle] = []
        self._registered = False
        self._post_accumulate = _HAS_POST_ACCUMULATE_GRAD_HOOK
        self.register()

    @property
    def num_buckets(self) -> int:
        """How many buckets the parameters are reduced in."""
        return len(self._buckets)

    @property
    def launched(self) -> int:
        """Buckets handed to the communication thread since the last wait()."""
        with self._lock:
            return self._next

    @property
    def registered(self) -> bool:
        """True while the hooks are on the parameters (between register() and close())."""
        return self._registered

    @property
    def hook_kind(self) -> str:
        """How backward tells a gradient is ready: "post_accumulate_grad"
        (Tensor.register_post_accumulate_grad_hook, torch >= 2.1) or
        "grad_accumulator" (a hook on the parameter's AccumulateGrad node,
        older torch)."""
        return "post_accumulate_grad" if self._post_accumulate else "grad_accumulator"

    def register(self) -> GradientHooks:
        """Puts the hooks on the parameters (done by the constructor; again
        after close()): post-accumulate-grad hooks where torch has them (>=
        2.1), else hooks on the parameters' gradient accumulators. Returns
        self."""
        if self._registered:
            return self
        self._reset()
        for p in self._params:
            if self._post_accumulate:
                # (untyped in torch's own annotations)
                handle = p.register_post_accumulate_grad_hook(self._hook(p))  # type: ignore[no-untyped-call]
                self._handles.append(handle)
            else:
                grad_fn = p.expand_as(p).grad_fn
                acc = grad_fn.next_functions[0][0] if grad_fn is not None else None
                if acc is None:  # p requires grad: expand_as's only input edge is its accumulator
                    raise Error("erun: GradientHooks found no gradient accumulator for a parameter")
                self._handles.append(acc.register_hook(self._hook(p)))
                self._accumulators.append(acc)
        self._registered = True
        return self

    def close(self) -> None:
        """Removes the hooks and ends the communication thread (after wait())."""
        for h in self._handles:
            h.remove()
        self._handles, self._accumulators = [], []
        self._registered = False
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def __enter__(self) -> GradientHooks:
        return self.register()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _reset(self) -> None:
        self._seen: List[Set[int]] = [set() for _ in self._buckets]
        self._next = 0       # the next bucket to launch (launched in index order)
        self._finished = 0   # buckets reduced (or failed) this step
        self._error: Optional[BaseException] = None

    def _hook(self, p: torch.Tensor) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            with self._lock:
                i = self._where[id(p)]
                self._seen[i].add(id(p))
                self._launch_ready()
        return hook

    def _launch_ready(self) -> None:
        while self._next < len(self._buckets) and len(self._seen[self._next]) == len(self._buckets[self._next]):
            self._submit(self._next)
            self._next += 1

    def _submit(self, i: int) -> None:
        """Hands bucket i to the communication thread (started on first use).
        Called with the lock held, in index order. A subclass may run the
        buckets elsewhere (erun.horovod.torch runs them on its own thread,
        among the program's other collectives): it calls _run_bucket(i)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="erun-gradients", daemon=True)
            self._thread.start()
        self._queue.put(i)

    def _run(self) -> None:
        while True:
            i = self._queue.get()
            if i is None:
                return
            self._run_bucket(i)

    def _reduce(self, grads: List[torch.Tensor]) -> None:
        """Reduces one bucket's gradients in place (a subclass may compress or scale them)."""
        _reduce_bucket(grads, self.op)

    def _run_bucket(self, i: int) -> None:
        error: Optional[BaseException] = None
        try:
            if self._error is None:  # after a failure the rest would fail too
                grads = [_grad_of(p) for p in self._buckets[i]]
                if grads[0].is_cuda:  # the current device is per thread
                    torch.cuda.set_device(grads[0].device)
                self._reduce(grads)
        except BaseException as e:  # handed to wait()
            error = e
        with self._lock:
            if error is not None and self._error is None:
                self._error = error
            self._finished += 1
            self._done.notify_all()

    def wait(self) -> None:
        """Returns when every bucket is reduced; raises the first error."""
        with self._lock:
            for i in range(self._next, len(self._buckets)):
                for p in self._buckets[i]:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    self._seen[i].add(id(p))
            self._launch_ready()
            while self._finished < len(self._buckets):
                self._done.wait()
            error = self._error
            self._reset()
        if error is not None:
            raise error


class DistributedOptimizer:
    """Wraps an optimizer so that step() first averages the gradients across
    ranks (allreduce_gradients): ``opt = erun.torch.DistributedOptimizer(opt)``.
    With ``overlap=True`` the buckets are reduced during backward
    (GradientHooks) and step() only waits for them. Everything else is the
    wrapped optimizer's (``.optimizer``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, op: Op = Average, bucket_bytes: int = 25 << 20,
                 overlap: bool = False) -> None:
        self.optimizer = optimizer
        self.op = op
        self.bucket_bytes = bucket_bytes
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.hooks: Optional[GradientHooks] = GradientHooks(params, op, bucket_bytes) if overlap else None

    def step(self, closure: Optional[Any] = None) -> Any:
        if self.hooks is not None:
            self.hooks.wait()
        else:
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            allreduce_gradients(params, self.op, self.bucket_bytes)
        return self.optimizer.step(closure) if closure is not None else self.optimizer.step()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def _advertise_address() -> str:
    """The address peers reach rank 0 at: the one erun gave this worker, else
    loopback in a one-host world, else this host's name."""
    addr = os.environ.get("ERUN_ADVERTISE_ADDR")
    if addr:
        return addr
    return "127.0.0.1" if _core.cross_size() == 1 else socket.gethostname()


class ProcessGroup:
    """The default torch.distributed process group of one generation, built
    by erun: rank 0 hosts a TCPStore on a free port; its address goes to the
    others through erun. torch.distributed has one default group per
    process, so one ProcessGroup is up at a time.

    ``build()`` (collective) returns the group, building it unless it is up
    for the current generation (after a re-join it destroys the old one and
    builds the new one). Built inside an erun.run function, the group is
    destroyed before the loop's next re-join, and a RuntimeError the loop
    gets while it is up is checked with an erun barrier: when that fails
    too, a peer was lost and the loop handles it as a CommError.
    ``destroy()`` destroys it (idempotent).

    As a context manager, ``with ProcessGroup() as pg:`` builds the group
    (``pg`` is torch.distributed's group) and destroys it when the block
    ends; a RuntimeError leaving the block is checked the same way and
    becomes an erun.CommError when a peer was lost."""

    def __init__(self, backend: str = "gloo", timeout: timedelta = timedelta(seconds=30)) -> None:
        self.backend = backend
        self.timeout = timeout
        self._generation: Optional[int] = None
        self._store: Optional[object] = None  # kept alive while the group is up

    @property
    def generation(self) -> Optional[int]:
        """The generation the group is up for; None when it is not up."""
        return self._generation

    def build(self) -> torch.distributed.ProcessGroup:
        """The group of the current generation (collective), built unless it is up."""
        group = self._build()
        state = running_state()
        if state is not None:
            state.on_rejoin(self.destroy)
            state.add_peer_loss_check(self.lost_peer)
        return group

    def _build(self) -> torch.distributed.ProcessGroup:
        import torch.distributed as dist
        gen = _core.generation()
        if self._generation == gen and dist.is_initialized():
            return _world()
        self.destroy()
        if dist.is_initialized():
            raise Error("erun: torch.distributed is already initialized by someone else; erun.torch.process_group() "
                        "manages the default group itself")
        store, where = None, None
        if _core.rank() == 0:
            addr = _advertise_address()
            store = dist.TCPStore(addr, 0, None, True, self.timeout,  # type: ignore[attr-defined]
                                  wait_for_workers=False)
            where = (addr, store.port)
        addr, port = _core.broadcast_object(where, root=0)
        if store is None:
            store = dist.TCPStore(addr, port, None, False, self.timeout)  # type: ignore[attr-defined]
        hook = sys.excepthook
        dist.init_process_group(self.backend, store=store, rank=_core.rank(), world_size=_core.size(),
                                timeout=self.timeout)
        # torch >= 2.2 wraps sys.excepthook in a new hook at every init_process_group() and
        # never unwraps it: one more per generation, each prefixing a traceback's lines with
        # the rank it had then. Its hook prints into a buffer, calls the one it wrapped and only
        # then writes the buffer, so under the erun driver (whose hook ends the process after a
        # fatal error) the traceback was never shown. Keep the hook as it was; erun tags each
        # worker's output lines with its rank anyway.
        if sys.excepthook is not hook:
            sys.excepthook = hook
        self._generation, self._store = gen, store
        return _world()

    def destroy(self) -> None:
        """Destroys the group if it is up."""
        import torch.distributed as dist
        if self._generation is not None and dist.is_initialized():
            dist.destroy_process_group()
        self._generation = None
        self._store = None

    def lost_peer(self, exc: BaseException) -> bool:
        """Collective check of a torch.distributed error while the group is up:
        a lost peer makes an erun barrier on the same generation fail too."""
        if self._generation is None or not isinstance(exc, RuntimeError):
            return False
        try:
            _core.barrier()
        except CommError:
            return True
        return False

    def __enter__(self) -> torch.distributed.ProcessGroup:
        return self._build()

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        try:
            if isinstance(exc, Exception) and not isinstance(exc, Error) and self.lost_peer(exc):
                raise CommError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.destroy()


def _world() -> torch.distributed.ProcessGroup:
    """torch.distributed's default group (it is initialized)."""
    import torch.distributed as dist
    world = dist.group.WORLD
    if world is None:
        raise Error("erun: torch.distributed has no default group")
    return world


# The group behind process_group() and destroy_process_group(): like
# torch.distributed's default group, one per process. Programs and tests that
# want their own make a ProcessGroup.
_default_group = ProcessGroup()


def process_group(backend: str = "gloo", timeout: timedelta = timedelta(seconds=30)) -> torch.distributed.ProcessGroup:
    """The default torch.distributed process group for the current generation
    (collective: call it on every rank, inside the erun.run function). Rank 0
    hosts a TCPStore on a free port; its address goes to the others through
    erun. erun.run destroys the group before each re-join and the next call
    builds the one of the new generation, so re-wrap DDP each time:
    ``ddp = DistributedDataParallel(model, process_group=erun.torch.process_group())``."""
    _default_group.backend, _default_group.timeout = backend, timeout
    return _default_group.build()


def destroy_process_group() -> None:
    """Destroys the process group process_group() made (done before every re-join)."""
    _default_group.destroy()


# FSDP2 (fully_shard) state, resharded in memory: erun/_fsdp.py. Imported last:
# it uses this module's ProcessGroup and ElasticSampler.
from ._fsdp import FSDPState  # noqa: E402
