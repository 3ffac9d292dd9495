"""erun.State and erun.run: elastic training state and the loop that keeps a
training function going across membership changes (the Python side of
erun::State and erun::run(), see include/erun/state.hpp and docs/state.md)."""
import functools
import pickle

from . import _core, _erun
from ._erun import CommError, Error, HostsUpdated


class State:
    """Training state that survives failures and resizes.

    Keyword arguments become picklable values reachable as attributes
    (``state.epoch += 1``). ``register_buffer`` adds a tensor/array committed by
    memcpy of its own memory. ``commit()`` snapshots everything (and is where
    the ranks agree on pending host changes: it may raise HostsUpdated);
    ``restore()`` returns to the last commit; ``sync()`` gives every rank the
    newest commit of any rank. commit/sync/check_host_updates are collective.
    """

    def __init__(self, **values):
        _core.init()
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_c", _erun.State())
        object.__setattr__(self, "_buffers", [])
        object.__setattr__(self, "_reset_callbacks", [])
        object.__setattr__(self, "_sync_hooks", [])
        for name, value in values.items():
            self.register_value(name, value)

    # Registered values read and write as attributes.
    def __getattr__(self, name):
        values = self.__dict__.get("_values")
        if values is not None and name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or registered value '{name}'")

    def __setattr__(self, name, value):
        if name in self._values:
            self._values[name] = value
        else:
            object.__setattr__(self, name, value)

    def register_value(self, name, value):
        """A picklable value, committed by pickling; read/written as state.<name>."""
        if name in self._values or name in type(self).__dict__:
            raise Error(f"erun: state value '{name}' is registered twice or shadows a State attribute")
        values = self._values
        values[name] = value
        self.register_callbacks("value/" + name, lambda: [pickle.dumps(values[name], protocol=5)],
                                lambda view: values.__setitem__(name, pickle.loads(view)))

    def register_callbacks(self, name, save, load):
        """A custom entry: save() returns a list of bytes-like pieces or
        (address, nbytes) pairs, concatenated into the commit; load(view) gets
        a memoryview of those bytes and must copy what it keeps."""
        self._c.register_callbacks(name, save, load)

    def register_buffer(self, name, x):
        """A contiguous CPU tensor or numpy array, committed and restored by
        memcpy of its own memory. It must stay the same object in the same
        memory (update it in place); commit() checks that."""
        b = _core._Buffer(x, "State.register_buffer", writable=True)
        self._buffers.append((name, x, b.ptr, b.nbytes))
        self._c.register_buffer(name, b.ptr, b.nbytes)

    def _check_buffers(self):
        for name, x, ptr, nbytes in self._buffers:
            b = _core._Buffer(x, "State", writable=True)
            if b.ptr != ptr or b.nbytes != nbytes:
                raise Error(f"erun: state buffer '{name}' moved or changed size since it was registered; update "
                            f"registered tensors in place (copy_(), optimizer steps) instead of replacing them")

    def commit(self):
        self._check_buffers()
        self._c.commit()

    def restore(self):
        self._c.restore()

    def sync(self):
        self._c.sync()
        for hook in self._sync_hooks:
            hook()

    def check_host_updates(self):
        """Collective: raises HostsUpdated on every rank when any rank saw a pending update."""
        self._c.check_host_updates()

    @property
    def commit_id(self):
        return self._c.commit_id

    def set_checkpoint_dir(self, path):
        """Durable commits: rank 0 writes each commit to PATH/erun-state.bin; a
        valid file there is loaded. Call after registering every entry."""
        self._c.set_checkpoint_dir(str(path))

    def on_reset(self, callback):
        """callback(old_size, new_size) runs after every re-join, once the state
        is synced (so what it changes, e.g. a learning rate, is kept)."""
        self._reset_callbacks.append(callback)
        return callback

    def _notify_reset(self, old_size, new_size):
        for cb in self._reset_callbacks:
            cb(old_size, new_size)

    def _rejoin(self, comm_error, what):
        for hook in _before_rejoin:
            hook()
        return self._c.rejoin(comm_error, str(what))


# Called before every re-join (erun.torch destroys its process group there).
_before_rejoin = []
# probe(exception) -> True when a non-erun exception came from a lost peer
# (erun.torch checks torch.distributed errors with an erun barrier).
_failure_probes = []


def _lost_peer(exc):
    return any(probe(exc) for probe in _failure_probes)


def _loop(fn, state, args, kwargs):
    if not isinstance(state, State):
        raise Error(f"erun.run: the function's first argument must be an erun.State, got {type(state).__name__}")
    while True:
        try:
            state.sync()
            reset = state._c.take_reset()
            if reset is not None:
                state._notify_reset(*reset)
            return fn(*args, **kwargs)
        except HostsUpdated as e:
            state._rejoin(False, e)
        except CommError as e:
            state._rejoin(True, e)
        except Exception as e:  # noqa: BLE001 - only a lost peer is retried
            if isinstance(e, Error) or not _lost_peer(e):
                raise
            state._rejoin(True, f"{type(e).__name__}: {e}")


def run(arg):
    """The elastic loop, as a decorator: ``@erun.run def train(state, ...)``
    (the state is the first argument) or ``erun.run(state)(fn)`` (fn() is
    called with the state as its first argument). Syncs the state, calls the
    function; on CommError restores the last commit and re-joins, on
    HostsUpdated re-joins; then syncs, runs the reset callbacks and calls the
    function again. Any other exception ends the loop unchanged."""
    if isinstance(arg, State):
        def bind(fn):
            @functools.wraps(fn)
            def bound(*args, **kwargs):
                return _loop(fn, arg, (arg,) + args, kwargs)
            return bound
        return bind
    if not callable(arg):
        raise Error(f"erun.run: expected a function or an erun.State, got {type(arg).__name__}")

    @functools.wraps(arg)
    def wrapper(*args, **kwargs):
        if not args:
            raise Error(f"erun.run: call {arg.__name__}(state, ...) with an erun.State first")
        return _loop(arg, args[0], args, kwargs)
    return wrapper
