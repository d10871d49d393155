# python bench/data_bench.py [--rows 300000] [--batch-size 256] [--steps 256] [--repeat 5] [--max-cardinality 1000000] [--quick]
"""Input pipeline benchmark: rows/s of one worker's batches (``batches.worker_batches``: label,
dense, fused-table ids) on one core, inline (no data thread), beside a raw copy of the
same bytes.

Sources: the synthetic stream (Criteo Kaggle cardinalities capped at --max-cardinality, as
``bench/modes_bench.py``) and an HDF5 file written by ``python -m pshybrid prep synthetic``
(a temporary file, in the page cache after writing). Worker 0's share of W = 1 and 2
simulated workers, batch --batch-size per worker, the file block-shuffled and in order.
Paths: ``fast`` (the built-in sources' paths) and ``generic`` (the same dataset seen only
through ``rows(start, stop)``: one call per range and step, then ``+ offsets``; for HDF5
that is what training did before). ``memcpy``: NumPy copies of a batch's bytes (label,
dense, int64 ids) from rotating places of a 256 MiB source, so not from cache.

Compression (``prep --compression``): the same rows copied into files written with each of
``none``, ``lzf``, ``gzip`` (``DatasetWriter``'s chunks: 16,384 rows uncompressed, read
directly; 1,024 rows compressed, through HDF5's filters), read by worker 0 of W = 2
through the fast path, block-shuffled and in order, with each file's size; ``several files``:
the uncompressed rows split into 4 files read as one dataset (``--data a,b,c,d``);
``multi-hot``: the last 2 of the 26 fields as multi-hot fields of 1-4 ids a row
(uncompressed; ``batches.read_ids``, flat ids and lengths). ``--quick``: only these cases
(and memcpy).

Each number: the median over --repeat interleaved rounds (every case once per round) of
(time for --steps consecutive batches) / --steps, so HDF5's window reads are amortised as
in training; ``ms/batch`` wall clock (rows/s and the ratio use it), ``cpu ms`` the thread's
CPU time (less sensitive to other processes on a shared machine).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: before NumPy loads its BLAS

import argparse  # noqa: E402
import itertools
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from pshybrid.batches import BatchPlan, worker_batches  # noqa: E402
from pshybrid.data import DatasetWriter, H5Dataset  # noqa: E402
from pshybrid.files import H5Files
from pshybrid.schema import FusedTable  # noqa: E402
from pshybrid.synthetic import CRITEO_KAGGLE, SyntheticCTR  # noqa: E402
from timing import at_least, description, machine  # noqa: E402  (bench/timing.py)



class RowsOnly:
    """A dataset seen through the documented minimum (schema, rows, n_rows): the generic path."""

    def __init__(self, inner):
        self.inner, self.schema = inner, inner.schema
        if hasattr(inner, "n_rows"):
            self.n_rows = inner.n_rows

    def rows(self, start, stop):
        return self.inner.rows(start, stop)


class Case:
    """One row of the table: worker 0's batches of ``data`` (W workers, batch b)."""

    def __init__(self, label, data, W, b, shuffle, steps):
        self.label, self.data, self.b, self.steps = label, data, b, steps
        self.plan = BatchPlan(getattr(data, "n_rows", None), W * b, shuffle, seed=1)
        self.layout = FusedTable(data.schema, 16, 1, "float32")
        self.wall, self.cpu, self.runs = [], [], 0

    def run(self, timed=True):
        """``steps`` consecutive batches from a new place of the stream (or epoch)."""
        s0 = self.runs * self.steps
        if self.plan.steps_per_epoch:
            s0 %= self.plan.steps_per_epoch
        self.runs += 1
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in worker_batches(self.data, self.plan, s0, self.steps, 0, self.b, self.layout):
            pass
        if timed:
            self.wall.append((time.perf_counter() - t0) / self.steps)
            self.cpu.append((time.thread_time() - c0) / self.steps)


class Memcpy(Case):
    """NumPy copies of a batch's bytes from rotating places of a 256 MiB source."""

    def __init__(self, b, n_dense, n_sparse, steps):
        self.label, self.b, self.steps = ("memcpy", 1, "-", "-"), b, steps
        n = (256 << 20) // (4 + 4 * n_dense + 8 * n_sparse)
        self.src = (np.ones(n, np.float32), np.ones((n, n_dense), np.float32),
                    np.ones((n, n_sparse), np.int64))
        self.dst = (np.empty(b, np.float32), np.empty((b, n_dense), np.float32),
                    np.empty((b, n_sparse), np.int64))
        self.rng = np.random.default_rng(0)
        self.wall, self.cpu = [], []

    def run(self, timed=True):
        at = self.rng.integers(0, self.src[0].size - self.b, self.steps).tolist()
        t0, c0 = time.perf_counter(), time.thread_time()
        for a in at:
            for d, s in zip(self.dst, self.src):
                np.copyto(d, s[a:a + self.b])
        if timed:
            self.wall.append((time.perf_counter() - t0) / self.steps)
            self.cpu.append((time.thread_time() - c0) / self.steps)


