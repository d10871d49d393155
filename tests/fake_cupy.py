"""A NumPy-backed stand-in for the part of CuPy that pshybrid's GPU training path uses, to run
that path where no GPU is (``install(monkeypatch)``). Device arrays are ``ndarray`` (a NumPy
subclass whose module name starts with "cupy", as ``backend.array_module`` looks for);
mixing a host array (not a scalar) into a device operation raises, as CuPy does. Kernels run
at once; a device->host copy queued with ``get(blocking=False)`` runs only when the host waits
(a stream or event synchronisation), so a host read before the sync sees stale values; a
host->device ``set`` runs in stream order (what is queued first, then itself). Events read
the host clock, or ``state.now`` when a test sets it (a device clock it advances). The
embedding kernels are their NumPy twins (``kernels.gather_ref`` / ``scatter_add_ref``), the
fused ones theirs (``layers.bce_with_logits``, the optimizers' CPU kernels).

Launches: every operation that would put work on a CUDA stream counts one in
``state.launches`` (an elementwise or reduction kernel, a matmul, a fancy read or write, an
array made filled, a cast or copy, a raw kernel, a host<->device copy, a graph launch);
views and empty arrays count none. Graphs: ``Stream.begin_capture`` .. ``end_capture``
records each operation (run as well, for its shape) as a replay on the same buffers; at the
end every array the graph writes is poisoned (NaN, or -2**62 in integers: CUDA runs nothing
at a capture, so a graph that reads what only the capture wrote reads garbage) and
``Graph.launch`` replays the operations in order, as one launch. A host wait, a blocking or
host->device copy during a capture raises, as CUDA's stream capture does."""

from __future__ import annotations

import contextlib
import sys
import time
import types

import numpy as np


class ndarray(np.ndarray):  # cupy's name
    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kw):
        args = [_dev_arg(x) for x in inputs]
        f = getattr(ufunc, method)
        if out is not None:
            kw["out"] = tuple(_dev_arg(o) for o in out)
            return _wrap(_op(lambda: f(*args, **kw), kw["out"]))
        if method == "at":  # in place on its first operand
            return _op(lambda: f(*args, **kw), args[:1])
        return _made(lambda: f(*args, **kw))

    def __array_function__(self, func, types_, args, kwargs):
        a, k = _unwrap(args), _unwrap(kwargs)
        return _made(lambda: func(*a, **k), views_of=self)

    def __getitem__(self, key):
        k = _index(key)
        return _made(lambda: np.ndarray.__getitem__(self.view(np.ndarray), k), views_of=self)

    def __setitem__(self, key, value):
        k, v, me = _index(key), _dev_arg(value), self.view(np.ndarray)
        _op(lambda: np.ndarray.__setitem__(me, k, v), [me])

    def fill(self, value):
        me = self.view(np.ndarray)
        _op(lambda: me.fill(value), [me])

    def astype(self, dtype, copy=True, **kw):
        me = self.view(np.ndarray)
        return _made(lambda: me.astype(dtype, copy=copy, **kw), views_of=self)

    def copy(self, order="C"):
        me = self.view(np.ndarray)
        return _made(lambda: me.copy(order=order))

    def reshape(self, *shape, **kw):
        me = self.view(np.ndarray)
        return _made(lambda: me.reshape(*shape, **kw), views_of=self)

    def ravel(self, order="C"):
        me = self.view(np.ndarray)
        return _made(lambda: me.ravel(order=order), views_of=self)

    def get(self, stream=None, order="C", out=None, blocking=True):
        STATE.no_capture("a device->host copy")
        STATE.launches += 1
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
        STATE.no_capture("a host->device copy")
        STATE.launches += 1
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
    if isinstance(r, np.generic):  # CuPy's reductions give 0-d device arrays
        return np.asarray(r).view(ndarray)
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


def _op(run, writes):
    """A device operation that writes (in place) the arrays ``writes``: run now, counted as
    a launch, and recorded with them in a capture."""
    out = run()
    STATE.launched(run, [w for w in writes if isinstance(w, np.ndarray)])
    return out


def _made(make, views_of=None):
    """A device operation that makes an array: a view of ``views_of`` (or of no device
    memory: a scalar) is no launch; a new array is one, its replay refills that array."""
    r = _wrap(make())
    if not isinstance(r, np.ndarray) or (views_of is not None and r.base is not None
                                         and np.shares_memory(r, views_of)):
        return r
    dst = r.view(np.ndarray)
    STATE.launched(lambda: np.copyto(dst, make()), [dst])
    return r


