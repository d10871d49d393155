"""CUDA kernel plumbing: the one place that finds ``kernels/*.cu``, builds them
with ``cupy.RawModule`` (lazily, once per device), maps dtype -> kernel name and launches.

``gather(rows, index)`` and ``scatter_add(index, values, n)`` have the signatures and results
of ``pshybrid.kernels.gather`` / ``scatter_add`` (which dispatch here for CuPy arrays); their
oracles are ``kernels.gather_ref`` / ``scatter_add_ref``. Design notes: ``kernels/embedding.cu``.
``bce``, ``dense_update``, ``bias_act`` and ``relu_grad`` launch the fused elementwise
kernels of ``kernels/fused.cu`` (twins: ``layers.bce_with_logits``, the CPU's row kernels
through ``optim.Optimizer``, ``layers.Linear``'s NumPy expressions); ``gemm_acc`` is cuBLAS's
GEMM accumulating into its output.

The sources are found installed with the package (``share/pshybrid/kernels/*.cu``, setup.cfg
``[options.data_files]``, located through the distribution's file list), or, when the package
is imported from a source checkout, in the checkout's ``kernels/`` (so edits take effect).
Importing this module does not import CuPy; nothing here needs a GPU until a launch.
"""

from __future__ import annotations

import sysconfig
import threading
from pathlib import Path

import numpy as np

from .errors import PshybridError

# dtype -> (scalar element type, 16-byte vector type, elements per vector)
CTYPES = {np.dtype(np.float32): ("float", "float4", 4),
          np.dtype(np.float64): ("double", "double2", 2)}
KERNELS = ("gather_rows", "scatter_add_rows")
FUSED = ("bce_logits", "sgd_update", "adagrad_update", "adam_update", "bias_act",
         "relu_grad")  # kernels/fused.cu
NAME_EXPRESSIONS = (tuple(f"{k}<{t}>" for k in KERNELS for c in CTYPES.values() for t in c[:2])
                    + tuple(f"{k}<{c[0]}>" for k in FUSED for c in CTYPES.values()))
OPTIONS = ("--std=c++17",)
BLOCK_THREADS = 256  # threads per block: (lanes, rows) = (min(32, pow2 >= row width), 256 / lanes)
#                     for the row kernels; 1-D blocks for the elementwise ones
_CHECKOUT = Path(__file__).resolve().parent.parent


def _ctypes(dtype) -> tuple[str, str, int]:
    try:
        return CTYPES[np.dtype(dtype)]
    except KeyError:
        raise PshybridError(f"CUDA kernels support float32 and float64, not {dtype}") from None


def kernel_name(op: str, dtype, vector: bool) -> str:
    """Name expression of kernel ``op`` ('gather_rows' | 'scatter_add_rows') for ``dtype``
    (float32 | float64), 16-byte vector loads or scalar ones: e.g. 'gather_rows<float4>'."""
    assert op in KERNELS, op
    scalar, vec, _ = _ctypes(dtype)
    return f"{op}<{vec if vector else scalar}>"


def source_files() -> list[Path]:
    """The ``.cu`` files: the source checkout's ``kernels/`` when the package is imported from
    one, else those installed with the distribution. Raises if none is found."""
    if (_CHECKOUT / "setup.cfg").is_file() and (_CHECKOUT / "kernels").is_dir():
        found = sorted((_CHECKOUT / "kernels").glob("*.cu"))
        where = [str(_CHECKOUT / "kernels")]
    else:
        found, where = _installed_files()
    if not found:
        raise PshybridError(f"CUDA kernel sources (*.cu) not found in {', '.join(where)}: "
                            "reinstall pshybrid (pip install .) so share/pshybrid/kernels exists")
    return found


