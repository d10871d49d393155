"""``prep``'s inputs and outputs beyond one file: several inputs == their concatenation,
standard input == the file, quoted CSV == Python's ``csv`` module, multi-hot columns ==
the documented split and hash written out here, every ``--compression`` == the same
arrays."""

import csv
import gzip
import io
import random
import subprocess
import sys
import zlib

import h5py
import numpy as np
import pytest
from test_prep import CRITEO, RATINGS

from pshybrid.cli import main
from pshybrid.errors import ConfigError, InputError
from pshybrid.prep import convert
from pshybrid.prep import read as prep_read


def run(*argv) -> int:
    return main(["prep", *map(str, argv)])


def content(path) -> dict:
    """Every dataset (by name) and the attributes but ``source``, of a dataset file."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
        out.update({f"@{k}": np.asarray(v).tolist() for k, v in f.attrs.items()
                    if k != "source"})
    return out


def assert_same(a, b):
    ca, cb = content(a), content(b)
    assert sorted(ca) == sorted(cb)
    for k in ca:
        assert np.array_equal(ca[k], cb[k]), k


ENCODINGS = {"hashing": ["--buckets", "97"],
             "vocabulary+split": ["--min-count", "2", "--valid-fraction", "0.25"]}


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_several_criteo_inputs_equal_the_concatenated_file(tmp_path, encoding):
    lines = CRITEO.encode().splitlines(keepends=True)
    parts = [b"".join(lines[:7]), b"".join(lines[7:8]), b"".join(lines[8:])]
    names = []
    for i, part in enumerate(parts):
        p = tmp_path / f"part{i}" if i != 1 else tmp_path / "part1.gz"
        p.write_bytes(gzip.compress(part) if i == 1 else part)
        names.append(p)
    (tmp_path / "all").write_bytes(b"".join(parts))
    opts = ENCODINGS[encoding]
    assert run("criteo", *names, tmp_path / "several.h5", *opts) == 0
    assert run("criteo", tmp_path / "all", tmp_path / "one.h5", *opts) == 0
    assert_same(tmp_path / "several.h5", tmp_path / "one.h5")
    if "--valid-fraction" in opts:
        assert_same(tmp_path / "several.valid.h5", tmp_path / "one.valid.h5")


def test_several_csv_inputs_repeat_the_header(tmp_path):
    head, *rows = RATINGS.splitlines(keepends=True)
    (tmp_path / "a.csv").write_text(head + "".join(rows[:3]))
    (tmp_path / "b.csv").write_text(head + "".join(rows[3:]))
    (tmp_path / "all.csv").write_text(RATINGS)
    opts = ["--label", "rating", "--label-threshold", "4", "--sparse", "user,item",
            "--min-count", "1"]
    assert run("csv", tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "two.h5", *opts) == 0
    assert run("csv", tmp_path / "all.csv", tmp_path / "one.h5", *opts) == 0
    assert_same(tmp_path / "two.h5", tmp_path / "one.h5")
    (tmp_path / "c.csv").write_text("other," + head + "".join(rows[3:]))
    with pytest.raises(InputError, match="c.csv:1: the header differs from the first "):
        run("csv", tmp_path / "a.csv", tmp_path / "c.csv", tmp_path / "bad.h5", *opts)
    assert not (tmp_path / "bad.h5").exists()


def _second_input(case: str, d) -> str:
    """A bad second input named ``case`` made in ``d``: its name."""
    if case == "missing":
        return str(d / "nope.tsv")
    if case == "directory":
        (d / "sub").mkdir()
        return str(d / "sub")
    if case == "io-error":                   # (opens, then its first read fails: EIO)
        return "/proc/self/mem"
    if case == "gzip":
        (d / "bad.gz").write_bytes(b"\x1f\x8b" + bytes(range(256)))
        return str(d / "bad.gz")
    if case == "parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.table({"user": ["u1"], "rating": [5]}), d / "t.parquet")
        return str(d / "t.parquet")
    (d / "other.csv").write_text("other," + RATINGS)              # case "header"
    return str(d / "other.csv")


@pytest.mark.parametrize("command, case", [
    ("criteo", "missing"), ("criteo", "directory"), ("criteo", "io-error"),
    ("criteo", "gzip"), ("criteo", "parquet"), ("csv", "header"), ("csv", "parquet")])
def test_a_bad_later_input_fails_before_the_first_is_read(tmp_path, monkeypatch, command,
                                                          case):
    """Every input is opened (and a csv header compared) before the first pass: a bad
    second input fails with the reader's own message before a row of the first is parsed
    (before, after the whole first input: hours on a large dataset), and nothing is left.
    Oracles: the row parser is never called; the message equals the reader's, taken from
    the same run with the early check skipped."""
    first = tmp_path / "first"
    first.write_text(CRITEO if command == "criteo" else RATINGS)
    argv = [command, first, _second_input(case, tmp_path), tmp_path / "out.h5"]
    if command == "csv":
        argv += ["--label", "rating", "--label-threshold", "4", "--sparse", "user"]
    made = set(tmp_path.iterdir())
    parsed = []
    real = prep_read.parse
    monkeypatch.setattr(prep_read, "parse", lambda t, data: parsed.append(1) or real(t, data))
    with pytest.raises(InputError) as early:
        run(*argv)
    assert parsed == [] and set(tmp_path.iterdir()) == made
    monkeypatch.setattr(convert, "check_inputs", lambda t: None)   # the reader alone
    with pytest.raises(InputError) as late:
        run(*argv)
    assert parsed and str(early.value) == str(late.value), (early.value, late.value)
    assert set(tmp_path.iterdir()) == made


@pytest.mark.parametrize("command,gz,opts,name", [
    ("criteo", False, ["--buckets", "50"], "-"),                 # one pass: streamed
    ("criteo", True, ["--buckets", "50"], "-"),
    ("criteo", True, ["--min-count", "2", "--valid-fraction", "0.2"], "-"),  # two: spooled
    ("criteo", True, ["--min-count", "2"], "/dev/stdin"),        # the pipe by its name
    ("csv", False, ["--label", "rating", "--label-threshold", "4", "--sparse", "item,city",
                    "--dense", "age"], "-"),
    ("csv", True, ["--label", "rating", "--label-threshold", "4", "--sparse", "item,city",
                   "--dense", "age", "--min-count", "2"], "-")])  # two passes: spooled
def test_stdin_equals_the_file(tmp_path, gz, command, opts, name):
    text = (CRITEO if command == "criteo" else RATINGS).encode()
    data = gzip.compress(text) if gz else text
    (tmp_path / "in").write_bytes(data)
    assert run(command, tmp_path / "in", tmp_path / "file.h5", *opts) == 0
    # A pipe: no seek can give back the two bytes read to tell gzip from text.
    got = subprocess.run([sys.executable, "-m", "pshybrid", "prep", command, name,
                          str(tmp_path / "pipe.h5"), *opts], input=data, capture_output=True,
                         timeout=60, check=False)
    assert got.returncode == 0, got.stderr.decode()
    assert_same(tmp_path / "pipe.h5", tmp_path / "file.h5")
    if "--valid-fraction" in opts:
        assert_same(tmp_path / "pipe.valid.h5", tmp_path / "file.valid.h5")


def _many_rows(n: int) -> str:
    rng = random.Random(0)
    return "y,x,c\n" + "".join(f"{rng.randint(0, 1)},{rng.random():.4f},k{rng.randint(0, 999)}\n"
                                for _ in range(n))


@pytest.mark.parametrize("gz", [False, True], ids=["text", "gzip"])
@pytest.mark.parametrize("rows,keep", [(None, None), (400_000, 3 << 19)],
                         ids=["small", "past-the-kept-bytes"])
def test_a_csv_read_once_from_stdin_is_not_copied(tmp_path, monkeypatch, gz, rows, keep):
    """``prep csv -`` in one pass keeps only the bytes its header's read took, to read them
    again (it copied all of standard input to TMPDIR first: a node's small /tmp ran out);
    the same file as from the path. Past ``KEEP`` bytes (the rows' pass) they are let go."""
    from pshybrid.prep import inputs

    if keep:
        monkeypatch.setattr(inputs._Replay, "KEEP", keep)
    text = (RATINGS if rows is None else _many_rows(rows)).encode()
    data = gzip.compress(text) if gz else text
    assert rows is None or len(data) > keep  # (the header's read took 1 MiB at most)
    opts = (["--label", "rating", "--label-threshold", "4", "--sparse", "item,city", "--dense",
             "age"] if rows is None else ["--label", "y", "--dense", "x", "--sparse", "c"])
    (tmp_path / "in").write_bytes(data)
    assert run("csv", tmp_path / "in", tmp_path / "file.h5", *opts) == 0

    made = inputs.tempfile.TemporaryFile

    def copied(*args, **kwargs):
        if "dir" in kwargs:  # (the output directory's probe)
            return made(*args, **kwargs)
        raise AssertionError("standard input was copied to a temporary file")

    monkeypatch.setattr(inputs.tempfile, "TemporaryFile", copied)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert run("csv", "-", tmp_path / "pipe.h5", *opts) == 0
    assert_same(tmp_path / "pipe.h5", tmp_path / "file.h5")


def hashed(value: bytes, buckets: int) -> int:
    return 0 if value == b"" else 1 + zlib.crc32(value) % (buckets - 1)


@pytest.mark.parametrize("block", [1 << 20, 256], ids=["one-block", "256-byte-blocks"])
def test_quoted_csv_equals_the_csv_module(tmp_path, monkeypatch, block):
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", block)
    rng = np.random.default_rng(3)
    alphabet = list('ab,"\n xé|;')
    rows = [[str(rng.integers(0, 2)), f"{rng.random() * 9:.3f}"]
            + ["".join(rng.choice(alphabet, rng.integers(0, 9))) for _ in range(3)]
            for _ in range(200)]
    buf = io.StringIO(newline="")
    w = csv.writer(buf, quoting=csv.QUOTE_MINIMAL)   # CRLF line ends
    w.writerow(["y", "x", "a", "b", "c"])
    for i, r in enumerate(rows):
        (csv.writer(buf, quoting=csv.QUOTE_ALL) if i % 7 == 0 else w).writerow(r)
    (tmp_path / "in.csv").write_bytes(buf.getvalue().encode())
    assert run("csv", tmp_path / "in.csv", tmp_path / "out.h5", "--label", "y", "--dense",
               "x", "--sparse", "a,b,c", "--buckets", "1009", "--dense-transform", "none") == 0
    with open(tmp_path / "in.csv", newline="", encoding="utf-8") as f:
        want = list(csv.reader(f))[1:]                 # the oracle
    assert want == rows
    got = content(tmp_path / "out.h5")
    assert got["label"].tolist() == [float(r[0]) for r in want]
    assert got["dense"][:, 0].tolist() == [float(np.float32(r[1])) for r in want]
    assert got["sparse"].tolist() == [[hashed(v.encode(), 1009) for v in r[2:]] for r in want]


@pytest.mark.parametrize("block", [1 << 20, 64], ids=["one-block", "64-byte-blocks"])
def test_a_quote_inside_an_unquoted_value_is_a_character_of_it(tmp_path, monkeypatch,
                                                               block):
    """As the csv module reads it (``5" screen``, ``x""``): every row kept, each value ==
    the module's, quoted values with LFs and ``""`` around them. Before, such a quote opened
    a quoted value: the lines after it, up to the next odd quote, were one bad record."""
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", block)
    lines = ["y,a,b"] + [f'{i % 2},{v},"q{i}\n""x"""' if i % 5 == 0 else f"{i % 2},{v},w{i}"
                         for i, v in enumerate(['5" screen', 'x""', 'a"b"c', "plain",
                                                'x"', '9"" tv'] * 4)]
    (tmp_path / "in.csv").write_bytes(("\n".join(lines) + "\n").encode())
    assert run("csv", tmp_path / "in.csv", tmp_path / "out.h5", "--label", "y",
               "--sparse", "a,b", "--buckets", "1009") == 0
    with open(tmp_path / "in.csv", newline="", encoding="utf-8") as f:
        want = list(csv.reader(f, strict=True))[1:]       # the oracle
    assert len(want) == len(lines) - 1 and want[0][1] == '5" screen'
    got = content(tmp_path / "out.h5")
    assert got["label"].tolist() == [float(r[0]) for r in want]
    assert got["sparse"].tolist() == [[hashed(v.encode(), 1009) for v in r[1:]] for r in want]


@pytest.mark.parametrize("other_quotes", [False, True], ids=["no-other-quote", "quoted-rows"])
def test_a_quote_never_closed_costs_its_own_line_in_a_small_input(tmp_path, other_quotes,
                                                                  capsys):
    """A value that opens a quote and never closes it (in an input smaller than a line
    may be, so the input's end comes first), or closes where no record can be read (at a
    later row's quoted value): its line is the bad one, named by its number, and every
    other row is kept (== the csv module on the input without that line). Before, the
    lines from it to the input's end, or to that later quote, were one bad record."""
    body = [f'{i % 2},{chr(97 + i % 7)},' + ('"r, s"' if other_quotes and i % 3 == 0 else "t")
            for i in range(40)]
    body[9] = '1,"oops,t'
    src = tmp_path / "in.csv"
    src.write_text("y,a,b\n" + "\n".join(body) + "\n")
    argv = ["--label", "y", "--sparse", "a,b", "--buckets", "1009"]
    with pytest.raises(InputError, match="in.csv:11: bad quoting: a double quote never closed"):
        run("csv", src, tmp_path / "out.h5", *argv)
    capsys.readouterr()
    assert run("csv", src, tmp_path / "out.h5", *argv, "--skip-bad-lines") == 0
    out = capsys.readouterr().out
    assert "39 rows -> " in out and "; 1 bad lines skipped;" in out
    want = list(csv.reader(body[:9] + body[10:], strict=True))
    got = content(tmp_path / "out.h5")
    assert got["label"].tolist() == [float(r[0]) for r in want]
    assert got["sparse"].tolist() == [[hashed(v.encode(), 1009) for v in r[1:]] for r in want]


def _quoted_field(rng) -> tuple[str, str]:
    """(as written, the value): a random value of quotes, separators, LFs, spaces, letters,
    written raw where the csv module reads it back raw (a quote inside it, not first: a
    character of it), else quoted with its quotes doubled."""
    value = "".join(rng.choice('ab,"\n x;') for _ in range(rng.randrange(0, 7)))
    if value and value[0] != '"' and not set(value) & set(",\n") and rng.random() < 0.6:
        return value, value
    return '"' + value.replace('"', '""') + '"', value


@pytest.mark.parametrize("seed", range(12))
def test_random_quoting_splits_as_the_csv_module(tmp_path, monkeypatch, seed):
    """Random files of raw values with quotes inside and quoted values with quotes,
    separators and LFs, read in blocks of 16 and 64 bytes and in one: every row, each value
    == the csv module's (the oracle, strict), hashed as documented."""
    rng = random.Random(seed)
    rows, lines = [], ["y,a,b,c"]
    for i in range(rng.randrange(1, 60)):
        cells = [_quoted_field(rng) for _ in range(3)]
        rows.append([str(i % 2)] + [c[1] for c in cells])
        lines.append(",".join([str(i % 2)] + [c[0] for c in cells]))
    text = "\n".join(lines) + ("\n" if seed % 3 else "")
    (tmp_path / "in.csv").write_bytes(text.encode())
    want = list(csv.reader(io.StringIO(text, newline=""), strict=True))[1:]
    assert want == rows
    for block in (16, 64, 1 << 20):
        monkeypatch.setattr(prep_read, "BLOCK_BYTES", block)
        assert run("csv", tmp_path / "in.csv", tmp_path / f"{block}.h5", "--label", "y",
                   "--sparse", "a,b,c", "--buckets", "1009") == 0
        got = content(tmp_path / f"{block}.h5")
        assert got["label"].tolist() == [float(r[0]) for r in want]
        assert got["sparse"].tolist() == [[hashed(v.encode(), 1009) for v in r[1:]]
                                          for r in want], block


def test_bad_quoting_names_the_line(tmp_path):
    (tmp_path / "in.csv").write_text('y,a\n1,"x"\n0,"ab"c\n')
    with pytest.raises(InputError, match="in.csv:3: bad quoting"):
        run("csv", tmp_path / "in.csv", tmp_path / "out.h5", "--label", "y", "--sparse", "a")
    assert run("csv", tmp_path / "in.csv", tmp_path / "out.h5", "--label", "y",
               "--sparse", "a", "--quoting", "none", "--buckets", "5") == 0


def bag_oracle(value: bytes, sep: bytes, encode) -> list[int]:
    """The documented multi-hot rule: split at SEP, drop empty items, none left: [0]."""
    items = [v for v in value.split(sep) if v]
    return [encode(v) for v in items] or [0]


@pytest.mark.parametrize("tag_sep", [";", ":"])  # tags:; and tags:: (a colon)
@pytest.mark.parametrize("block", [1 << 20, 128], ids=["one-block", "128-byte-blocks"])
def test_multi_hot_columns_are_values_and_offsets(tmp_path, monkeypatch, block, tag_sep):
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", block)
    rng = np.random.default_rng(5)
    genres = ["Action", "Crime", "Drama", "", "Sci-Fi"]
    rows = [(int(rng.integers(0, 2)), "|".join(rng.choice(genres, rng.integers(0, 4))),
             tag_sep.join(rng.choice(["t1", "t2", "t3", ""], rng.integers(0, 3))),
             f"u{rng.integers(0, 9)}") for _ in range(150)]
    text = "y,genres,tags,user\n" + "".join(f"{y},{g},{t},{u}\n" for y, g, t, u in rows)
    (tmp_path / "in.csv").write_text(text)
    assert run("csv", tmp_path / "in.csv", tmp_path / "out.h5", "--label", "y", "--sparse",
               "user", "--multi-hot", "genres", "--multi-hot", f"tags:{tag_sep}",
               "--buckets", "31,17,13", "--valid-fraction", "0.2") == 0
    n_train = 150 - round(0.2 * 150)
    for path, part in (("out.h5", rows[:n_train]), ("out.valid.h5", rows[n_train:])):
        got = content(tmp_path / path)
        assert got["@field_names"] == ["user", "genres", "tags"]
        assert got["@multi_hot"] == ["genres", "tags"]
        assert got["@cardinalities"] == [31, 17, 13]
        assert got["sparse"][:, 0].tolist() == [hashed(u.encode(), 31) for *_, u in part]
        for col, sep, b in ((1, b"|", 17), (2, tag_sep.encode(), 13)):
            name = ["genres", "tags"][col - 1]
            bags = [bag_oracle(r[col].encode(), sep, lambda v, b=b: hashed(v, b)) for r in part]
            assert got[f"multi_hot/{name}/values"].tolist() == [i for x in bags for i in x]
            assert got[f"multi_hot/{name}/offsets"].tolist() == \
                np.concatenate(([0], np.cumsum([len(x) for x in bags]))).tolist()


def test_multi_hot_vocabulary_counts_items(tmp_path):
    (tmp_path / "in.csv").write_text("y,g\n1,a|b\n0,b\n1,b|c|a\n0,\n1,c|d\n")
    assert run("csv", tmp_path / "in.csv", tmp_path / "out.h5", "--label", "y",
               "--multi-hot", "g", "--min-count", "2") == 0
    got = content(tmp_path / "out.h5")
    # counts: b 3, a 2, c 2, d 1 -> b 2, a 3, c 4 (ties by bytes), d rare 1; missing 0
    assert got["multi_hot/g/values"].tolist() == [3, 2, 2, 2, 4, 3, 0, 4, 1]
    assert got["multi_hot/g/offsets"].tolist() == [0, 2, 3, 6, 7, 9]
    assert got["@cardinalities"] == [5]


@pytest.mark.parametrize("compression", ["lzf", "gzip", "none"])
def test_every_compression_holds_the_same_arrays(tmp_path, compression):
    src = tmp_path / "in"
    src.write_text(CRITEO)
    assert run("criteo", src, tmp_path / "ref.h5", "--buckets", "101",
               "--compression", "none") == 0
    assert run("criteo", src, tmp_path / "out.h5", "--buckets", "101",
               "--compression", compression) == 0
    assert_same(tmp_path / "out.h5", tmp_path / "ref.h5")
    with h5py.File(tmp_path / "out.h5", "r") as f:
        assert f["sparse"].compression == (None if compression == "none" else compression)


def test_parquet_equals_the_same_table_as_csv(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from pshybrid.prep import parquet

    monkeypatch.setattr(parquet, "BATCH", 7)               # several batches, one header
    rng = np.random.default_rng(2)
    n = 40
    cols = {"y": rng.integers(0, 2, n).tolist(),
            "x": [None if i % 5 == 0 else float(v) for i, v in enumerate(rng.random(n))],
            "title": [None if i % 6 == 0 else f'M{v}, "The"' if i % 3 == 0 else f"M{v}"
                      for i, v in enumerate(rng.integers(0, 9, n))],
            "genres": ["|".join(rng.choice(["A", "B", "C"], rng.integers(0, 3)))
                       for _ in range(n)],
            "user": rng.integers(0, 50, n).tolist()}
    pq.write_table(pa.table(cols), tmp_path / "t.parquet", row_group_size=16)
    with open(tmp_path / "t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows([["" if v is None else v for v in row] for row in zip(*cols.values())])
    opts = ["--label", "y", "--dense", "x", "--sparse", "title,user", "--multi-hot", "genres",
            "--buckets", "101"]
    assert run("csv", tmp_path / "t.parquet", tmp_path / "p.h5", *opts) == 0
    assert run("csv", tmp_path / "t.csv", tmp_path / "c.h5", *opts) == 0
    assert_same(tmp_path / "p.h5", tmp_path / "c.h5")
    # a CSV and a Parquet input of the same columns are one table: their headers are the
    # same line (pyarrow's quoted every name, so the Parquet input's "header differed")
    text = (tmp_path / "t.csv").read_text()
    (tmp_path / "twice.csv").write_text(text + text.split("\n", 1)[1])
    assert run("csv", tmp_path / "t.csv", tmp_path / "t.parquet", tmp_path / "m.h5", *opts) == 0
    assert run("csv", tmp_path / "twice.csv", tmp_path / "cc.h5", *opts) == 0
    assert_same(tmp_path / "m.h5", tmp_path / "cc.h5")


def test_parquet_is_read_a_row_group_at_a_time(tmp_path, monkeypatch):
    """A Parquet file of 40 row groups is read holding about one row group beyond what its
    CSV twin's prep holds, and gives the twin's file. Oracle: tracemalloc's peak over each
    prep (Python's and NumPy's allocations: the column chunks pyarrow reads through a Python
    file object are Python bytes, which Arrow's memory pool does not count). pyarrow's
    default pre_buffer read every row group's chunks ahead and held them to the end: the
    peak grew with the file (here ~10 MB over the twin's, against a bound of 3 row groups
    uncompressed, ~1 MB)."""
    import tracemalloc

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pcsv = pytest.importorskip("pyarrow.csv")
    from pshybrid.prep import parquet

    monkeypatch.setattr(parquet, "BATCH", 1000)     # a batch within one row group
    rng = np.random.default_rng(5)
    n = 200_000
    table = pa.table({"y": rng.integers(0, 2, n), "x": rng.random(n),
                      **{f"c{i}": pa.array(rng.integers(0, 2 ** 32, n)).cast(pa.string())
                         for i in range(4)}})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=n // 40)
    pcsv.write_csv(table, tmp_path / "t.csv", pcsv.WriteOptions(quoting_style="none",
                                                                 quoting_header="none"))
    meta = pq.ParquetFile(tmp_path / "t.parquet").metadata
    group = max(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    opts = ["--label", "y", "--dense", "x", "--sparse", "c0,c1,c2,c3", "--buckets", "1000"]
    peaks = {}
    for name in ("t.csv", "t.parquet"):
        tracemalloc.start()
        try:
            assert run("csv", tmp_path / name, tmp_path / f"{name}.h5", *opts) == 0
            peaks[name] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks["t.parquet"] - peaks["t.csv"] < 3 * group, (peaks, group)
    assert_same(tmp_path / "t.parquet.h5", tmp_path / "t.csv.h5")


def test_a_parquet_header_is_quoted_as_a_csv_writer_quotes_it(tmp_path):
    """Column names that need quotes (a comma, a double quote) are quoted as a CSV input's
    are (Python's csv module, pandas: only those names), so that the two inputs still mix:
    pyarrow's 'needed' header quoting quotes every name once one needs it."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    cols = {"y": [1, 0, 1, 1], "a,b": ["p", "q", "p", "r,s"], 'c"d': ["u", "v", "w", "u"],
            "é": ["x", "x", "z", "y"]}
    pq.write_table(pa.table(cols), tmp_path / "t.parquet")
    rows = list(zip(*cols.values()))
    for name, part in (("t.csv", rows), ("twice.csv", rows + rows)):
        with open(tmp_path / name, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([list(cols), *part])
    opts = ["--label", "y", "--sparse", "1,2,3", "--min-count", "1"]
    assert run("csv", tmp_path / "t.csv", tmp_path / "t.parquet", tmp_path / "m.h5", *opts) == 0
    assert run("csv", tmp_path / "twice.csv", tmp_path / "cc.h5", *opts) == 0
    assert_same(tmp_path / "m.h5", tmp_path / "cc.h5")


def test_parquet_booleans_and_lists_equal_their_text(tmp_path, monkeypatch):
    """A boolean reads as 1/0 and a list as its items joined by '|' (a null item empty):
    the same dataset as the CSV holding that text; a struct column nobody selects is no
    obstacle."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from pshybrid.prep import parquet

    monkeypatch.setattr(parquet, "BATCH", 5)
    rng = np.random.default_rng(3)
    n = 23
    clicked = [bool(v) for v in rng.integers(0, 2, n)]
    tags = [None if i % 7 == 0 else [f"t{v}" for v in rng.integers(0, 5, i % 4)]
            for i in range(n)]
    tags[3] = ["a", None, "b"]
    codes = [[int(v) for v in rng.integers(0, 9, 2)] for _ in range(n)]
    pq.write_table(pa.table({"clicked": clicked, "tags": tags, "codes": codes,
                             "meta": [{"a|b": i} for i in range(n)],
                             "notes": [["x|y"]] * n}), tmp_path / "t.parquet")
    with open(tmp_path / "t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["clicked", "tags", "codes"])
        w.writerows([[int(c), "" if t is None else "|".join(v or "" for v in t),
                      "|".join(map(str, k))] for c, t, k in zip(clicked, tags, codes)])
    opts = ["--label", "clicked", "--multi-hot", "tags,codes", "--buckets", "31"]
    assert run("csv", tmp_path / "t.parquet", tmp_path / "p.h5", *opts) == 0
    assert run("csv", tmp_path / "t.csv", tmp_path / "c.h5", *opts) == 0
    assert_same(tmp_path / "p.h5", tmp_path / "c.h5")


@pytest.mark.parametrize("opts, error, message", [
    (["--sparse", "tags"], ConfigError,
     r"t.parquet: --sparse tags: a Parquet list column .*--multi-hot"),
    (["--multi-hot", "tags:;"], ConfigError,
     r"--multi-hot tags:;: a Parquet list column .*no separator"),
    (["--multi-hot", "meta"], ConfigError, r"--multi-hot meta: a Parquet column of a nested"),
    (["--dense", "meta"], ConfigError, r"--dense meta: a Parquet column of a nested type"),
    (["--multi-hot", "notes"], InputError,
     r"t.parquet:4: column 'notes': the list item 'x\|y' holds"),
    (["--sparse", "tags", "--no-header"], ConfigError,
     r"--no-header: a Parquet input's column names")])
def test_parquet_columns_it_cannot_read_are_refused(tmp_path, opts, error, message):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"y": [1, 0, 1], "tags": [["a"], [], ["b", "c"]],
                             "meta": [{"k": 1}, None, {"k": 2}],
                             "notes": [["p"], ["q"], ["x|y"]]}), tmp_path / "t.parquet")
    with pytest.raises(error, match=message):
        run("csv", tmp_path / "t.parquet", tmp_path / "out.h5", "--label", "y", *opts)
    assert not (tmp_path / "out.h5").exists()


def test_prep_criteo_refuses_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"y": [1, 0]}), tmp_path / "t.parquet")
    with pytest.raises(InputError, match=r"t.parquet: a Parquet file: prep criteo reads"):
        run("criteo", tmp_path / "t.parquet", tmp_path / "out.h5")
    r = subprocess.run([sys.executable, "-m", "pshybrid", "prep", "criteo", "-",
                        str(tmp_path / "out.h5")], stdin=open(tmp_path / "t.parquet", "rb"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "<stdin>: a Parquet file: prep criteo" in r.stderr
    assert not (tmp_path / "out.h5").exists()
