"""``pshybrid prep criteo|csv``. Oracles: hand-written tables with hand-derived arrays (the
documented transform, hash and vocabulary rules written out here independently), split ==
unsplit, and failed runs leaving the directory exactly as it was."""

import gzip
import math
import os
import re
import subprocess
import sys
import zlib

import h5py
import numpy as np
import pytest

from pshybrid.prep import read as prep_read
from pshybrid.prep import write as prep_write
from pshybrid.prep.block import Block
from pshybrid.prep.hashing import crc32
from pshybrid.cli import main
from pshybrid.data import H5Dataset
from pshybrid.errors import ConfigError, InputError
from pshybrid.files import open_dataset

# Criteo rows, only the columns that hold values: label|I1|I2|I3|I4|I13|C1|C2|C3|C26.
# I5..I12 and C4..C25 are empty (missing) everywhere; see criteo_line.
ROWS = """\
0|1|5||0|3|68fd1e64|80e26c9b|fb936136|
1||-1|12|7||8cf07265|0468d672|02cf9876|b1252a9d
0|0|2|3||10|68fd1e64|80e26c9b|6b3a6b0d|
0|4|-3||2||05db9164|287130e0|fb936136|49d68486
1|2|0|45||1|68fd1e64||c5fe64d9|
0||1|1|1|0|8cf07265|80e26c9b|77f2f2e5|b1252a9d
0|10|100||||be589b51|0468d672|02cf9876|
1|1|0|8|3|4|68fd1e64|80e26c9b|fb936136|b1252a9d
0||6|2||2|05db9164|287130e0|9a8cb066|
0|3|-2||9||8cf07265||74e1a23a|49d68486
1|0|15|7|0|6|68fd1e64|0468d672|fb936136|
0|6|1|||1|05db9164|80e26c9b|1d04f4a4|
0||4|20|5|||287130e0|02cf9876|b1252a9d
1|2|3|0||12|8cf07265|80e26c9b|3e4fa2cc|
0|1|0||1|0|68fd1e64|0468d672|6b3a6b0d|
0|7|-1|5|2||05db9164|80e26c9b|e5ba7672|49d68486
1||2|9||3|8cf07265|287130e0|fb936136|
0|5|8|1|4||68fd1e64|80e26c9b|0b153874|
0|0|1|||5|be589b51||02cf9876|49d68486
1|1234567|0|6|2|2|68fd1e64|0468d672|7e5c2ff4|
"""
LABEL = [0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1]
# I1, I2, I3, I4, I13 as integers, missing = 0 (the documented rule).
X = [[1, 5, 0, 0, 3], [0, -1, 12, 7, 0], [0, 2, 3, 0, 10], [4, -3, 0, 2, 0], [2, 0, 45, 0, 1],
     [0, 1, 1, 1, 0], [10, 100, 0, 0, 0], [1, 0, 8, 3, 4], [0, 6, 2, 0, 2], [3, -2, 0, 9, 0],
     [0, 15, 7, 0, 6], [6, 1, 0, 0, 1], [0, 4, 20, 5, 0], [2, 3, 0, 0, 12], [1, 0, 0, 1, 0],
     [7, -1, 5, 2, 0], [0, 2, 9, 0, 3], [5, 8, 1, 4, 0], [0, 1, 0, 0, 5], [1234567, 0, 6, 2, 2]]
# --min-count 2, ids of C1, C2, C3, C26 derived by hand (C4..C25 are all missing: id 0):
# C1: 68fd1e64 x8 -> 2, 8cf07265 x5 -> 3, 05db9164 x4 -> 4, be589b51 x2 -> 5; card 6.
# C2: 80e26c9b x8 -> 2, 0468d672 x5 -> 3, 287130e0 x4 -> 4; card 5.
# C3: fb936136 x5 -> 2, 02cf9876 x4 -> 3, 6b3a6b0d x2 -> 4, nine values seen once -> 1; card 5.
# C26: 49d68486 x4 and b1252a9d x4 tie, bytes order: 49d68486 -> 2, b1252a9d -> 3; card 4.
VOCAB = [[2, 2, 2, 0], [3, 3, 3, 3], [2, 2, 4, 0], [4, 4, 2, 2], [2, 0, 1, 0], [3, 2, 1, 3],
         [5, 3, 3, 0], [2, 2, 2, 3], [4, 4, 1, 0], [3, 0, 1, 2], [2, 3, 2, 0], [4, 2, 1, 0],
         [0, 4, 3, 3], [3, 2, 1, 0], [2, 3, 4, 0], [4, 2, 1, 2], [3, 4, 2, 0], [2, 2, 1, 0],
         [5, 0, 3, 2], [2, 3, 1, 0]]
VOCAB_CARDS = [6, 5, 5] + [2] * 22 + [4]
NAMES = [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


def criteo_line(short: str) -> str:
    """A 40-field Criteo line from a ROWS line: the empty I5..I12, C4..C25 put back."""
    f = short.split("|")
    return "\t".join(f[:5] + [""] * 8 + f[5:9] + [""] * 22 + f[9:])


CRITEO = "".join(criteo_line(r) + "\n" for r in ROWS.splitlines())


def log1p0(x) -> np.float32:
    """The documented dense transform, written out: float32(log(1 + max(x, 0)))."""
    return np.float32(math.log1p(max(x, 0)))


def expected_dense() -> np.ndarray:
    dense = np.zeros((20, 13), np.float32)
    dense[:, [0, 1, 2, 3, 12]] = [[log1p0(x) for x in row] for row in X]
    return dense


def hashed(value: str, buckets: int) -> int:
    """The documented hash, written out: 0 if missing else 1 + crc32(bytes) % (buckets - 1)."""
    return 0 if value == "" else 1 + zlib.crc32(value.encode()) % (buckets - 1)


def expected_hashed(buckets: list[int]) -> np.ndarray:
    cats = [line.split("\t")[14:] for line in CRITEO.splitlines()]
    return np.array([[hashed(v, b) for v, b in zip(row, buckets)] for row in cats], np.int64)


def expected_vocab() -> np.ndarray:
    sparse = np.zeros((20, 26), np.int64)
    sparse[:, [0, 1, 2, 25]] = VOCAB
    return sparse


def read(path):
    """(label, dense, sparse, attrs) of a dataset file, read with plain h5py."""
    with h5py.File(path, "r") as f:
        assert f["label"].dtype == np.float32 and f["dense"].dtype == np.float32
        assert f["sparse"].dtype == np.int64
        attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in f.attrs.items()}
        assert attrs["format_version"] == 1
        return f["label"][:], f["dense"][:], f["sparse"][:], attrs


def write(path, text: str, gz: bool = False) -> str:
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return str(path)


def run(*argv) -> int:
    return main(["prep", *map(str, argv)])


def listing(d) -> dict:
    """{name: bytes} of every file in directory d."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def earlier_output(path) -> None:
    """An earlier prep's OUT at ``path``: what ``--overwrite`` may replace."""
    with h5py.File(path, "w") as f:
        f.attrs["pshybrid_output"] = "prep"


# -- criteo ---------------------------------------------------------------------------------

@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("block", [prep_read.BLOCK_BYTES, 100],
                         ids=["one-block", "100-byte-blocks"])
def test_criteo_hashing_exact(tmp_path, monkeypatch, capsys, gz, block):
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", block)
    src = write(tmp_path / ("in.tsv.gz" if gz else "in.tsv"), CRITEO, gz)
    assert run("criteo", src, tmp_path / "out.h5", "--buckets", "1000") == 0
    label, dense, sparse, attrs = read(tmp_path / "out.h5")
    np.testing.assert_array_equal(label, np.array(LABEL, np.float32))
    np.testing.assert_array_equal(dense, expected_dense())
    np.testing.assert_array_equal(sparse, expected_hashed([1000] * 26))
    assert attrs["cardinalities"] == [1000] * 26 and attrs["field_names"] == NAMES
    assert attrs["source"] == src and "crc32" in attrs["transform"]
    assert "prep criteo: 20 rows -> " in capsys.readouterr().out


