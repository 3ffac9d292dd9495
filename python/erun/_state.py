"""erun.State and erun.run: elastic training state and the loop that keeps a
training function going across membership changes (the Python side of
erun::State and erun::run(), see include/erun/state.hpp and docs/state.md).

Everything the loop does besides the C++ State's work lives in the State
object: callbacks after a sync (``on_sync``), after a re-join (``on_reset``),
before a re-join (``on_rejoin``) and the checks that tell a lost peer behind
a non-erun exception (``add_peer_loss_check``); erun.torch's process group
registers the last two with the state of the erun.run loop it is built in
(``running_state()``, package-internal)."""
from __future__ import annotations

import contextvars
import functools
import os
import pickle
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

from . import _core, _erun
from ._erun import CommError, Error, HostsUpdated

F = TypeVar("F", bound=Callable[..., Any])


class State:
    """Training state that survives failures and resizes.

    Keyword arguments become picklable values reachable as attributes
    (``state.epoch += 1``). ``register_buffer`` adds a tensor/array committed by
    memcpy of its own memory. ``commit()`` snapshots everything (and is where
    the ranks agree on pending host changes: it may raise HostsUpdated);
    ``restore()`` returns to the last commit; ``sync()`` gives every rank the
    newest commit of any rank. commit/sync/check_host_updates are collective.
    """
    _values: Dict[str, Any]
    _c: _erun.State
    _buffers: List[Any]
    _reset_callbacks: List[Callable[[int, int], Any]]
    _sync_callbacks: List[Callable[[], Any]]
    _rejoin_callbacks: List[Callable[[], Any]]
    _peer_loss_checks: List[Callable[[BaseException], bool]]

    def __init__(self, **values: Any) -> None:
        _core.init()
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_c", _erun.State())
        object.__setattr__(self, "_buffers", [])
        object.__setattr__(self, "_reset_callbacks", [])
        object.__setattr__(self, "_sync_callbacks", [])
        object.__setattr__(self, "_rejoin_callbacks", [])
        object.__setattr__(self, "_peer_loss_checks", [])
        for name, value in values.items():
            self.register_value(name, value)

    # Registered values read and write as attributes.
    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values")
        if values is not None and name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or registered value '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._values:
            self._values[name] = value
        else:
            object.__setattr__(self, name, value)

    @property
    def native(self) -> _erun.State:
        """The extension's State (erun::State) underneath, for erun's own
        modules (erun.torch.ElasticSampler registers its position there)."""
        return self._c

    def register_value(self, name: str, value: Any) -> None:
        """A picklable value, committed by pickling; read/written as state.<name>."""
        if name in self._values or name in type(self).__dict__:
            raise Error(f"erun: state value '{name}' is registered twice or shadows a State attribute")
        values = self._values
        values[name] = value
        self.register_callbacks("value/" + name, lambda: [pickle.dumps(values[name], protocol=5)],
                                lambda view: values.__setitem__(name, pickle.loads(view)))

    def register_callbacks(self, name: str, save: Callable[[], Sequence[Any]],
                           load: Callable[[memoryview], None]) -> None:
        """A custom entry: save() returns a list of bytes-like pieces or
        (address, nbytes) pairs, concatenated into the commit; load(view) gets
        a memoryview of those bytes and must copy what it keeps."""
        self._c.register_callbacks(name, save, load)

    def register_buffer(self, name: str, x: _core.Tensor) -> None:
        """A contiguous CPU tensor or numpy array, committed and restored by
        memcpy of its own memory. It must stay the same object in the same
        memory (update it in place); commit() checks that."""
        b = _core.Buffer(x, "State.register_buffer", writable=True)
        self._buffers.append((name, x, b.ptr, b.nbytes))
        self._c.register_buffer(name, b.ptr, b.nbytes)

    def register_shard(self, name: str, rows: int, get: Callable[[], Any], set: Callable[[Any], None],
                       split: str = "chunk") -> None:
        """A sharded entry: this rank's rows of a global tensor of ``rows``
        rows (its first dimension), split over the ranks as ``shard_rows``
        says (``split="chunk"``: as torch.chunk and FSDP2's Shard(0);
        ``"even"``: the first rows % size ranks one more row). ``get()``
        returns this rank's piece (a contiguous CPU tensor or numpy array of
        its rows); when the world changes, sync() gives each rank its new
        rows from the pieces the hosts hold, in a new tensor of the same
        dtype and trailing shape that it hands to ``set(new)``. See
        docs/state.md, "Sharded entries"."""
        if split not in ("chunk", "even"):
            raise Error(f"erun: State.register_shard('{name}'): split must be 'chunk' or 'even', not {split!r}")
        first = get()
        _core.Buffer(first, "State.register_shard", writable=True)
        trailing = tuple(first.shape[1:])
        dtype = first.dtype
        row_bytes = _row_bytes(first)
        is_array = isinstance(first, np.ndarray)
        del first  # a reshard frees the old piece: keep no reference to it
        fresh: List[Any] = []

        def piece() -> Any:
            x = get()
            if x.dtype != dtype or tuple(x.shape[1:]) != trailing:
                raise Error(f"erun: sharded entry '{name}' changed its dtype or row shape (now {x.dtype}, "
                            f"{tuple(x.shape[1:])}; registered {dtype}, {trailing})")
            return x

        def save() -> List[Tuple[int, int]]:
            b = _core.Buffer(piece(), "State.commit", writable=False)
            return [(b.ptr, b.nbytes)]

        def load(view: memoryview) -> None:
            x = piece()
            if len(view) != x.shape[0] * row_bytes:
                x = _empty_rows(is_array, dtype, trailing, len(view) // row_bytes)
                set(x)
            _copy_bytes_into(x, view)

        def prepare(n: int) -> int:
            fresh[:] = [_empty_rows(is_array, dtype, trailing, n)]
            return _core.Buffer(fresh[0], "State.sync", writable=True).ptr

        def install() -> None:
            set(fresh.pop())

        self._c.register_shard(name, rows, row_bytes, split == "even", save, load, prepare, install)

    def _check_buffers(self) -> None:
        for name, x, ptr, nbytes in self._buffers:
            b = _core.Buffer(x, "State", writable=True)
            if b.ptr != ptr or b.nbytes != nbytes:
                raise Error(f"erun: state buffer '{name}' moved or changed size since it was registered; update "
                            f"registered tensors in place (copy_(), optimizer steps) instead of replacing them")

    def commit(self) -> None:
        self._check_buffers()
        self._c.commit()

    def restore(self) -> None:
        self._c.restore()

    def sync(self) -> None:
        self._c.sync()
        for callback in self._sync_callbacks:
            callback()

    def check_host_updates(self) -> None:
        """Collective: raises HostsUpdated on every rank when any rank saw a pending update."""
        self._c.check_host_updates()

    @property
    def commit_id(self) -> int:
        return self._c.commit_id

    def set_checkpoint_dir(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Durable commits: rank 0 writes each commit to PATH/erun-state.bin; a
        valid file there is loaded. Call after registering every entry."""
        self._c.set_checkpoint_dir(str(path))

    def on_reset(self, callback: F) -> F:
        """callback(old_size, new_size) runs after every re-join, once the state
        is synced (so what it changes, e.g. a learning rate, is kept)."""
        self._reset_callbacks.append(callback)
        return callback

    def on_sync(self, callback: F) -> F:
        """callback() runs after every sync(), e.g. to re-split work over the
        world the sync was in (TorchState's sampler does)."""
        self._sync_callbacks.append(callback)
        return callback

    def on_rejoin(self, callback: F) -> F:
        """callback() runs in erun.run before every re-join, to tear down what
        belongs to the old generation (erun.torch's process group does).
        Registering the same callback again does nothing."""
        if callback not in self._rejoin_callbacks:
            self._rejoin_callbacks.append(callback)
        return callback

    def add_peer_loss_check(self, check: Callable[[BaseException], bool]) -> None:
        """check(exc) -> True when an exception erun.run would otherwise let
        through (not an erun.Error) came from a lost peer; erun.run then
        restores and re-joins as on CommError (erun.torch's process group
        checks torch.distributed errors with an erun barrier). Registering
        the same check again does nothing."""
        if check not in self._peer_loss_checks:
            self._peer_loss_checks.append(check)

    def _notify_reset(self, old_size: int, new_size: int) -> None:
        for cb in self._reset_callbacks:
            cb(old_size, new_size)

    def _lost_peer(self, exc: BaseException) -> bool:
        return any(check(exc) for check in self._peer_loss_checks)

    def _rejoin(self, comm_error: bool, what: Any) -> None:
        for callback in self._rejoin_callbacks:
            callback()
        self._c.rejoin(comm_error, str(what))


# The State of the erun.run loop whose function is running (in this thread or task).
_running: contextvars.ContextVar[Optional[State]] = contextvars.ContextVar("erun_running_state", default=None)


def running_state() -> Optional[State]:
    """The State of the erun.run loop whose function is running, else None.
    Package-internal (erun.torch.ProcessGroup registers itself there)."""
    return _running.get()


def _loop(fn: Callable[..., Any], state: State, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    if not isinstance(state, State):
        raise Error(f"erun.run: the function's first argument must be an erun.State, got {type(state).__name__}")
    while True:
        try:
            state.sync()
            reset = state._c.take_reset()
            if reset is not None:
                state._notify_reset(*reset)
            token = _running.set(state)
            try:
                return fn(*args, **kwargs)
            finally:
                _running.reset(token)
        except HostsUpdated as e:
            state._rejoin(False, e)
        except CommError as e:
            state._rejoin(True, e)
        except Exception as e:  # noqa: BLE001 - only a lost peer is retried
            if isinstance(e, Error) or not state._lost_peer(e):
                raise
            state._rejoin(True, f"{type(e).__name__}: {e}")


def shard_rows(rows: int, rank: int, size: int, split: str = "chunk") -> Tuple[int, int]:
    """The rows [begin, end) that rank ``rank`` of ``size`` holds of a
    sharded entry of ``rows`` rows (State.register_shard)."""
    if split not in ("chunk", "even"):
        raise Error(f"erun.shard_rows: split must be 'chunk' or 'even', not {split!r}")
    return _erun.shard_rows(rows, rank, size, split == "even")


def _row_bytes(x: Any) -> int:
    n = x.dtype.itemsize if hasattr(x.dtype, "itemsize") else x.element_size()
    for d in x.shape[1:]:
        n *= int(d)
    return int(n)


def _empty_rows(is_array: bool, dtype: Any, trailing: Tuple[int, ...], rows: int) -> Any:
    """A new contiguous numpy array (or torch tensor) of `rows` rows."""
    shape = (rows,) + trailing
    if is_array:
        return np.empty(shape, dtype=dtype)
    import torch
    return torch.empty(shape, dtype=dtype)


def _copy_bytes_into(x: Any, view: memoryview) -> None:
    if len(view) == 0:
        return
    if isinstance(x, np.ndarray):
        x.reshape(-1).view(np.uint8)[:] = np.frombuffer(view, dtype=np.uint8)
    else:
        import torch
        x.reshape(-1).view(torch.uint8).copy_(torch.frombuffer(view, dtype=torch.uint8))


def run(arg: Union[Callable[..., Any], State]) -> Callable[..., Any]:
    """The elastic loop, as a decorator: ``@erun.run def train(state, ...)``
    (the state is the first argument) or ``erun.run(state)(fn)`` (fn() is
    called with the state as its first argument). Syncs the state, calls the
    function; on CommError restores the last commit and re-joins, on
    HostsUpdated re-joins; then syncs, runs the reset callbacks and calls the
    function again. Any other exception ends the loop unchanged, unless a
    check of the state's (add_peer_loss_check) finds it came from a lost
    peer: then it is handled as a CommError."""
    if isinstance(arg, State):
        def bind(fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            def bound(*args: Any, **kwargs: Any) -> Any:
                return _loop(fn, arg, (arg,) + args, kwargs)
            return bound
        return bind
    if not callable(arg):
        raise Error(f"erun.run: expected a function or an erun.State, got {type(arg).__name__}")

    @functools.wraps(arg)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not args:
            raise Error(f"erun.run: call {arg.__name__}(state, ...) with an erun.State first")
        return _loop(arg, args[0], args, kwargs)
    return wrapper
