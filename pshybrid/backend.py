"""Array-module selection: NumPy on CPU, CuPy on GPU."""

from __future__ import annotations

import numpy as np


def array_module(*arrays):
    """The array module (numpy or cupy) of the given arrays; numpy if none is on a GPU."""
    for a in arrays:
        mod = type(a).__module__
        if mod.startswith("cupy"):
            import cupy

            return cupy
    return np


def cupy_available() -> bool:
    """True when cupy imports and sees at least one CUDA device (``cupy_status`` says why
    not)."""
    return cupy_status()[0]


def cupy_status() -> tuple[bool, str]:
    """(usable, what was found): whether cupy imports and sees a CUDA device, and, when not,
    what failed in one line: cupy not installed, a driver older than CuPy's CUDA runtime, no
    device visible (with ``CUDA_VISIBLE_DEVICES``), or the error CuPy raised."""
    try:
        import cupy
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken install (missing libs)
        if isinstance(e, ImportError) and getattr(e, "name", None) == "cupy":
            return False, ("cupy is not installed (pip install -e \".[gpu]\" with a CUDA 12 "
                           "toolkit, \".[gpu-cuda13]\" with 13, \".[gpu-libs]\" without one: "
                           "docs/gpu.md)")
        return False, f"cupy does not import: {type(e).__name__}: {e}"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CUDARuntimeError and friends
        text = f"{type(e).__name__}: {e}"
        insufficient = "InsufficientDriver" in text or "insufficient" in text.lower()
        if insufficient and not nvidia_driver_loaded():
            return False, (f"no NVIDIA driver on this machine (no {DRIVER_PROC}): --device "
                           f"cuda needs a GPU node ({text})")
        if insufficient:
            return False, (f"the NVIDIA driver is older than CuPy's CUDA runtime ({text}): "
                           f"install the cupy wheel of the driver's CUDA major version "
                           f"(nvidia-smi's 'CUDA Version'; docs/gpu.md)")
        if "NoDevice" in text:
            return False, f"no CUDA device visible ({text}){_visible()}"
        return False, f"the CUDA runtime failed: {text}"
    if n <= 0:
        return False, f"no CUDA device visible (device count {n}){_visible()}"
    return True, f"{n} CUDA device(s), CuPy {cupy.__version__}"


DRIVER_PROC = "/proc/driver/nvidia/version"  # present while the kernel driver is loaded


def nvidia_driver_loaded() -> bool:
    """Whether the NVIDIA kernel driver is loaded here (CUDA reports its absence as an
    'insufficient' driver, as it does an old one)."""
    import os

    return os.path.exists(DRIVER_PROC)


def _visible() -> str:
    import os

    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if v is None else f"; CUDA_VISIBLE_DEVICES={v!r}"


_WAITS = [0]  # host waits for the GPU performed through this module (``host_waits``)


def host_waits() -> int:
    """How many times this process's host has waited for the GPU through this module: stream
    synchronisations, blocking device->host copies (``to_host``), waits on a CUDA event not
    yet reached. A GPU worker's training step makes one (``modes.step``)."""
    return _WAITS[0]


def to_host(a):
    """``a`` as a NumPy array: ``a`` itself if it is one, else a blocking device->host copy."""
    if array_module(a) is np:
        return a
    _WAITS[0] += 1
    return a.get()


def synchronize(*arrays) -> None:
    """Wait for the current CUDA stream if any of ``arrays`` is a CuPy array (no-op otherwise):
    CuPy kernels are asynchronous, so a host timer or a reader outside the stream (MPI) must
    wait for the kernels that wrote the array."""
    if array_module(*arrays) is not np:
        import cupy

        _WAITS[0] += 1
        cupy.cuda.get_current_stream().synchronize()


def wait_event(event) -> None:
    """Wait for a recorded CUDA ``event``; a wait (counted) only if it is not reached yet."""
    if not event.done:
        _WAITS[0] += 1
        event.synchronize()


