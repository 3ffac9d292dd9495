"""erun.torch.FSDPState: an FSDP2 (``fully_shard``) model and its optimizer
kept as sharded State entries, resharded in memory when the world changes.

Each rank commits only its own rows of every parameter and every optimizer
tensor (the DTensors' local pieces, FSDP2's ``Shard(0)`` = erun's "chunk"
split). When the world changes, erun.State.sync() gives each rank its new
rows from the pieces the hosts hold (docs/state.md, "Sharded entries"); the
state then rebuilds the model for the new world: it calls the user's
``build(mesh)`` under ``torch.device("meta")`` (no weights are allocated),
assigns the pieces as the new DTensors' local tensors
(``load_state_dict(assign=True)``: no copy where FSDP2 needs no padding), and
makes a new optimizer whose state is the resharded pieces. Everything that
is not sharded (buffers, the optimizer's steps and options, values, the
sampler) is a whole entry as in TorchState.
"""
from __future__ import annotations

import functools
import gc
import pickle
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch

from . import _core
from . import _erun
from ._erun import Error
from ._state import State, _row_bytes

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from .torch import ElasticSampler, ProcessGroup

_Build = Callable[["DeviceMesh"], torch.nn.Module]
_MakeOptimizer = Callable[[torch.nn.Module], torch.optim.Optimizer]


def _fsdp_available() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.distributed.tensor import DTensor  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or Debian's torch 1.13 failing on Python 3.11 (ValueError)
        return False
    return True


def _sharded(t: Any) -> bool:
    """A DTensor of one mesh dimension placed as Shard(0): what FSDP2 makes."""
    from torch.distributed.tensor import DTensor, Shard
    return isinstance(t, DTensor) and len(t.placements) == 1 and t.placements[0] == Shard(0)


def _local(t: Any) -> torch.Tensor:
    """The local piece of a DTensor (or the tensor), without autograd."""
    from torch.distributed.tensor import DTensor
    if isinstance(t, DTensor):
        local: torch.Tensor = t._local_tensor  # the piece itself: to_local() makes an autograd view
        return local.detach()
    return t.detach() if isinstance(t, torch.Tensor) else t


