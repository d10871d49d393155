"""A NumPy-backed stand-in for the part of CuPy that pshybrid's GPU training path uses, to run
that path where no GPU is (``install(monkeypatch)``). Device arrays are ``ndarray`` (a NumPy
subclass whose module name starts with "cupy", as ``backend.array_module`` looks for);
mixing a host array (not a scalar) into a device operation raises, as CuPy does. Kernels run
at once; a device->host copy queued with ``get(blocking=False)`` runs only when the host waits
(a stream or event synchronisation), so a host read before the sync sees stale values; a
host->device ``set`` runs in stream order (what is queued first, then itself). Events read
the host clock, or ``state.now`` when a test sets it (a device clock it advances). The
embedding kernels are their NumPy twins (``kernels.gather_ref`` / ``scatter_add_ref``)."""

from __future__ import annotations

import sys
import time
import types

import numpy as np


class ndarray(np.ndarray):  # cupy's name
    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kw):
        args = [_dev_arg(x) for x in inputs]
        if out is not None:
            kw["out"] = tuple(_dev_arg(o) for o in out)
        return _wrap(getattr(ufunc, method)(*args, **kw))

    def __array_function__(self, func, types_, args, kwargs):
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def __getitem__(self, key):
        return _wrap(np.ndarray.__getitem__(self, _index(key)))

    def __setitem__(self, key, value):
        np.ndarray.__setitem__(self, _index(key), _dev_arg(value))

    def get(self, stream=None, order="C", out=None, blocking=True):
        if blocking:
            STATE.log.append("blocking get")
            STATE.run_all()
            return np.array(self.view(np.ndarray), order=order)
        assert stream is not None and out is not None, "an async copy needs a stream and out"
        src = np.array(self.view(np.ndarray))  # the values when the device reaches the copy
        STATE.log.append("d2h queued")
        STATE.queue.append(lambda: np.copyto(out, src))
        return out

    def set(self, arr, stream=None):
        assert isinstance(arr, np.ndarray) and not isinstance(arr, ndarray)
        dst = self.view(np.ndarray)
        STATE.queue.append(lambda: np.copyto(dst, arr))
        STATE.run_all()  # stream order: the device reaches it before any later kernel

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


ndarray.__module__ = "cupy._core.core"


def _dev_arg(x):
    """A device array's NumPy view; a host array (not a scalar) raises, as in CuPy."""
    if isinstance(x, ndarray):
        return x.view(np.ndarray)
    if isinstance(x, np.ndarray) and x.ndim > 0:
        raise TypeError("fake cupy: a host array in a device operation (implicit copy)")
    return x


def _index(key):
    return tuple(_dev_arg(k) for k in key) if isinstance(key, tuple) else _dev_arg(key)


def _wrap(r):
    if isinstance(r, np.ndarray) and not isinstance(r, ndarray):
        return r.view(ndarray)
    if isinstance(r, tuple):
        return tuple(_wrap(x) for x in r)
    return r


def _unwrap(x):
    if isinstance(x, ndarray):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


class _State:
    """The fake device: its queue of copies (``done`` of them ran), what the host did
    (``log``), and the device clock of events (``now``; None: the host clock)."""

    def __init__(self, now=None):
        self.queue, self.done, self.log, self.now = [], 0, [], now

    def run(self, upto):
        while self.done < upto:
            self.queue[self.done]()
            self.done += 1

    def run_all(self):
        self.run(len(self.queue))


STATE = _State()


class Event:
    def __init__(self, *a, **k):
        self.state, self.upto, self.t = STATE, 0, 0.0

    def record(self, stream=None):
        self.state, self.upto = STATE, len(STATE.queue)  # the copies queued before it
        self.t = time.perf_counter() if STATE.now is None else STATE.now

    @property
    def done(self):
        return self.state.done >= self.upto

    def synchronize(self):
        self.state.log.append("event sync")
        self.state.run(self.upto)


class Stream:
    def synchronize(self):
        STATE.log.append("stream sync")
        STATE.run_all()


_STREAM = Stream()


def _elapsed(a, b):
    assert a.done and b.done, "cudaEventElapsedTime of an event not reached"
    return (b.t - a.t) * 1e3


def _module():
    cp = types.ModuleType("cupy")
    cp.__version__ = "fake"
    cp.ndarray = ndarray

    def asarray(a, dtype=None):
        if isinstance(a, ndarray):
            return a if dtype is None else a.astype(dtype)
        return np.array(a, dtype=dtype).view(ndarray)  # an explicit host->device copy

    def ascontiguousarray(a, dtype=None):
        return _wrap(np.ascontiguousarray(_unwrap(asarray(a)), dtype=dtype))

    cp.asarray, cp.array, cp.ascontiguousarray = asarray, asarray, ascontiguousarray
    def on_device(f):
        return lambda *a, **k: _wrap(f(*a, **k))

    for name in ("zeros", "empty", "ones", "full", "arange", "tril_indices", "float32",
                 "float64", "int64", "int32", "bool_", "dtype", "newaxis"):
        attr = getattr(np, name)
        setattr(cp, name, on_device(attr) if callable(attr) and not isinstance(attr, type)
                else attr)

    def module_getattr(name):  # the rest of the NumPy subset, on device arrays
        attr = getattr(np, name)
        if callable(attr) and not isinstance(attr, type):
            return lambda *a, **k: _wrap(attr(*_unwrap(a), **_unwrap(k)))
        return attr

    cp.__getattr__ = module_getattr
    def alloc_pinned_memory(n):
        STATE.log.append(f"alloc {n}")
        return bytearray(b"\x7f" * n)  # not zeroed, as page-locked memory

    cp.cuda = types.SimpleNamespace(
        Event=Event, get_elapsed_time=_elapsed, get_current_stream=lambda: _STREAM,
        alloc_pinned_memory=alloc_pinned_memory,
        Device=lambda i=0: types.SimpleNamespace(use=lambda: None, id=i),
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
    return cp


def install(monkeypatch, now=None):
    """Make ``import cupy`` the stand-in for this test, with the embedding kernels as their
    NumPy twins and no NVRTC build, on a fresh fake device (``now``: its clock, see
    ``_State``); returns the module (``.state``: the device)."""
    global STATE
    from pshybrid import backend, cuda, devices, transport
    from pshybrid.kernels import gather_ref, scatter_add_ref

    STATE = _State(now)
    cp = _module()
    cp.state = STATE
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(
        empty_pinned=lambda shape, dtype: np.empty(shape, dtype)))
    monkeypatch.setattr(backend, "cupy_status", lambda: (True, "fake cupy"))
    monkeypatch.setattr(devices, "cupy_status", lambda: (True, "fake cupy"))
    monkeypatch.setattr(backend, "_RING", backend._PinnedRing())  # no fake slot outlives it
    monkeypatch.setattr(transport, "_PINNED", {})
    monkeypatch.setattr(cuda, "module", lambda: None)
    monkeypatch.setattr(cuda, "gather", lambda rows, index: _wrap(gather_ref(
        _unwrap(rows), _unwrap(index))))
    monkeypatch.setattr(cuda, "scatter_add", lambda index, values, n: _wrap(scatter_add_ref(
        _unwrap(index), _unwrap(values), n)))
    return cp
