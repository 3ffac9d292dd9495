"""Horovod's helpers for whole models and objects (``horovod.torch.functions``)."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch

from erun import _core
from .mpi_ops import _broadcast_into_, _check_process_set, _sync, global_process_set

Params = Union[Dict[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]]]


def _named_tensors(params: Params) -> List[Tuple[str, torch.Tensor]]:
    if isinstance(params, dict):
        return sorted(params.items())
    items = list(params)
    if not all(isinstance(p, tuple) and len(p) == 2 for p in items):
        raise ValueError("erun.horovod: broadcast_parameters takes a state_dict() or named_parameters() "
                         "(a dict or a list of (name, tensor) pairs)")
    return items


def broadcast_parameters(params: Params, root_rank: int, prefix: Optional[str] = None) -> None:
    """Overwrites every tensor of a state_dict() or named_parameters() with
    root_rank's, in place (parameters that require grad included)."""
    named = _named_tensors(params)

    def run() -> None:
        with torch.no_grad():
            for _, t in named:
                if isinstance(t, torch.Tensor):
                    _broadcast_into_(t.detach(), int(root_rank))
    _sync(run)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, prefix: str = "Parameter.",
                              model: Optional[torch.nn.Module] = None) -> None:
    """Gives every rank root_rank's optimizer state (its param_groups'
    options, lr included, and its per-parameter state) by loading root's
    state_dict(); a state not created yet (before the first step) stays
    lazy on every rank."""
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if _core.rank() != root_rank:
        optimizer.load_state_dict(state)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: Any = global_process_set) -> Any:
    """Returns root_rank's obj (pickled) on every rank."""
    _check_process_set(process_set)
    return _sync(lambda: _core.broadcast_object(obj, int(root_rank)), name)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = global_process_set) -> List[Any]:
    """Returns every rank's obj (pickled), by rank."""
    _check_process_set(process_set)
    return _sync(lambda: _core.allgather_object(obj), name)  # type: ignore[no-any-return]
