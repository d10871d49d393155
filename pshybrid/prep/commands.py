"""The ``prep`` commands: ``criteo`` and ``csv`` (text tables), ``synthetic``."""

from __future__ import annotations

import time

from ..config import ArgumentParser, add_arguments, resolve
from ..errors import ConfigError, InputError
from .hashing import Hashing
from .options import DEFAULT_BUCKETS, CsvOptions, SyntheticOptions, TableOptions, separator
from .read import MAX_LINE_BYTES, Table, Tally, open_input, scan
from .vocabulary import Vocabulary
from .write import SplitWriter, check_out, valid_path

CRITEO_DENSE = [f"I{i}" for i in range(1, 14)]
CRITEO_SPARSE = [f"C{i}" for i in range(1, 27)]


def run_table(command: str, t: Table, out: str, o: TableOptions) -> int:
    """Convert IN to ``out`` (and the validation file); print the summary; exit code 0."""
    t0 = time.perf_counter()
    encoder = make_encoder(o, len(t.sparse))
    check_out(out, "OUT")
    valid = valid_path(out, o)
    rows = None
    if valid is not None or o.min_count is not None:
        tally = Tally(t.path, o.skip_bad_lines)
        for r in scan(t, o.max_rows, tally, f"prep {command}: pass 1/2 (count)"):
            encoder.count(r)
        rows = rows_read(tally)
        encoder.finish()
    n_train = None if valid is None else rows - round(o.valid_fraction * rows)
    tally = Tally(t.path, o.skip_bad_lines)
    title = f"prep {command}: {'write' if rows is None else 'pass 2/2 (write)'}"
    with SplitWriter(out, valid, n_train, t.dense_names, t.sparse_names) as w:
        for r in scan(t, o.max_rows, tally, title):
            w.append(r.label, t.transform(r.dense), encoder.encode(r))
        if rows_read(tally) != rows and rows is not None:
            raise InputError(f"{t.path}: changed while being read ({rows} rows, then "
                             f"{tally.rows})")
        w.close(encoder.cardinalities, source=t.path, transform=transform_text(t, o))
    dt = time.perf_counter() - t0
    cards = " ".join(f"{n}={c}" for n, c in zip(t.sparse_names, encoder.cardinalities))
    split = f", {w.rows[1]:,} valid rows -> {valid}" if valid is not None else ""
    print(f"prep {command}: {w.rows[0]:,} rows -> {out}{split}; {tally.bad:,} bad lines "
          f"skipped; cardinalities {cards or '(none)'}; {dt:.2f} s, "
          f"{tally.rows / max(dt, 1e-9):,.0f} rows/s", flush=True)
    return 0


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



def cmd_synthetic(args) -> int:
    from ..synthetic import CRITEO_LIKE, write_synthetic

    o = resolve(SyntheticOptions, args)
    check_out(args.out, "OUT")
    valid = valid_path(args.out, o)
    rows = min(o.rows, o.max_rows or o.rows)
    t0 = time.perf_counter()
    done = write_synthetic(args.out, rows, o.valid_fraction, valid, seed=o.seed, zipf=o.zipf,
                           cardinalities=tuple(min(c, o.max_cardinality) for c in CRITEO_LIKE))
    dt = time.perf_counter() - t0
    parts = "; ".join(f"{n} rows -> {path} (planted AUC {a:.4f})" for path, (n, a) in done.items())
    print(f"prep synthetic: {parts}; {dt:.2f} s, {rows / dt:,.0f} rows/s")
    return 0


def cmd_criteo(args) -> int:
    o = resolve(TableOptions, args)
    t = Table(args.input, sep=ord("\t"), n_fields=40, header=False, label=0,
              dense=list(range(1, 14)), sparse=list(range(14, 40)), dense_names=CRITEO_DENSE,
              sparse_names=CRITEO_SPARSE, integers=True, log=True, threshold=None)
    return run_table("criteo", t, args.out, o)


