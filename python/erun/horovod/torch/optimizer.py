"""Horovod's ``hvd.DistributedOptimizer`` over erun.torch's gradient hooks.

The optimizer returned is an instance of a subclass of the program's own
optimizer class (``isinstance(opt, torch.optim.SGD)`` holds) that shares its
param_groups and state. Backward marks each gradient ready; gradients are
reduced in buckets, in a fixed order, on the erun.horovod communication
thread while backward goes on (erun.torch.GradientHooks), and ``step()``
waits for them before the wrapped optimizer's step.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from erun._erun import ReduceOp
from erun.torch import GradientHooks
from .compression import Compression
from .mpi_ops import ADASUM_REFUSED, Adasum, Average, _check_process_set, _op_of, _scaled_reduce_, comm_thread
from .mpi_ops import global_process_set


class _HorovodHooks(GradientHooks):
    """erun.torch's hooks, with Horovod's options: compression, pre/post
    scaling, gradients accumulated over several backward passes, and buckets
    given as groups. The buckets run on the erun.horovod communication thread,
    in order with the program's other collectives."""

    def __init__(self, params: List[torch.Tensor], op: ReduceOp, compression: Any, prescale: float, postscale: float,
                 passes: int, groups: Optional[List[List[torch.Tensor]]]) -> None:
        self.rop = op
        self.compression = compression
        self.prescale = prescale
        self.postscale = postscale
        self.passes = passes
        self._counts: Dict[int, int] = {}
        self._count_lock = threading.Lock()
        super().__init__(params, op)
        if groups is not None:
            self._set_buckets(groups)

    def _set_buckets(self, groups: List[List[torch.Tensor]]) -> None:
        trained = {id(p) for p in self._params}
        given = [[p for p in g if id(p) in trained] for g in groups]
        grouped = {id(p) for g in given for p in g}
        singles = [[p] for p in reversed(self._params) if id(p) not in grouped]
        self._buckets = [g for g in given if g] + singles
        self._where = {id(p): i for i, ps in enumerate(self._buckets) for p in ps}
        self._reset()

    def _hook(self, p: torch.Tensor) -> Any:
        mark = super()._hook(p)

        def hook(*args: Any) -> None:
            with self._count_lock:
                n = self._counts.get(id(p), 0) + 1
                self._counts[id(p)] = n
                if n < self.passes:
                    return  # accumulating: reduced after the last pass
            mark(*args)
        return hook

    def _reset(self) -> None:
        super()._reset()
        with self._count_lock:  # set before GradientHooks.__init__ first calls this
            self._counts = {}

    def _submit(self, i: int) -> None:
        # _run_bucket keeps its error for wait(): the handle itself is not needed.
        comm_thread().submit(lambda: self._run_bucket(i))

    def _reduce(self, grads: List[torch.Tensor]) -> None:
        if len(grads) == 1 and grads[0].is_contiguous() and self.compression is Compression.none:
            _scaled_reduce_(grads[0], self.rop, self.prescale, self.postscale)
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        compressed, ctx = self.compression.compress(flat)
        compressed = compressed.contiguous()
        _scaled_reduce_(compressed, self.rop, self.prescale, self.postscale)
        flat = self.compression.decompress(compressed, ctx)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


