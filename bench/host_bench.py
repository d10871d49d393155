# python bench/host_bench.py [--batch-sizes 256 4096] [--steps 320 60] [--json host.json]
"""One worker's host-side work per step, one core, no data thread, piece by piece.

Section ``input`` (``input_planning``): for each batch size b (rows x 26 fused ids, the modes
benchmark's Criteo Kaggle cardinalities capped at --max-cardinality: 5.6M rows of dim 16
float32) and each source — the synthetic stream, and an HDF5 file of the same stream written
to a temporary directory (``synthetic.write_synthetic``: uncompressed, so read directly,
``rawrows``; block-shuffled reads, page-cached) — the times of:
  input     the batch (``batches.worker_batches``: label, dense, fused int64 ids): the
            median over windows of WINDOW_ROWS // b consecutive batches of their mean, so
            a windowed read serving several batches (a compressed file's) would count;
  check     ``store.ids_in_range`` (every id a row of the table; their min and max);
  dedup     ``partition.group_by_owner`` (distinct ids grouped by owner, inverse index);
  types     ``store.owner_types`` (one committed row datatype per owner; freed untimed);
  total     their sum, beside the target (TARGET_MS) and a memcpy of the batch's bytes from
            rotating places of a 64 MiB source (not from cache);
  cpu       the thread's CPU time for all four (time.thread_time; by windows as input): on
            a shared machine, less sensitive than the wall clock to other processes.
Section ``apply`` (``server_apply``): a server's optimizer apply on dim-17 float32 rows of a
2M-row shard, 65,536 distinct rows a step (``--shard-rows``, ``--touched``), in M rows/s with
1 and 2 threads (Adagrad and Adam, ``ServerSparse.server_apply`` of one worker's part),
interleaved rounds, beside memcpy of the same rows, the shard in each memory of
``apply_bench.MEMORY``: ``window`` (shared memory, where a server's shard lives) and
``numpy`` (huge pages where the kernel gives them) (``bench/apply_bench.py``; more cases
there).
Check, dedup and types are what ``EmbeddingStore.plan`` runs, in that order. Each figure
but input: the median over --steps batches after --warmup, all pieces of a batch timed back
to back (time.perf_counter). Sections are functions of the parsed arguments returning rows;
``SECTIONS`` lists them (``--sections`` picks), ``--json`` writes every section's rows.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: before NumPy loads its BLAS

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from pshybrid import partition  # noqa: E402
from pshybrid.batches import WINDOW_ROWS, BatchPlan, worker_batches  # noqa: E402
from pshybrid.data import H5Dataset  # noqa: E402
from pshybrid.schema import field_offsets  # noqa: E402
from pshybrid.store import ids_in_range, owner_types  # noqa: E402
from pshybrid.synthetic import CRITEO_KAGGLE, SyntheticCTR, write_synthetic  # noqa: E402
from timing import at_least, check_outputs, description, machine, write_json  # noqa: E402

TARGET_MS = {256: 0.25, 4096: 1.5}  # the aim: input + planning per batch, one core
DIM = 16
PIECES = ("input", "check", "dedup", "types")


class Layout:
    """The fused table's field offsets (what ``worker_batches`` takes as ``layout``)."""

    def __init__(self, cards):
        self.offsets = field_offsets(cards)


def time_batches(batches, b: int, rows: int, servers: int, n: int) -> dict:
    """Median ms of each piece over the next ``n`` batches (of ``b`` rows) of the iterator
    ``batches``."""
    times = {k: [] for k in PIECES + ("cpu",)}
    for _ in range(n):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        _, _, ids = next(batches)
        t1 = time.perf_counter()
        ids, extent = ids_in_range("fused", rows, ids)
        t2 = time.perf_counter()
        unique, _, bounds = partition.group_by_owner(ids, rows, servers, extent)
        t3 = time.perf_counter()
        types = owner_types(MPI.FLOAT, DIM, 4, unique, bounds, servers)
        t4 = time.perf_counter()
        times["cpu"].append((time.thread_time() - c0) * 1e3)
        for _, _, dt in types:
            dt.Free()
        for piece, begun, ended in zip(PIECES, (t0, t1, t2, t3), (t1, t2, t3, t4)):
            times[piece].append((ended - begun) * 1e3)  # (b stays the batch size: below)
    out = {k: statistics.median(v) for k, v in times.items()}
    k = max(1, WINDOW_ROWS // b)  # input, cpu: the median of the means of windows of k batches
    for key in ("input", "cpu"):
        t = times[key]
        out[key] = statistics.median(statistics.fmean(t[i:i + k])
                                     for i in range(0, max(1, len(t) - k + 1), k))
    out["total"] = sum(out[k] for k in PIECES)
    out["distinct"] = int(unique.size)
    return out


def memcpy_ms(b: int, n_dense: int, n_sparse: int, n: int) -> float:
    """Median ms of NumPy copies of a batch's bytes from rotating places of 64 MiB."""
    rows = (64 << 20) // (4 + 4 * n_dense + 8 * n_sparse)
    src = (np.ones(rows, np.float32), np.ones((rows, n_dense), np.float32),
           np.ones((rows, n_sparse), np.int64))
    dst = tuple(np.empty((b,) + s.shape[1:], s.dtype) for s in src)
    times = []
    for a in np.random.default_rng(0).integers(0, rows - b, n).tolist():
        t0 = time.perf_counter()
        for d, s in zip(dst, src):
            np.copyto(d, s[a:a + b])
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def input_planning(a) -> list[dict]:
    """Section ``input``: rows of (source, batch) with each piece's median ms."""
    cards = tuple(min(c, a.max_cardinality) for c in CRITEO_KAGGLE)
    syn = SyntheticCTR(seed=0, cardinalities=cards)
    syn.rows(0, 1)  # (the alias tables, once)
    rows, layout, out = int(sum(cards)), Layout(cards), []
    need = max((n + a.warmup) * b for b, n in zip(a.batch_sizes, a.steps))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "syn.h5")
        write_synthetic(path, max(need, 2 * 4096), seed=0, cardinalities=cards)
        h5 = H5Dataset(path)
        for b, n in zip(a.batch_sizes, a.steps):
            for name, data in (("synthetic", syn), ("hdf5", h5)):
                plan = BatchPlan(getattr(data, "n_rows", None), b, name == "hdf5", seed=1)
                steps = n + a.warmup
                if plan.steps_per_epoch:
                    steps = min(steps, plan.steps_per_epoch)
                it = worker_batches(data, plan, 0, steps, 0, b, layout)
                time_batches(it, b, rows, a.servers, min(a.warmup, steps - 1))
                row = time_batches(it, b, rows, a.servers, steps - min(a.warmup, steps - 1))
                row.update(source=name, batch=b, ids=b * len(cards), target=TARGET_MS.get(b),
                           memcpy=memcpy_ms(b, syn.n_dense, len(cards), n))
                out.append(row)
        h5.close()
    return out


