"""Parquet inputs of ``prep csv`` (optional: pyarrow). A Parquet file is read as the CSV text
pyarrow writes for it (a header of the column names as Python's ``csv`` writes it, then the
rows, comma-separated, a value quoted only where it must be, null = empty), after three
changes per column:

- a boolean is written 1 / 0 (so it can be a label or a dense feature);
- a list of scalars is written as its items joined by ``|`` (a null item as an empty one),
  so ``--multi-hot COL`` (whose default separator is ``|``) reads it item by item; where it
  is selected, an item that holds ``|`` is refused, naming its line (``check_columns``);
- a column of another nested type (struct, map, a list of lists) is written empty; such a
  column is refused where an option selects it (``check_columns``)."""

from __future__ import annotations

import csv
import io

from ..errors import ConfigError, InputError

MAGIC = b"PAR1"
BATCH = 65536          # rows converted at a time
LIST_SEP = "|"         # the items of a list column, as text


def _pyarrow(name: str):
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.csv
        import pyarrow.parquet
    except ImportError:
        raise InputError(f"{name}: a Parquet file; reading it needs pyarrow (pip install "
                         "'pshybrid[parquet]')") from None
    return pyarrow


def kind(pa, t) -> str | None:
    """How a column of Arrow type ``t`` is written: ``"bool"``, ``"list"`` (of scalars),
    ``"nested"`` (written empty), or None (as pyarrow writes it)."""
    nested = (pa.types.is_struct, pa.types.is_map, pa.types.is_union, pa.types.is_list,
              pa.types.is_large_list, pa.types.is_fixed_size_list)
    if pa.types.is_boolean(t):
        return "bool"
    if any(f(t) for f in nested[3:]):
        v = t.value_type
        v = v.value_type if pa.types.is_dictionary(v) else v
        return "nested" if any(f(v) for f in nested) else "list"
    return "nested" if any(f(t) for f in nested) else None


def _open(f, name: str):
    """``f`` as a ``ParquetFile``, its row groups read one at a time as batches need them:
    with pyarrow's default ``pre_buffer=True``, ``iter_batches`` reads every row group's
    column chunks ahead and holds them to its end (through a Python file object, as Python
    bytes), so memory grew with the file (612 MB peak RSS for a 212 MB file)."""
    pa = _pyarrow(name)
    try:
        return pa.parquet.ParquetFile(f, pre_buffer=False)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors name no common base
        raise InputError(f"{name}: not a readable Parquet file ({exc})") from None


def check_columns(f, name: str, names: list[str], single: dict[str, list[int]],
                  multi: dict[int, int]) -> None:
    """Refuse, for the Parquet file ``f`` named ``name``: a list or nested column that
    ``single`` (option -> column indices: --label, --dense, --sparse) selects; a nested one in
    ``multi`` (column index -> separator byte), or a list column there with a separator other
    than ``|`` or an item holding ``|`` (naming its line)."""
    import pyarrow as pa

    pf = _open(f, name)
    kinds = {field.name: kind(pa, field.type) for field in pf.schema_arrow}
    what = {"list": "a Parquet list column (its items are read joined by '|')",
            "nested": "a Parquet column of a nested type, which prep does not read"}
    for option, cols in single.items():
        for c in cols:
            if kinds.get(names[c]) in what:
                raise ConfigError(f"{name}: {option} {names[c]}: {what[kinds[names[c]]]}"
                                  + ("; give it to --multi-hot" if kinds[names[c]] == "list"
                                     else ""), collective=True)
    for c, sep in multi.items():
        k = kinds.get(names[c])
        if k == "nested" or (k == "list" and sep != ord(LIST_SEP)):
            given = f"{names[c]}:{chr(sep)}" if k == "list" else names[c]
            raise ConfigError(f"{name}: --multi-hot {given}: {what[k]}"
                              + ("; give --multi-hot with no separator" if k == "list" else
                                 ""), collective=True)
    lists = [names[c] for c in multi if kinds.get(names[c]) == "list"]
    rows = 0
    for batch in (pf.iter_batches(batch_size=BATCH, columns=lists) if lists else ()):
        for col, column in zip(batch.columns, lists):
            _check_items(pa, _as_text(pa, col, f"{name}:", column), f"{name}:", rows, column)
        rows += batch.num_rows


