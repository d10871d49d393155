"""A cache prefetch hint for the numba kernels.

``prefetch_row(a, i)`` asks the CPU to start loading row ``i`` of the C-contiguous array
``a`` (2-D: the row's first and last cache line; 1-D: the element) and returns at once: a
hint, it changes no value. Kernels that visit rows of a large table in an order the
hardware prefetcher cannot guess (a server's optimizer over the step's rows, a gather from
a shard, the synthetic stream's tail-table draws) issue it before they need a row, so the
cache misses of many rows overlap instead of each one stalling the loop in turn (the gain:
docs/benchmarks.md, "Design measurements behind the code").

``build(numba)`` makes it: LLVM's ``llvm.prefetch`` (read intent, into L1), or, where this
numba or LLVM refuses that intrinsic, a jitted no-op (same results, only slower).
``hint(numba)`` is the one the kernels use (``kernels.numba_active``, ``datakernels``),
built and probed once per process.
"""

from __future__ import annotations

AHEAD = 32  # rows ahead: enough misses in flight to cover a DRAM latency, few enough for L1


def _declare(numba):
    """The intrinsic ``prefetch_row(a, i)`` (numba's extension API)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def prefetch_row(typingctx, arr, idx):
        sig = types.void(arr, idx)

        def codegen(context, builder, signature, args):
            aty = signature.args[0]
            ary = context.make_array(aty)(context, builder, args[0])
            zero, last = (context.get_constant(types.intp, k) for k in (0, -1))
            if aty.ndim == 1:
                ends = [[args[1]]]
            else:  # the row's first and last element: every cache line of a short row
                ncol = builder.extract_value(ary.shape, 1)
                ends = [[args[1], zero], [args[1], builder.add(ncol, last)]]
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            name = "llvm.prefetch.p0" + ("" if str(i8p) == "ptr" else "i8")  # opaque or not
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, name)
            for index in ends:  # read intent (a shard another rank owns stays shared), L1
                ptr = cgutils.get_item_pointer(context, builder, aty, ary, index)
                builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
            return context.get_dummy_value()

        return sig, codegen

    return prefetch_row


def build(numba):
    """-> ``prefetch_row`` for the numba kernels: the intrinsic if this numba compiles and
    runs it (``_probe``, jitted with ``cache=True`` like the kernels: a process after the
    first loads it instead of compiling it, ~0.5 s), else a jitted no-op."""
    import numpy as np

    global prefetch_row
    try:
        prefetch_row = _declare(numba)
        numba.njit(cache=True)(_probe)(np.ones((2, 3)), np.ones(2))
        return prefetch_row
    except Exception:  # an LLVM or numba that refuses the intrinsic: hints are optional
        return numba.njit(lambda a, i: None)


prefetch_row = None  # the intrinsic ``_probe`` compiles with (``build`` sets it first)


def _probe(a, b):
    for i in range(a.shape[0]):
        prefetch_row(a, i)
        prefetch_row(b, i)
    return a.sum() + b.sum()


_HINT: list = []  # [hint], built on the first call of ``hint``


def hint(numba):
    """``build(numba)``'s hint, built once per process."""
    if not _HINT:
        _HINT.append(build(numba))
    return _HINT[0]
