# python bench/kernels_bench.py
"""python bench/kernels_bench.py [--batch 4096 6656] [--dim 16 64] [--zipf 1.05 1.2] [--cold] [--pad 17]

CPU embedding-kernel benchmark, one process, no MPI. For each (B, D, dtype, a):
B ids drawn Zipf(a) over ``--rows`` rows, gradient rows (B, D). Every figure sits beside
its references, measured in the same run on the same data:
  memcpy       np.copyto of a (B, D) buffer: the machine's copy bandwidth for those bytes;
  add.at       np.unique(return_inverse) + np.add.at into (U, D): the same job as segment_sum;
  add.at only  np.add.at alone, inverse precomputed (the scatter, without the dedup);
  numpy        the sort-based NumPy twin (stable argsort + add.reduceat, the old path);
  numba        kernels.segment_sum (hash dedup + radix sort + input-order sums);
  gbo old/new  partition.group_by_owner before (argsort of sort_key) and now;
  gather       kernels.gather (numba, prefetching rows) of the B rows from U unique rows, and
               np.take of the same rows.
GB/s is bytes of the (B, D) rows (gather: rows written; group_by_owner: the B int64 ids)
per second. Warm-up first (numba compile time is printed once, not timed), then the
median of ``--repeat`` runs of time.perf_counter.
``--pad D``: instead, rows of D floats (17: the fused rows of dim 16 + the wide weight) vs the
same rows padded to a multiple of 4 (20: what 16-byte vector loads need), timed in alternating
rounds in one process (gather, segment_sum; per useful row), to decide whether padding pays.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import tempfile
import time

import numpy as np
from timing import above, at_least, description, median_time  # noqa: E402  (bench/timing.py)






def compile_report(kernels) -> str:
    """Import numba and run each kernel signature once; the first calls are compile (or cache
    load) time, which the timed runs below exclude."""
    t0 = time.perf_counter()
    active = kernels.numba_active()
    t_import = time.perf_counter() - t0
    if not active:
        return "numba: NOT available, the numba columns time the NumPy fallback"
    parts = [f"import {t_import:.2f} s"]
    for dtype in (np.float32, np.float64):
        t0 = time.perf_counter()
        kernels.segment_sum(np.array([2, 1, 2]), np.ones((3, 4), dtype))
        parts.append(f"segment_sum[{np.dtype(dtype).name}] {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    kernels.unique_inverse(np.array([2, 1, 2]), 3)
    parts.append(f"unique_inverse {time.perf_counter() - t0:.2f} s")
    from pshybrid import dedup

    entries = (dedup._nb_segment_sum, dedup._nb_unique_inverse)
    hits = sum(sum(f.stats.cache_hits.values()) for f in entries)
    misses = sum(sum(f.stats.cache_misses.values()) for f in entries)
    where = f"cache {hits} hit(s), {misses} miss(es) in {entries[0].stats.cache_path}"
    return "numba first calls (per process): " + ", ".join(parts) + f"  [{where}]"


def pad_report(kernels, a) -> None:
    """``--pad D``: each kernel on (B, D) rows and on the same rows padded to (B, P), P the
    next multiple of 4, alternating D and P ``--rounds`` times (medians of each round's
    median): the machine's drift hits both alike. Prints time per call and P/D."""
    import statistics
    from functools import partial

    D = a.pad
    P = -(-D // 4) * 4
    rng = np.random.default_rng(0)
    print(f"rows of {D} vs {P} floats (padded to a multiple of 4), {a.rounds} alternating rounds "
          f"of median-of-{a.repeat}; us per call; P/D = time ratio (< 1: padding wins; its "
          f"bytes ratio is {P / D:.2f})")
    print(f"{'B':>5} {'a':>4} {'dtype':>7} | {'kernel':<11} {'D us':>8} {'P us':>8} {'P/D':>5}")
    for dtype in map(np.dtype, a.dtype):
        for B in a.batch:
            for z in a.zipf:
                keys = ((rng.zipf(z, size=B) - 1) % a.rows).astype(np.int64)
                vals = {w: rng.standard_normal((B, w)).astype(dtype) for w in (D, P)}
                uniq, inverse = np.unique(keys, return_inverse=True)
                rows = {w: np.ascontiguousarray(rng.standard_normal((uniq.size, w)).astype(dtype))
                        for w in (D, P)}
                calls = {"gather": {w: partial(kernels.gather, rows[w], inverse) for w in rows},
                         "segment_sum": {w: partial(kernels.segment_sum, keys, vals[w])
                                         for w in vals}}
                for name, by_width in calls.items():
                    got = {D: [], P: []}
                    for _ in range(a.rounds):
                        for w in (D, P):
                            got[w].append(median_time(by_width[w], a.warmup, a.repeat))
                    td, tp = statistics.median(got[D]), statistics.median(got[P])
                    print(f"{B:>5} {z:>4} {dtype.name:>7} | {name:<11} {td * 1e6:>8.1f} "
                          f"{tp * 1e6:>8.1f} {tp / td:>5.2f}")


def parser() -> argparse.ArgumentParser:
    """The flags (``--help``: the docstring's summary line)."""
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--batch", type=at_least(1), nargs="+", default=[4096, 26 * 256])
    ap.add_argument("--dim", type=at_least(1), nargs="+", default=[16, 64])
    ap.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "float64"])
    ap.add_argument("--zipf", type=above(1), nargs="+", default=[1.05, 1.2])
    ap.add_argument("--rows", type=at_least(1), default=1_000_000)
    ap.add_argument("--servers", type=at_least(1), default=4, help="S for group_by_owner")
    ap.add_argument("--warmup", type=at_least(0), default=3)
    ap.add_argument("--repeat", type=at_least(1), default=30)
    ap.add_argument("--pad", type=at_least(1), default=None, metavar="D",
                    help="compare rows of D floats with the same padded to a multiple of 4")
    ap.add_argument("--rounds", type=at_least(1), default=5, help="--pad: alternating rounds")
    ap.add_argument("--cold", action="store_true",
                    help="compile into an empty numba cache, to see the cold compile time")
    return ap


