"""The ``prep`` commands: ``criteo`` and ``csv`` (text tables), ``synthetic``. NumPy, h5py and
the converters are imported when a command runs: option errors and ``--help`` answer fast."""

from __future__ import annotations

import time

from ..config import ArgumentParser, add_arguments, resolve
from ..errors import ConfigError, InputError
from ..stopping import ended_by_signals
from .options import DEFAULT_BUCKETS, CsvOptions, SyntheticOptions, TableOptions, separator

CRITEO_DENSE = [f"I{i}" for i in range(1, 14)]
CRITEO_SPARSE = [f"C{i}" for i in range(1, 27)]


def cmd_synthetic(args) -> int:
    o = resolve(SyntheticOptions, args)
    from ..synthetic import CRITEO_KAGGLE, write_synthetic
    from .convert import shown
    from .write import PREP_OUTPUT, check_out, split_sizes, valid_path

    check_out(args.out, "OUT", o.overwrite)
    valid = valid_path(args.out, o)
    rows = min(o.rows, o.max_rows or o.rows)
    split_sizes(rows, o)
    t0 = time.perf_counter()
    done = write_synthetic(args.out, rows, o.valid_fraction, valid, PREP_OUTPUT, seed=o.seed,
                           zipf=o.zipf,
                           cardinalities=tuple(min(c, o.max_cardinality) for c in CRITEO_KAGGLE))
    dt = time.perf_counter() - t0
    parts = "; ".join(f"{n} rows -> {shown(path)} (planted AUC {a:.4f})"
                      for path, (n, a) in done.items())
    print(f"prep synthetic: {parts}; {dt:.2f} s, {rows / dt:,.0f} rows/s")
    return 0


def cmd_criteo(args) -> int:
    o = resolve(TableOptions, args)
    from .convert import run_table
    from .inputs import as_inputs, spooled
    from .read import Table

    args.input = as_inputs(args.input)

    with spooled(args.input, two_passes(o)) as spools:
        first = 0 if o.unlabeled else 1  # I1 (--unlabeled: no label before it)
        t = Table(args.input, sep=ord("\t"), n_fields=39 + first,
                  header=False, label=None if o.unlabeled else 0,
                  dense=list(range(first, first + 13)),
                  sparse=list(range(first + 13, first + 39)),
                  dense_names=CRITEO_DENSE, sparse_names=CRITEO_SPARSE, integers=True,
                  log=True, threshold=None, spools=spools, one_short="" if o.unlabeled
                  else "; lines without a label (to predict): --unlabeled",
                  one_long="; lines with a label (40 fields): without --unlabeled"
                  if o.unlabeled else "")
        return run_table("criteo", t, args.out, o)


def two_passes(o: TableOptions) -> bool:
    """Whether the inputs are read twice (a vocabulary, or a split that needs the count)."""
    return o.min_count is not None or bool(o.valid_fraction)