def compressed_copies(h5: H5Dataset, tmp: str) -> dict:
    """The rows of ``h5`` written with each compression, and split into 4 files."""
    label, dense, sparse = h5.rows(0, h5.n_rows)
    sch, out = h5.schema, {}
    for name in ("none", "lzf", "gzip"):
        path = os.path.join(tmp, f"{name}.h5")
        with DatasetWriter(path, sch.dense_names, sch.sparse_names, compression=name) as w:
            w.append(label, dense, sparse)
            w.close(sch.cardinalities)
        out[name] = H5Dataset(path)
    cut = np.linspace(0, h5.n_rows, 5).astype(int)
    parts = []
    for i, (p, q) in enumerate(itertools.pairwise(cut)):
        parts.append(os.path.join(tmp, f"part{i}.h5"))
        with DatasetWriter(parts[-1], sch.dense_names, sch.sparse_names) as w:
            w.append(label[p:q], dense[p:q], sparse[p:q])
            w.close(sch.cardinalities)
    out["4 files"] = H5Files(parts)
    # 24 single-hot fields and the last 2 as multi-hot fields of 1-4 ids a row (uncompressed)
    rng = np.random.default_rng(0)
    lengths = [rng.integers(1, 5, h5.n_rows) for _ in range(2)]
    bags = [(rng.integers(0, c, int(n.sum())), n)
            for c, n in zip(sch.cardinalities[-2:], lengths)]
    path = os.path.join(tmp, "multi_hot.h5")
    with DatasetWriter(path, sch.dense_names, sch.sparse_names[:-2],
                       sch.sparse_names[-2:]) as w:
        w.append(label, dense, sparse[:, :-2], bags)
        w.close(sch.cardinalities)
    out["multi-hot"] = H5Dataset(path)
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--rows", type=at_least(1), default=300_000, help="rows of the HDF5 file")
    ap.add_argument("--batch-size", type=at_least(1), default=256)
    ap.add_argument("--steps", type=at_least(1), default=256, help="batches per timed run")
    ap.add_argument("--repeat", type=at_least(1), default=5)
    ap.add_argument("--max-cardinality", type=at_least(1), default=1_000_000,
                    help="cap of each table, the stream's and the file's")
    ap.add_argument("--quick", action="store_true", help="the compression cases only")
    return ap


def main(argv=None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    b = a.batch_size
    if a.rows < 2 * b:  # (2 simulated workers: was a ZeroDivisionError after the setup)
        ap.error(f"--rows {a.rows}: fewer than 2 workers' batches of --batch-size {b}")
    syn = SyntheticCTR(seed=0, cardinalities=tuple(min(c, a.max_cardinality)
                                                   for c in CRITEO_KAGGLE))
    t0 = time.perf_counter()
    syn.rows(0, 1)
    print(f"synthetic: tables built in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    sch = syn.schema
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "syn.h5")
        subprocess.run([sys.executable, "-m", "pshybrid", "prep", "synthetic", f, "--rows",
                        str(a.rows), "--max-cardinality", str(a.max_cardinality)],
                       check=True, stdout=subprocess.DEVNULL)  # (the stream's tables)
        h5 = H5Dataset(f)
        cases = [] if a.quick else \
            [Case(("synthetic", W, "-", path), data, W, b, False, a.steps)
             for W in (1, 2) for path, data in (("fast", syn), ("generic", RowsOnly(syn)))]
        cases += [] if a.quick else \
            [Case(("hdf5", W, "yes" if shuffle else "no", path), data, W, b, shuffle, a.steps)
             for W in (1, 2) for shuffle in (False, True)
             for path, data in (("fast", h5), ("generic", RowsOnly(h5)))]
        files = compressed_copies(h5, tmp)
        cases += [Case((f"h5 {name}", 2, "yes" if shuffle else "no", "fast"), data, 2, b,
                       shuffle, a.steps)
                  for shuffle in (False, True) for name, data in files.items()]
        cases.append(Memcpy(b, sch.n_dense, sch.n_sparse, a.steps))
        load = [os.getloadavg()[0]]
        for r in range(a.repeat + 1):  # rounds of every case; the first warms up
            for c in cases:
                c.run(timed=r > 0)
        load.append(os.getloadavg()[0])
        sizes = {name: sum(os.path.getsize(p) for p in d.path.split(","))
                 for name, d in files.items()}
        h5.close()
        for d in files.values():
            d.close()
    print("files: " + ", ".join(f"{n} {sz / 1e6:.1f} MB" for n, sz in sizes.items()))
    mem = statistics.median(cases[-1].wall)
    nbytes = b * (4 + 4 * sch.n_dense + 8 * sch.n_sparse)
    print(f"one worker, batch {b} ({nbytes:,} bytes: label, {sch.n_dense} dense float32, "
          f"{sch.n_sparse} int64 ids), inline; median of {a.repeat} interleaved runs of "
          f"{a.steps} batches; load average {load[0]:.2f} -> {load[1]:.2f} "
          f"({machine()})")
    print(f"{'source':<14} {'W':>2} {'shuffle':>7} {'path':<8} {'ms/batch':>9} {'cpu ms':>7} "
          f"{'rows/s':>12} {'x memcpy':>9}")
    for c in cases:
        src, W, sh, path = c.label
        t, cpu = statistics.median(c.wall), statistics.median(c.cpu)
        print(f"{src:<14} {W:>2} {sh:>7} {path:<8} {t * 1e3:>9.3f} {cpu * 1e3:>7.3f} "
              f"{b / t:>12,.0f} {t / mem:>9.1f}")
    return 0


if __name__ == "__main__":
    from pshybrid.launch import run

    sys.exit(run(main))  # (Ctrl-C: one line and status 130, not a traceback)