def test_a_files_reads_run_one_ahead_on_a_thread_that_ends_with_the_run(tmp_path,
                                                                       monkeypatch):
    """A gzip (or any file) input is read and decompressed on a thread of its own one
    block ahead of the parsing, so both cores work; live standard input stays in the
    caller's thread (a pipe's read may wait without end). Oracles: every block read of a
    gzip file ran on the read-ahead thread and the file is the one-block run's; a bad line
    ends the run with its error while a read is pending, and no read-ahead thread is left."""
    import threading

    from pshybrid.prep import inputs

    readers, real = [], inputs.read_checked

    def recorded(name, read, n):
        if n == prep_read.BLOCK_BYTES:
            readers.append(threading.current_thread().name)
        return real(name, read, n)

    monkeypatch.setattr(inputs, "read_checked", recorded)
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", 100)  # many blocks
    src = write(tmp_path / "in.tsv.gz", CRITEO, True)
    assert run("criteo", src, tmp_path / "out.h5", "--buckets", "1000") == 0
    assert len(readers) > 10 and all(r.startswith("prep-read") for r in readers), readers
    np.testing.assert_array_equal(read(tmp_path / "out.h5")[2], expected_hashed([1000] * 26))
    lines = CRITEO.splitlines(keepends=True)
    bad = write(tmp_path / "bad.tsv.gz", "".join(lines[:12] + ["x\n"] + lines[12:]), True)
    with pytest.raises(InputError, match=r"bad.tsv.gz:13: "):
        main(["prep", "criteo", bad, str(tmp_path / "b.h5"), "--buckets", "1000"])
    assert not [t for t in threading.enumerate() if t.name.startswith("prep-read")]


@pytest.mark.parametrize("fmt", ["criteo", "synthetic"])
def test_an_existing_out_is_replaced_only_with_overwrite_and_only_if_prep_wrote_it(tmp_path,
                                                                                  fmt):
    """Oracle: the bytes of every file that is not an earlier prep's output are unchanged,
    with or without --overwrite (``prep criteo day_0 day_1``, OUT forgotten, keeps day_1);
    an earlier output is replaced with --overwrite only, and the new file can be replaced
    again."""
    src = write(tmp_path / "day_0", CRITEO)
    write(tmp_path / "day_1", CRITEO)

    def argv(out, *flags):
        return ([fmt, src, out] if fmt == "criteo" else [fmt, out, "--rows", "300"]) + [*flags]

    split = ["--valid-fraction", "0.5", "--valid-out", tmp_path / "v.txt"]
    for flags in ([], ["--overwrite"]):
        for out, cmd in (("day_1", argv(tmp_path / "day_1", *flags)),
                         ("v.txt", argv(tmp_path / "new.h5", *split, *flags))):
            write(tmp_path / "v.txt", "a user's file\n")
            before = listing(tmp_path)
            with pytest.raises(ConfigError) as info:
                run(*cmd)
            assert f"{tmp_path / out} exists" in str(info.value)
            assert ("not an output of pshybrid prep" in str(info.value)) == bool(flags)
            assert listing(tmp_path) == before
    earlier_output(tmp_path / "out.h5")
    earlier = listing(tmp_path)["out.h5"]
    with pytest.raises(ConfigError, match="pass --overwrite to replace an earlier output of "
                       "prep$"):  # (prep has no Python call with an overwrite=)
        run(*argv(tmp_path / "out.h5"))
    assert listing(tmp_path)["out.h5"] == earlier
    for _ in range(2):
        assert run(*argv(tmp_path / "out.h5", "--overwrite")) == 0
        assert read(tmp_path / "out.h5")[3]["pshybrid_output"] == "prep"


def test_criteo_per_field_buckets_and_default(tmp_path):
    src = write(tmp_path / "in.tsv", CRITEO)
    buckets = [2 + 37 * f for f in range(26)]
    run("criteo", src, tmp_path / "a.h5", "--buckets", ",".join(map(str, buckets)))
    _, _, sparse, attrs = read(tmp_path / "a.h5")
    np.testing.assert_array_equal(sparse, expected_hashed(buckets))
    assert attrs["cardinalities"] == buckets
    run("criteo", src, tmp_path / "b.h5")
    _, _, sparse, attrs = read(tmp_path / "b.h5")
    np.testing.assert_array_equal(sparse, expected_hashed([1_000_000] * 26))
    assert attrs["cardinalities"] == [1_000_000] * 26


@pytest.mark.parametrize("block", [prep_read.BLOCK_BYTES, 100],
                         ids=["one-block", "100-byte-blocks"])
def test_criteo_vocabulary_exact(tmp_path, monkeypatch, block):
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", block)
    src = write(tmp_path / "in.tsv.gz", CRITEO, gz=True)
    run("criteo", src, tmp_path / "out.h5", "--min-count", "2")
    label, dense, sparse, attrs = read(tmp_path / "out.h5")
    np.testing.assert_array_equal(label, np.array(LABEL, np.float32))
    np.testing.assert_array_equal(dense, expected_dense())
    np.testing.assert_array_equal(sparse, expected_vocab())
    assert attrs["cardinalities"] == VOCAB_CARDS and attrs["field_names"] == NAMES
    ds = H5Dataset(tmp_path / "out.h5")   # the trainer's reader accepts the file
    ds.validate(0, ds.n_rows)
    ds.close()


def test_criteo_crlf_and_no_final_newline(tmp_path):
    src = write(tmp_path / "in.tsv", CRITEO.replace("\n", "\r\n")[:-2])
    run("criteo", src, tmp_path / "out.h5", "--min-count", "2")
    label, dense, sparse, _ = read(tmp_path / "out.h5")
    np.testing.assert_array_equal(label, np.array(LABEL, np.float32))
    np.testing.assert_array_equal(dense, expected_dense())
    np.testing.assert_array_equal(sparse, expected_vocab())


def test_criteo_max_rows(tmp_path, capsys):
    bad_after = CRITEO + "0\tnot a criteo line\n"   # never reached
    src = write(tmp_path / "in.tsv", bad_after)
    run("criteo", src, tmp_path / "out.h5", "--max-rows", "7", "--buckets", "1000")
    label, dense, sparse, _ = read(tmp_path / "out.h5")
    np.testing.assert_array_equal(label, np.array(LABEL[:7], np.float32))
    np.testing.assert_array_equal(dense, expected_dense()[:7])
    np.testing.assert_array_equal(sparse, expected_hashed([1000] * 26)[:7])
    assert "prep criteo: 7 rows -> " in capsys.readouterr().out


def test_options_from_toml_file_command_line_wins(tmp_path):
    src = write(tmp_path / "in.tsv", CRITEO)
    (tmp_path / "prep.toml").write_text("buckets = [1000]\nmax-rows = 7\nvalid_fraction = 0.5\n")
    run("criteo", src, tmp_path / "out.h5", "--config", tmp_path / "prep.toml", "--max-rows", "6")
    train, valid = read(tmp_path / "out.h5"), read(tmp_path / "out.valid.h5")
    np.testing.assert_array_equal(np.concatenate([train[2], valid[2]]),
                                  expected_hashed([1000] * 26)[:6])
    assert len(valid[0]) == 3
    (tmp_path / "bad.toml").write_text("min_cont = 2\n")
    with pytest.raises(ConfigError, match=r"unknown key 'min_cont' in .*bad\.toml; did you mean "
                                          r"min_count\?"):
        run("criteo", src, tmp_path / "x.h5", "--config", tmp_path / "bad.toml")


@pytest.mark.parametrize("encoding", [["--buckets", "1000"], ["--min-count", "2"]],
                         ids=["hashing", "vocabulary"])