def cmd_csv(args) -> int:
    o = resolve(CsvOptions, args)
    from .convert import run_table
    from .inputs import as_inputs, is_parquet, raw_input, shown_input, spooled
    from .multihot import parse_multi_hot
    from .parquet import check_columns
    from .read import Table

    args.input = as_inputs(args.input)

    sep = separator(o.sep)
    with spooled(args.input, two_passes(o), header=True) as spools:  # (read before the rows)
        parquets = [p for p in args.input if is_parquet(p, spools)]
        if not o.header and parquets:
            raise ConfigError("--no-header: a Parquet input's column names are its header",
                              collective=True)
        first, names = _header(args.input[0], sep, o.header, spools)
        label, dense, sparse = (_columns(text, option, names, o.header, args.input[0]) for
                                text, option in ((o.label, "--label"), (o.dense, "--dense"),
                                                 (o.sparse, "--sparse")))
        multi, seps = parse_multi_hot(o.multi_hot, names, o.header, args.input[0], _columns)
        if len(label) != (0 if o.unlabeled else 1):
            raise ConfigError(f"--label {o.label}: give one column", collective=True)
        used = label + dense + sparse + multi
        if len(set(used)) < len(used):
            twice = next(names[c] for c in used if used.count(c) > 1)
            raise ConfigError(f"column {twice!r} is used twice in "
                              "--label/--dense/--sparse/--multi-hot", collective=True)
        same = [c for c in used if [names[u] for u in used].count(names[c]) > 1]
        if same:  # (by index: the dataset's field names are the header's, one each)
            raise ConfigError(f"columns {same[0]} and {same[1]} of {args.input[0]} are both "
                              f"named {names[same[0]]!r}: a dataset's fields need names of "
                              "their own; rename one in the header", collective=True)
        for path in parquets:               # their list and nested columns
            with raw_input(path, spools) as f:
                check_columns(f, shown_input(path), names, {
                    "--label": label, "--dense": dense, "--sparse": sparse},
                    dict(zip(multi, seps)))
        t = Table(args.input, sep=ord(sep), n_fields=len(names), header=o.header,
                  label=label[0] if label else None, dense=dense, sparse=sparse,
                  dense_names=[names[c] for c in dense],
                  sparse_names=[names[c] for c in sparse + multi], integers=False,
                  log=o.dense_transform == "log", threshold=o.label_threshold,
                  quote=o.quoting == "rfc4180", spools=spools, multi_hot=multi,
                  multi_sep=seps, header_line=first if o.header else None, parquet=True)
        return run_table("csv", t, args.out, o)


def _header(path: str, sep: str, header: bool, spools: dict):
    """``(first line, column names)``: the first line's cells with ``header``, else ``c0,
    c1, ...``; a header with double quotes is read as a csv record."""
    from .inputs import first_line, shown_input

    name = shown_input(path)
    first = first_line(path, spools)
    if not first.strip(b"\r\n"):
        raise InputError(f"{name}: no data rows (empty first line)")
    line = first.rstrip(b"\n").rstrip(b"\r")
    if not header:
        return first, [f"c{i}" for i in range(line.count(sep.encode()) + 1)]
    if b"\0" in line:
        raise InputError(f"{name}:1: the header holds a NUL byte (not a text file?)")
    try:
        text = line.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{name}:1: the header is not UTF-8 text (with --no-header, "
                         "columns are given by index)") from None
    if '"' in text:
        import csv

        return first, next(csv.reader([text], delimiter=sep))
    return first, text.split(sep)


def _columns(text: str | None, option: str, names: list[str], header: bool, path: str):
    """Column indices of a comma list of header names or 0-based indices."""
    out = []
    for c in (text.split(",") if text else []):
        if header and names.count(c) > 1:
            at = ", ".join(str(i) for i, n in enumerate(names) if n == c)
            raise ConfigError(f"{option}: column {c!r} is named {names.count(c)} times in the "
                              f"header of {path} (columns {at}): give it by its 0-based "
                              "index", collective=True)
        if header and c in names:
            out.append(names.index(c))
        elif c.isascii() and c.isdigit() and int(c) < len(names):
            out.append(int(c))
        else:
            shown = ", ".join(n if n.isprintable() else repr(n) for n in names)
            known = f"columns: {shown}" if header else f"{len(names)} columns"
            seps = [s for s in ",\t;|" if len(names) == 1 and s in names[0]]
            hint = ("; the first line holds a CR: only LF and CRLF end a line (CR line ends: "
                    "convert them first, e.g. tr '\\r' '\\n')"
                    if any("\r" in n for n in names) else
                    f"; one column: is --sep right? the first line holds {seps[0]!r}"
                    if seps else "")
            raise ConfigError(f"{option}: no column {c!r} in {path} ({known}{hint})",
                              collective=True)
    return out


def _ended_by_signals(func):
    """``func(args)`` ended by signals (``stopping``), each recorded for the dataset writers
    too (``data.stop_writing``): they raise it again before they write or publish more."""
    def record(sig):
        from ..data import stop_writing  # (NumPy, h5py: loaded when a command runs)

        stop_writing(sig)
    return ended_by_signals(func, record)