class _State:
    """The fake device: its queue of copies (``done`` of them ran), what the host did
    (``log``), the device clock of events (``now``; None: the host clock), the launches
    made (``launches``) and the capture in progress (``capture``: [(replay, writes)])."""

    def __init__(self, now=None):
        self.queue, self.done, self.log, self.now = [], 0, [], now
        self.launches, self.capture = 0, None

    def launched(self, replay, writes) -> None:
        if self.capture is None:
            self.launches += 1
        else:
            self.capture.append((replay, writes))

    def no_capture(self, what: str) -> None:
        if self.capture is not None:
            raise RuntimeError(f"fake cupy: {what} during a stream capture "
                               "(cudaErrorStreamCaptureUnsupported)")

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
        STATE.no_capture("an event synchronisation")
        self.state.log.append("event sync")
        self.state.run(self.upto)


class Stream:
    """The legacy default stream (``ptr`` 0), or a non-blocking one (``non_blocking``);
    ``use()`` makes it current."""

    def __init__(self, non_blocking=False, ptr=None):
        self.ptr = ptr if ptr is not None else 0x5000 + id(self) % 4096 * 16

    def synchronize(self):
        STATE.no_capture("a stream synchronisation")
        STATE.log.append("stream sync")
        STATE.run_all()

    def use(self):
        global _CURRENT
        _CURRENT = self

    def begin_capture(self, mode=None):
        assert self.ptr not in (0, 1), "cannot capture on the default (legacy) stream"
        assert STATE.capture is None
        STATE.capture = []

    def is_capturing(self):
        return STATE.capture is not None

    def end_capture(self):
        ops, STATE.capture = STATE.capture, None
        for _, writes in ops:  # CUDA ran nothing: what the graph writes holds garbage
            for w in writes:
                if w.dtype.kind == "f":
                    w[...] = np.nan
                elif w.dtype.kind in "iu":
                    w[...] = -2**62 if w.dtype.itemsize == 8 else -1
        return Graph([run for run, _ in ops])


class Graph:
    def __init__(self, ops):
        self.ops = ops

    def launch(self, stream=None):
        STATE.no_capture("a graph launch")
        STATE.launches += 1
        for run in self.ops:
            run()


_STREAM = Stream(ptr=0)
_CURRENT = _STREAM


def _elapsed(a, b):
    assert a.done and b.done, "cudaEventElapsedTime of an event not reached"
    return (b.t - a.t) * 1e3


