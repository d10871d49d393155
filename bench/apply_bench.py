# python bench/apply_bench.py
"""python bench/apply_bench.py [--threads 1 2] [--kinds adagrad adam] [--parts 0 1 2]
                              [--memory window numpy] [--sweep]

A server's optimizer apply on several threads (``pshybrid.pool``), one process, no MPI.

The shard: ``--rows`` rows of ``--dim`` floats with its optimizer state, in ``--memory``
(``window``: shared memory, where a server's shard lives, an MPI window; ``numpy``: NumPy's
own allocation, on huge pages where the kernel gives them: ``shard_array``); each step updates
``--touched`` distinct random rows (sorted, as the segment sum leaves them). Rows/s is the
touched rows per second of the step, printed beside its reference, measured in the same run:
  memcpy   np.copyto of the step's (touched, dim) gradient rows: the same rows' bytes, once;
  parts 0  the optimizer step alone (``Optimizer.update_rows``);
  parts P  ``ServerSparse.server_apply`` itself on P workers' parts (disjoint, sorted; their
           union is the touched rows): P = 1 needs no segment sum, with P >= 2 each thread
           sums and updates its own range of rows (``modes.sparse.apply_parts``).
Every figure is the median over ``--rounds`` rounds of each round's median of ``--repeat``
steps (after a warm-up step), the thread counts and memcpy interleaved in every round, so
the machine's drift hits them alike. ``--sweep``: rows/s of the optimizer step with 1 and
2 threads at several touched-row counts, every count cut into 2 chunks (the threshold
``pool.MIN_ROWS_PER_THREAD`` forced to 1): where a second thread starts to pay.

``apply_rows_per_s(kind, threads, ...)`` is one such figure, for other scripts.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np

from pshybrid import kernels, pool
from pshybrid.modes.sparse import ServerSparse
from pshybrid.optim import Optimizer
from timing import at_least, description  # bench/timing.py (a sibling: python bench/X.py)

OPTIMIZERS = {"sgd": Optimizer("sgd", lr=0.05, l2=1e-5),  # sgd with L2: a server step
              "adagrad": Optimizer("adagrad", lr=0.05), "adam": Optimizer("adam", lr=0.001)}


MEMORY = ("window", "numpy")  # where a shard lives (shard_array)


def shard_array(shape, dtype, memory: str = "window") -> np.ndarray:
    """An uninitialised array for a shard. ``window``: shared memory mapped as MPICH maps an
    MPI window's on a node (a file in /dev/shm, else anonymous shared memory), where the
    servers' shards live; the kernel gives it huge pages only where shared memory has them
    (``/sys/kernel/mm/transparent_hugepage/shmem_enabled``, /dev/shm's mount). ``numpy``:
    NumPy's own allocation, which asks for transparent huge pages on large arrays."""
    dt = np.dtype(dtype)
    if memory == "numpy":
        return np.empty(shape, dt)
    n = max(1, int(np.prod(shape)) * dt.itemsize)
    try:
        with tempfile.TemporaryFile(dir="/dev/shm") as f:
            f.truncate(n)
            m = mmap.mmap(f.fileno(), n)  # MAP_SHARED; the mapping outlives the file
    except OSError:
        m = mmap.mmap(-1, n)
    return np.frombuffer(m, dt, count=int(np.prod(shape))).reshape(shape)


def make_shard(kind: str, rows: int = 2_000_000, dim: int = 17, dtype="float32", seed=0,
               memory: str = "window"):
    """(w (rows, dim), {slot: (rows, dim)}): a shard with its optimizer's state, in
    ``memory`` (``shard_array``)."""
    rng = np.random.default_rng(seed)
    w = shard_array((rows, dim), dtype, memory)
    w[...] = rng.standard_normal((rows, dim), dtype=np.dtype(dtype).type) * 0.01
    slots = {k: shard_array(w.shape, w.dtype, memory) for k in OPTIMIZERS[kind].slots}
    for a in slots.values():
        a[...] = 0.1
    return w, slots


def step_inputs(rows: int, touched: int, dim: int, dtype, parts: int, seed: int):
    """One step's parts: [(rows (n,) int64 sorted, gradient sums (n, dim))]; parts 0: the
    union as one part."""
    rng = np.random.default_rng(seed)
    union = np.sort(rng.choice(rows, touched, replace=False)).astype(np.int64)
    g = rng.standard_normal((touched, dim), dtype=np.dtype(dtype).type)
    owner = rng.integers(0, max(1, parts), touched)  # the worker that sent each row
    return [(union[owner == p], g[owner == p]) for p in range(max(1, parts))]


@contextmanager
def min_rows_per_thread(n: int | None):
    """``pool.MIN_ROWS_PER_THREAD`` set to ``n`` (None: left as it is) for the block."""
    old = pool.MIN_ROWS_PER_THREAD
    pool.MIN_ROWS_PER_THREAD = old if n is None else n
    try:
        yield
    finally:
        pool.MIN_ROWS_PER_THREAD = old


def apply_rows_per_s(kind: str = "adagrad", threads: int = 1, rows: int = 2_000_000,
                     dim: int = 17, touched: int = 65536, dtype="float32", repeat: int = 5,
                     parts: int = 0, shard=None, min_rows: int | None = None,
                     seed: int = 0) -> float:
    """Touched rows per second of a server's apply with ``threads`` threads: median of
    ``repeat`` steps (after one warm-up step), each on new random rows. ``parts`` 0: the
    optimizer step alone; P >= 1: ``ServerSparse.server_apply`` on P workers' parts.
    ``shard``: ``make_shard``'s (reused and updated; else one is made); ``min_rows``:
    ``pool.MIN_ROWS_PER_THREAD`` for the run."""
    assert kernels.numba_active(), "numba is needed: the NumPy path has no threads"
    opt = OPTIMIZERS[kind]
    w, state = shard if shard is not None else make_shard(kind, rows, dim, dtype, seed)
    server = SimpleNamespace(server_step=True, name="t", opt=opt,
                             ctx=SimpleNamespace(apply_threads=threads),
                             store=SimpleNamespace(shard=lambda t, k="w": state.get(k, w)))
    steps = [step_inputs(w.shape[0], touched, w.shape[1], w.dtype, parts, seed + 1 + i)
             for i in range(repeat + 1)]
    times = []
    with min_rows_per_thread(min_rows):
        for i, step_parts in enumerate(steps):
            t0 = time.perf_counter()
            if parts:
                ServerSparse.server_apply(server, step_parts, i + 1)
            else:
                opt.update_rows(w, *step_parts[0], state, i + 1, threads=threads)
            times.append(time.perf_counter() - t0)
    return touched / statistics.median(times[1:])


def memcpy_rows_per_s(touched: int = 65536, dim: int = 17, dtype="float32",
                      repeat: int = 5) -> float:
    """Rows per second of np.copyto of (touched, dim) rows (the reference)."""
    src = np.random.default_rng(0).standard_normal((touched, dim)).astype(dtype)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return touched / statistics.median(times[1:])


def cpu_seconds() -> tuple[float, float] | None:
    """(busy seconds of the whole machine, of this process) so far; None without
    /proc/stat. Their growth during a run, minus this process's, is the load from elsewhere."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK"), time.process_time()


def load_elsewhere(before, seconds: float) -> str:
    """The cores other processes kept busy since ``before`` (``cpu_seconds``)."""
    after = cpu_seconds()
    if before is None or after is None:
        return "load from other processes: unknown"
    other = (after[0] - before[0]) - (after[1] - before[1])
    return (f"cores busy with other processes during the run: {max(0.0, other) / seconds:.2f} "
            f"of {os.cpu_count()} (what they take, the threads lack)")


def report(a) -> None:
    """The table: per optimizer, memory and parts, rows/s per thread count beside memcpy.
    Every round runs every (optimizer, memory, parts, threads) once and memcpy once: a burst
    of load from elsewhere hits one round of each, not all rounds of one."""
    print(f"shard {a.rows:,} x {a.dim} {a.dtype}, {a.touched:,} distinct rows a step; "
          f"M rows/s, median of {a.rounds} rounds x {a.repeat} steps; "
          f"pool.MIN_ROWS_PER_THREAD = {pool.MIN_ROWS_PER_THREAD}")
    shards = {(kind, m): make_shard(kind, a.rows, a.dim, a.dtype, memory=m)
              for kind in a.kinds for m in a.memory}
    before, t0 = cpu_seconds(), time.perf_counter()
    cases = [(kind, m, parts, t) for kind in a.kinds for m in a.memory for parts in a.parts
             for t in a.threads]
    got = {c: [] for c in cases}
    ref = []
    for r in range(a.rounds):
        for kind, m, parts, t in cases:
            got[kind, m, parts, t].append(apply_rows_per_s(
                kind, t, dim=a.dim, touched=a.touched, repeat=a.repeat, parts=parts,
                shard=shards[kind, m], seed=1000 * r))
        ref.append(memcpy_rows_per_s(a.touched, a.dim, a.dtype, a.repeat))
    used = {t: len(pool.spans(a.touched, t, pool.MIN_ROWS_PER_THREAD)) for t in a.threads}
    head = " ".join(f"{f'{t} thr' if used[t] == t else f'{t}({used[t]}) thr':>8}"
                    for t in a.threads)
    print(f"{'optimizer':<9} {'memory':<6} {'parts':>5} | {head} | {f'x {a.threads[-1]}':>6}")
    for kind in a.kinds:
        for m in a.memory:
            for parts in a.parts:
                med = [statistics.median(got[kind, m, parts, t]) / 1e6 for t in a.threads]
                cells = " ".join(f"{v:>8.2f}" for v in med)
                print(f"{kind:<9} {m:<6} {parts:>5} | {cells} | {med[-1] / med[0]:>6.2f}")
    print(f"{'memcpy':<9} {'':<6} {'':>5} | {statistics.median(ref) / 1e6:>8.1f}  (the same "
          "rows' bytes, one copy)")
    if any(used[t] != t for t in a.threads):
        print(f"T(U) thr: T threads given, U used: below {pool.MIN_ROWS_PER_THREAD:,} rows a "
              "thread the pool keeps the work on fewer (--sweep forces them)")
    print(load_elsewhere(before, time.perf_counter() - t0), flush=True)


def sweep(a) -> None:
    """Rows/s of 1 vs 2 threads at small touched-row counts, every count cut in two."""
    counts = (250, 500, 1000, 2000, 4000, 8000, 16000, 65536)
    print(f"sweep: the optimizer step, 2 chunks at every count (MIN_ROWS_PER_THREAD = 1); "
          f"M rows/s, median of {a.rounds} rounds")
    print(f"{'optimizer':<9} {'rows':>6} | {'1 thr':>8} {'2 thr':>8} | {'x 2':>5}")
    before, t0 = cpu_seconds(), time.perf_counter()
    for kind in a.kinds:
        shard = make_shard(kind, a.rows, a.dim, a.dtype, memory=a.memory[0])
        for n in counts:
            got = {1: [], 2: []}
            for r in range(a.rounds):
                for t in (1, 2):
                    got[t].append(apply_rows_per_s(kind, t, dim=a.dim, touched=n,
                                                   repeat=a.repeat * 4, shard=shard,
                                                   min_rows=1, seed=1000 * r))
            m1, m2 = (statistics.median(got[t]) / 1e6 for t in (1, 2))
            print(f"{kind:<9} {n:>6} | {m1:>8.2f} {m2:>8.2f} | {m2 / m1:>5.2f}", flush=True)
        del shard
    print(load_elsewhere(before, time.perf_counter() - t0), flush=True)


def parser() -> argparse.ArgumentParser:
    """The flags (``--help``: the docstring's summary line)."""
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--threads", type=at_least(1), nargs="+", default=[1, 2])
    ap.add_argument("--kinds", nargs="+", default=["adagrad", "adam"], choices=list(OPTIMIZERS))
    ap.add_argument("--parts", type=at_least(0), nargs="+", default=[0, 1, 2],
                    help="0: the optimizer step alone; P: server_apply on P workers' parts")
    ap.add_argument("--memory", nargs="+", default=["window"], choices=MEMORY,
                    help="where the shard lives: window (shared memory, as the servers' "
                    "shards), numpy (NumPy's allocation); --sweep: the first")
    ap.add_argument("--rows", type=at_least(1), default=2_000_000, help="rows of the shard")
    ap.add_argument("--dim", type=at_least(1), default=17)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--touched", type=at_least(1), default=65536, help="distinct rows a step")
    ap.add_argument("--repeat", type=at_least(1), default=5, help="steps a round")
    ap.add_argument("--rounds", type=at_least(1), default=7)
    ap.add_argument("--sweep", action="store_true",
                    help="1 vs 2 threads by touched rows (instead of --threads)")
    return ap


def main(argv=None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    if a.touched > a.rows:
        ap.error(f"--touched {a.touched} is more than the shard's --rows {a.rows}: the rows a "
                 "step updates are distinct")
    kernels.numba_active()
    apply_rows_per_s("sgd", 1, rows=64, touched=8, repeat=1, parts=2)  # compile, untimed
    (sweep if a.sweep else report)(a)
    return 0


if __name__ == "__main__":
    from pshybrid.launch import run

    sys.exit(run(main))  # (Ctrl-C: one line and status 130, not a traceback)
