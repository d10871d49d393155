"""One text table to a dataset file: the passes over IN, the encoder, the split, the summary."""

from __future__ import annotations

import os
import time

from ..errors import ConfigError, InputError
from .hashing import Hashing
from .options import DEFAULT_BUCKETS, TableOptions
from .read import Table, Tally, scan
from .vocabulary import Vocabulary
from .write import SplitWriter, check_out, split_sizes, valid_path


def run_table(command: str, t: Table, out: str, o: TableOptions) -> int:
    """Convert IN to ``out`` (and the validation file); print the summary; exit code 0."""
    t0 = time.perf_counter()
    encoder = make_encoder(o, len(t.sparse))
    check_out(out, "OUT", [("IN", t.path)])
    valid = valid_path(out, o, [("IN", t.path)])
    # The files first: an OUT that cannot be made fails before a pass over IN.
    with SplitWriter(out, valid, t.dense_names, t.sparse_names) as w:
        rows = None
        if valid is not None or o.min_count is not None:
            tally = Tally(t.path, o.skip_bad_lines)
            for r in scan(t, o.max_rows, tally, f"prep {command}: pass 1/2 (count)"):
                encoder.count(r)
            rows = rows_read(tally)
            encoder.finish()
            w.n_train = split_sizes(rows, o)
        tally = Tally(t.path, o.skip_bad_lines)
        title = f"prep {command}: {'write' if rows is None else 'pass 2/2 (write)'}"
        for r in scan(t, o.max_rows, tally, title):
            w.append(r.label, t.transform(r.dense), encoder.encode(r))
        if rows_read(tally) != rows and rows is not None:
            raise InputError(f"{t.path}: changed while being read ({rows} rows, then "
                             f"{tally.rows})")
        w.close(encoder.cardinalities, source=shown(t.path), transform=transform_text(t, o))
    dt = time.perf_counter() - t0
    cards = " ".join(f"{n}={c}" for n, c in zip(t.sparse_names, encoder.cardinalities))
    split = f", {w.rows[1]:,} valid rows -> {shown(valid)}" if valid is not None else ""
    print(f"prep {command}: {w.rows[0]:,} rows -> {shown(out)}{split}; {tally.bad:,} bad lines "
          f"skipped; cardinalities {cards or '(none)'}; {dt:.2f} s, "
          f"{tally.rows / max(dt, 1e-9):,.0f} rows/s", flush=True)
    return 0


def shown(path: str) -> str:
    """``path`` as text that prints and stores anywhere (undecodable bytes of a file name
    as U+FFFD)."""
    return os.fsencode(path).decode("utf-8", "replace")


def rows_read(tally: Tally) -> int:
    """The rows of a finished pass; an InputError if there were none."""
    if tally.rows == 0:
        skipped = f" ({tally.bad} bad lines skipped)" if tally.bad else ""
        raise InputError(f"{tally.path}: no data rows{skipped}")
    return tally.rows


def make_encoder(o: TableOptions, n_fields: int):
    """``Hashing`` (default) or ``Vocabulary`` (``--min-count``) for ``n_fields`` fields."""
    if o.min_count is not None:
        return Vocabulary(n_fields, o.min_count)
    buckets = list(o.buckets or [DEFAULT_BUCKETS])
    if len(buckets) == 1:
        buckets = buckets * n_fields
    elif len(buckets) != n_fields:
        raise ConfigError(f"--buckets: {len(buckets)} values for {n_fields} sparse fields "
                          "(give one, or one per field)", collective=True)
    return Hashing(buckets)


def transform_text(t: Table, o: TableOptions) -> str:
    """The one-line ``transform`` attribute."""
    dense = "log1p(max(x, 0))" if t.log else "x"
    sparse = (f"vocabulary min_count={o.min_count} (0 missing, 1 rare, 2.. by count)"
              if o.min_count is not None else "1 + crc32(value) % (buckets - 1), 0 missing")
    label = "" if t.threshold is None else f"label = value >= {t.threshold}; "
    return f"{label}dense {dense} (missing 0); sparse {sparse}"