def checked_case(kernels, partition, keys, values, a):
    """Correctness first: numba == np.add.at bit for bit, gbo new == old; (uniq, inverse,
    the numba sums)."""
    uniq, inverse = np.unique(keys, return_inverse=True)
    u_nb, s_nb = kernels.segment_sum(keys, values)
    ref = np.zeros((uniq.size, values.shape[1]), values.dtype)
    np.add.at(ref, inverse, values)
    assert np.array_equal(u_nb, uniq) and np.array_equal(s_nb.view(np.uint8),
                                                         ref.view(np.uint8))
    for g, w in zip(partition.group_by_owner(keys, a.rows, a.servers),
                    partition.group_by_owner_ref(keys, a.rows, a.servers)):
        assert np.array_equal(g, w)
    return uniq, inverse, s_nb


def case_lines(kernels, partition, a, rng, dtype, B: int, D: int, z: float) -> tuple[str, str]:
    """One (B, D, dtype, a) case, checked then timed: its segment_sum line and its
    group_by_owner / gather line."""
    T = lambda fn: median_time(fn, a.warmup, a.repeat)  # noqa: E731
    keys = ((rng.zipf(z, size=B) - 1) % a.rows).astype(np.int64)
    values = rng.standard_normal((B, D)).astype(dtype)
    uniq, inverse, s_nb = checked_case(kernels, partition, keys, values, a)
    U, nbytes = uniq.size, values.nbytes
    dst = np.empty_like(values)
    t_copy = T(lambda: np.copyto(dst, values))

    def add_at():
        u, inv = np.unique(keys, return_inverse=True)
        out = np.zeros((u.size, D), dtype)
        np.add.at(out, inv, values)

    def add_at_only():
        out = np.zeros((U, D), dtype)
        np.add.at(out, inverse, values)

    t_at, t_only = T(add_at), T(add_at_only)
    t_np = T(lambda: kernels.segment_sum_numpy(keys, values))
    t_nb = T(lambda: kernels.segment_sum(keys, values))
    t_old = T(lambda: partition.group_by_owner_ref(keys, a.rows, a.servers))
    t_new = T(lambda: partition.group_by_owner(keys, a.rows, a.servers))
    rows_u = np.ascontiguousarray(s_nb)
    t_take = T(lambda: kernels.gather(rows_u, inverse))
    t_fancy = T(lambda: np.take(rows_u, inverse, axis=0))

    us = lambda t: f"{t * 1e6:.0f}" if t >= 1e-4 else f"{t * 1e6:.1f}"  # noqa: E731
    gbs = lambda n, t: f"{n / t / 1e9:.1f}"  # noqa: E731
    case = f"{B:>5} {D:>3} {dtype.name:>7} {z:>4} {U:>5} |"
    seg = (f"{case} {us(t_copy):>9} {gbs(nbytes, t_copy):>5} | {us(t_at):>7} "
           f"{us(t_only):>7} {us(t_np):>7} {us(t_nb):>6} {gbs(nbytes, t_nb):>5} | "
           f"{t_at / t_nb:>8.1f} {t_only / t_nb:>6.1f} {t_np / t_nb:>7.1f} "
           f"{t_nb / t_copy:>8.1f}")
    gbo = (f"{case} {us(t_old):>7} {us(t_new):>7} {t_old / t_new:>5.1f} "
           f"{gbs(keys.nbytes, t_new):>5} | {us(t_take):>7} {gbs(nbytes, t_take):>5} "
           f"{us(t_fancy):>7} {t_take / t_copy:>8.1f}")
    return seg, gbo