def cmd_csv(args) -> int:
    o = resolve(CsvOptions, args)
    sep = separator(o.sep)
    with open_input(args.input) as f:
        first = f.readline(MAX_LINE_BYTES + 1)
    if not first.strip(b"\r\n"):
        raise InputError(f"{args.input}: no data rows (empty first line)")
    cells = first.rstrip(b"\n").rstrip(b"\r").decode("utf-8-sig", "replace").split(sep)
    names = cells if o.header else [f"c{i}" for i in range(len(cells))]
    label, dense, sparse = (_columns(text, option, names, o.header, args.input) for
                            text, option in ((o.label, "--label"), (o.dense, "--dense"),
                                             (o.sparse, "--sparse")))
    if len(label) != 1:
        raise ConfigError(f"--label {o.label}: give one column", collective=True)
    used = label + dense + sparse
    if len(set(used)) < len(used):
        twice = next(names[c] for c in used if used.count(c) > 1)
        raise ConfigError(f"column {twice!r} is used twice in --label/--dense/--sparse",
                          collective=True)
    t = Table(args.input, sep=ord(sep), n_fields=len(names), header=o.header, label=label[0],
              dense=dense, sparse=sparse, dense_names=[names[c] for c in dense],
              sparse_names=[names[c] for c in sparse], integers=False,
              log=o.dense_transform == "log", threshold=o.label_threshold)
    return run_table("csv", t, args.out, o)


def _columns(text: str | None, option: str, names: list[str], header: bool, path: str):
    """Column indices of a comma list of header names or 0-based indices."""
    out = []
    for c in (text.split(",") if text else []):
        if header and c in names:
            out.append(names.index(c))
        elif c.isdigit() and int(c) < len(names):
            out.append(int(c))
        else:
            known = f"columns: {', '.join(names)}" if header else f"{len(names)} columns"
            raise ConfigError(f"{option}: no column {c!r} in {path} ({known})", collective=True)
    return out


def _command(formats, name: str, options, func, help: str, description: str) -> None:
    """Add ``prep <name> IN OUT`` with the options of dataclass ``options`` (and --config)."""
    p = formats.add_parser(name, help=help, description=description + " Every option can "
                           "also come from a TOML file (--config FILE; the command line wins).")
    p.add_argument("input", metavar="IN", help="input table, plain text or gzip")
    p.add_argument("out", metavar="OUT", help="dataset file to write (HDF5)")
    add_arguments(p, options)
    p.set_defaults(func=func)


def add_prep_commands(sub) -> None:
    """Register ``prep`` and its subcommands on the CLI's subparsers ``sub``."""
    prep = sub.add_parser("prep", help="build a dataset file (criteo, csv, synthetic)",
                          description="Build a dataset file (HDF5, DESIGN §8).")
    formats = prep.add_subparsers(dest="format", metavar="<format>",
                                  parser_class=ArgumentParser)
    formats.required = True
    _command(formats, "criteo", TableOptions, cmd_criteo, "Criteo TSV: label, I1..I13, C1..C26",
             "Criteo TSV (label, 13 integer and 26 categorical fields, tab-separated) -> "
             "dataset file.")
    _command(formats, "csv", CsvOptions, cmd_csv, "any delimited table: label, dense and "
             "sparse columns", "Delimited table -> dataset file; columns by header name or "
             "0-based index.")
    p = formats.add_parser("synthetic", help="the built-in synthetic CTR stream as a file, "
                           "with the planted model's AUC", description="Synthetic Criteo-like "
                           "dataset (pshybrid/synthetic.py) -> dataset file; each file stores "
                           "the planted model's own AUC on its rows as attribute planted_auc "
                           "(the quality ceiling). Every option can also come from a TOML "
                           "file (--config FILE; the command line wins).")
    p.add_argument("out", metavar="OUT", help="dataset file to write (HDF5)")
    add_arguments(p, SyntheticOptions)
    p.set_defaults(func=cmd_synthetic)