def test_valid_fraction_split_equals_unsplit(tmp_path, capsys, encoding):
    src = write(tmp_path / "in.tsv", CRITEO)
    run("criteo", src, tmp_path / "all.h5", *encoding)
    run("criteo", src, tmp_path / "train.h5", *encoding, "--valid-fraction", "0.25")
    assert "15 rows -> " in capsys.readouterr().out.splitlines()[-1]
    whole = read(tmp_path / "all.h5")
    train, valid = read(tmp_path / "train.h5"), read(tmp_path / "train.valid.h5")
    assert len(train[0]) == 15 and len(valid[0]) == 5   # the last round(0.25 * 20) rows
    for a, b, c in zip(whole[:3], train[:3], valid[:3]):
        np.testing.assert_array_equal(np.concatenate([b, c]), a)
    assert train[3] == valid[3] == whole[3]


def test_valid_out_path(tmp_path):
    src = write(tmp_path / "in.tsv", CRITEO)
    run("criteo", src, tmp_path / "train", "--valid-fraction", "0.1",
        "--valid-out", tmp_path / "v.h5")
    assert len(read(tmp_path / "train")[0]) == 18 and len(read(tmp_path / "v.h5")[0]) == 2
    run("criteo", src, tmp_path / "data", "--valid-fraction", "0.1")
    assert len(read(tmp_path / "data.valid.h5")[0]) == 2


@pytest.mark.parametrize("valid", [[], ["--valid-fraction", "0.25"]], ids=["one", "split"])
def test_criteo_unlabeled_lines_are_the_labeled_ones_without_the_label(tmp_path, valid):
    """``--unlabeled`` (a file to predict, as Criteo's test.txt: 39 fields): the dense and
    sparse values of the same lines with their label field, /label 0 and attribute
    unlabeled = 1 (``train`` and ``eval`` refuse the file); the hint names it for such lines
    read without it, and lines with a label are bad with it."""
    src = write(tmp_path / "in.tsv", CRITEO)
    bare = write(tmp_path / "bare.tsv", "".join(ln.split("\t", 1)[1] + "\n"
                                                for ln in CRITEO.splitlines()))
    run("criteo", src, tmp_path / "l.h5", "--buckets", "1000", *valid)
    run("criteo", bare, tmp_path / "u.h5", "--buckets", "1000", "--unlabeled", *valid)
    for part in ("", ".valid") if valid else ("",):
        label, dense, sparse, attrs = read(tmp_path / f"u{part}.h5")
        had_label, *want, had = read(tmp_path / f"l{part}.h5")
        np.testing.assert_array_equal(dense, want[0])
        np.testing.assert_array_equal(sparse, want[1])
        assert attrs.pop("unlabeled") == 1 and not label.any() and had_label.any()
        assert attrs.pop("transform").startswith("no labels") and "unlabeled" not in had
        assert attrs.pop("source") == bare and had.pop("source") == src
        assert attrs == {k: v for k, v in had.items() if k != "transform"}
    with pytest.raises(InputError, match=r"bare.tsv:1: wrong number of fields: 39, expected "
                       r"40; lines without a label \(to predict\): --unlabeled"):
        run("criteo", bare, tmp_path / "x.h5")
    with pytest.raises(InputError, match=r"in.tsv:1: wrong number of fields: 40, expected "
                       r"39; lines with a label \(40 fields\): without --unlabeled \(--skip"):
        run("criteo", src, tmp_path / "x.h5", "--unlabeled")
    with pytest.raises(ConfigError, match=r"--unlabeled with --min-count: a vocabulary"):
        run("criteo", bare, tmp_path / "x.h5", "--unlabeled", "--min-count", "2")
    with pytest.raises(InputError, match=r"u.h5: its rows have no labels"):
        open_dataset(f"{tmp_path}/l.h5,{tmp_path}/u.h5")  # what train and eval open
    open_dataset(str(tmp_path / "u.h5"), labels=False).close()  # as predict does
    assert not os.path.exists(tmp_path / "x.h5")


def test_a_stored_vocabulary_gives_another_file_the_same_ids(tmp_path):
    """--min-count stores each field's kept values in id order (/vocabulary/<field>);
    --vocabulary FILE encodes another input with them: the hand-derived ids of the same
    lines (unlabeled here), 1 for a value FILE lacks, FILE's cardinalities; multi-hot items
    and values over 8 bytes alike. What cannot be a vocabulary of these fields is refused."""
    src = write(tmp_path / "in.tsv", CRITEO)
    run("criteo", src, tmp_path / "v.h5", "--min-count", "2")
    with h5py.File(tmp_path / "v.h5") as f:
        data, at = f["vocabulary/C1/bytes"][()], f["vocabulary/C1/offsets"][()]
    assert [data[a:b].tobytes() for a, b in zip(at[:-1], at[1:])] == [
        b"68fd1e64", b"8cf07265", b"05db9164", b"be589b51"]          # ids 2, 3, 4, 5
    lines = [ln.split("\t", 1)[1].split("\t") for ln in CRITEO.splitlines()]
    lines[0][13] = "deadbeef"                                          # C1: not in v.h5
    bare = write(tmp_path / "bare.tsv", "".join("\t".join(f) + "\n" for f in lines))
    run("criteo", bare, tmp_path / "u.h5", "--unlabeled", "--vocabulary", tmp_path / "v.h5")
    _, _, sparse, attrs = read(tmp_path / "u.h5")
    want = expected_vocab()
    want[0, 0] = 1
    np.testing.assert_array_equal(sparse, want)
    assert attrs["cardinalities"] == VOCAB_CARDS
    # csv: c "san francisco" x2 -> 2, "new york" -> 3; t's items q x3 -> 2, p, r (ties) -> 3, 4
    a = write(tmp_path / "a.csv",
              "y,c,t\n1,san francisco,p|q\n0,new york,q|r\n1,san francisco,q\n")
    b = write(tmp_path / "b.csv", "y,c,t\n0,new york,r|p|s\n1,los angeles,q\n")
    csv = ["--label", "y", "--sparse", "c", "--multi-hot", "t"]
    run("csv", a, tmp_path / "a.h5", *csv, "--min-count", "1")
    run("csv", b, tmp_path / "b.h5", *csv, "--vocabulary", tmp_path / "a.h5")
    with h5py.File(tmp_path / "b.h5") as f:
        assert f["sparse"][()].tolist() == [[3], [1]] and list(f.attrs["cardinalities"]) == [4, 5]
        assert f["multi_hot/t/values"][()].tolist() == [4, 3, 1, 2]
    run("criteo", src, tmp_path / "h.h5", "--buckets", "10")
    for argv, error, says in (
            ([src, "--vocabulary", tmp_path / "h.h5"], InputError, r"holds no /vocabulary/C1"),
            ([src, "--vocabulary", src], InputError, r"--vocabulary .*in.tsv: not a readable HDF"),
            ([src, "--vocabulary", tmp_path / "no.h5"], InputError, r"--vocabulary .*no.h5: no "),
            ([src, "--vocabulary", tmp_path / "a.h5"], InputError, r"its sparse fields \['c', "),
            ([src, "--vocabulary", tmp_path / "v.h5", "--min-count", "2"], ConfigError,
             r"--vocabulary gives the ids: --buckets and --min-count are not given with it")):
        with pytest.raises(error, match=says):
            run("criteo", *argv, tmp_path / "x.h5")
    assert not os.path.exists(tmp_path / "x.h5")