def _set_module_tensor(model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    module._buffers[leaf] = value


class FSDPState(State):
    """State of an FSDP2 job: ``FSDPState(build, optimizer, sampler=s,
    epoch=0, ...)``.

    - ``build(mesh)`` makes the model and applies ``fully_shard(...,
      mesh=mesh)`` to it (and to whichever submodules it wraps), the same on
      every rank; the first time in a process it runs as written and must give
      the same weights on every rank (seed it); after a change of the world it
      runs under ``torch.device("meta")``, and the resharded pieces become the
      new model's parameters.
    - ``optimizer(model)`` makes the optimizer over ``model.parameters()``.
      Its per-parameter state is created at the first build (by a step with
      zero gradients and a zero learning rate, then set back to zeros and step
      0, which is what Adam, AdamW and SGD create lazily), so that every rank
      registers the same entries before its first commit.

    Take ``state.model`` and ``state.optimizer`` at the start of the
    erun.run function: they are rebuilt after every re-join (``state.mesh``
    is the generation's DeviceMesh; the default torch.distributed group is
    ``erun.torch.process_group()``'s, which this state builds). Parameters
    must be DTensors placed ``Shard(0)`` (FSDP2's default) or plain tensors;
    optimizer tensors shaped as their parameter are sharded with it, the rest
    (Adam's ``step``) are whole.
    """
    _build: _Build
    _make_optimizer: _MakeOptimizer
    _device: torch.device
    _group: ProcessGroup
    _model: Optional[torch.nn.Module]
    _optimizer: Optional[torch.optim.Optimizer]
    _mesh: Optional[DeviceMesh]
    _built_generation: Optional[int]
    _pending: Dict[str, torch.Tensor]   # entry name -> its new rows (CPU) from a sync, until the rebuild
    _staged: Dict[str, torch.Tensor]    # entry name -> a host copy of a device piece, for a commit
    # The model's parameters by name, as the model was built: the sharded
    # DTensors the optimizer steps. While FSDP2 runs a forward or backward
    # the module holds unsharded tensors under those names instead, and an
    # error (a lost peer) can leave it so.
    _params: Dict[str, torch.nn.Parameter]

    def __init__(self, build: _Build, optimizer: _MakeOptimizer, sampler: Optional[ElasticSampler] = None,
                 device: str = "cpu", backend: Optional[str] = None,
                 timeout: timedelta = timedelta(seconds=30), **values: Any) -> None:
        if not _fsdp_available():
            raise Error(f"erun.torch.FSDPState needs FSDP2 (torch.distributed.fsdp.fully_shard and "
                        f"torch.distributed.tensor.DTensor), which torch {torch.__version__} does not have; "
                        f"use torch >= 2.6, or TorchState for a model every rank holds whole")
        super().__init__(**values)
        from .torch import ElasticSampler, _default_group
        object.__setattr__(self, "_build", build)
        object.__setattr__(self, "_make_optimizer", optimizer)
        object.__setattr__(self, "_device", torch.device(device))
        object.__setattr__(self, "_group", _default_group)
        _default_group.backend = backend or ("nccl" if torch.device(device).type == "cuda" else "gloo")
        _default_group.timeout = timeout
        object.__setattr__(self, "_model", None)
        object.__setattr__(self, "_optimizer", None)
        object.__setattr__(self, "_mesh", None)
        object.__setattr__(self, "_built_generation", None)
        object.__setattr__(self, "_pending", {})
        object.__setattr__(self, "_staged", {})
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "sampler", sampler)
        if sampler is not None:
            if not isinstance(sampler, ElasticSampler):
                raise Error(f"erun: FSDPState(sampler=) takes an erun.torch.ElasticSampler, got "
                            f"{type(sampler).__name__}")
            sampler.register_with(self)
        self.on_rejoin(self._group.destroy)
        self.add_peer_loss_check(self._group.lost_peer)

    @property
    def model(self) -> torch.nn.Module:
        """This generation's model (built by the first sync())."""
        if self._model is None:
            raise Error("erun: FSDPState.model is built by the first sync(): use it inside the erun.run function")
        return self._model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """This generation's optimizer (built with the model)."""
        if self._optimizer is None:
            raise Error("erun: FSDPState.optimizer is built by the first sync(): use it inside the erun.run "
                        "function")
        return self._optimizer

    @property
    def mesh(self) -> DeviceMesh:
        """This generation's one-dimensional DeviceMesh over every rank."""
        if self._mesh is None:
            raise Error("erun: FSDPState.mesh is built by the first sync()")
        return self._mesh

    @property
    def process_group(self) -> ProcessGroup:
        """The erun.torch.ProcessGroup the mesh is made over (erun.torch.process_group()'s)."""
        return self._group

    def sync(self) -> None:
        """Builds this generation's process group (collective), the model the
        first time, syncs the entries (resharding the pieces), rebuilds the
        model and optimizer for a new world, commits if nothing was ever
        committed (so that every piece has a copy on its host and its buddy
        from the start), then runs the sync callbacks."""
        from torch.distributed.device_mesh import DeviceMesh
        group = self._group.build()
        if self._model is None:
            self._first_build(DeviceMesh.from_group(group, self._device.type))
        self._c.sync()
        if self._built_generation != _core.generation() or self._pending:
            self._rebuild(DeviceMesh.from_group(group, self._device.type))
        self._built_generation = _core.generation()
        if self.commit_id == 0:
            # Until the first commit a piece has no copy outside its rank
            # (docs/state.md, "Sharded entries"): make one at once.
            self.commit()
        for callback in self._sync_callbacks:
            callback()

    def close(self) -> None:
        """At the end of training: drops this state's model, optimizer and
        mesh (whose DTensors and FSDP2 hooks hold the process group), then
        destroys the process group, so that nothing of torch.distributed is
        left for the interpreter's exit to tear down in its own order. Take
        what you keep (e.g. ``full_tensor()`` of the parameters) before."""
        self._model = self._optimizer = self._mesh = None
        self._params = {}
        self._pending.clear()
        self._staged.clear()
        gc.collect()
        self._group.destroy()

    def restore(self) -> None:
        super().restore()
        if self._pending:  # a commit of another layout than the model's
            self._rebuild(self.mesh)

    # The first build: the model as `build` makes it, entries registered.

    def _first_build(self, mesh: DeviceMesh) -> None:
        model = self._build(mesh)
        opt = self._make_optimizer(model)
        _create_optimizer_state(opt)
        self._model, self._optimizer, self._mesh = model, opt, mesh
        self._params = dict(model.named_parameters())
        self._built_generation = _core.generation()
        name_of: Dict[Any, str] = {p: fqn for fqn, p in self._params.items()}
        for fqn, p in self._params.items():
            self._register_tensor("model/" + fqn, p, functools.partial(self._param, fqn))
        for fqn, b in _persistent_buffers(model):
            self._register_tensor("model/" + fqn, b, functools.partial(self._buffer, fqn))
        for param, entries in opt.state.items():
            fqn = name_of[param]
            for key, value in entries.items():
                if _sharded(value):
                    self._register_tensor(f"optimizer/{fqn}/{key}", value,
                                          functools.partial(self._opt_tensor, fqn, key))
        self.register_callbacks("optimizer", self._save_optimizer, self._load_optimizer)

    def _param(self, fqn: str) -> torch.Tensor:
        return self._params[fqn]

    def _buffer(self, fqn: str) -> torch.Tensor:
        return self.model.get_buffer(fqn)

    def _opt_tensor(self, fqn: str, key: str) -> torch.Tensor:
        t: torch.Tensor = self.optimizer.state[self._param(fqn)][key]
        return t

    def _register_tensor(self, name: str, t: torch.Tensor, current: Callable[[], torch.Tensor]) -> None:
        """A sharded entry for a Shard(0) DTensor, a whole one for the rest;
        `current()` finds the tensor in the model or optimizer of the time."""
        if not _sharded(t):
            from torch.distributed.tensor import DTensor
            if isinstance(t, DTensor) and any(not pl.is_replicate() for pl in t.placements):
                raise Error(f"erun: FSDPState entry '{name}' is placed {t.placements}; erun reshards FSDP2's "
                            f"default Shard(0) placement on a one-dimensional mesh only")
            self.register_callbacks(name, lambda: [self._host_bytes(name, _local(current()))],
                                    lambda view: _copy_into(_local(current()), view))
            return
        rows = int(t.shape[0])
        local = _local(t)
        begin, end = _erun.shard_rows(rows, _core.rank(), _core.size(), False)
        if local.shape[0] != end - begin:
            raise Error(f"erun: FSDPState entry '{name}' holds {local.shape[0]} of {rows} rows on rank "
                        f"{_core.rank()} of {_core.size()}; erun expects torch.chunk's split (FSDP2's Shard(0)): "
                        f"{end - begin}")
        dtype, trailing, row_bytes = local.dtype, tuple(local.shape[1:]), _row_bytes(local)
        fresh: List[torch.Tensor] = []

        def piece() -> torch.Tensor:
            """The rows this rank holds now: those a sync gave it, until the
            model is rebuilt with them (the sync rewrites the commit in host
            memory from them), else the model's."""
            new = self._pending.get(name)
            return new if new is not None else _local(current())

        def save() -> List[Tuple[int, int]]:
            b = _core.Buffer(self._host_piece(name, piece()), "State.commit", writable=False)
            return [(b.ptr, b.nbytes)]

        def load(view: memoryview) -> None:
            held = piece()
            if len(view) != held.shape[0] * row_bytes:  # another layout: the model is rebuilt with it
                new = torch.empty((len(view) // row_bytes,) + trailing, dtype=dtype)
                _copy_into(new, view)
                self._pending[name] = new
            else:
                _copy_into(held, view)

        def prepare(n: int) -> int:
            fresh[:] = [torch.empty((n,) + trailing, dtype=dtype)]
            return _core.Buffer(fresh[0], "State.sync", writable=True).ptr

        def install() -> None:
            self._pending[name] = fresh.pop()

        self._c.register_shard(name, rows, row_bytes, False, save, load, prepare, install)

    def _host_piece(self, name: str, piece: torch.Tensor) -> torch.Tensor:
        """The piece in host memory for a commit: itself on the CPU, else a
        copy kept until the next commit (the commit reads it by address)."""
        if piece.device.type == "cpu" and piece.is_contiguous():
            return piece
        staged = piece.contiguous().cpu()
        self._staged[name] = staged
        return staged

    def _host_bytes(self, name: str, t: torch.Tensor) -> Any:
        return _core.bytes_of(self._host_piece(name, t))

    # The optimizer's whole entry: options of its groups and the state that is not sharded.

    def _save_optimizer(self) -> List[Any]:
        opt = self.optimizer
        names: Dict[Any, str] = {p: fqn for fqn, p in self._params.items()}
        state = {names[p]: {k: (_local(v).cpu() if isinstance(v, torch.Tensor) else v)
                            for k, v in entries.items() if not _sharded(v)}
                 for p, entries in opt.state.items()}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        return [pickle.dumps({"groups": groups, "state": state}, protocol=5)]

    def _load_optimizer(self, view: memoryview) -> None:
        saved = pickle.loads(view)
        opt = self.optimizer
        if len(saved["groups"]) != len(opt.param_groups):
            raise Error(f"erun: the committed optimizer has {len(saved['groups'])} parameter groups, this one "
                        f"{len(opt.param_groups)}: FSDPState's optimizer() must make the same optimizer on every rank")
        for group, options in zip(opt.param_groups, saved["groups"]):
            group.update(options)
        for fqn, entries in saved["state"].items():
            current = opt.state[self._param(fqn)]
            for key, value in entries.items():
                old = current.get(key)
                if isinstance(value, torch.Tensor) and isinstance(old, torch.Tensor) and old.shape == value.shape:
                    with torch.no_grad():
                        _local(old).copy_(value)
                else:
                    current[key] = value.to(self._device) if isinstance(value, torch.Tensor) else value

    # A new world: the model and optimizer made again over the new mesh, with the pieces.

    def _rebuild(self, mesh: DeviceMesh) -> None:
        from torch.distributed.tensor import DTensor
        old_model, old_opt = self.model, self.optimizer
        pending = self._pending
        params: Dict[str, Tuple[torch.Tensor, Any, bool]] = {}
        for fqn, p in self._params.items():
            piece = pending.pop("model/" + fqn, None)
            params[fqn] = (_local(p) if piece is None else piece.to(self._device), p, p.requires_grad)
        buffers = dict(old_model.named_buffers())
        names: Dict[Any, str] = {p: fqn for fqn, p in self._params.items()}
        opt_state: Dict[str, Dict[str, Any]] = {}
        for param, entries in old_opt.state.items():
            fqn = names[param]
            out: Dict[str, Any] = {}
            for key, value in entries.items():
                if _sharded(value):
                    piece = pending.pop(f"optimizer/{fqn}/{key}", None)
                    out[key] = (_local(value) if piece is None else piece.to(self._device), value)
                else:
                    out[key] = value
            opt_state[fqn] = out
        groups = [{k: v for k, v in g.items() if k != "params"} for g in old_opt.param_groups]
        if pending:
            raise Error(f"erun: FSDPState got rows for entries its model does not have: {sorted(pending)}")

        def on_mesh(piece: torch.Tensor, like: Any) -> Any:
            if not isinstance(like, DTensor):
                return piece
            return DTensor.from_local(piece, mesh, like.placements, run_check=False, shape=like.shape,
                                      stride=like.stride())

        self._model = self._optimizer = None
        self._params = {}
        del old_model, old_opt, names
        with torch.device("meta"):
            model = self._build(mesh)
        persistent = {fqn for fqn, _ in _persistent_buffers(model)}
        sd: Dict[str, Any] = {fqn: on_mesh(piece, like) for fqn, (piece, like, _) in params.items()}
        sd.update({fqn: b for fqn, b in buffers.items() if fqn in persistent})
        model.load_state_dict(sd, assign=True)
        for fqn, b in buffers.items():  # non-persistent buffers are kept as they were
            if fqn not in persistent:
                _set_module_tensor(model, fqn, b)
        for fqn, param in model.named_parameters():
            param.requires_grad_(params[fqn][2])
        params.clear()
        opt = self._make_optimizer(model)
        for fqn, entries in opt_state.items():
            opt.state[model.get_parameter(fqn)] = {
                key: on_mesh(*value) if isinstance(value, tuple) else value for key, value in entries.items()}
        for group, options in zip(opt.param_groups, groups):
            group.update(options)
        self._model, self._optimizer, self._mesh = model, opt, mesh
        self._params = dict(model.named_parameters())
        self._staged.clear()
        gc.collect()  # the old FSDP modules hold cycles (hooks); free their memory now


def _persistent_buffers(model: torch.nn.Module) -> List[Tuple[str, torch.Tensor]]:
    keys = set(model.state_dict(keep_vars=True))
    return [(fqn, b) for fqn, b in model.named_buffers() if fqn in keys]


def _copy_into(t: torch.Tensor, view: memoryview) -> None:
    if len(view) == 0:
        return
    src = torch.frombuffer(view, dtype=torch.uint8)
    with torch.no_grad():
        if t.device.type == "cpu" and t.is_contiguous():
            t.reshape(-1).view(torch.uint8).copy_(src)
        else:
            t.copy_(src.view(t.dtype).reshape(t.shape))


def _create_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Creates the per-parameter state an optimizer makes at its first step,
    as that step would find it: one step with zero gradients and a zero
    learning rate, then every new state tensor zeroed (Adam's exp_avg,
    exp_avg_sq and step; SGD's momentum_buffer)."""
    params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad and p not in opt.state]
    if not params:
        return
    grads = {p: p.grad for p in params}
    lrs = [g.get("lr") for g in opt.param_groups]
    for p in params:
        p.grad = torch.zeros_like(p)
    for g in opt.param_groups:
        if "lr" in g:
            g["lr"] = 0.0 if not isinstance(g["lr"], torch.Tensor) else torch.zeros_like(g["lr"])
    try:
        opt.step()
    finally:
        for g, lr in zip(opt.param_groups, lrs):
            if lr is not None:
                g["lr"] = lr
        for p in params:
            p.grad = grads[p]
    with torch.no_grad():
        for p in params:
            for value in opt.state.get(p, {}).values():
                if isinstance(value, torch.Tensor):
                    _local(value).zero_()
