"""Horovod's elastic states (``hvd.elastic.ObjectState``, ``TorchState``)
over erun's, which keep their commits in host memory: after a failure the
survivors keep their process and go back to the last commit, and new
workers get it from them.

Horovod's methods map onto erun's: ``commit()`` (a snapshot, and the point
where the ranks agree on host changes: it may raise HostsUpdatedInterrupt),
``save()`` (the same snapshot; a host change it finds is raised by the next
``check_host_updates()`` or ``commit()``), ``restore()``, ``sync()``,
``check_host_updates()`` and ``register_reset_callbacks()``. Reset callbacks
run after the re-join's sync (Horovod runs them before it), so what they set
(a learning rate scaled to the new size) is what training goes on with.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch

from erun._erun import HostsUpdated
from erun._state import State as _ErunState
from erun.torch import TorchState as _ErunTorchState
from ...common.exceptions import HostsUpdatedInterrupt, raises_horovod_errors
from ..mpi_ops import comm_thread
from .sampler import ElasticSampler


class State(_ErunState):
    """What every Horovod elastic state has (``horovod.common.elastic.State``)."""

    def _horovod_init(self) -> None:
        object.__setattr__(self, "_hvd_reset_callbacks", [])
        object.__setattr__(self, "_hvd_update_pending", False)
        self.on_rejoin(self._hvd_before_rejoin)

    def _hvd_before_rejoin(self) -> None:
        """Lets queued collectives finish (they fail fast once a peer is gone)
        and forgets a half-done optimizer step, before erun re-joins."""
        comm_thread().drain()
        object.__setattr__(self, "_hvd_update_pending", False)
        reset = getattr(getattr(self, "optimizer", None), "_erun_reset", None)
        if reset is not None:
            reset()

    def register_reset_callbacks(self, callbacks: List[Callable[[], Any]]) -> None:
        """Callbacks run, in order, after every re-join (not at the start)."""
        self._hvd_reset_callbacks.extend(callbacks)

    def on_reset(self, callback: Optional[Callable[..., Any]] = None) -> Any:  # type: ignore[override]
        """Horovod's on_reset(): runs reset() and the reset callbacks. With a
        callback, erun's State.on_reset(callback) (it gets the old and new sizes)."""
        if callback is not None:
            return super().on_reset(callback)
        self.reset()
        for cb in self._hvd_reset_callbacks:
            cb()
        return None

    def reset(self) -> None:
        """Called after a re-join, before the reset callbacks (for subclasses)."""

    def _notify_reset(self, old_size: int, new_size: int) -> None:
        super()._notify_reset(old_size, new_size)
        self.on_reset()

    @raises_horovod_errors
    def commit(self) -> None:
        """Snapshots the state; raises HostsUpdatedInterrupt on every rank when the hosts changed."""
        self.check_host_updates_pending()
        comm_thread().call(super().commit)

    @raises_horovod_errors
    def save(self) -> None:
        """Snapshots the state; a host change found is raised later, by check_host_updates() or commit()."""
        try:
            comm_thread().call(super().commit)
        except HostsUpdated:
            object.__setattr__(self, "_hvd_update_pending", True)

    @raises_horovod_errors
    def restore(self) -> None:
        comm_thread().call(super().restore)

    @raises_horovod_errors
    def sync(self) -> None:
        comm_thread().call(super().sync)

    @raises_horovod_errors
    def check_host_updates(self) -> None:
        """Collective: raises HostsUpdatedInterrupt on every rank when any rank saw a host change."""
        self.check_host_updates_pending()
        comm_thread().call(super().check_host_updates)

    def check_host_updates_pending(self) -> None:
        if self._hvd_update_pending:
            object.__setattr__(self, "_hvd_update_pending", False)
            raise HostsUpdatedInterrupt(False, "erun: hosts updated (found by an earlier save())")


class ObjectState(State):
    """Picklable values, as attributes: ``ObjectState(epoch=0, batch=0)``."""

    def __init__(self, bcast_object: Any = None, get_rank: Any = None, **kwargs: Any) -> None:
        _ErunState.__init__(self, **kwargs)
        self._horovod_init()


class TorchState(State, _ErunTorchState):
    """``TorchState(model, optimizer, **kwargs)``: the model's tensors, the
    optimizer's state, every ``hvd.elastic.ElasticSampler`` among the keyword
    arguments (its position) and the other keyword arguments (picklable
    values), all reachable as attributes."""

    def __init__(self, model: Optional[torch.nn.Module] = None, optimizer: Optional[torch.optim.Optimizer] = None,
                 **kwargs: Any) -> None:
        samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        values = {k: v for k, v in kwargs.items() if k not in samplers}
        _ErunTorchState.__init__(self, model=model, optimizer=optimizer, **values)
        for key, sampler in samplers.items():
            sampler.register_with(self, "sampler/" + key)
            object.__setattr__(self, key, sampler)
        self._horovod_init()
