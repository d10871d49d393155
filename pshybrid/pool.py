"""A small persistent thread pool for kernels that release the GIL (numba ``nogil=True``).

A server's optimizer step touches distinct rows (the union of the workers' rows, summed per
row), so contiguous chunks of them can be updated by different threads with no two writing
the same row, and each row's arithmetic is that of the serial kernel: the result is the
same bit for bit. ``spans(n, threads, min_items)`` cuts ``range(n)`` into such chunks (pure);
``run(fn, chunks)`` calls ``fn(a, b)`` for each ``(a, b)`` (index ranges from ``spans``, or
ranges of row values: ``modes.sparse.apply_parts``), the calling thread taking the first
and the pool's threads the others, and returns when all are done (re-raising the first
error). The pool is created on the first call that needs it and reused; it grows when a
call needs more threads. ``threads.server_threads`` decides how many a rank uses.

A thread pays only above some work per thread: handing a chunk to a pool thread and
waiting for it costs tens of microseconds, the time Adagrad takes on about a thousand
dim-17 rows (the thresholds below; bench/apply_bench.py measures them).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

# Fewest rows a thread is given in a row update (``optim.Optimizer.update_rows``,
# ``modes.sparse.apply_parts``): below 2 x this many rows one thread does all of them (a
# second thread's hand-over and wake-ups cost about what a thousand rows do; the sweep
# behind the figure: docs/benchmarks.md, "Design measurements behind the code").
MIN_ROWS_PER_THREAD = 2048
# Fewest values a thread is given in a whole contiguous buffer (``apply_slot`` of the ps
# dense table): a streaming pass is soon bound by memory bandwidth (same section).
MIN_VALUES_PER_THREAD = 1 << 19

_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0


def spans(n: int, threads: int, min_items: int) -> list[tuple[int, int]]:
    """Cut ``range(n)`` into ``k = min(threads, n // min_items)`` (at least 1) contiguous
    ``(a, b)`` chunks whose lengths differ by at most one, in order."""
    k = max(1, min(int(threads), n // max(1, int(min_items))))
    return [(n * i // k, n * (i + 1) // k) for i in range(k)]


def _pool(size: int) -> ThreadPoolExecutor:
    """The pool, with at least ``size`` threads (a larger one replaces a smaller)."""
    global _POOL, _POOL_SIZE
    with _LOCK:
        if _POOL is None or _POOL_SIZE < size:
            old = _POOL
            _POOL = ThreadPoolExecutor(max_workers=size, thread_name_prefix="pshybrid-apply")
            _POOL_SIZE = size
            if old is not None:
                old.shutdown(wait=False)  # its threads end once idle
        return _POOL


def run(fn, chunks: list[tuple[int, int]]) -> None:
    """``fn(a, b)`` for every chunk: the first on this thread, the others on the pool's
    threads at the same time; returns when all have finished."""
    if len(chunks) == 1:
        fn(*chunks[0])
        return
    futures = [_pool(len(chunks) - 1).submit(fn, a, b) for a, b in chunks[1:]]
    try:
        fn(*chunks[0])
    finally:
        errors = [f.exception() for f in futures]  # waits for each
    for e in errors:
        if e is not None:
            raise e