def pinned_buffer(xp, buf, nbytes: int) -> np.ndarray:
    """``buf`` (a pinned uint8 host array, or None) if it holds ``nbytes``, else a new one."""
    if buf is None or buf.size < nbytes:
        mem = xp.cuda.alloc_pinned_memory(nbytes)  # as cupyx.empty_pinned does
        buf = np.ndarray((nbytes,), np.uint8, buffer=mem)
    return buf


class HostStaging:
    """Device->host copies into pinned (page-locked) host buffers reused step after step:
    ``stage`` queues the copy on the current stream and returns at once; the host reads the
    buffer only after a later stream synchronisation (``modes.step``: one per step). The
    next ``stage`` of the same key overwrites the buffer (queued after everything before it
    on the stream), so whatever reads it (MPI) must have completed by then: each caller
    says why it has."""

    def __init__(self):
        self.bufs: dict = {}  # key -> pinned uint8 array, grown to the largest copy

    def stage(self, xp, key: str, dev, total: int | None = None) -> np.ndarray:
        """Queue the copy of ``dev`` (a contiguous ``xp`` array) into ``key``'s buffer ->
        the host view: ``dev.shape``, or with ``total`` a flat (total,) view whose elements
        past ``dev.size`` are 0 (a padded table)."""
        n = dev.size if total is None else total
        nbytes = n * dev.dtype.itemsize
        buf = self.bufs[key] = pinned_buffer(xp, self.bufs.get(key), nbytes)
        host = buf[:nbytes].view(dev.dtype)
        host[dev.size:] = 0
        out = host[:dev.size].reshape(dev.shape)
        dev.get(out=out, stream=xp.cuda.get_current_stream(), blocking=False)  # async D2H
        return out if total is None else host


class _PinnedRing:
    """Host-to-device copies through pinned (page-locked) host buffers: the copy is
    asynchronous on the current stream (a pageable copy blocks the host until it is done).
    ``slots`` buffers are reused in turn, each grown to the largest copy it served; a slot's
    previous copy is waited for (its event, long done in a training loop) before the slot is
    overwritten."""

    def __init__(self, slots: int = 8):
        import threading

        self.slots: list = [None] * slots  # (pinned uint8 array, event of its last copy)
        self.next = 0
        self.lock = threading.Lock()

    def to_device(self, xp, host: np.ndarray, dtype=None, out=None):
        dtype = np.dtype(dtype or host.dtype)
        nbytes = host.size * dtype.itemsize
        with self.lock:
            i, self.next = self.next, (self.next + 1) % len(self.slots)
            buf, event = self.slots[i] or (None, None)
            if event is not None:
                wait_event(event)  # the copy that last read this slot has finished
            buf = pinned_buffer(xp, buf, nbytes)
            staged = buf[:nbytes].view(dtype).reshape(host.shape)
            np.copyto(staged, host, casting="same_kind")  # the cast happens here, on the host
            dev = xp.empty(host.shape, dtype) if out is None else out
            dev.set(staged, stream=xp.cuda.get_current_stream())  # async H2D, pinned source
            event = xp.cuda.Event()
            event.record()
            self.slots[i] = (buf, event)
        return dev


_RING = _PinnedRing()


def to_device(xp, host, dtype=None, out=None):
    """``host`` (NumPy) as an ``xp`` array of ``dtype`` (default: its own). NumPy: ``host``
    itself when the dtype matches (no copy). CuPy: an asynchronous copy on the current
    stream from a pinned staging buffer (``_PinnedRing``): kernels later on the stream see
    it, and the host does not wait for it. ``out`` (CuPy, contiguous, ``host``'s shape and
    ``dtype``): copy into it instead of a new array."""
    host = np.asarray(host)
    if out is not None:
        assert xp is not np and out.shape == host.shape, (xp, out.shape, host.shape)
    if xp is np:
        return host.astype(dtype or host.dtype, copy=False)
    if host.size == 0:
        return xp.empty(host.shape, dtype or host.dtype)
    return _RING.to_device(xp, np.ascontiguousarray(host), dtype, out)
