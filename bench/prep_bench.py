"""python bench/prep_bench.py [--rows 1000000] [--repeats 2]

``prep criteo`` throughput on one core, beside its reference in the same run,
each the best of ``--repeats`` runs after a warm-up read of the input:
  raw line read   iterating the file's lines in Python (``for line in f``): the floor;
  hashing         ``prep criteo IN OUT`` (default --buckets), one pass, with each
                  ``--compression`` (none, lzf, gzip: the HDF5 output's filter);
  vocabulary      ``prep criteo IN OUT --min-count 2``, two passes (count, then write);
  multi-hot csv   ``prep csv`` of a MovieLens-like table (user, movie, a quoted title with
                  commas in a third of the rows, a ``|``-separated genres list of 1-3
                  items, rating), hashing, ``--multi-hot genres``, beside the same table
                  with genres as a single-hot column.
The input is a generated Criteo TSV: labels ~ Bernoulli(0.25); I1..I13 rounded log-normal
integers (I2 may be negative), each missing with its own probability up to 45%; C1..C26
8-digit hex values of Zipf(1.1) ids over per-field cardinalities from 3 to 300k, some fields
often missing. Everything lives in a temporary directory that is removed at the end.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: before NumPy loads its BLAS

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from pshybrid.cli import main as pshybrid  # noqa: E402
from timing import at_least, description  # noqa: E402  (bench/timing.py)

CARDINALITIES = [1400, 550, 300_000, 200_000, 300, 24, 12_000, 630, 3, 90_000, 5500, 250_000,
                 3200, 27, 14_000, 180_000, 10, 5600, 2200, 4, 220_000, 18, 15, 140_000, 100,
                 70_000]
CAT_MISSING = [0, 0, .03, .03, 0, .1, 0, 0, 0, 0, 0, .03, 0, 0, 0, .03, 0, 0, .44, .44, .03,
               0, .76, .03, .03, .44]
DENSE_MISSING = [.45, 0, .2, .2, .03, .22, .04, .0, .04, .45, .04, .77, .2]


def generate(path: str, rows: int, seed: int = 0, block: int = 100_000) -> None:
    """Write ``rows`` Criteo-format lines to ``path``."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for a in range(0, rows, block):
            n = min(block, rows - a)
            cols = [rng.binomial(1, 0.25, n).astype(str)]
            for j, p in enumerate(DENSE_MISSING):
                x = np.rint(rng.lognormal(1.5, 1.5, n)).astype(np.int64) - (j == 1) * 3
                cols.append(np.where(rng.random(n) < p, "", x.astype(str)))
            for f_, (card, p) in enumerate(zip(CARDINALITIES, CAT_MISSING)):
                ids, at = np.unique((rng.zipf(1.1, n) - 1) % card, return_inverse=True)
                hexes = [f"{(i * 2654435761 + f_ * 40503) % 2**32:08x}" for i in ids.tolist()]
                cols.append(np.where(rng.random(n) < p, "", np.array(hexes)[at]))
            f.write("\n".join(map("\t".join, zip(*(c.tolist() for c in cols)))) + "\n")


def raw_read(path: str) -> float:
    """Seconds to iterate the file's lines."""
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        for _ in f:
            pass
    return time.perf_counter() - t0


def prep(command: str, *argv: str) -> float:
    """Seconds of one in-process ``pshybrid prep COMMAND IN OUT ...`` run (its output
    swallowed, OUT removed afterwards, its size kept)."""
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        pshybrid(["prep", command, *argv])
    sec = time.perf_counter() - t0
    SIZES[_name_of(command, argv)] = os.path.getsize(argv[1])
    os.remove(argv[1])
    return sec


def _name_of(command: str, argv) -> str:
    if command == "csv":
        return "prep csv --multi-hot genres" if "--multi-hot" in argv else \
            "prep csv, genres single-hot"
    if "--min-count" in argv:
        return "prep criteo --min-count 2"
    return f"prep criteo, {argv[argv.index('--compression') + 1]}"