def print_input(rows: list[dict], a) -> None:
    print(f"one worker, one core, inline: input + planning per batch (ms, medians; "
          f"{a.servers} server(s), dim {DIM} float32, load average {os.getloadavg()[0]:.2f}; "
          f"{machine()})")
    print(f"{'source':<10} {'batch':>5} {'ids':>7} {'distinct':>8} {'input':>7} {'check':>7} "
          f"{'dedup':>7} {'types':>7} {'total':>7} {'cpu':>7} {'target':>6} {'memcpy':>7}")
    for r in rows:
        target = "-" if r["target"] is None else f"{r['target']:.2f}"
        print(f"{r['source']:<10} {r['batch']:>5} {r['ids']:>7} {r['distinct']:>8} "
              + " ".join(f"{r[k]:>7.3f}" for k in PIECES + ("total", "cpu"))
              + f" {target:>6} {r['memcpy']:>7.3f}")


def server_apply(a) -> list[dict]:
    """Section ``apply``: M rows/s per optimizer, memory and thread count (medians over
    rounds)."""
    from apply_bench import MEMORY, apply_rows_per_s, make_shard, memcpy_rows_per_s

    out = []
    for kind in ("adagrad", "adam"):
        for memory in MEMORY:
            shard, got = make_shard(kind, a.shard_rows, memory=memory), {1: [], 2: []}
            for _ in range(a.rounds):
                for t in got:
                    got[t].append(apply_rows_per_s(kind, t, shard=shard, parts=1,
                                                   touched=a.touched) / 1e6)
            del shard
            med = {t: statistics.median(v) for t, v in got.items()}
            out.append(dict(kind=kind, memory=memory, one=med[1], two=med[2],
                            speedup=med[2] / med[1], memcpy=memcpy_rows_per_s(a.touched) / 1e6))
    return out


def print_apply(rows: list[dict], a) -> None:
    print(f"\na server's optimizer apply, dim 17 float32, {a.touched:,} of {a.shard_rows:,} "
          f"rows a step (M rows/s, medians of {a.rounds} rounds; load average "
          f"{os.getloadavg()[0]:.2f}); window: the shard in shared memory, as a server's")
    print(f"{'optimizer':<9} {'memory':<6} {'1 thread':>9} {'2 threads':>9} {'x':>5} "
          f"{'memcpy':>7}")
    for r in rows:
        print(f"{r['kind']:<9} {r['memory']:<6} {r['one']:>9.1f} {r['two']:>9.1f} "
              f"{r['speedup']:>5.2f} {r['memcpy']:>7.1f}")


SECTIONS = {"input": (input_planning, print_input),  # name: (rows of args, printer)
            "apply": (server_apply, print_apply)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--batch-sizes", type=at_least(1), nargs="+", default=[256, 4096])
    ap.add_argument("--steps", type=at_least(1), nargs="+", default=[320, 60],
                    help="timed batches per batch size (one value: all)")
    ap.add_argument("--warmup", type=at_least(0), default=10)
    ap.add_argument("--servers", type=at_least(1), default=1, help="owners of the table's rows")
    ap.add_argument("--max-cardinality", type=at_least(1), default=1_000_000)
    ap.add_argument("--rounds", type=at_least(1), default=5, help="apply: interleaved rounds")
    ap.add_argument("--shard-rows", type=at_least(1), default=2_000_000, help="apply: the shard")
    ap.add_argument("--touched", type=at_least(1), default=65536, help="apply: rows a step")
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    ap.add_argument("--json", help="write every section's rows to this file")
    a = ap.parse_args(argv)
    check_outputs(ap, a.json)
    if len(a.steps) == 1:
        a.steps = a.steps * len(a.batch_sizes)
    if len(a.steps) != len(a.batch_sizes):
        ap.error("--steps takes one value or one per batch size")
    rows = sum(min(c, a.max_cardinality) for c in CRITEO_KAGGLE)
    if a.servers > rows:  # (a datatype per owner a step: 10**8 owners ran for hours)
        ap.error(f"--servers {a.servers}: more owners than the table's {rows:,} rows")
    results = {}
    for name in a.sections:
        make, show = SECTIONS[name]
        results[name] = make(a)
        show(results[name], a)
    if a.json:
        write_json(a.json, {"args": vars(a), "sections": results})
    return 0


if __name__ == "__main__":
    from pshybrid.launch import run

    sys.exit(run(main))  # (Ctrl-C: one line and status 130, not a traceback)