def test_a_vocabulary_that_cannot_encode_this_input_is_one_error(tmp_path):
    """--vocabulary FILE whose stored values are not a vocabulary (a group where the bytes
    should be, a value twice: which id would it get?) or whose multi-hot fields are not
    this input's (items counted, whole values looked up: nearly every id 1) is one
    InputError, nothing written; FILE itself still encodes the input."""
    src = write(tmp_path / "in.tsv", CRITEO)
    run("criteo", src, tmp_path / "v.h5", "--min-count", "2")
    bad = {"group.h5": lambda f: (f.__delitem__("vocabulary/C1/bytes"),
                                  f.create_group("vocabulary/C1/bytes")),
           "twice.h5": lambda f: f["vocabulary/C1/bytes"].__setitem__(
               slice(8, 16), f["vocabulary/C1/bytes"][:8])}          # value 1 := value 0
    for name, spoil in bad.items():
        (tmp_path / name).write_bytes((tmp_path / "v.h5").read_bytes())
        with h5py.File(tmp_path / name, "a") as f:
            spoil(f)
        with pytest.raises(InputError, match=rf"--vocabulary .*{name}: /vocabulary/C1 is not "
                           r"a vocabulary of its cardinality 6 \(.*4 distinct values"):
            run("criteo", src, tmp_path / "x.h5", "--vocabulary", tmp_path / name)
    run("criteo", src, tmp_path / "same.h5", "--vocabulary", tmp_path / "v.h5")
    np.testing.assert_array_equal(read(tmp_path / "same.h5")[2], expected_vocab())
    a = write(tmp_path / "a.csv", "y,c,t\n1,x,p|q\n0,y,q|r\n1,x,q\n")
    run("csv", a, tmp_path / "a.h5", "--label", "y", "--sparse", "c", "--multi-hot", "t",
        "--min-count", "1")
    for argv, ours in ((["--sparse", "c,t"], r"\[\]"),
                       (["--sparse", "c", "--multi-hot", "t"], None)):
        if ours is None:   # as FILE was made: accepted
            run("csv", a, tmp_path / "ok.h5", "--label", "y", *argv, "--vocabulary",
                tmp_path / "a.h5")
            continue
        with pytest.raises(InputError, match=r"--vocabulary .*a.h5: its multi-hot fields are "
                           rf"\['t'\], this input's {ours}"):
            run("csv", a, tmp_path / "x.h5", "--label", "y", *argv, "--vocabulary",
                tmp_path / "a.h5")
    with pytest.raises(InputError, match=r"--vocabulary .*a.h5: its multi-hot field t's items "
                       r"were split at '\|', this input's at ','"):  # the items: other values
        run("csv", a, tmp_path / "x.h5", "--label", "y", "--sparse", "c", "--multi-hot",
            "t:comma", "--vocabulary", tmp_path / "a.h5")
    assert not os.path.exists(tmp_path / "x.h5")


# -- csv ------------------------------------------------------------------------------------

RATINGS = """\
user,item,rating,age,price,genre,city
u1,i9,5,23,9.99,drama,san francisco
u2,i3,3,,12.5,comedy,new york
u3,i9,4,41,-1,drama,san francisco
u1,i7,1,35,0.5,,{long}
u4,i3,4.5,19,1e3,comedy,new york
""".format(long="x" * 70)
RATING_CLICKS = [1, 0, 1, 0, 1]                         # rating >= 4
AGE_PRICE = [[23, 9.99], [0, 12.5], [41, -1], [35, 0.5], [19, 1000]]
CSV_SPARSE = [["u1", "i9", "drama", "san francisco"], ["u2", "i3", "comedy", "new york"],
              ["u3", "i9", "drama", "san francisco"], ["u1", "i7", "", "x" * 70],
              ["u4", "i3", "comedy", "new york"]]


def check_ratings(path, names, buckets=1000):
    label, dense, sparse, attrs = read(path)
    np.testing.assert_array_equal(label, np.array(RATING_CLICKS, np.float32))
    np.testing.assert_array_equal(dense, [[log1p0(x) for x in row] for row in AGE_PRICE])
    np.testing.assert_array_equal(sparse, [[hashed(v, buckets) for v in row]
                                           for row in CSV_SPARSE])
    assert attrs["field_names"] == names and attrs["cardinalities"] == [buckets] * 4


def test_csv_by_names_and_by_indices(tmp_path):
    src = write(tmp_path / "ratings.csv", RATINGS)
    names = ["age", "price", "user", "item", "genre", "city"]
    run("csv", src, tmp_path / "a.h5", "--label", "rating", "--label-threshold", "4",
        "--dense", "age,price", "--sparse", "user,item,genre,city", "--buckets", "1000")
    check_ratings(tmp_path / "a.h5", names)
    run("csv", src, tmp_path / "b.h5", "--label", "2", "--label-threshold", "4",
        "--dense", "3,4", "--sparse", "0,1,5,6", "--buckets", "1000")
    check_ratings(tmp_path / "b.h5", names)


def test_csv_unlabeled_is_the_labeled_file_without_its_labels(tmp_path):
    """``--unlabeled``, no --label: the same dense and sparse values (the label column, had
    it one, is no feature), /label 0, attribute unlabeled = 1."""
    src = write(tmp_path / "ratings.csv", RATINGS)
    run("csv", src, tmp_path / "l.h5", "--label", "rating", "--label-threshold", "4",
        "--dense", "age,price", "--sparse", "user,item,genre,city", "--buckets", "1000")
    run("csv", src, tmp_path / "u.h5", "--unlabeled", "--dense", "age,price",
        "--sparse", "user,item,genre,city", "--buckets", "1000")
    (_, *want, had), (label, *got, attrs) = read(tmp_path / "l.h5"), read(tmp_path / "u.h5")
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert attrs["unlabeled"] == 1 and not label.any() and "unlabeled" not in had


def test_csv_options_from_toml_take_the_command_lines_forms(tmp_path):
    """A TOML file takes what the command line takes: ``buckets = 1000`` as ``--buckets
    1000``, and arrays of column names or indices as the comma lists of --dense/--sparse
    (which may also be repeated): the same file as from the command line."""
    src = write(tmp_path / "ratings.csv", RATINGS)
    names = ["age", "price", "user", "item", "genre", "city"]
    (tmp_path / "p.toml").write_text('label = "rating"\nlabel-threshold = 4\nbuckets = 1000\n'
                                     'dense = ["age", "price"]\nsparse = [0, 1, 5, 6]\n')
    run("csv", src, tmp_path / "a.h5", "--config", tmp_path / "p.toml")
    check_ratings(tmp_path / "a.h5", names)
    run("csv", src, tmp_path / "b.h5", "--label", "rating", "--label-threshold", "4",
        "--dense", "age", "--dense", "price", "--sparse", "user,item", "--sparse", "genre,city",
        "--buckets", "1000")
    check_ratings(tmp_path / "b.h5", names)


def test_a_quoted_value_may_be_as_long_as_a_line(tmp_path):
    """Python's csv stops at 128 KiB a field by default; a quoted value of 140,000 bytes (a
    line may hold 8 MiB) hashes as the same value unquoted does."""
    value = "x" * 140_000
    src = write(tmp_path / "q.csv", f'label,u\n1,"{value}"\n0,{value}\n')
    run("csv", src, tmp_path / "q.h5", "--label", "label", "--sparse", "u", "--buckets", "1000")
    _, _, sparse, _ = read(tmp_path / "q.h5")
    assert sparse[:, 0].tolist() == [hashed(value, 1000)] * 2


def test_a_stray_double_quote_costs_its_own_line_only(tmp_path, monkeypatch, capsys):
    """A quote never closed: its line is the bad one (named by its number), and the lines
    after it are read again as records of their own, each kept; before, the whole open
    record (MAX_LINE_BYTES of good lines) was dropped as one bad line, and later line
    numbers were off by the lines it swallowed."""
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", 64)
    monkeypatch.setattr(prep_read, "MAX_LINE_BYTES", 200)
    src = write(tmp_path / "q.csv", 'label,u\n1,a\n0,"oops\n' + "1,zz\n" * 100 + "0,x,y\n")
    argv = ["--label", "label", "--sparse", "u", "--buckets", "1000"]
    with pytest.raises(InputError) as info:
        run("csv", src, tmp_path / "q.h5", *argv)
    assert str(info.value).startswith(f"{src}:3: a double quote not closed within 200 bytes")
    run("csv", src, tmp_path / "q.h5", *argv, "--skip-bad-lines")
    label, _, sparse, _ = read(tmp_path / "q.h5")
    assert label.tolist() == [1.0] * 101 and sparse[1:, 0].tolist() == [hashed("zz", 1000)] * 100
    assert "; 2 bad lines skipped;" in capsys.readouterr().out   # line 3 and the 3-field line


