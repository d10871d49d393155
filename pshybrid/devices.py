"""Device facts: CUDA-aware MPI detection and per-rank GPU choice."""

from __future__ import annotations

import ctypes
import os

from .backend import cupy_status


def cuda_aware_mpi(setting: str = "auto") -> tuple[bool, str]:
    """(hand device buffers to MPI, why). ``setting`` (``--cuda-aware``): "on" or "off"
    decides; "auto" asks ``MPIX_Query_cuda_support()`` of the loaded MPI library (MPICH,
    Open MPI)."""
    if setting != "auto":
        return setting == "on", f"--cuda-aware {setting}"
    from mpi4py import MPI  # noqa: F401  (loads libmpi)

    for lib in _loaded_mpi() + ["libmpi.so.12", "libmpi.so.40", "libmpi.so"]:
        try:
            fn = ctypes.CDLL(lib, mode=os.RTLD_NOLOAD).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        return bool(fn()), f"MPIX_Query_cuda_support() in {os.path.basename(lib)}"
    return False, "no MPIX_Query_cuda_support in the loaded MPI library"


def _loaded_mpi() -> list[str]:
    """The paths of the MPI libraries this process has mapped (``/proc/self/maps``; Cray
    MPICH's is ``libmpi_cray.so.12``, which no usual name finds); none without /proc."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                name = os.path.basename(path)
                if name.startswith("libmpi") and ".so" in name and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def pick_device(kind: str, local_rank: int) -> str:
    """'cpu', or 'cuda:<local_rank % device_count>' for kind 'cuda' (workers pin one GPU)."""
    if kind == "cpu":
        return "cpu"
    usable, why = cupy_status()
    if not usable:
        from .errors import ConfigError

        raise ConfigError(f"--device cuda: no usable CUDA device: {why}", collective=True)
    import cupy

    return f"cuda:{local_rank % cupy.cuda.runtime.getDeviceCount()}"
