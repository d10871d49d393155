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
    """True when cupy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def to_host(a):
    """``a`` as a NumPy array: ``a`` itself if it is one, else a device->host copy."""
    return a if array_module(a) is np else a.get()


def synchronize(*arrays) -> None:
    """Wait for the current CUDA stream if any of ``arrays`` is a CuPy array (no-op otherwise):
    CuPy kernels are asynchronous, so a host timer or a reader outside the stream (MPI) must
    wait for the kernels that wrote the array."""
    if array_module(*arrays) is not np:
        import cupy

        cupy.cuda.get_current_stream().synchronize()