def _installed_files() -> tuple[list[Path], list[str]]:
    from importlib import metadata

    try:
        files = metadata.distribution("pshybrid").files or []
    except metadata.PackageNotFoundError:
        files = []
    found = sorted(Path(f.locate()).resolve() for f in files
                   if f.name.endswith(".cu") and Path(f.locate()).is_file())
    if found:
        return found, ["the pshybrid distribution's files"]
    share = Path(sysconfig.get_path("data")) / "share" / "pshybrid" / "kernels"
    return sorted(share.glob("*.cu")), ["the pshybrid distribution's files", str(share)]


def source() -> str:
    """All kernel sources, concatenated in file-name order (one RawModule)."""
    return "\n".join(p.read_text() for p in source_files())


_MODULES: dict[int, tuple] = {}  # device id -> (RawModule, multiprocessor count)
_LOCK = threading.Lock()


def module():
    """The compiled ``cupy.RawModule`` for the current device (built on first use, cached)."""
    return _module()[0]


def _module():
    import cupy

    dev = cupy.cuda.Device().id
    entry = _MODULES.get(dev)
    if entry is None:
        with _LOCK:
            entry = _MODULES.get(dev)
            if entry is None:
                mod = cupy.RawModule(code=source(), options=OPTIONS,
                                     name_expressions=list(NAME_EXPRESSIONS))
                mod.compile()  # NVRTC for this device's arch; errors surface here, once
                rt = cupy.cuda.runtime
                sms = rt.deviceGetAttribute(rt.cudaDevAttrMultiProcessorCount, dev)
                entry = _MODULES[dev] = (mod, sms)
    return entry


def _launch(op: str, dtype, width: int, n: int, args: tuple, vector: bool) -> None:
    """Launch ``op`` over ``n`` rows of ``width`` elements (scalars, or 16-byte vectors)."""
    launcher(op, dtype, width, n, args, vector)()


