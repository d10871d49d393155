"""Array-module selection: NumPy on CPU, CuPy on GPU (STYLE.md §5)."""

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
