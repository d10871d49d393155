"""``python -m pshybrid prep criteo IN... OUT`` · ``prep csv IN... OUT``: text tables → dataset
file.

One process, no MPI. Each IN is a regular file or ``-`` (standard input, copied to an
unnamed temporary file where it must be read twice), plain text or gzip (told by its first
bytes, read and handed back without a seek; ``prep csv`` also reads Parquet with pyarrow,
as the CSV text pyarrow writes for it, booleans as 1/0 and lists joined by ``|``:
``prep.parquet``); the inputs are read one after the other as one table, read twice where
a first pass is needed (see rows). It is streamed in blocks of whole lines of about
``read.BLOCK_BYTES``, each parsed with NumPy at once, so memory stays bounded whatever
the input size (a ``--min-count`` vocabulary grows with the number of distinct values). Rows
are written with ``DatasetWriter``: published atomically at the end, removed on any error, so
a failed run (a bad option, a bad IN, a full disk, SIGTERM) leaves no OUT, valid or temporary
file and an existing OUT unchanged; it ends with one line ``pshybrid: error: ...`` and exit
status 2.

Lines. ``criteo``: 40 tab-separated fields: label, I1..I13 (integers), C1..C26 (categorical,
hexadecimal in Criteo's files, taken as raw strings). ``csv``: ``--sep``-separated, RFC 4180
quoting (``prep.quoted``; ``--quoting none``: quotes are data); every record has as many
fields as the first (the header, UTF-8, with ``--header``: the same in every input);
``--multi-hot COL[:SEP]`` columns are lists of items (``prep.multihot``). Lines end in
LF or CRLF, the last may lack one: a CR right before the LF is dropped, any other CR is data.
An empty field is missing. A bad line stops the run with an ``InputError`` naming IN and the
1-based line number, or with ``--skip-bad-lines`` is skipped and counted: a wrong number of
fields, a bad label, a bad dense value, a NUL byte, a line over ``read.MAX_LINE_BYTES``.

Transform, the same for both commands:

- label: criteo ``0`` or ``1``; csv a number (Python ``float`` syntax, finite) that is 0 or
  1, or with ``--label-threshold T`` any number: 1 if value >= T else 0. Stored float32.
  ``--unlabeled``: none (criteo: 39 fields; csv: no ``--label``); /label 0 and attribute
  ``unlabeled = 1`` (``files.open_dataset`` refuses the file but for ``predict``).
- dense: criteo a decimal integer ``-?[0-9]{1,18}``; csv a finite number (Python ``float``
  syntax); missing → x = 0. Stored ``float32(log1p(max(x, 0)))`` computed in float64
  (csv ``--dense-transform none``: ``float32(x)``, |x| at most float32's largest).
- sparse, field f, value v = the field's raw bytes as in IN (after gunzip; no trimming, no
  decoding; a NUL byte makes the line bad):
  hashing (default): id = 0 if v is missing, else ``1 + zlib.crc32(v) % (buckets_f - 1)``;
  cardinality_f = buckets_f (``--buckets N``: the same N for every field, or one per field).
  vocabulary (``--min-count K``): a first pass counts each field's non-empty values over all
  rows read (the validation part included); values seen >= K times get ids 2, 3, ... by
  decreasing count, ties by increasing bytes; id 0 = missing, id 1 = every other value;
  cardinality_f = 2 + the number of kept values; each file written stores the kept values
  (``/vocabulary/<field>``: ``prep.vocabulary``). ``--vocabulary FILE``: FILE's stored
  values and ids instead (any other value 1), FILE's cardinalities, no counting pass.
- rows: the good lines in file order, at most ``--max-rows``. With ``--valid-fraction F`` the
  last ``round(F * rows)`` (Python round, half to even; neither part may be empty) go to
  ``--valid-out``, the rest to OUT; both files get the same field names and cardinalities.
  The row count comes from a first pass that parses IN (the vocabulary's counting pass, or
  one of its own when hashing), then a second pass writes.
"""

from .commands import add_prep_commands
from .options import CsvOptions, SplitOptions, SyntheticOptions, TableOptions

__all__ = ["add_prep_commands", "CsvOptions", "SplitOptions", "SyntheticOptions", "TableOptions"]