def test_csv_no_header_and_separator(tmp_path):
    body = RATINGS.split("\n", 1)[1].replace(",", ";")
    src = write(tmp_path / "ratings.txt", body)
    run("csv", src, tmp_path / "out.h5", "--no-header", "--sep", ";", "--label", "2",
        "--label-threshold", "4", "--dense", "3,4", "--sparse", "0,1,5,6", "--buckets", "1000")
    check_ratings(tmp_path / "out.h5", ["c3", "c4", "c0", "c1", "c5", "c6"])


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("header", [False, True], ids=["no-header", "header"])
def test_a_byte_order_mark_is_no_part_of_the_first_value(tmp_path, gz, header):
    """Oracle: the file without the BOM (with --no-header the BOM became part of row 0's
    first id, column 0 = "user")."""
    body = RATINGS if header else RATINGS.split("\n", 1)[1]
    opts = ["--label", "2", "--label-threshold", "4", "--dense", "3,4", "--sparse", "0,1,5,6",
            "--buckets", "1000"] + ([] if header else ["--no-header"])
    for name, text in (("plain.csv", body), ("bom.csv", "\ufeff" + body)):
        run("csv", write(tmp_path / name, text, gz), tmp_path / f"{name}.h5", *opts)
    got, want = read(tmp_path / "bom.csv.h5"), read(tmp_path / "plain.csv.h5")
    for g, w in zip(got[:3], want[:3]):
        np.testing.assert_array_equal(g, w)
    assert got[3]["field_names"] == want[3]["field_names"]


def test_csv_vocabulary_and_raw_dense(tmp_path):
    src = write(tmp_path / "ratings.csv.gz", RATINGS, gz=True)
    run("csv", src, tmp_path / "out.h5", "--label", "rating", "--label-threshold", "4",
        "--dense", "price", "--dense-transform", "none", "--sparse", "user,item,genre,city",
        "--min-count", "2")
    _, dense, sparse, attrs = read(tmp_path / "out.h5")
    np.testing.assert_array_equal(dense, np.array([[9.99], [12.5], [-1], [0.5], [1000]],
                                                  np.float32))
    # user: u1 x2 -> 2; item: i3, i9 x2 tie -> 2, 3; genre: comedy, drama x2 tie -> 2, 3;
    # city: "new york" (8 bytes), "san francisco" (13) x2 tie -> 2, 3; the rest once -> 1.
    assert sparse.tolist() == [[2, 3, 3, 3], [1, 2, 2, 2], [1, 3, 3, 3], [2, 1, 0, 1],
                               [1, 2, 2, 2]]
    assert attrs["cardinalities"] == [3, 4, 4, 4]


def test_csv_label_must_be_0_or_1_without_threshold(tmp_path):
    src = write(tmp_path / "clicks.csv", "clicked,x,cat\n1,2.5,a\n0,,b\n1.0,-3,\n")
    run("csv", src, tmp_path / "out.h5", "--label", "clicked", "--dense", "x",
        "--sparse", "cat", "--buckets", "10")
    label, dense, sparse, _ = read(tmp_path / "out.h5")
    assert label.tolist() == [1, 0, 1] and sparse.tolist() == [[hashed("a", 10)],
                                                                [hashed("b", 10)], [0]]
    np.testing.assert_array_equal(dense, [[log1p0(2.5)], [0], [0]])
    write(tmp_path / "clicks.csv", "clicked,x,cat\n1,2.5,a\n2,1,b\n")
    with pytest.raises(InputError) as e:  # a rating: the fix is --label-threshold
        run("csv", src, tmp_path / "out2.h5", "--label", "clicked", "--dense", "x")
    assert str(e.value) == (f"{src}:3: label '2' is not 0 or 1: --label-threshold T makes a "
                            "number 1 if >= T, else 0 (--skip-bad-lines skips such lines)")
    write(tmp_path / "clicks.csv", "clicked,x,cat\n1,2.5,a\nyes,1,b\n")
    with pytest.raises(InputError) as e:  # not a number: no threshold would help
        run("csv", src, tmp_path / "out2.h5", "--label", "clicked", "--dense", "x")
    assert str(e.value).endswith("label 'yes' is not 0 or 1 (--skip-bad-lines skips such lines)")


@pytest.mark.parametrize("text, extra, line, why", [
    ("y,x,c\n1,2.5,a\n0,1\n1,1,b\n", [], 3, "wrong number of fields: 2, expected 3"),
    ("y,x,c\n1,abc,a\n0,1,b\n", [], 2, "x value 'abc' is not a finite number"),
    ("y,x,c\n1,1,a\n0,nan,b\n", [], 3, "x value 'nan' is not a finite number"),
    ("y,x,c\n4,1,a\nfive,1,b\n", ["--label-threshold", "3"], 3, "label 'five' is not a number"),
    ("y,x,c\n0,1e39,a\n1,1,b\n", ["--dense-transform", "none"], 2,
     "x value '1e39' is not a float32"),
], ids=["fields", "text", "nan", "label", "float32"])
def test_csv_bad_lines(tmp_path, capsys, text, extra, line, why):
    src = write(tmp_path / "t.csv", text)
    with pytest.raises(InputError) as info:
        run("csv", src, tmp_path / "out.h5", "--label", "y", "--dense", "x", "--sparse", "c",
            *extra)
    assert str(info.value) == f"{src}:{line}: {why} (--skip-bad-lines skips such lines)"
    assert os.listdir(tmp_path) == ["t.csv"]
    run("csv", src, tmp_path / "out.h5", "--label", "y", "--dense", "x", "--sparse", "c",
        "--skip-bad-lines", *extra)
    assert len(read(tmp_path / "out.h5")[0]) == text.count("\n") - 2
    assert "; 1 bad lines skipped;" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--label", "nope", "--dense", "age"], r"--label: no column 'nope'"),
    (["--label", "rating", "--dense", "age,rating"], r"column 'rating' is used twice"),
    (["--label", "rating"], r"--sparse and/or --multi-hot"),
    (["--label", "rating", "--sparse", "user", "--buckets", "10,20"], r"--buckets: 2 values"),
    (["--label", "rating", "--sparse", "user", "--sep", "ab"],
     r"--sep: must be one ASCII character \(or \\t\), got 'ab'"),
    (["--dense", "age"], r"--label is required"),
    (["--unlabeled", "--label", "rating", "--dense", "age"], r"--unlabeled: the lines have no"),
    (["--unlabeled", "--label-threshold", "4", "--dense", "age"], r"so --label and --label-t"),
    (["--label", "rating", "--sparse", "user", "--sep", ";"],
     r"no column 'rating' .*; one column: is --sep right\? the first line holds ','\)"),
])
def test_csv_bad_options(tmp_path, argv, message):
    src = write(tmp_path / "ratings.csv", RATINGS)
    with pytest.raises(ConfigError, match=message):
        run("csv", src, tmp_path / "out.h5", *argv)
    assert os.listdir(tmp_path) == ["ratings.csv"]


@pytest.mark.parametrize("text, argv, message", [
    ("y,c,c\n1,a,b\n", ["--sparse", "c"],
     "--sparse: column 'c' is named 2 times in the header of {src} (columns 1, 2): give it "
     "by its 0-based index"),
    ("y,c,c\n1,a,b\n", ["--sparse", "1,2"],
     "columns 1 and 2 of {src} are both named 'c': a dataset's fields need names of their "
     "own; rename one in the header"),
    ("y,a,b\r1,x,z\r", ["--sparse", "b"],
     "--sparse: no column 'b' in {src} (columns: y, a, 'b\\r1', x, z; the first line "
     "holds a CR: only LF and CRLF end a line (CR line ends: convert them first, e.g. tr "
     "'\\r' '\\n'))"),
], ids=["name-twice", "two-of-one-name", "cr-line-ends"])
def test_a_header_that_cannot_name_the_columns_is_said_so(tmp_path, text, argv, message):
    """Two columns of one name: chosen by that name, it was silently the first; by index,
    the refusal named the output file. CR line ends: the message printed raw CRs."""
    src = write(tmp_path / "t.csv", text)
    with pytest.raises(ConfigError) as info:
        run("csv", src, tmp_path / "out.h5", "--label", "y", *argv)
    assert str(info.value) == message.format(src=src)
    assert os.listdir(tmp_path) == ["t.csv"]
    if argv == ["--sparse", "1,2"]:  # (one of them, by index, is a field)
        run("csv", src, tmp_path / "out.h5", "--label", "y", "--sparse", "2", "--buckets", "7")
        assert read(tmp_path / "out.h5")[2].tolist() == [[hashed("b", 7)]]


