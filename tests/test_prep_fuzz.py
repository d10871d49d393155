"""Bad input to ``python -m pshybrid prep``: a table of cases, each run in a fresh directory
holding IN and an earlier prep's OUT, run with ``--overwrite``. Each must end with exit status 2 and exactly one stderr line
``pshybrid: error...`` (no traceback, no crash), the directory exactly as it was (no
temporary or partial file; the older OUT byte-identical). A full disk is simulated with
RLIMIT_FSIZE (SIGXFSZ ignored, so writes fail with EFBIG).

Cases marked ``own`` (a full disk, a possible hang, a sample of the rest) run as their own
``python -m pshybrid prep ...`` process with a timeout; the others, to spare ~0.3 s of
interpreter and NumPy start-up each, run one after another in one process calling
``pshybrid.__main__.main(argv)``, each in its own directory with its own file descriptor 2,
its exit status and stderr checked one by one (a crash there fails the cases not reported).

``python tests/test_prep_fuzz.py`` runs the table and prints the counts by outcome."""

from __future__ import annotations

import gzip
import io
import json
import os
import resource
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import pshybrid  # noqa: E402



def earlier_output() -> bytes:
    """An earlier prep's OUT (what ``--overwrite``, which every case passes, may replace)."""
    import h5py

    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        f.attrs["pshybrid_output"] = "prep"
    return buf.getvalue()


OLD = earlier_output()
TIMEOUT = 60
pytestmark = pytest.mark.timeout(300)   # the first test waits for the whole table
ROOT = os.geteuid() == 0     # root ignores permission bits: those cases use /proc, /sys


