"""``hvd.elastic``: Horovod's elastic training API over erun's in-place recovery.

``@hvd.elastic.run`` runs a training function ``train(state, ...)`` in erun's
elastic loop (erun.run): after a lost peer (HorovodInternalError) the state
goes back to its last commit and the ranks re-join; after a host change
(HostsUpdatedInterrupt) they re-join; either way the survivors keep their
process, the state is synced to every rank (new ones included), the reset
callbacks run, and the function is called again.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from erun._erun import Error
from erun._state import _loop
from ...common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, translated
from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "HorovodInternalError",
           "HostsUpdatedInterrupt"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: ``@hvd.elastic.run def train(state, ...)``; call ``train(state, ...)``."""
    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise Error(f"erun.horovod: {func.__name__}(state, ...) takes an hvd.elastic state "
                        f"(TorchState or ObjectState) first, got {type(state).__name__}")
        try:
            return _loop(func, state, (state,) + args, kwargs)
        except BaseException as e:
            t = translated(e)
            if t is e:
                raise
            raise t from e
    return wrapper