def test_a_validation_file_that_is_out_is_refused_as_such(tmp_path):
    src = write(tmp_path / "ratings.csv", RATINGS)
    with pytest.raises(ConfigError) as info:
        run("csv", src, tmp_path / "out.h5", "--label", "rating", "--sparse", "user",
            "--valid-fraction", "0.5", "--valid-out", tmp_path / "out.h5")
    assert str(info.value) == (f"--valid-out {tmp_path}/out.h5 is the same file as OUT "
                               f"{tmp_path}/out.h5: the validation rows need a file of their "
                               "own")
    assert os.listdir(tmp_path) == ["ratings.csv"]


# -- bad input ------------------------------------------------------------------------------

def replace_line(n: int, line: str) -> str:
    """CRITEO with its 1-based line n replaced by ``line``."""
    lines = CRITEO.splitlines()
    lines[n - 1] = line
    return "\n".join(lines) + "\n"


def with_field(n: int, index: int, value: str) -> str:
    """CRITEO with field ``index`` of line n set to ``value``."""
    fields = CRITEO.splitlines()[n - 1].split("\t")
    fields[index] = value
    return replace_line(n, "\t".join(fields))


BAD = {
    "39 fields": (replace_line(7, criteo_line(ROWS.splitlines()[6]).rsplit("\t", 1)[0]), 7,
                  "wrong number of fields: 39, expected 40; lines without a label (to "
                  "predict): --unlabeled"),
    "41 fields": (replace_line(20, CRITEO.splitlines()[19] + "\t"), 20,
                  "wrong number of fields: 41, expected 40"),
    "blank line": (replace_line(11, ""), 11, "an empty line (a record has 40 fields)"),
    "float dense": (with_field(3, 2, "1.5"), 3,
                    "I2 value '1.5' is not an integer of at most 18 digits"),
    "text dense": (with_field(16, 13, "abc"), 16,
                   "I13 value 'abc' is not an integer of at most 18 digits"),
    "label 2": (with_field(12, 0, "2"), 12, "label '2' is not 0 or 1"),
    "empty label": (with_field(1, 0, ""), 1, "label '' is not 0 or 1"),
}
ENCODINGS = {"hashing": [], "vocabulary": ["--min-count", "2"], "split": ["--valid-fraction",
                                                                           "0.5"]}


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("case", BAD)
def test_bad_line_fails_and_leaves_nothing(tmp_path, monkeypatch, case, encoding):
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", 100)   # rows before the bad line get written
    text, line, why = BAD[case]
    src = write(tmp_path / "in.tsv", text)
    earlier_output(tmp_path / "out.h5")
    before = listing(tmp_path)
    with pytest.raises(InputError) as info:
        run("criteo", src, tmp_path / "out.h5", "--overwrite", *ENCODINGS[encoding])
    assert str(info.value) == f"{src}:{line}: {why} (--skip-bad-lines skips such lines)"
    assert listing(tmp_path) == before


@pytest.mark.parametrize("case", BAD)
def test_skip_bad_lines(tmp_path, monkeypatch, capsys, case):
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", 100)
    text, line, _ = BAD[case]
    src = write(tmp_path / "in.tsv", text)
    run("criteo", src, tmp_path / "out.h5", "--skip-bad-lines", "--min-count", "2")
    label, dense, _, _ = read(tmp_path / "out.h5")
    keep = [i for i in range(20) if i != line - 1]
    np.testing.assert_array_equal(label, np.array(LABEL, np.float32)[keep])
    np.testing.assert_array_equal(dense, expected_dense()[keep])
    assert "19 rows -> " in capsys.readouterr().out