def _module():
    cp = types.ModuleType("cupy")
    cp.__version__ = "fake"
    cp.ndarray = ndarray

    def asarray(a, dtype=None):
        if isinstance(a, ndarray):
            return a if dtype is None or a.dtype == dtype else a.astype(dtype)
        STATE.no_capture("a host->device copy (pageable)")
        STATE.launches += 1
        return np.array(a, dtype=dtype).view(ndarray)  # an explicit host->device copy

    def ascontiguousarray(a, dtype=None):
        a = asarray(a)
        src = a.view(np.ndarray)
        return _made(lambda: np.ascontiguousarray(src, dtype=dtype), views_of=a)

    cp.asarray, cp.array, cp.ascontiguousarray = asarray, asarray, ascontiguousarray
    def on_device(f):  # made filled: a launch (a memset, a kernel)
        return lambda *a, **k: _made(lambda: f(*a, **k))

    for name in ("zeros", "ones", "full", "arange", "tril_indices", "zeros_like"):
        setattr(cp, name, on_device(getattr(np, name)))
    cp.empty = lambda *a, **k: _wrap(np.empty(*a, **k))  # no launch
    cp.empty_like = lambda a, **k: _wrap(np.empty_like(_unwrap(a), **k))
    for name in ("float32", "float64", "int64", "int32", "bool_", "dtype", "newaxis"):
        setattr(cp, name, getattr(np, name))

    def module_getattr(name):  # the rest of the NumPy subset, on device arrays
        attr = getattr(np, name)
        if callable(attr) and not isinstance(attr, type):
            def call(*a, **k):
                a, k = _unwrap(a), _unwrap(k)
                out = k.get("out")
                if out is not None:
                    return _wrap(_op(lambda: attr(*a, **k), [out]))
                views = next((x for x in a if isinstance(x, np.ndarray)), None)
                return _made(lambda: attr(*a, **k), views_of=views)
            return call
        return attr

    cp.__getattr__ = module_getattr
    def alloc_pinned_memory(n):
        STATE.log.append(f"alloc {n}")
        return bytearray(b"\x7f" * n)  # not zeroed, as page-locked memory

    cp.cuda = types.SimpleNamespace(
        Event=Event, get_elapsed_time=_elapsed, get_current_stream=lambda: _CURRENT,
        alloc_pinned_memory=alloc_pinned_memory, Stream=Stream, Graph=Graph,
        MemoryPool=lambda: types.SimpleNamespace(malloc=None),
        using_allocator=lambda malloc=None: contextlib.nullcontext(),
        Device=lambda i=0: types.SimpleNamespace(use=lambda: None, id=i,
                                                 synchronize=lambda: None),
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
    return cp


def install(monkeypatch, now=None):
    """Make ``import cupy`` the stand-in for this test, with the embedding kernels as their
    NumPy twins and no NVRTC build, on a fresh fake device (``now``: its clock, see
    ``_State``); returns the module (``.state``: the device)."""
    global STATE, _CURRENT
    from pshybrid import backend, cuda, devices, transport
    from pshybrid.kernels import gather_ref

    STATE, _CURRENT = _State(now), _STREAM
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
    monkeypatch.setattr(cuda, "gather", lambda rows, index: _made(lambda: gather_ref(
        _unwrap(rows), _unwrap(index))))
    monkeypatch.setattr(cuda, "scatter_add", _scatter_add)
    monkeypatch.setattr(cuda, "bce", _bce)
    monkeypatch.setattr(cuda, "dense_update", _dense_update)
    monkeypatch.setattr(cuda, "bias_act", _bias_act)
    monkeypatch.setattr(cuda, "relu_grad", _relu_grad)
    monkeypatch.setattr(cuda, "gemm_acc", _gemm_acc)
    return cp


def _bias_act(y, b, relu):
    """``cuda.bias_act``'s twin (one launch): y += b, then y * (y > 0), in place."""
    yy, bb = _unwrap(y), _unwrap(b)

    def run():
        np.add(yy, bb, out=yy)
        if relu:
            np.multiply(yy, yy > 0, out=yy)

    _op(run, [yy])
    return y


def _relu_grad(dy, y):
    """``cuda.relu_grad``'s twin (one launch): dy * (y > 0)."""
    d, yy = _unwrap(dy), _unwrap(y)
    return _made(lambda: d * (yy > 0))


def _gemm_acc(x, dy, out):
    """``cuda.gemm_acc``'s twin (one launch): out += x.T @ dy."""
    xx, d, o = _unwrap(x), _unwrap(dy), _unwrap(out)
    _op(lambda: np.add(o, xx.T @ d, out=o), [o])


def _scatter_add(index, values, n, out=None):
    """``cuda.scatter_add``'s twin: a new array, or into ``out`` (a fill, then the kernel)."""
    from pshybrid.kernels import scatter_add_ref

    idx, val = _unwrap(index), _unwrap(values)
    if out is None:
        return _made(lambda: scatter_add_ref(idx, val, n))
    out.fill(0)
    dst = out.view(np.ndarray)
    return _op(lambda: np.add.at(dst, idx, val) or out, [dst])


def _bce(z, y, scale, loss=None, dz=None):
    """``cuda.bce``'s twin (one launch): the NumPy expressions of ``bce_with_logits``."""
    from pshybrid.layers import bce_with_logits

    zz, yy = _unwrap(z), _unwrap(y)
    loss = np.empty_like(zz) if loss is None else _unwrap(loss)
    dz = np.empty_like(zz) if dz is None else _unwrap(dz)

    def run():
        a, b = bce_with_logits(zz, yy, scale)
        loss[...], dz[...] = a, b

    _op(run, [loss, dz])
    return _wrap(loss), _wrap(dz)


def _dense_update(kind, w, g, state, scalars):
    """``cuda.dense_update``'s twin (one launch): the CPU's fused kernel on the flat
    buffers seen as one row (the same per-element formulas, ``optim.row_kernel``)."""
    from pshybrid import kernels
    from pshybrid.optim import row_kernel

    kernels.numba_active()  # the kernels jitted (else plain Python: the same values)
    arrs = [_unwrap(a).reshape(1, -1) for a in (w, g, *state)]
    kernel, row0 = row_kernel(kind, scalars, False), np.zeros(1, np.int64)
    _op(lambda: kernel(*arrs, row0), [arrs[0], *arrs[2:]])