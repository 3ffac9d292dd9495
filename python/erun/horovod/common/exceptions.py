"""Horovod's exceptions (``horovod.common.exceptions``), as erun's.

erun raises these from every ``erun.horovod`` call where Horovod would: a
collective or a commit that lost a peer raises ``HorovodInternalError`` (an
``erun.CommError``), a commit or ``check_host_updates()`` that found the hosts
changed raises ``HostsUpdatedInterrupt`` (an ``erun.HostsUpdated``). Code that
catches either keeps working, and ``hvd.elastic.run`` (like ``erun.run``)
recovers from both.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar, cast

from erun._erun import CommError, HostsUpdated

F = TypeVar("F", bound=Callable[..., Any])


class HorovodInternalError(CommError):
    """A peer was lost or timed out during a collective: the elastic loop
    restores the last commit and re-joins."""


class HostsUpdatedInterrupt(HostsUpdated):
    """The job's hosts changed: the elastic loop re-joins the new world.

    ``skip_sync`` is accepted for Horovod's signature; erun always syncs
    after a re-join (the sync of survivors that all hold the newest commit
    moves no state)."""

    def __init__(self, skip_sync: bool = False, *args: Any) -> None:
        super().__init__(*(args or ("hosts updated",)))
        self.skip_sync = bool(skip_sync)


def translated(exc: BaseException) -> BaseException:
    """erun's CommError and HostsUpdated as Horovod's exceptions (other errors unchanged)."""
    if isinstance(exc, (HorovodInternalError, HostsUpdatedInterrupt)):
        return exc
    if isinstance(exc, CommError):
        return HorovodInternalError(str(exc))
    if isinstance(exc, HostsUpdated):
        return HostsUpdatedInterrupt(False, str(exc))
    return exc


def raises_horovod_errors(fn: F) -> F:
    """Decorator: fn's erun.CommError/HostsUpdated come out as Horovod's exceptions."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (CommError, HostsUpdated) as e:
            t = translated(e)
            if t is e:
                raise
            raise t from e
    return cast(F, wrapper)