def test_skip_counts_several_and_too_long_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", 64)
    monkeypatch.setattr(prep_read, "MAX_LINE_BYTES", 150)
    lines = with_field(15, 1, "-").splitlines()                      # I1 = "-"
    lines[4] += "x" * 200                                            # too long
    lines[9] = "1\t2"                                                # 2 fields
    src = write(tmp_path / "in.tsv", "\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"in\.tsv:5: line longer than 150 bytes"):
        run("criteo", src, tmp_path / "out.h5")
    run("criteo", src, tmp_path / "out.h5", "--skip-bad-lines", "--buckets", "1000")
    keep = [i for i in range(20) if i not in (4, 9, 14)]
    label, dense, sparse, _ = read(tmp_path / "out.h5")
    np.testing.assert_array_equal(label, np.array(LABEL, np.float32)[keep])
    np.testing.assert_array_equal(dense, expected_dense()[keep])
    np.testing.assert_array_equal(sparse, expected_hashed([1000] * 26)[keep])
    summary = capsys.readouterr().out.splitlines()[-1]
    assert "17 rows -> " in summary and "; 3 bad lines skipped;" in summary


@pytest.mark.parametrize("length", [150, 151, 180, 214, 215, 400])
def test_a_line_is_too_long_exactly_past_the_limit_however_reads_cut_it(tmp_path, monkeypatch,
                                                                        length):
    """Oracle: line 5 of ``length`` bytes before its LF is refused iff ``length`` > the
    limit (150 here; 8 MiB by default), wherever the 64-byte reads fall. A line that ended
    within the read after the one that passed the limit went through (9.4 MB > 8 MiB)."""
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", 64)
    monkeypatch.setattr(prep_read, "MAX_LINE_BYTES", 150)
    lines = CRITEO.splitlines()
    lines[4] += "x" * (length - len(lines[4]))
    src = write(tmp_path / "in.tsv", "\n".join(lines) + "\n")
    if length > 150:
        with pytest.raises(InputError, match=r"in\.tsv:5: line longer than 150 bytes"):
            run("criteo", src, tmp_path / "out.h5")
    else:
        run("criteo", src, tmp_path / "out.h5", "--buckets", "1000")
        assert read(tmp_path / "out.h5")[0].shape == (20,)


def test_empty_and_all_bad_inputs(tmp_path):
    src = write(tmp_path / "empty.tsv", "")
    for extra in ([], ["--min-count", "2"]):
        with pytest.raises(InputError, match=r"empty\.tsv: no data rows$"):
            run("criteo", src, tmp_path / "out.h5", *extra)
    src = write(tmp_path / "bad.tsv", "x\ny\n")
    with pytest.raises(InputError, match=r"bad\.tsv: no data rows \(2 bad lines skipped\)"):
        run("criteo", src, tmp_path / "out.h5", "--skip-bad-lines")
    with pytest.raises(InputError, match=r"empty\.csv: no data rows"):
        run("csv", write(tmp_path / "empty.csv", ""), tmp_path / "out.h5", "--label", "0",
            "--sparse", "1")
    assert sorted(os.listdir(tmp_path)) == ["bad.tsv", "empty.csv", "empty.tsv"]


def test_missing_input_and_output_directory(tmp_path):
    src = write(tmp_path / "in.tsv", CRITEO)
    missing = tmp_path / "nope.tsv"
    with pytest.raises(InputError, match=rf"{re.escape(str(missing))}: cannot read: No such"):
        run("criteo", missing, tmp_path / "out.h5")
    with pytest.raises(InputError, match=r"OUT .*/no/out\.h5: directory .*/no does not exist"):
        run("criteo", src, tmp_path / "no" / "out.h5")
    with pytest.raises(InputError, match=r"--valid-out .*/no/v\.h5: directory"):
        run("criteo", src, tmp_path / "out.h5", "--valid-fraction", "0.5",
            "--valid-out", tmp_path / "no" / "v.h5")
    assert os.listdir(tmp_path) == ["in.tsv"]


@pytest.mark.parametrize("argv, message", [
    (["--valid-fraction", "1"], r"--valid-fraction: must be in \[0, 1\), got 1\.0"),
    (["--valid-fraction", "x"], r"--valid-fraction: expected a number, got 'x'"),
    (["--buckets", "10,1"], r"--buckets: must be integers from 2 to 2\*\*32 \+ 1 .*, got "
                            r"10,1$"),
    (["--buckets", "10,20"], r"--buckets: 2 values for 26 sparse fields"),
    (["--buckets", "10", "--min-count", "2"], r"exclude each other"),
    (["--max-rows", "0"], r"--max-rows: must be > 0, got 0"),
    (["--valid-out", "v.h5"], r"--valid-out needs --valid-fraction > 0"),
    (["--no-such-option"], r"unrecognized arguments: --no-such-option"),
])
def test_criteo_bad_options(tmp_path, argv, message):
    src = write(tmp_path / "in.tsv", CRITEO)
    with pytest.raises(ConfigError, match=message):
        run("criteo", src, tmp_path / "out.h5", *argv)
    assert os.listdir(tmp_path) == ["in.tsv"]


def test_cli_subprocess_exit_status_and_message(tmp_path):
    text, line, why = BAD["float dense"]
    src = write(tmp_path / "in.tsv", text)
    proc = subprocess.run([sys.executable, "-m", "pshybrid", "prep", "criteo", src,
                           str(tmp_path / "out.h5")], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"pshybrid: error: {src}:{line}: {why} (--skip-bad-lines skips " \
                          "such lines)\n"
    assert os.listdir(tmp_path) == ["in.tsv"]


# -- NumPy field parsers against Python ------------------------------------------------------

def test_block_parsers_match_python():
    rng = np.random.default_rng(0)
    values = [bytes(rng.integers(1, 256, n, dtype=np.uint8)) for n in
              rng.choice([0, 1, 2, 7, 8, 9, 16, 17, 64, 65, 200], 500)]
    ints = [b"0", b"-0", b"7", b"-12", b"123456789", b"-999999999999999999", b"+1", b"1 ",
            b"-", b"--1", b"1-2", b"12345678901234567890", b"0x1", b"9" * 18, b"9" * 19, b""]
    for vals in (values, [v for v in values if v], ints):   # with and without b""
        data = b"".join(vals)
        L = np.array([len(v) for v in vals])
        s = np.concatenate([[0], np.cumsum(L)[:-1]])
        block = Block(data)
        assert crc32(block, s, L).tolist() == [zlib.crc32(v) for v in vals]
    v, ok = block.ints(s, L)
    python = [0 if x == b"" else int(x) if re.fullmatch(rb"-?[0-9]{1,18}", x) else None
              for x in ints]
    assert ok.tolist() == [p is not None for p in python]
    assert [x for x, good in zip(v.tolist(), ok) if good] == [p for p in python if p is not None]


# -- the hash, token by token, on random values ----------------------------------------------

def random_tokens(rng, n: int, exclude: bytes, empty: float) -> list[bytes]:
    """n random values of 1..80 bytes (both sides of SHORT_BYTES), any byte but NUL, LF and
    ``exclude`` (CR included, a few at the end); a share ``empty`` of them missing (b"")."""
    allowed = np.array(sorted(set(range(1, 256)) - set(b"\n" + exclude)), np.uint8)
    return [b"" if rng.random() < empty else bytes(rng.choice(allowed, rng.integers(1, 81)))
            + b"\r" * (rng.random() < 0.1) for _ in range(n)]


def as_read(tokens: list[bytes], end: bytes) -> list[bytes]:
    """The values of a line of ``tokens`` ended by ``end``, by the documented rule: the raw
    bytes, but a CR right before the LF ends the line (the last value loses it with LF)."""
    last = tokens[-1][:-1] if end == b"\n" and tokens[-1].endswith(b"\r") else tokens[-1]
    return tokens[:-1] + [last]


def oracle_ids(values: list[bytes], buckets: int) -> list[int]:
    """The documented hash: 0 if missing else 1 + zlib.crc32(value) % (buckets - 1)."""
    return [0 if v == b"" else 1 + zlib.crc32(v) % (buckets - 1) for v in values]


@pytest.mark.parametrize("empty", [0.0, 0.2], ids=["no-empty-values", "some-empty"])
@pytest.mark.parametrize("block", [1 << 20, 4096], ids=["one-block", "4k-blocks"])
def test_criteo_hash_oracle_random_tokens(tmp_path, monkeypatch, empty, block):
    monkeypatch.setattr(prep_read, "BLOCK_BYTES", block)
    rng = np.random.default_rng(1 + int(empty * 10))
    rows = 120
    sparse = [random_tokens(rng, 26, b"\t", empty) for _ in range(rows)]
    text = b"".join(b"\t".join([b"1", b"3"] + [b""] * 12 + toks) + b"\n" for toks in sparse)
    (tmp_path / "in.tsv").write_bytes(text)
    buckets = [int(b) for b in rng.integers(2, 5000, 26)]
    assert run("criteo", tmp_path / "in.tsv", tmp_path / "out.h5",
               "--buckets", ",".join(map(str, buckets))) == 0
    got = read(tmp_path / "out.h5")[2]
    want = [[oracle_ids([v], b)[0] for v, b in zip(as_read(toks, b"\n"), buckets)]
            for toks in sparse]
    assert got.tolist() == want


@pytest.mark.parametrize("empty", [0.0, 0.2], ids=["no-empty-values", "some-empty"])
def test_csv_hash_oracle_random_tokens(tmp_path, empty):
    rng = np.random.default_rng(7 + int(empty * 10))
    rows = 150
    sparse = [random_tokens(rng, 3, b",", empty) for _ in range(rows)]
    text = b"y,a,b,c\n" + b"".join(b",".join([b"1"] + toks) + b"\r\n" for toks in sparse)
    (tmp_path / "in.csv").write_bytes(text)
    assert run("csv", tmp_path / "in.csv", tmp_path / "out.h5", "--label", "y",
               "--sparse", "a,b,c", "--buckets", "777", "--quoting", "none") == 0
    got = read(tmp_path / "out.h5")[2]
    assert got.tolist() == [oracle_ids(as_read(toks, b"\r\n"), 777) for toks in sparse]


@pytest.mark.parametrize("command", ["criteo", "csv"])
def test_help_states_the_hash_and_cites_no_outside_file(command, capsys):
    with pytest.raises(SystemExit) as info:
        main(["prep", command, "--help"])
    text = " ".join(capsys.readouterr().out.split())   # argparse wraps the description
    assert info.value.code == 0
    for rule in ("id = 0 if v is empty (missing), else 1 + zlib.crc32(v) % (B - 1)",
                 "no trimming", "a CR before the LF ends the line", "--min-count K",
                 "ties by increasing bytes", "float32(log1p(max(x, 0)))"):
        assert rule in text, rule
    with pytest.raises(SystemExit):
        main(["prep", "--help"])
    assert "§" not in text + capsys.readouterr().out


@pytest.mark.parametrize("command, says", [
    ("eval", "A file without labels (prep --unlabeled) is refused: predict scores it"),
    ("predict", "DATA may be a file without labels (prep --unlabeled), encoded as the "
                "training data was (its --buckets or --vocabulary TRAIN.h5)")])
def test_scoring_help_says_what_a_file_without_labels_gets(command, says, capsys):
    """eval refuses a prep --unlabeled file, predict scores it: their --help says so."""
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0 and says in " ".join(capsys.readouterr().out.split())


def test_buckets_far_beyond_the_data_are_warned_about(tmp_path, capsys):
    """The default 10**6 buckets per field on a 3-row file: tables of 2 x 10**6 rows for 6
    ids is a trap (memory, checkpoints, start-up); prep says so once, with the fix. Buckets
    the data can fill, or a vocabulary, get no warning."""
    src = write(tmp_path / "t.csv", "y,a,b\n1,x,p\n0,y,q\n1,z,p\n")
    run("csv", src, tmp_path / "big.h5", "--label", "y", "--sparse", "a,b")
    err = capsys.readouterr().err
    assert err == ("prep csv: warning: the tables get 2,000,000 rows (--buckets) for 6 ids in "
                   "the data: most rows can never train; a smaller --buckets (e.g. the rows "
                   "read) or a vocabulary (--min-count K) sizes them to the data\n"), err
    run("csv", src, tmp_path / "fit.h5", "--label", "y", "--sparse", "a,b", "--buckets", "3")
    run("csv", src, tmp_path / "voc.h5", "--label", "y", "--sparse", "a,b", "--min-count", "1")
    assert capsys.readouterr().err == ""
    # a multi-hot field's items are ids each: 3 rows x (1 + 4 items) = 15 ids, 8 + 7 rows
    src = write(tmp_path / "m.csv", "y,a,t\n1,x,p|q|r|s\n0,y,q|r|s|t\n1,z,p|q|r|u\n")
    run("csv", src, tmp_path / "m.h5", "--label", "y", "--sparse", "a", "--multi-hot", "t",
        "--buckets", "8,7")
    assert capsys.readouterr().err == ""
    run("csv", src, tmp_path / "m2.h5", "--label", "y", "--sparse", "a", "--multi-hot", "t",
        "--buckets", "8,8")
    assert "the tables get 16 rows (--buckets) for 15 ids in the data" in capsys.readouterr().err
    # sizes that are another file's: a vocabulary's (FILE's), an unlabeled file's (the
    # training file's buckets): a smaller --buckets would make predict refuse it, so no
    # warning; the same row hashed with its label warns (9 and 6 rows for 2 ids here)
    one = write(tmp_path / "one.csv", "y,a,b\n1,x,p\n")
    for argv in (["--label", "y", "--vocabulary", tmp_path / "voc.h5"],
                 ["--unlabeled", "--vocabulary", tmp_path / "voc.h5"],
                 ["--unlabeled", "--buckets", "3"]):
        run("csv", one, tmp_path / "one.h5", "--sparse", "a,b", *argv, "--overwrite")
        assert capsys.readouterr().err == "", argv
    run("csv", one, tmp_path / "one.h5", "--sparse", "a,b", "--label", "y", "--buckets", "3",
        "--overwrite")
    assert "the tables get 6 rows (--buckets) for 2 ids" in capsys.readouterr().err


def test_vocabulary_ids_and_memory(monkeypatch):
    """--min-count's counting and its id table, on keys fed as a block's packed values:
    the ids are the documented rule's (a Counter here: kept by count >= K, then decreasing
    count, ties by increasing bytes; 1 rare, 0 empty), through several merges; the counts
    hold 16 B a distinct value and peak under 64 with the blocks' (the (field, key, count)
    triples' merge of every field at once, two argsorts, peaked at ~130 B: 2.7 GB at 16M
    rows), the table takes 52 B a kept key at most (it had 80-160)."""
    import tracemalloc
    from collections import Counter
    from types import SimpleNamespace

    from pshybrid.prep import vocabulary

    monkeypatch.setattr(vocabulary, "MERGE_AT", 500)  # a merge after every block
    rng, F, K = np.random.default_rng(3), 3, 2
    blocks = [(rng.zipf(1.1, (20000, F)) % 200000 + 1).astype(np.uint64) for _ in range(6)]

    class Packed:
        data = b""

        def __init__(self, keys):
            self.keys = keys

        def packed(self, s, L):
            return self.keys

    def rows(keys):
        L = np.where(keys % 7 == 0, 0, 4)  # some empty values
        return SimpleNamespace(block=Packed(keys), s=np.zeros_like(L), L=L)

    voc = vocabulary.Vocabulary(F, K)
    tracemalloc.start()
    try:
        for keys in blocks:
            voc.count(rows(keys))
        voc._merge()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    distinct = sum(len(k) for k, _ in voc.counts)
    assert held < 16 * distinct + 2**16 and peak < 64 * distinct, (held / distinct,
                                                                   peak / distinct)
    voc.finish()
    table = voc.table
    assert table.fields.nbytes + table.keys.nbytes + table.ids.nbytes <= 52 * sum(
        c - 2 for c in voc.cardinalities)
    for f in range(F):
        counts = Counter(int(k) for keys in blocks for k in keys[:, f] if k % 7)
        kept = sorted((k for k, c in counts.items() if c >= K),
                      key=lambda k: (-counts[k], k.to_bytes(8, "little").rstrip(b"\0")))
        want = {k: 2 + i for i, k in enumerate(kept)}
        for keys in blocks:
            got = voc.encode(rows(keys))[:, f]
            assert got.tolist() == [0 if k % 7 == 0 else want.get(int(k), 1) for k in keys[:, f]]
        assert voc.cardinalities[f] == 2 + len(kept)


# -- room for the second pass --------------------------------------------------------------

@pytest.mark.parametrize("limit", ["disk", "ulimit -f"])
@pytest.mark.parametrize("opts", [["--min-count", "2"],
                                  ["--min-count", "1", "--valid-fraction", "0.25"]],
                         ids=["vocabulary", "vocabulary+split"])
def test_a_second_pass_without_room_is_refused_before_it_writes(tmp_path, monkeypatch, opts,
                                                                limit):
    """After the first pass the files' size is known: a disk (or ``ulimit -f``) without room
    for them is refused then, naming them, before the second pass writes a row (it failed
    only as pass 2 wrote: 13.7 s into a 2M-row run). Oracles: the files' real size, written
    where there is room: room 3% short of it is refused, 10% and the margin over it passes
    (the estimate is within 4%, 5% and 1 MiB added); no row reaches
    ``DatasetWriter.append`` in a refused run, and nothing is left. A compressed file is not
    checked: its size is known only once written."""
    import resource
    from types import SimpleNamespace

    from pshybrid.data import DatasetWriter

    src = write(tmp_path / "in.tsv", CRITEO * 1000)          # 20,000 rows
    files = [tmp_path / "out.h5"] + [tmp_path / "out.valid.h5"] * ("--valid-fraction" in opts)
    assert run("criteo", src, files[0], *opts) == 0
    sizes = [os.path.getsize(f) for f in files]
    need = max(sizes) if limit == "ulimit -f" else sum(sizes)
    appended = []
    real_append, real_limit = DatasetWriter.append, resource.getrlimit
    monkeypatch.setattr(DatasetWriter, "append",
                        lambda w, *a: appended.append(w.path) or real_append(w, *a))

    def room(n: int) -> None:
        if limit == "disk":
            monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(f_bavail=n, f_frsize=1))
        else:
            monkeypatch.setattr(resource, "getrlimit", lambda r: (n, n) if
                                r == resource.RLIMIT_FSIZE else real_limit(r))

    before = listing(tmp_path)
    room(int(need * 0.97))
    with pytest.raises(InputError) as e:
        run("criteo", src, files[0], *opts, "--overwrite")
    assert appended == [] and listing(tmp_path) == before
    why = "file size limit (ulimit -f)" if limit == "ulimit -f" else "free (No space left"
    assert f"OUT {files[0]} (" in str(e.value) and why in str(e.value), e.value
    assert run("criteo", src, files[0], *opts, "--overwrite", "--compression", "lzf") == 0
    room(int(need * 1.10) + 2 * prep_write.MARGIN)  # (the files' margins, on one disk)
    assert run("criteo", src, files[0], *opts, "--overwrite") == 0
    assert appended and [os.path.getsize(f) for f in files] == sizes
