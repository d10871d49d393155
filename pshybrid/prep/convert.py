"""One text table to a dataset file: the passes over IN, the encoder, the split, the summary."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time

import numpy as np

from ..errors import ConfigError, InputError
from ..files import UNLABELED
from .hashing import Hashing
from .inputs import STDIN, shown_input
from .multihot import items
from .options import DEFAULT_BUCKETS, TableOptions
from .read import Table, Tally, check_inputs, scan
from .vocabulary import Vocabulary, digest, read_vocabulary
from .write import SplitWriter, check_out, split_sizes, valid_path


def run_table(command: str, t: Table, out: str, o: TableOptions) -> int:
    """Convert the inputs to ``out`` (and the validation file); print the summary; exit
    code 0."""
    t0 = time.perf_counter()
    n_single = len(t.sparse)
    encoders = make_encoders(o, t)
    named = [("IN", p) for p in t.paths if p != STDIN]
    check_out(out, "OUT", o.overwrite, named)
    valid = valid_path(out, o, named)
    names = t.sparse_names
    check_inputs(t)   # (each input opened: a bad later one fails before any pass)
    # The files first: an OUT that cannot be made fails before a pass over IN.
    with SplitWriter(out, valid, t.dense_names, names[:n_single], names[n_single:],
                     o.compression) as w:
        rows = None
        if valid is not None or o.min_count is not None:
            rows, items = _count(command, t, o, encoders)
            w.n_train = split_sizes(rows, o)
            kept = [k for enc in encoders for k in getattr(enc, "kept", ())]  # (vocabulary)
            w.check_room(rows, items, kept)   # (the disk, before pass 2 writes a row)
        tally = Tally(t.paths[0], o.skip_bad_lines)
        title = f"prep {command}: {'write' if rows is None else 'pass 2/2 (write)'}"
        for r in scan(t, o.max_rows, tally, title):
            parts = _parts(t, r)
            bags = [(enc.encode(p)[:, 0], p.lengths) for enc, p in zip(encoders[1:], parts[1:])]
            w.append(r.label, t.transform(r.dense), encoders[0].encode(r), bags)
        if rows_read(tally, t) != rows and rows is not None:
            raise InputError(f"{', '.join(map(shown_input, t.paths))}: changed while being "
                             f"read ({rows} rows, then {tally.rows})")
        cards = [c for enc in encoders for c in enc.cardinalities]
        attrs = {UNLABELED: 1} if o.unlabeled else {}
        if t.multi_sep:  # (files of one dataset must agree: checked at use, as the digest)
            attrs["multi_hot_separators"] = json.dumps(separators(t))
        if o.min_count is not None or o.vocabulary is not None:  # (a file to encode alike)
            kept = [kept for enc in encoders for kept in enc.kept]
            w.vocabulary(names, kept, separators(t))
            attrs["vocabulary_digest"] = digest(names, kept)  # (whose ids: checked at use)
        w.close(cards, source=", ".join(shown(shown_input(p)) for p in t.paths),
                transform=transform_text(t, o), **attrs)
    dt = time.perf_counter() - t0
    _warn_oversized(command, sum(cards), w.ids, o)
    cards = " ".join(f"{n}={c}" for n, c in zip(names, cards))
    split = f", {w.rows[1]:,} valid rows -> {shown(valid)}" if valid is not None else ""
    print(f"prep {command}: {w.rows[0]:,} rows -> {shown(out)}{split}; {tally.bad:,} bad lines "
          f"skipped; cardinalities {cards or '(none)'}; {dt:.2f} s, "
          f"{tally.rows / max(dt, 1e-9):,.0f} rows/s", flush=True)
    return 0


def _count(command: str, t: Table, o: TableOptions, encoders: list) -> tuple[int, list[int]]:
    """Pass 1: the encoders' counts (a vocabulary's ids), finished; the rows read (an
    InputError if none) and each multi-hot field's items in all."""
    tally, items = Tally(t.paths[0], o.skip_bad_lines), [0] * len(t.multi_sep)
    for r in scan(t, o.max_rows, tally, f"prep {command}: pass 1/2 (count)"):
        parts = _parts(t, r)
        for enc, part in zip(encoders, parts):
            enc.count(part)
        for k, part in enumerate(parts[1:]):
            items[k] += int(part.lengths.sum())
    rows = rows_read(tally, t)
    for enc in encoders:
        enc.finish()
    return rows, items