def _command(formats, name: str, options, func, help: str, description: str) -> None:
    """Add ``prep <name> IN OUT`` with the options of dataclass ``options`` (and --config)."""
    p = formats.add_parser(name, help=help, description=description + " Every option can "
                           "also come from a TOML file (--config FILE; the command line wins).")
    p.add_argument("input", metavar="IN", nargs="+", help="input tables, read one after the "
                   "other as one table: files (plain text or gzip, told by content) or - for "
                   "standard input")
    p.add_argument("out", metavar="OUT", help="dataset file to write (HDF5)")
    add_arguments(p, options)
    p.set_defaults(func=_ended_by_signals(func))


# The transform, as --help states it (the module docstring and docs/data.md in full).
_SPARSE_RULE = (
    "Categorical value v = the field's bytes exactly as in IN (no trimming; a CR before the "
    "LF ends the line, any other CR is part of v; gzip IN is hashed after decompression). "
    "Hashing (default): id = 0 if v is empty (missing), else 1 + zlib.crc32(v) % (B - 1), "
    f"B = --buckets of the field (default {DEFAULT_BUCKETS}); cardinality B. Vocabulary "
    "(--min-count K): a first pass counts each field's values over all rows; values seen >= "
    "K times get ids 2, 3, ... by decreasing count, ties by increasing bytes; 1 = any other "
    "value, 0 = missing; cardinality 2 + kept values (stored in OUT; --vocabulary FILE: "
    "FILE's stored ids instead, any other value 1). A line with a NUL byte is bad.")
_CRITEO = (
    "Criteo TSV -> dataset file. Each line: 40 tab-separated fields: label (0 or 1), I1..I13 "
    "(decimal integers -?[0-9]{1,18}, missing = 0), C1..C26 (categorical); "
    "--unlabeled: 39, no label (a file to predict). Dense stored as "
    "float32(log1p(max(x, 0))). " + _SPARSE_RULE)
_CSV = (
    "Delimited table (or Parquet, with pyarrow: booleans as 1/0, lists as items joined by"
    " |) -> dataset file; columns by header name or 0-based index; RFC 4180 quoting "
    "(a quoted value is the text between the quotes, \"\" as one \"; --quoting none: "
    "quotes are data), every record as many fields as the first; "
    "--multi-hot COL[:SEP]: a list of items (split at SEP, default |), each encoded as a "
    "value of its own field. Label: a number, 0 or 1, or with --label-threshold T: 1 if "
    ">= T else 0 (--unlabeled: none, a file to predict). Dense: a finite number (Python "
    "float syntax), missing = 0, stored as "
    "float32(log1p(max(x, 0))) (--dense-transform none: float32(x)). "
    + _SPARSE_RULE)


def add_prep_commands(sub) -> None:
    """Register ``prep`` and its subcommands on the CLI's subparsers ``sub``."""
    prep = sub.add_parser("prep", help="build a dataset file (criteo, csv, synthetic)",
                          description="Build a dataset file (HDF5; the format, the transform "
                          "and the errors: docs/data.md).")
    formats = prep.add_subparsers(dest="format", metavar="<format>",
                                  parser_class=ArgumentParser)
    formats.required = True
    _command(formats, "criteo", TableOptions, cmd_criteo, "Criteo TSV: label, I1..I13, C1..C26",
             _CRITEO)
    _command(formats, "csv", CsvOptions, cmd_csv, "any delimited table: label, dense and "
             "sparse columns", _CSV)
    p = formats.add_parser("synthetic", help="the built-in synthetic CTR stream as a file, "
                           "with the planted model's AUC", description="Synthetic Criteo-like "
                           "dataset (pshybrid/synthetic.py) -> dataset file; each file stores "
                           "the planted model's own AUC on its rows as attribute planted_auc "
                           "(the quality ceiling). Every option can also come from a TOML "
                           "file (--config FILE; the command line wins).")
    p.add_argument("out", metavar="OUT", help="dataset file to write (HDF5)")
    add_arguments(p, SyntheticOptions)
    p.set_defaults(func=_ended_by_signals(cmd_synthetic))