class _DistributedOptimizer:
    """The methods the DistributedOptimizer subclass adds to (or puts over)
    the program's optimizer class."""
    _erun_hooks: _HorovodHooks
    _erun_should_synchronize: bool
    _erun_synchronized: bool

    def step(self, closure: Optional[Any] = None) -> Any:
        if self._erun_should_synchronize:
            self.synchronize()
        self._erun_synchronized = False
        parent: Any = super(self.__class__, self)  # type: ignore[misc]
        return parent.step(closure) if closure is not None else parent.step()

    def synchronize(self) -> None:
        """Waits until every gradient is reduced (step() calls it)."""
        from ..common.exceptions import translated
        try:
            self._erun_hooks.wait()
        except BaseException as e:
            t = translated(e)
            if t is e:
                raise
            raise t from e
        self._erun_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """For ``optimizer.synchronize(); <clip gradients>; with
        optimizer.skip_synchronize(): optimizer.step()``."""
        self._erun_should_synchronize = False
        try:
            yield
        finally:
            self._erun_should_synchronize = True

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        if self._erun_hooks.launched:
            raise AssertionError("erun.horovod: optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(); call it before backward")
        parent: Any = super(self.__class__, self)  # type: ignore[misc]
        parent.zero_grad(*args, **kwargs)

    @property
    def backward_passes_per_step(self) -> int:
        return self._erun_hooks.passes

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes: int) -> None:
        self.set_backward_passes_per_step(passes)

    def set_backward_passes_per_step(self, passes: int) -> None:
        if int(passes) < 1:
            raise ValueError(f"erun.horovod: backward_passes_per_step must be at least 1, not {passes}")
        self._erun_hooks.passes = int(passes)

    def _erun_reset(self) -> None:
        """After a failed step: forget the half-done step (the elastic state calls it before a re-join)."""
        self._erun_hooks._reset()
        self._erun_synchronized = False


def _check_named(named_parameters: Optional[Sequence[Tuple[str, torch.Tensor]]], params: List[torch.Tensor]) -> None:
    """Refuses what Horovod refuses: entries that are not (name, parameter), duplicate names, unnamed parameters."""
    if named_parameters is None:
        return
    named = list(named_parameters)
    if not all(isinstance(x, tuple) and len(x) == 2 for x in named):
        raise ValueError("erun.horovod: named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually model.named_parameters()")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"erun.horovod: parameter names in named_parameters must be unique; found duplicates: "
                         f"{', '.join(dups)}")
    named_ids = {id(p) for _, p in named}
    missing = [i for i, p in enumerate(params) if id(p) not in named_ids]
    if missing:
        raise ValueError(f"erun.horovod: named_parameters was given, but {len(missing)} of the optimizer's "
                         f"parameters are not named (positions {missing[:8]} in its param_groups)")


def _groups(groups: Any, num_groups: int, params: List[torch.Tensor]) -> Optional[List[List[torch.Tensor]]]:
    n = groups if isinstance(groups, int) else (num_groups or 0)
    if isinstance(groups, (list, tuple)):
        return [list(g) for g in groups]
    if n and n > 0:
        k = (len(params) + n - 1) // n
        return [params[i:i + k] for i in range(0, len(params), k)]
    return None


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Sequence[Tuple[str, torch.Tensor]]] = None,
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: Any = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None, sparse_as_dense: bool = False,
                         process_set: Any = global_process_set) -> Any:
    """Wraps an optimizer so that step() applies the gradients averaged (op)
    over all ranks. See the module's docstring and docs/horovod.md."""
    if op is Adasum:
        raise NotImplementedError(ADASUM_REFUSED)
    rop = _op_of(op, None)
    if gradient_predivide_factor != 1.0 and rop != Average:
        raise ValueError("erun.horovod: gradient_predivide_factor is only supported with op=hvd.Average")
    if int(backward_passes_per_step) < 1:
        raise ValueError(f"erun.horovod: backward_passes_per_step must be at least 1, not {backward_passes_per_step}")
    _check_process_set(process_set)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    _check_named(named_parameters, params)
    base = optimizer.__class__
    namespace = {k: v for k, v in _DistributedOptimizer.__dict__.items()
                 if k not in ("__dict__", "__weakref__", "__annotations__")}
    cls = type(base.__name__, (base,), namespace)
    opt: Any = object.__new__(cls)
    opt.__dict__.update(optimizer.__dict__)  # the same param_groups, state and defaults
    opt._erun_hooks = _HorovodHooks([p for p in params if p.requires_grad], rop, compression,
                                    1.0 / gradient_predivide_factor, float(gradient_predivide_factor),
                                    int(backward_passes_per_step), _groups(groups, num_groups, params))
    opt._erun_should_synchronize = True
    opt._erun_synchronized = False
    return opt