def launcher(op: str, dtype, width: int, n: int, args: tuple, vector: bool):
    """A no-argument callable that launches ``op`` as ``_launch`` does, its kernel, geometry
    and arguments bound once (for timing many launches of the kernel alone)."""
    lanes = 1
    while lanes < min(width, 32):
        lanes *= 2
    rows_per_block = BLOCK_THREADS // lanes
    mod, sms = _module()
    blocks = max(1, min(-(-n // rows_per_block), 32 * sms))  # grid-stride beyond 32 per SM
    kernel = mod.get_function(kernel_name(op, dtype, vector))
    return lambda: kernel((blocks,), (lanes, rows_per_block), args)


def _width(dtype, dim: int, *arrays) -> tuple[int, bool]:
    """(row width in kernel elements, vector?): 16-byte loads when the row is a whole number
    of vectors and every base pointer is 16-byte aligned, else scalar ones."""
    per = _ctypes(dtype)[2]
    vec = dim % per == 0 and all(a.data.ptr % 16 == 0 for a in arrays)
    return (dim // per, True) if vec else (dim, False)


def gather(rows, index):
    """rows: (N, *S) CuPy; index: any-shape int64 (CuPy or NumPy) in [0, N) ->
    index.shape + S, out[i] = rows[index[i]]. Same result as ``kernels.gather_ref``."""
    import cupy

    rows = cupy.ascontiguousarray(rows)
    idx = cupy.ascontiguousarray(cupy.asarray(index), dtype=cupy.int64)
    out = cupy.empty(idx.shape + rows.shape[1:], rows.dtype)
    dim = int(np.prod(rows.shape[1:], dtype=np.int64))
    if out.size == 0:
        return out
    width, vec = _width(rows.dtype, dim, rows, out)
    _launch("gather_rows", rows.dtype, width, idx.size,
            (rows, idx, out, np.int64(idx.size), np.int64(width), np.int64(rows.shape[0])), vec)
    return out


def scatter_add(index, values, n: int, out=None):
    """index: (B,) int64 (CuPy or NumPy) in [0, n); values: (B, *S) CuPy -> (n, *S),
    out[i] = sum of values[index == i] (atomics: summation order not fixed). Same result as
    ``kernels.scatter_add_ref`` up to float rounding. ``out``: a contiguous (n, *S) buffer
    to reuse (cleared first, on the stream: no allocation)."""
    import cupy

    values = cupy.ascontiguousarray(values)
    idx = cupy.ascontiguousarray(cupy.asarray(index), dtype=cupy.int64).ravel()
    assert values.shape[0] == idx.size, (values.shape, idx.shape)
    if out is None:
        out = cupy.zeros((n,) + values.shape[1:], values.dtype)
    else:
        assert out.shape == (n,) + values.shape[1:] and out.flags.c_contiguous, out.shape
        out.fill(0)
    dim = int(np.prod(values.shape[1:], dtype=np.int64))
    if idx.size == 0 or out.size == 0:
        return out
    width, vec = _width(values.dtype, dim, values, out)
    _launch("scatter_add_rows", values.dtype, width, idx.size,
            (idx, values, out, np.int64(idx.size), np.int64(width), np.int64(n)), vec)
    return out


def _elementwise(op: str, dtype, n: int, args: tuple) -> None:
    """Launch the fused kernel ``op<T>`` over ``n`` elements (1-D blocks, grid-stride)."""
    mod, sms = _module()
    blocks = max(1, min(-(-n // BLOCK_THREADS), 32 * sms))
    kernel = mod.get_function(f"{op}<{_ctypes(dtype)[0]}>")
    kernel((blocks,), (BLOCK_THREADS,), args)


def bce(z, y, scale: float, loss=None, dz=None):
    """Logits z (B,) and labels y (B,) (CuPy, one dtype) -> (losses (B,), dz (B,)): the
    binary cross-entropy with logits and its gradient times ``scale``, in one kernel (into
    ``loss`` / ``dz`` when given). Twin: ``layers.bce_with_logits``."""
    import cupy

    z, y = cupy.ascontiguousarray(z), cupy.ascontiguousarray(y, dtype=z.dtype)
    loss = cupy.empty_like(z) if loss is None else loss
    dz = cupy.empty_like(z) if dz is None else dz
    if z.size:
        f = z.dtype.type
        _elementwise("bce_logits", z.dtype, z.size, (z, y, loss, dz, f(scale), np.int64(z.size)))
    return loss, dz


def dense_update(kind: str, w, g, state: list, scalars: tuple) -> None:
    """One optimizer step over contiguous CuPy buffers of one dtype, in place, in one kernel:
    ``kind`` 'sgd' | 'adagrad' | 'adam', ``state`` its slots in ``optim.SLOTS`` order,
    ``scalars`` the step's (after ``n``) as ``kernels/fused.cu`` lists them."""
    f = w.dtype.type
    _elementwise(f"{kind}_update", w.dtype, w.size,
                 (w, g, *state, np.int64(w.size), *(f(s) for s in scalars)))


def bias_act(y, b, relu: bool):
    """y (rows, d) contiguous CuPy (a GEMM's output), b (d,): y += b, then max(y, 0) with
    ``relu``, in place, in one kernel -> y."""
    assert y.flags.c_contiguous and y.shape[-1] == b.size, (y.shape, b.shape)
    if y.size:
        _elementwise("bias_act", y.dtype, y.size,
                     (y, b, np.int64(y.size), np.int64(b.size), np.int32(relu)))
    return y


def relu_grad(dy, y):
    """dy, y: same shape, contiguous CuPy, y a ReLU's output -> dy where y > 0, else 0."""
    import cupy

    dy = cupy.ascontiguousarray(dy)
    dx = cupy.empty_like(dy)
    if dy.size:
        _elementwise("relu_grad", dy.dtype, dy.size, (dy, y, dx, np.int64(dy.size)))
    return dx


def gemm_acc(x, dy, out) -> None:
    """out += x.T @ dy through cuBLAS's beta (no temporary): x (B, m), dy (B, n), out (m, n)
    CuPy of one dtype, ``out`` contiguous (a view into the gradient buffer)."""
    import cupy.cublas

    cupy.cublas.gemm("T", "N", x, dy, out=out, alpha=1.0, beta=1.0)