def main(argv=None) -> int:
    """Parse, compile (cold with ``--cold``), then ``--pad``'s report or every case's lines."""
    a = parser().parse_args(argv)
    if a.cold:  # numba is imported lazily (first kernel call), so this still takes effect
        cold_dir = tempfile.mkdtemp(prefix="pshybrid-numba-")
        atexit.register(shutil.rmtree, cold_dir, ignore_errors=True)
        os.environ["NUMBA_CACHE_DIR"] = cold_dir

    from pshybrid import kernels, partition

    print(compile_report(kernels))
    if a.pad:
        pad_report(kernels, a)
        return 0
    print(f"ids ~ Zipf(a) mod {a.rows} rows; group_by_owner with S={a.servers}; "
          f"median of {a.repeat} after {a.warmup} warm-up; us = microseconds\n")
    hdr1 = (f"{'B':>5} {'D':>3} {'dtype':>7} {'a':>4} {'U':>5} | {'memcpy us':>9} {'GB/s':>5} | "
            f"{'add.at':>7} {'only':>7} {'numpy':>7} {'numba':>6} {'GB/s':>5} | "
            f"{'x add.at':>8} {'x only':>6} {'x numpy':>7} {'x memcpy':>8}")
    hdr2 = (f"{'B':>5} {'D':>3} {'dtype':>7} {'a':>4} {'U':>5} | {'gbo old':>7} {'gbo new':>7} "
            f"{'x':>5} {'GB/s':>5} | {'gather':>7} {'GB/s':>5} {'np.take':>7} {'x memcpy':>8}")
    seg_lines, gbo_lines = [hdr1, "-" * len(hdr1)], [hdr2, "-" * len(hdr2)]
    rng = np.random.default_rng(0)
    for dtype in map(np.dtype, a.dtype):
        for B in a.batch:
            for D in a.dim:
                for z in a.zipf:
                    seg, gbo = case_lines(kernels, partition, a, rng, dtype, B, D, z)
                    seg_lines.append(seg)
                    gbo_lines.append(gbo)
    print("segment_sum (dedup + scatter-add of gradient rows): times in us; x = speed-up of numba "
          "over that column; x memcpy = numba time / memcpy time")
    print("\n".join(seg_lines))
    print("\ngroup_by_owner (dedup + inverse + owner bounds) and gather (kernels.gather vs "
          "np.take, us); x memcpy = gather time / memcpy time")
    print("\n".join(gbo_lines))
    return 0

if __name__ == "__main__":
    from pshybrid.launch import run

    raise SystemExit(run(main))  # (Ctrl-C: one line and status 130, not a traceback)