def criteo(rows: int = 20, seed: int = 0) -> bytes:
    """Good Criteo lines: label, 13 integers (some missing), 26 hex categories."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(rows):
        dense = [str(x) if x % 3 else "" for x in rng.integers(-5, 1000, 13)]
        cats = [f"{x:08x}" if x % 5 else "" for x in rng.integers(0, 2 ** 32, 26)]
        lines.append("\t".join([str(rng.integers(0, 2))] + dense + cats))
    return ("\n".join(lines) + "\n").encode()


GOOD = criteo()
BIG = criteo(3000, seed=1)                 # writes more than the full-disk limits below
CSV = b"y,x,c\n1,2.5,a\n0,,b\n1,-3,\n0,7,d\n"
CSV_BIG = CSV + b"1,2.5,a\n0,,b\n" * 2000


def replace_field(text: bytes, line: int, index: int, value: bytes, sep=b"\t") -> bytes:
    lines = text.split(b"\n")
    cells = lines[line - 1].split(sep)
    cells[index] = value
    lines[line - 1] = sep.join(cells)
    return b"\n".join(lines)


def gz_bad_crc(data: bytes) -> bytes:
    z = bytearray(gzip.compress(data))
    z[-8] ^= 0xFF                          # the CRC-32 of the trailer
    return bytes(z)


@dataclass
class Case:
    argv: list[str]                        # after "prep"
    files: dict[str, bytes] = field(default_factory=lambda: {"in.tsv": GOOD})
    fsize: int | None = None               # RLIMIT_FSIZE of the run (a full disk)
    setup: object = None                   # setup(directory), after the files are made
    needle: str = ""                       # a part of the expected message
    own: bool = False                      # its own process (else the shared one)

    def __post_init__(self):
        self.own = self.own or self.fsize is not None


def table_argv(*argv: str) -> list[str]:
    return ["criteo", "in.tsv", "out.h5", *argv]


def csv_case(*argv: str, text: bytes = CSV) -> Case:
    return Case(["csv", "in.csv", "out.h5", *argv], {"in.csv": text})


def _mkdir(name: str, mode: int = 0o755):
    return lambda d: os.mkdir(os.path.join(d, name), mode)


def _link(kind: str, target: str, name: str):
    make = os.symlink if kind == "sym" else os.link
    return lambda d: make(target if kind == "sym" else os.path.join(d, target),
                          os.path.join(d, name))


def _chmod(name: str, mode: int):
    return lambda d: os.chmod(os.path.join(d, name), mode)


CASES: dict[str, Case] = {
    # -- IN ---------------------------------------------------------------------------------
    "in-missing": Case(["criteo", "nope.tsv", "out.h5"], own=True),
    "in-directory": Case(["criteo", "sub", "out.h5"], setup=_mkdir("sub")),
    "in-fifo": Case(["criteo", "fifo", "out.h5"],
                    setup=lambda d: os.mkfifo(os.path.join(d, "fifo")),
                    needle="not a regular file", own=True),
    "in-dev-null": Case(["criteo", "/dev/null", "out.h5"]),
    "in-io-error": Case(["criteo", "/proc/self/mem", "out.h5"], own=True),
    "in-symlink-loop": Case(["criteo", "loop", "out.h5"], setup=_link("sym", "loop", "loop")),
    "in-gzip-corrupt": Case(table_argv(), {"in.tsv": b"\x1f\x8b" + bytes(range(256)) * 4}),
    "in-gzip-truncated": Case(table_argv(), {"in.tsv": gzip.compress(BIG)[:20000]}),
    "in-gzip-bad-crc": Case(table_argv(), {"in.tsv": gz_bad_crc(GOOD)}),
    "in-gzip-trailing-garbage": Case(table_argv(), {"in.tsv": gzip.compress(GOOD) + b"junk"}),
    "in-empty": Case(table_argv(), {"in.tsv": b""}),
    "in-empty-vocabulary": Case(table_argv("--min-count", "2"), {"in.tsv": b""}),
    "in-blank-lines": Case(table_argv(), {"in.tsv": b"\n\n\n"}),
    "in-binary-garbage": Case(table_argv(), {"in.tsv": np.random.default_rng(0).bytes(5000)}),
    "in-nul-bytes": Case(table_argv(), {"in.tsv": b"\0" * 100}),
    "in-nul-in-category": Case(table_argv(), {"in.tsv": replace_field(GOOD, 3, 20, b"ab\0cd")},
                               needle="in.tsv:3: a NUL byte", own=True),
    "in-nul-vocabulary": Case(table_argv("--min-count", "1"),
                              {"in.tsv": replace_field(GOOD, 5, 14, b"\0")}),
    "in-utf16": Case(table_argv(), {"in.tsv": GOOD.decode().encode("utf-16")}),
    "in-line-over-8-mib": Case(table_argv(), {"in.tsv": GOOD + b"1\t" + b"7" * 9_400_000 +
                                              b"\n"}, needle="in.tsv:21: line longer than"),
    "in-stdin-twice": Case(["criteo", "-", "-", "out.h5"],
                           needle="standard input is given 2 times"),
    "synthetic-seed-2**64": Case(["synthetic", "out.h5", "--rows", "10", "--seed", str(2**64)],
                                 needle="--seed: must be an integer from 0 to 2**32 - 1"),
    "in-cr-line-ends": Case(table_argv(), {"in.tsv": GOOD.replace(b"\n", b"\r")}),
    "in-all-bad-skipped": Case(table_argv("--skip-bad-lines"), {"in.tsv": b"x\ny\n"}),
    "in-too-few-fields": Case(table_argv(), {"in.tsv": GOOD + b"1\t2\n"}),
    "in-label-2": Case(table_argv(), {"in.tsv": replace_field(GOOD, 4, 0, b"2")}),
    "in-float-dense": Case(table_argv(), {"in.tsv": replace_field(GOOD, 2, 3, b"1.5")}),
    "in-dense-19-digits": Case(table_argv(),
                               {"in.tsv": replace_field(GOOD, 6, 5, b"1234567890123456789")}),
    "in-same-as-out": Case(["criteo", "in.tsv", "in.tsv"], needle="the same file as IN",
                           own=True),
    "in-hardlink-as-out": Case(["criteo", "in.tsv", "out.h5"], {"in.tsv": GOOD},
                               setup=_link("hard", "in.tsv", "out.h5")),
    "in-symlink-as-out": Case(["criteo", "in.tsv", "out.h5"], {"in.tsv": GOOD},
                              setup=_link("sym", "in.tsv", "out.h5")),
    # -- csv --------------------------------------------------------------------------------
    "csv-header-not-utf8": Case(["csv", "in.csv", "out.h5", "--label", "y", "--sparse", "c"],
                                {"in.csv": b"y,\xff\xfe,c\n1,2,a\n"}, own=True),
    "csv-header-nul": csv_case("--label", "0", "--sparse", "2", text=b"y,a\0b,c\n1,2,a\n"),
    "csv-gzip-corrupt": csv_case("--label", "y", "--sparse", "c",
                                 text=b"\x1f\x8b\x08\x00" + bytes(200)),
    "csv-gzip-truncated": csv_case("--label", "y", "--sparse", "c",
                                   text=gzip.compress(CSV)[:12]),
    "csv-empty": csv_case("--label", "y", "--sparse", "c", text=b""),
    "csv-header-only": csv_case("--label", "y", "--sparse", "c", text=b"y,x,c\n"),
    "csv-empty-first-line": csv_case("--label", "y", "--sparse", "c", text=b"\n" + CSV),
    "csv-label-not-0-1": csv_case("--label", "y", "--dense", "x", text=CSV + b"5,1,e\n"),
    "csv-dense-nan": csv_case("--label", "y", "--dense", "x", text=CSV + b"1,nan,e\n"),
    "csv-dense-inf": csv_case("--label", "y", "--dense", "x", text=CSV + b"1,1e999,e\n"),
    "csv-dense-over-float32": csv_case("--label", "y", "--dense", "x", "--dense-transform",
                                       "none", text=CSV + b"1,1e39,e\n"),
    "csv-wrong-field-count": csv_case("--label", "y", "--sparse", "c", text=CSV + b"1,2\n"),
    "csv-no-such-column": csv_case("--label", "nope", "--sparse", "c"),
    "csv-label-superscript-2": csv_case("--label", "\u00b2", "--sparse", "c"),
    "csv-label-index-too-big": csv_case("--label", "99", "--sparse", "c"),
    "csv-label-negative": csv_case("--label", "-1", "--sparse", "c"),
    "csv-two-labels": csv_case("--label", "y,x", "--sparse", "c"),
    "csv-column-twice": csv_case("--label", "y", "--dense", "x", "--sparse", "x"),
    "csv-no-features": csv_case("--label", "y"),
    "csv-no-label": csv_case("--sparse", "c"),
    "csv-sep-two-chars": csv_case("--label", "y", "--sparse", "c", "--sep", "ab"),
    "csv-sep-newline": csv_case("--label", "y", "--sparse", "c", "--sep", "\n"),
    "csv-sep-non-ascii": csv_case("--label", "y", "--sparse", "c", "--sep", "\u00e9"),
    "csv-bad-transform": csv_case("--label", "y", "--dense", "x", "--dense-transform", "sqrt"),
    "csv-threshold-nan": csv_case("--label", "y", "--dense", "x", "--label-threshold", "nan"),
    "csv-threshold-inf": csv_case("--label", "y", "--dense", "x", "--label-threshold", "1e999"),
    # -- several inputs, standard input, quotes, multi-hot ------------------------------------
    "in-second-missing": Case(["criteo", "in.tsv", "nope.tsv", "out.h5"], needle="nope.tsv"),
    "in-second-bad-line": Case(["criteo", "in.tsv", "in2.tsv", "out.h5"],
                               {"in.tsv": GOOD, "in2.tsv": GOOD + b"1\t2\n"},
                               needle="in2.tsv:21: wrong number of fields"),
    "in-second-gzip-corrupt": Case(["criteo", "in.tsv", "in2.tsv", "out.h5", "--min-count",
                                    "1"], {"in.tsv": GOOD, "in2.tsv": gz_bad_crc(GOOD)},
                                   needle="in2.tsv: cannot read"),
    "in-out-is-an-input": Case(["criteo", "in.tsv", "in2.tsv", "in2.tsv"],
                               {"in.tsv": GOOD, "in2.tsv": GOOD}, needle="the same file as IN"),
    "in-stdin-empty": Case(["criteo", "-", "out.h5"], {}, needle="<stdin>: no data rows"),
    "in-stdin-empty-vocabulary": Case(["criteo", "-", "out.h5", "--min-count", "2"], {},
                                      needle="<stdin>: no data rows", own=True),
    "csv-stdin-empty": Case(["csv", "-", "out.h5", "--label", "y", "--sparse", "c"], {},
                            needle="<stdin>: no data rows"),
    "csv-header-differs": Case(["csv", "in.csv", "in2.csv", "out.h5", "--label", "y",
                                "--sparse", "c"], {"in.csv": CSV, "in2.csv": b"y,z,c\n1,2,a\n"},
                               needle="in2.csv:1: the header differs"),
    "csv-quote-unclosed": csv_case("--label", "y", "--sparse", "c",
                                   text=CSV + b'1,2,"abc\n0,3,d\n'),
    "csv-quote-then-text": csv_case("--label", "y", "--sparse", "c",
                                    text=CSV + b'1,2,"ab"c\n', ),
    "csv-quoted-wrong-field-count": csv_case("--label", "y", "--sparse", "c",
                                             text=CSV + b'1,"2,5"\n'),
    "csv-multi-hot-no-column": csv_case("--label", "y", "--multi-hot", "nope"),
    "csv-multi-hot-bad-separator": csv_case("--label", "y", "--multi-hot", "c:ab"),
    "csv-multi-hot-twice": csv_case("--label", "y", "--sparse", "c", "--multi-hot", "c"),
    "csv-multi-hot-buckets-count": csv_case("--label", "y", "--sparse", "x", "--multi-hot",
                                            "c", "--buckets", "5,6,7"),
    "bad-compression": Case(table_argv("--compression", "zstd")),
    # -- options ----------------------------------------------------------------------------
    "buckets-2**63": Case(table_argv("--buckets", str(2 ** 63)), own=True),
    "buckets-10**30": Case(table_argv("--buckets", str(10 ** 30))),
    "buckets-past-crc32": Case(table_argv("--buckets", str(2 ** 32 + 2)),  # rows no id reaches
                               needle="from 2 to 2**32 + 1"),
    "buckets-1": Case(table_argv("--buckets", "1")),
    "buckets-negative": Case(table_argv("--buckets", "-5")),
    "buckets-not-integer": Case(table_argv("--buckets", "1e6")),
    "buckets-empty": Case(table_argv("--buckets", ",")),
    "buckets-wrong-count": Case(table_argv("--buckets", "10,20")),
    "buckets-and-min-count": Case(table_argv("--buckets", "10", "--min-count", "2")),
    "min-count-0": Case(table_argv("--min-count", "0")),
    "max-rows-0": Case(table_argv("--max-rows", "0")),
    "max-rows-negative": Case(table_argv("--max-rows", "-3")),
    "valid-fraction-1": Case(table_argv("--valid-fraction", "1")),
    "valid-fraction-nan": Case(table_argv("--valid-fraction", "nan")),
    "valid-fraction-negative": Case(table_argv("--valid-fraction", "-0.1")),
    "valid-fraction-no-valid-rows": Case(table_argv("--valid-fraction", "0.001")),
    "valid-fraction-no-train-rows": Case(table_argv("--valid-fraction", "0.9"),
                                         {"in.tsv": criteo(1)}),
    "valid-out-without-fraction": Case(table_argv("--valid-out", "v.h5")),
    "valid-out-is-out": Case(table_argv("--valid-fraction", "0.5", "--valid-out", "out.h5")),
    "valid-out-is-out-via-dot": Case(table_argv("--valid-fraction", "0.5",
                                                "--valid-out", "./out.h5")),
    "valid-out-is-in": Case(table_argv("--valid-fraction", "0.5", "--valid-out", "in.tsv"),
                            own=True),
    "valid-out-missing-dir": Case(table_argv("--valid-fraction", "0.5",
                                             "--valid-out", "no/v.h5")),
    "valid-out-is-directory": Case(table_argv("--valid-fraction", "0.5", "--valid-out", "sub"),
                                   setup=_mkdir("sub")),
    "unknown-option": Case(table_argv("--no-such-option")),
    "csv-option-to-criteo": Case(table_argv("--label", "0")),
    "missing-out-argument": Case(["criteo", "in.tsv"]),
    "unknown-format": Case(["parquet", "in.tsv", "out.h5"]),
    "config-missing": Case(table_argv("--config", "nope.toml")),
    "config-directory": Case(table_argv("--config", "sub"), setup=_mkdir("sub")),
    "config-invalid-toml": Case(table_argv("--config", "c.toml"),
                                {"in.tsv": GOOD, "c.toml": b"buckets = [1,\n"}),
    "config-unknown-key": Case(table_argv("--config", "c.toml"),
                               {"in.tsv": GOOD, "c.toml": b"bucket = 10\n"}),
    "config-wrong-type": Case(table_argv("--config", "c.toml"),
                              {"in.tsv": GOOD, "c.toml": b"buckets = \"many\"\n"}),
    "config-not-utf8": Case(table_argv("--config", "c.toml"),
                            {"in.tsv": GOOD, "c.toml": b"buckets = [\xff]\n"}),
    # -- OUT --------------------------------------------------------------------------------
    "out-is-directory": Case(["criteo", "in.tsv", "sub"], setup=_mkdir("sub"), own=True),
    "out-missing-directory": Case(["criteo", "in.tsv", "no/out.h5"]),
    "out-parent-is-a-file": Case(["criteo", "in.tsv", "in.tsv/out.h5"]),
    "out-name-too-long": Case(["criteo", "in.tsv", "x" * 300 + ".h5"]),
    "out-read-only-directory": (Case(["criteo", "in.tsv", "/sys/out.h5"]) if ROOT else
                                Case(["criteo", "in.tsv", "ro/out.h5"],
                                     setup=_mkdir("ro", 0o555))),
    "out-read-only-directory-vocabulary": (
        Case(["criteo", "in.tsv", "/sys/out.h5", "--min-count", "2"]) if ROOT else
        Case(["criteo", "in.tsv", "ro/out.h5", "--min-count", "2"], setup=_mkdir("ro", 0o555))),
    "full-disk-hashing": Case(table_argv(), {"in.tsv": BIG}, fsize=64 << 10,
                              needle="out.h5: cannot write: File too large"),
    "full-disk-tiny": Case(table_argv(), {"in.tsv": BIG}, fsize=100,  # (the probe, first)
                           needle="full-disk-tiny is not writable"),
    # two passes: refused after the first, before the second writes (the rows are known)
    "full-disk-split": Case(table_argv("--valid-fraction", "0.5"), {"in.tsv": BIG},
                            fsize=64 << 10, needle="(ulimit -f) of 64.0 KiB (File too large); "
                            "found before the second pass"),
    "full-disk-vocabulary": Case(table_argv("--min-count", "2"), {"in.tsv": BIG},
                                 fsize=64 << 10, needle="found before the second pass"),
    "full-disk-split-lzf": Case(table_argv("--valid-fraction", "0.5", "--compression", "lzf"),
                                {"in.tsv": BIG}, fsize=64 << 10,   # (not checked: written)
                                needle="out.h5: cannot write: File too large"),
    "full-disk-csv": Case(["csv", "in.csv", "out.h5", "--label", "y", "--dense", "x",
                           "--sparse", "c"], {"in.csv": CSV_BIG}, fsize=4 << 10),
    "full-disk-synthetic": Case(["synthetic", "out.h5", "--rows", "20000",
                                 "--max-cardinality", "50"], {}, fsize=64 << 10),
    # OUT (4000 rows, one 4.3 MB chunk per dataset) fits, the validation file does not
    "full-disk-synthetic-valid": Case(["synthetic", "out.h5", "--rows", "40000",
                                       "--valid-fraction", "0.9", "--max-cardinality", "50"],
                                      {}, fsize=6 << 20,
                                      needle="out.valid.h5: cannot write: File too large"),
    # -- synthetic --------------------------------------------------------------------------
    "synthetic-rows-0": Case(["synthetic", "out.h5", "--rows", "0"], {}),
    "synthetic-rows-2**63": Case(["synthetic", "out.h5", "--rows", str(2 ** 63)], {}, own=True),
    "synthetic-zipf-0.9": Case(["synthetic", "out.h5", "--zipf", "0.9"], {}),
    "synthetic-zipf-inf": Case(["synthetic", "out.h5", "--zipf", "inf"], {}),
    "synthetic-max-cardinality-0": Case(["synthetic", "out.h5", "--max-cardinality", "0"], {}),
    "synthetic-seed-negative": Case(["synthetic", "out.h5", "--seed", "-1"], {}),
    "synthetic-no-valid-rows": Case(["synthetic", "out.h5", "--rows", "100",
                                     "--valid-fraction", "0.001"], {}),
    "synthetic-out-is-directory": Case(["synthetic", "sub"], {}, setup=_mkdir("sub")),
    "synthetic-out-missing-directory": Case(["synthetic", "no/out.h5"], {}),
    "synthetic-valid-is-out": Case(["synthetic", "out.h5", "--valid-fraction", "0.5",
                                    "--valid-out", "out.h5"], {}),
    "synthetic-given-in": Case(["synthetic", "in.tsv", "out.h5"]),
}
if not ROOT:
    CASES["in-no-permission"] = Case(table_argv(), setup=_chmod("in.tsv", 0))


def listing(d: str) -> dict:
    """{relative path: bytes, or a link's target, or None for a directory}, recursively."""
    out = {}
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            p = os.path.join(root, name)
            key = os.path.relpath(p, d)
            if os.path.islink(p):
                out[key] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[key] = None
            elif os.path.isfile(p) and os.access(p, os.R_OK):
                with open(p, "rb") as f:
                    out[key] = f.read()
            else:
                out[key] = ("special", os.lstat(p).st_mode)
    return out


@dataclass
class Result:
    rc: int | None
    stderr: str
    seconds: float
    before: dict
    after: dict

    def verdict(self) -> str:
        """clear error | traceback | crash | silent accept | hang | unclear error."""
        if self.rc is None:
            return "hang"
        if "Traceback" in self.stderr:
            return "traceback"
        if self.rc < 0 or self.rc > 2:
            return "crash"
        if self.rc == 0:
            return "silent accept"
        lines = self.stderr.splitlines()
        if self.rc == 2 and len(lines) == 1 and lines[0].startswith("pshybrid: error"):
            return "clear error"
        return "unclear error"

    def partial(self) -> bool:
        """The directory changed: a stray temporary, a new or changed file."""
        return self.before != self.after


def _preexec(fsize: int | None):
    def run():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return run


def prepare(name: str, case: Case, base: str) -> str:
    """The case's directory: its files, its setup, and an older OUT."""
    d = os.path.join(base, name)
    os.mkdir(d)
    for fname, data in case.files.items():
        with open(os.path.join(d, fname), "wb") as f:
            f.write(data)
    if case.setup is not None:
        case.setup(d)
    if not os.path.lexists(os.path.join(d, "out.h5")):
        with open(os.path.join(d, "out.h5"), "wb") as f:
            f.write(OLD)
    return d


def finish(d: str) -> dict:
    """The directory's listing after the run (then made removable by tmp_path's cleanup)."""
    after = listing(d)
    for key in after:
        p = os.path.join(d, key)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, 0o755)
    return after


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI", "MPI_"))}
    return dict(env, OMP_NUM_THREADS="1")