def _warn_oversized(command: str, table_rows: int, ids: int, o: TableOptions) -> None:
    """Hashing buckets far beyond what the data holds make tables that are mostly rows no
    id reaches (memory, checkpoint size, start-up time): say so, with the fix. Not where the
    sizes are another file's (``--vocabulary``) or must be (``--unlabeled``: the training
    file's buckets, which its own prep judged)."""
    if (o.min_count is None and o.vocabulary is None and not o.unlabeled
            and table_rows > max(ids, 1)):
        print(f"prep {command}: warning: the tables get {table_rows:,} rows (--buckets) for "
              f"{ids:,} ids in the data: most rows can never train; a smaller --buckets "
              "(e.g. the rows read) or a vocabulary (--min-count K) sizes them to the data",
              file=sys.stderr, flush=True)


def _parts(t: Table, r):
    """What each encoder reads: the rows (single-hot fields), then each multi-hot column's
    items."""
    return [r] + [items(r.block, r.ms[:, k], r.mL[:, k], sep)
                  for k, sep in enumerate(t.multi_sep)]


def shown(path: str) -> str:
    """``path`` as text that prints and stores anywhere (undecodable bytes of a file name
    as U+FFFD)."""
    return os.fsencode(path).decode("utf-8", "replace")


def rows_read(tally: Tally, t: Table) -> int:
    """The rows of a finished pass; an InputError if there were none."""
    if tally.rows == 0:
        skipped = f" ({tally.bad} bad lines skipped)" if tally.bad else ""
        raise InputError(f"{', '.join(map(shown_input, t.paths))}: no data rows{skipped}")
    return tally.rows


def separators(t: Table) -> dict[str, str]:
    """{multi-hot field: the separator of its items}."""
    return {n: chr(c) for n, c in zip(t.sparse_names[len(t.sparse):], t.multi_sep)}


def make_encoders(o: TableOptions, t: Table) -> list:
    """``Hashing`` (default) or ``Vocabulary`` (``--min-count``, or ``--vocabulary``'s, of
    ``t``'s fields): one for the single-hot fields, then one per multi-hot field
    (``--buckets``: one value for all, or one per field, the single-hot fields first)."""
    n_single, n_multi, names = len(t.sparse), len(t.multi_hot), t.sparse_names
    sizes = [n_single] + [1] * n_multi
    if o.min_count is not None or o.vocabulary is not None:
        encoders = [Vocabulary(n, o.min_count) for n in sizes]
        if o.vocabulary is not None:
            kept = read_vocabulary(o.vocabulary, names, separators(t))
            for enc, a, b in zip(encoders, np.cumsum([0] + sizes), np.cumsum(sizes)):
                enc.load(kept[a:b])
        return encoders
    n_fields = n_single + n_multi
    buckets = list(o.buckets or [DEFAULT_BUCKETS])
    if len(buckets) == 1:
        buckets = buckets * n_fields
    elif len(buckets) != n_fields:
        raise ConfigError(f"--buckets: {len(buckets)} values for {n_fields} sparse fields "
                          "(give one, or one per field)", collective=True)
    cut = np.cumsum([0] + sizes)
    return [Hashing(buckets[a:b]) for a, b in itertools.pairwise(cut)]


def transform_text(t: Table, o: TableOptions) -> str:
    """The one-line ``transform`` attribute."""
    dense = "log1p(max(x, 0))" if t.log else "x"
    sparse = (f"vocabulary min_count={o.min_count} (0 missing, 1 rare, 2.. by count)"
              if o.min_count is not None else
              f"vocabulary of {shown(o.vocabulary)} (0 missing, 1 a value it lacks)"
              if o.vocabulary is not None else "1 + crc32(value) % (buckets - 1), 0 missing")
    label = ("no labels (/label 0); " if t.label is None else "" if t.threshold is None
             else f"label = value >= {t.threshold}; ")
    multi = "".join(f"; multi-hot {n} items split at {chr(c)!r}" for n, c in
                    zip(t.sparse_names[len(t.sparse):], t.multi_sep))
    return f"{label}dense {dense} (missing 0); sparse {sparse}{multi}"