def run(rows: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="prep_bench.") as d:
        src, out = os.path.join(d, "criteo.tsv"), os.path.join(d, "out.h5")
        t0 = time.perf_counter()
        generate(src, rows)
        mb = os.path.getsize(src) / 1e6
        print(f"input: {rows:,} Criteo lines, {mb:.0f} MB, generated in "
              f"{time.perf_counter() - t0:.1f} s; one core "
              f"(cpu {sorted(os.sched_getaffinity(0))})")
        raw_read(src)  # warm-up: the file into the page cache
        cases = [("raw line read", lambda: raw_read(src))]
        cases += [(f"prep criteo, {c}", lambda c=c: prep("criteo", src, out, "--compression", c))
                  for c in ("none", "lzf", "gzip")]
        cases += [("prep criteo --min-count 2",
                   lambda: prep("criteo", src, out, "--min-count", "2"))]
        report(cases, rows, mb, repeats, out)
        movies = os.path.join(d, "ratings.csv")
        generate_ratings(movies, rows)
        mb = os.path.getsize(movies) / 1e6
        print(f"input: {rows:,} MovieLens-like lines, {mb:.0f} MB")
        opts = ["--label", "rating", "--label-threshold", "4", "--sparse", "user,movie,title"]
        report([("raw line read", lambda: raw_read(movies)),
                ("prep csv, genres single-hot",
                 lambda: prep("csv", movies, out, *opts[:-1], opts[-1] + ",genres")),
                ("prep csv --multi-hot genres",
                 lambda: prep("csv", movies, out, *opts, "--multi-hot", "genres"))],
               rows, mb, repeats, out)


def report(cases, rows, mb, repeats, out) -> None:
    """Best of ``repeats`` rounds of every case (interleaved), beside the first (the raw
    read)."""
    best = [float("inf")] * len(cases)
    for _ in range(repeats):
        for i, (_, fn) in enumerate(cases):
            best[i] = min(best[i], fn())
    floor = rows / best[0]
    for (name, _), sec in zip(cases, best):
        size = f"{name_size(out, name):>9}" if name.startswith("prep") else " " * 9
        print(f"{name:<30} {sec:7.2f} s  {rows / sec:>12,.0f} rows/s  {mb / sec:7.1f} MB/s  "
              f"{rows / sec / floor:6.1%} of raw read {size}")
    sys.stdout.flush()


SIZES: dict = {}


def name_size(out: str, name: str) -> str:
    return f"{SIZES.get(name, 0) / 1e6:.1f} MB"


GENRES = ["Action", "Adventure", "Animation", "Children", "Comedy", "Crime", "Documentary",
          "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi",
          "Thriller", "War", "Western"]


def generate_ratings(path: str, rows: int, seed: int = 0) -> None:
    """A MovieLens-like ratings CSV with a title and a multi-hot genres column."""
    rng = np.random.default_rng(seed)
    movies = 20_000
    titles = [f'"Movie {i}, The ({1950 + i % 70})"' if i % 3 == 0 else f"Movie {i}"
              for i in range(movies)]
    genres = ["|".join(rng.choice(GENRES, rng.integers(1, 4), replace=False))
              for _ in range(movies)]
    with open(path, "w") as f:
        f.write("user,movie,title,genres,rating\n")
        for a in range(0, rows, 100_000):
            n = min(100_000, rows - a)
            m = (rng.zipf(1.2, n) - 1) % movies
            u = rng.integers(0, 160_000, n)
            r = rng.integers(1, 11, n) / 2
            f.write("".join(f"{x},{y},{titles[y]},{genres[y]},{z}\n"
                            for x, y, z in zip(u.tolist(), m.tolist(), r.tolist())))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--rows", type=at_least(1), default=1_000_000,
                    help="input lines (default: 1000000)")
    ap.add_argument("--repeats", type=at_least(1), default=2,
                    help="runs of each, best kept (default: 2)")
    args = ap.parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    run(args.rows, args.repeats)
    return 0


if __name__ == "__main__":
    from pshybrid.launch import run as launched

    sys.exit(launched(main))  # (Ctrl-C: one line and status 130, not a traceback)