def run_case(name: str, case: Case, base: str) -> Result:
    """One case as its own ``python -m pshybrid prep ...`` process."""
    d = prepare(name, case, base)
    before, t0 = listing(d), time.perf_counter()
    try:
        p = subprocess.run(pshybrid("prep", *case.argv, "--overwrite"), cwd=d, env=_env(), capture_output=True,
                           text=True, errors="replace", timeout=TIMEOUT,
                           stdin=subprocess.DEVNULL, preexec_fn=_preexec(case.fsize))
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, err = None, (exc.stderr or b"").decode(errors="replace")
    return Result(rc, err, time.perf_counter() - t0, before, finish(d))


BATCH = """
import json, os, sys, time
from pshybrid.__main__ import main
todo, report = json.load(open(sys.argv[1])), open(sys.argv[2], "w")
for d, err, argv in todo:
    os.chdir(d)
    fd, saved = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), os.dup(2)
    sys.stderr.flush()
    os.dup2(fd, 2)
    t0 = time.perf_counter()
    try:
        rc = main(["prep", *argv])
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(fd)
        os.close(saved)
    report.write(json.dumps([rc, time.perf_counter() - t0]) + "\\n")
    report.flush()
"""


def run_batch(names: list[str], base: str) -> dict[str, Result]:
    """The cases ``names`` one after another in one process (see the module docstring)."""
    dirs = {name: prepare(name, CASES[name], base) for name in names}
    before = {name: listing(d) for name, d in dirs.items()}
    err = {name: os.path.join(base, f".{name}.stderr") for name in names}
    todo, report = os.path.join(base, ".batch.json"), os.path.join(base, ".batch.out")
    with open(todo, "w") as f:
        json.dump([[dirs[n], err[n], [*CASES[n].argv, "--overwrite"]] for n in names], f)
    try:
        p = subprocess.run([sys.executable, "-c", BATCH, todo, report], env=_env(),
                           capture_output=True, text=True, errors="replace",
                           timeout=TIMEOUT * 2, stdin=subprocess.DEVNULL)
        tail = f"the shared process ended with status {p.returncode}: {p.stderr[-2000:]}"
    except subprocess.TimeoutExpired:
        tail = "the shared process hung"
    with open(report) if os.path.exists(report) else io.StringIO() as f:
        done = [json.loads(line) for line in f]
    out = {}
    for i, name in enumerate(names):
        with open(err[name], errors="replace") if os.path.exists(err[name]) else io.StringIO() as f:
            stderr = f.read()
        rc, sec = done[i] if i < len(done) else (-1 if "status" in tail else None, 0.0)
        out[name] = Result(rc, stderr if i < len(done) else stderr + tail, sec, before[name],
                           finish(dirs[name]))
    return out