def _as_text(pa, col, where: str, column: str):
    """The list column ``col`` as a list of strings."""
    try:
        return col.cast(pa.list_(pa.string()))
    except Exception as exc:  # noqa: BLE001 - ArrowInvalid (an item is not UTF-8 text)
        raise InputError(f"{where} column {column!r}: cannot read its items as text: "
                         f"{exc}") from None


def _check_items(pa, s, where: str, rows: int, column: str) -> None:
    """Refuse an item of the string lists ``s`` that holds ``|``, naming its line (``rows``
    rows before ``s``)."""
    items = s.flatten()
    bad = pa.compute.match_substring(items, LIST_SEP).fill_null(False)
    if pa.compute.any(bad).as_py():
        i = pa.compute.index(bad, True).as_py()
        row = pa.compute.list_parent_indices(s)[i].as_py()
        raise InputError(f"{where}{rows + row + 2}: column {column!r}: the list item "
                         f"{items[i].as_py()!r} holds {LIST_SEP!r}, which joins the items of "
                         "a list column")


class ParquetText(io.RawIOBase):
    """A Parquet file as the CSV text of the module's docstring, converted BATCH rows at a
    time."""

    def __init__(self, f, name: str):
        self.pa, self.name = _pyarrow(name), name
        self.batches = _open(f, name).iter_batches(batch_size=BATCH)
        self.buf, self.header = b"", True

    def readable(self) -> bool:
        return True

    def _column(self, col, column: str):
        pa = self.pa
        k = kind(pa, col.type)
        if k == "bool":
            return col.cast(pa.int8())
        if k == "nested":
            return pa.nulls(len(col), pa.string())
        if k != "list":
            return col
        s = _as_text(pa, col, f"{self.name}:", column)
        whole = pa.ListArray.from_arrays(s.offsets, s.values.fill_null(""), mask=s.is_null())
        return pa.compute.binary_join(whole, LIST_SEP)   # a null item as an empty one

    def _next(self) -> bytes | None:
        """The next batch's text (the header before the first), None at the end."""
        pa = self.pa
        try:
            batch = next(self.batches)
        except StopIteration:
            return None
        except Exception as exc:  # noqa: BLE001
            raise InputError(f"{self.name}: cannot read: {exc}") from None
        batch = pa.record_batch([self._column(c, n) for c, n in zip(batch.columns,
                                                                     batch.schema.names)],
                                names=batch.schema.names)
        head = self._header(batch) if self.header else b""
        out = io.BytesIO()
        for style in ("none", "needed"):     # unquoted where no value needs quotes
            try:
                opts = pa.csv.WriteOptions(include_header=False, quoting_style=style)
                pa.csv.write_csv(batch, out, opts)
                break
            except Exception as exc:  # noqa: BLE001 - ArrowInvalid (a value needs quotes)
                out, why = io.BytesIO(), exc
        else:
            raise InputError(f"{self.name}: cannot convert to text: {why}")
        self.header = False
        return head + out.getvalue()

    @staticmethod
    def _header(batch) -> bytes:
        """The header line as a CSV input's: each name quoted only where it must be (a comma,
        a double quote, CR or LF: Python's ``csv``, pandas), so the two kinds of input mix
        (pyarrow's ``needed`` quotes every name once one needs quotes, and before
        ``quoting_header``, every name)."""
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerow(batch.schema.names)
        return out.getvalue().encode()

    def readinto(self, b) -> int:
        while not self.buf:
            self.buf = self._next()
            if self.buf is None:
                self.buf = b""
                return 0
        n = min(len(b), len(self.buf))
        b[:n], self.buf = self.buf[:n], self.buf[n:]
        return n