def run_all(base: str, workers: int = 2) -> dict[str, Result]:
    shared = [name for name, case in CASES.items() if not case.own]
    with ThreadPoolExecutor(workers) as pool:
        batch = pool.submit(run_batch, shared, base)
        own = {name: pool.submit(run_case, name, case, base)
               for name, case in CASES.items() if case.own}
        results = {name: f.result() for name, f in own.items()} | batch.result()
    return {name: results[name] for name in CASES}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_all(str(tmp_path_factory.mktemp("fuzz")))


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_clear_error_and_leaves_nothing(results, name):
    r = results[name]
    assert r.verdict() == "clear error", f"rc={r.rc}\n{r.stderr}"
    assert CASES[name].needle in r.stderr
    assert r.after == r.before, (f"directory changed: +{sorted(set(r.after) - set(r.before))} "
                                 f"-{sorted(set(r.before) - set(r.after))}")


def test_sigterm_removes_the_temporary_file(tmp_path):
    """A job's time limit (SIGTERM) mid-write: exit 143, no temporary left, OUT unchanged."""
    (tmp_path / "out.h5").write_bytes(OLD)
    p = subprocess.Popen(pshybrid("prep", "synthetic", "out.h5", "--rows", "5000000",
                                  "--overwrite"),
                         cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and len(os.listdir(tmp_path)) < 2:
            time.sleep(0.05)
        assert len(os.listdir(tmp_path)) == 2, "no temporary file appeared"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM, err
    assert os.listdir(tmp_path) == ["out.h5"] and (tmp_path / "out.h5").read_bytes() == OLD


class _SignalledOnCollection:
    """Raises SIGTERM from its ``__del__``: the handler's SystemExit is printed and dropped
    there, as when a signal lands in a weakref callback or an h5py file-object callback."""

    def __del__(self):
        signal.raise_signal(signal.SIGTERM)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_swallowed_sigterm_still_stops_the_writer(tmp_path):
    """The handler's exception is lost, the command goes on: the writer raises it again at
    its next append, nothing is published, OUT is unchanged, no temporary is left."""
    from pshybrid.data import DatasetWriter
    from pshybrid.prep.commands import _ended_by_signals

    out = tmp_path / "out.h5"
    out.write_bytes(OLD)
    went_on = []

    def command(_args):
        w = DatasetWriter(str(out), ["d"], ["s"])
        try:
            rows = (np.zeros(4, np.float32), np.zeros((4, 1), np.float32),
                    np.zeros((4, 1), np.int64))
            w.append(*rows)
            _SignalledOnCollection()  # collected at once: SIGTERM inside __del__
            went_on.append(True)
            w.append(*rows)
            w.close([3])
        except BaseException:
            w.abort()
            raise
        return 0

    with pytest.raises(SystemExit) as e:
        _ended_by_signals(command)(None)
    assert e.value.code == 128 + signal.SIGTERM and went_on == [True]
    assert os.listdir(tmp_path) == ["out.h5"] and out.read_bytes() == OLD
    w = DatasetWriter(str(out), ["d"], ["s"])  # the stop ended with the command
    w.append(np.ones(2, np.float32), np.ones((2, 1), np.float32), np.ones((2, 1), np.int64))
    w.close([3])
    assert out.read_bytes() != OLD and os.listdir(tmp_path) == ["out.h5"]


if __name__ == "__main__":
    import collections
    import tempfile

    with tempfile.TemporaryDirectory() as base:
        t0 = time.perf_counter()
        res = run_all(base)
        verdicts = collections.Counter(r.verdict() for r in res.values())
        for name, r in res.items():
            if r.verdict() != "clear error" or r.partial():
                last = r.stderr.strip().splitlines()[-1:] or [""]
                print(f"{name:<40} {r.verdict():<14} rc={r.rc} "
                      f"{'PARTIAL ' if r.partial() else ''}{last[0][:110]}")
        slow = sorted(res.items(), key=lambda kv: -kv[1].seconds)[:8]
        print("slowest:", ", ".join(f"{n} {r.seconds:.1f} s" for n, r in slow))
        print(f"{len(res)} bad inputs tried in {time.perf_counter() - t0:.1f} s: "
              f"{verdicts['clear error']} clear errors, {verdicts['traceback']} tracebacks, "
              f"{verdicts['crash']} crashes, {verdicts['hang']} hangs, "
              f"{verdicts['silent accept']} silent accepts, "
              f"{verdicts['unclear error']} unclear errors; "
              f"{sum(r.partial() for r in res.values())} left the directory changed")
