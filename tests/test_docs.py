"""Docs that cannot drift: every fenced shell command (```bash / ```sh / ```console) of
README.md and docs/*.md is either executed here or allow-listed with its reason, and every
```python snippet runs (under ``mpiexec -n N`` when its first line is a comment
``# mpiexec -n N python FILE``). A command that changes in the docs without this table, a
flag the code no longer takes, or an output format the docs no longer describe fails.

How a documented command is executed (``COMMANDS``, keyed by the command as written, after
joining ``\\`` continuations, dropping a trailing ``# comment`` and splitting ``&&``):

- ``python``/``python3`` is this interpreter and ``mpiexec`` the environment's; a path of the
  repository (``bench/...``, ``jobs/...``) is made absolute; the rest runs as written in a
  fresh directory that the command's group set up (input files, a run.toml), in the
  table's order, each with a hard timeout.
- Substitution rule for ``train``: ``SMALL`` is appended (the last occurrence of an option
  wins, so a documented ``--steps 500`` becomes 3 steps), plus the few per-command values
  the table names (checkpoint steps); ``replace`` swaps whole tokens (``ck/step-2000`` ->
  ``ck/step-4``).
- An allow-listed command (``Skip``) says why it cannot run here and still gets a check
  that needs nothing it lacks: its options parse, its flags are in ``--help``, its script
  passes ``bash -n``.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import io
import json
import mmap
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import zlib
from dataclasses import dataclass, field

import h5py
import numpy as np
import pytest

from mpi_util import JOB_TIMEOUT, mpiexec

pytestmark = pytest.mark.job
ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("bash", "sh", "console")
SMALL = ("--steps", "3", "--batch-size", "8", "--mlp", "8", "--embedding-dim", "4",
         "--log-every", "1")


# -- reading the docs ---------------------------------------------------------------------------

def fenced(path: pathlib.Path) -> list[tuple[str, int, str]]:
    """(language, first line number, text) of every fenced block of ``path``."""
    out, lang, start, buf = [], None, 0, []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if lang is None:
                lang, start, buf = line[3:].strip(), n + 1, []
            else:
                out.append((lang, start, "\n".join(buf) + "\n"))
                lang = None
        elif lang is not None:
            buf.append(line)
    assert lang is None, f"{path}: unclosed fenced block from line {start}"
    return out


def split_commands(lang: str, text: str) -> list[str]:
    """The commands of a shell block: a block with a loop or a condition is one script;
    else each line (``\\`` continuations joined, a trailing ``# comment`` dropped, ``&&``
    split). ``console`` blocks: only ``$ `` lines."""
    if re.search(r"^\s*(for|while|if|do|done|then|fi)\b", text, re.M):
        return [text]
    text = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in text.splitlines():
        if lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            out += [" ".join(c.split()) for c in line.split(" && ")]
    return out


def documented_commands() -> dict[str, list[str]]:
    """{command: ["file:line", ...]} over every shell block of the docs."""
    found: dict[str, list[str]] = {}
    for path in DOCS:
        for lang, line, text in fenced(path):
            if lang in SHELL:
                for cmd in split_commands(lang, text):
                    found.setdefault(cmd, []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


def snippets() -> list[tuple[str, str]]:
    """(``file:line``, code) of every ```python block."""
    return [(f"{p.relative_to(ROOT)}:{line}", text)
            for p in DOCS for lang, line, text in fenced(p) if lang == "python"]


# -- running ---------------------------------------------------------------------------------

def argv_of(cmd: str, cwd: pathlib.Path, run=None) -> list[str]:
    toks = [(run.replace.get(t, t) if run else t) for t in shlex.split(cmd)]
    out = []
    for t in toks:
        if t in ("python", "python3"):
            t = sys.executable
        elif t == "mpiexec":
            t = mpiexec()
        elif "/" in t and (ROOT / t).exists() and not (cwd / t).exists():
            t = str(ROOT / t)
        out.append(t)
    return out + list(run.extra if run else ())


def execute(argv: list[str], cwd, timeout: float = JOB_TIMEOUT, **kw):
    try:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"ran past {timeout}s (a hang is a failure): {argv}\n"
                             f"stdout: {exc.stdout}\nstderr: {exc.stderr}") from None


def ok(p) -> str:
    assert p.returncode == 0, f"exit {p.returncode}: {p.args}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def jsonl(path) -> list[dict]:
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


def train_argv(cmd: str) -> list[str]:
    """The ``pshybrid`` arguments of a ``... python -m pshybrid ARGS`` command."""
    toks = shlex.split(cmd)
    return toks[toks.index("pshybrid") + 1:]


# -- what is checked, command by command ---------------------------------------------------------

@dataclass
class Run:
    """Executed in ``group``'s directory, with ``extra`` appended and tokens ``replace``d;
    ``expect(stdout, cwd)`` asserts on what it printed and wrote."""

    group: str
    extra: tuple = ()
    replace: dict = field(default_factory=dict)
    expect: object = None


@dataclass
class Skip:
    """Not runnable here, for ``reason``; ``check(cmd)`` checks what it can."""

    reason: str
    check: object = None


def parses(cmd: str) -> None:
    """The options are pshybrid's: parsed and resolved as on the command line."""
    from pshybrid.cli import build_parser
    from pshybrid.config import TrainConfig, resolve

    args = build_parser().parse_args(train_argv(cmd))
    if args.command == "train":
        resolve(TrainConfig, args)


def flags_in_help(cmd: str) -> None:
    """Every ``--flag`` of the command is in its script's ``--help``."""
    toks = shlex.split(cmd)
    script = next(t for t in toks if t.endswith(".py"))
    out = ok(execute([sys.executable, str(ROOT / script), "--help"], ROOT, 60))
    for flag in (t.split("=")[0] for t in toks if t.startswith("--")):
        assert re.search(rf"(^|[\s\[,]){re.escape(flag)}\b", out), f"{flag} not in {script} --help"


def bash_n(cmd: str) -> None:
    script = next(t for t in shlex.split(cmd) if t.endswith(".sh"))
    ok(execute(["bash", "-n", str(ROOT / script)], ROOT, 30))


def extras(cmd: str) -> None:
    """The extras named in ``pip install -e ".[a,b]"`` exist in setup.cfg."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    names = re.search(r"\[([a-z0-9,-]+)\]", cmd).group(1).split(",")
    assert set(names) <= set(cfg["options.extras_require"]), names


def exists(cmd: str) -> None:
    paths = [t for t in shlex.split(cmd) if "/" in t and not t.startswith("-")]
    assert paths and all((ROOT / p).exists() for p in paths), paths


def summary_of(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("done: "))


TRAFFIC = {  # docs/training.md, "Output": traffic_per_step's keys per mode
    "hybrid": {"rma_get_bytes", "shm_read_bytes", "rma_acc_bytes", "p2p_bytes",
               "allreduce_bytes"},
    "ps": {"rma_get_bytes", "shm_read_bytes", "rma_acc_bytes", "p2p_bytes"},
    "allreduce": {"allgather_bytes", "allreduce_bytes"},
}
SUMMARY_KEYS = {"summary", "mode", "model", "steps", "steps_run", "workers", "servers",
                "batch_size", "samples_per_s", "seconds", "startup_seconds", "final_loss",
                "base_rate", "base_rate_logloss", "phase_seconds", "phase_fraction",
                "server_apply_seconds", "slowest_worker", "traffic_per_step", "peak_rss_mb",
                "time", "epoch", "lr"}
LOG_KEYS = {"step", "loss", "samples_per_s", "seconds", "time", "epoch", "lr"}
CONFIG_KEYS = {"config", "rates", "pshybrid", "command", "start_step", "workers", "servers",
               "time"}


def metrics_as_documented(path, mode: str, steps: list[int]) -> None:
    recs = jsonl(path)  # the last run's records: runs given one file append to it
    recs = recs[max(i for i, r in enumerate(recs) if "config" in r):]
    config, logs, summary = recs[0], recs[1:-1], recs[-1]
    assert set(config) == CONFIG_KEYS and config["config"]["mode"] == mode, sorted(config)
    assert [r["step"] for r in logs] == steps
    assert all(set(r) == LOG_KEYS for r in logs), logs[0]
    assert set(summary) == SUMMARY_KEYS and summary["mode"] == mode, sorted(summary)
    assert set(summary["traffic_per_step"]) == TRAFFIC[mode], summary["traffic_per_step"]
    assert summary["final_loss"] == logs[-1]["loss"]


def quick_start(out, cwd):
    assert "done: hybrid wdl  3 steps" in summary_of(out) and "workers 3 servers 1" in out
    metrics_as_documented(cwd / "m.jsonl", "hybrid", [1, 2, 3])


def info_alone(out, cwd):
    assert "0 server(s) [], 1 worker(s)" in out and "note " in out, out


def info_four(out, cwd):
    assert "1 server(s) [3], 3 worker(s)" in out, out
    assert [ln.split()[1] for ln in out.splitlines() if re.match(r"\s+\d+ ", ln)] == \
        ["worker"] * 3 + ["server"], out


def ps_metrics(out, cwd):
    assert "done: ps dlrm  3 steps" in summary_of(out)
    metrics_as_documented(cwd / "run.jsonl", "ps", [1, 2, 3])


def train_help(out, cwd):
    from pshybrid.config import TrainConfig

    for f in dataclasses.fields(TrainConfig):
        assert "--" + f.name.replace("_", "-") in out, f.name


def criteo_hashed(out, cwd):
    lines = gzip.open(cwd / "train.txt.gz", "rb").read().splitlines()
    with h5py.File(cwd / "criteo.h5") as f, h5py.File(cwd / "criteo.valid.h5") as v:
        assert (len(f["label"]), len(v["label"])) == (len(lines) - 10, 10)  # round(0.1 * 100)
        for row in (0, 7):  # docs/data.md: the hashing rule, value by value
            values = lines[row].split(b"\t")[14:]
            want = [0 if x == b"" else 1 + zlib.crc32(x) % (10**6 - 1) for x in values]
            assert f["sparse"][row].tolist() == want


def vocabulary(out, cwd):
    with h5py.File(cwd / "day0.h5") as f:
        cards = f.attrs["cardinalities"]
        assert cards[0] == 2 + 3, cards  # C1 takes 4 values; 3 are seen >= 5 times


def csv_made(out, cwd):
    with h5py.File(cwd / "ml.h5") as f:
        assert f["label"][:].tolist() == [1, 0, 1, 1, 0, 0]  # rating >= 4
        assert f["sparse"].shape == (6, 2) and f["dense"].shape == (6, 1)


def two_days(out, cwd):
    with h5py.File(cwd / "days.h5") as f, h5py.File(cwd / "day0.h5") as d0:
        assert len(f["label"]) == 33 + 33 and f["sparse"].compression == "gzip"
        assert f["label"][:33].tolist() == d0["label"][:].tolist()   # day_0's rows first


def day0_ids(out, cwd):
    """day_1 is day_0's lines reversed: day0.h5's ids, reversed, and its cardinalities."""
    with h5py.File(cwd / "day1.h5") as f, h5py.File(cwd / "day0.h5") as d0:
        assert (f["sparse"][:] == d0["sparse"][:][::-1]).all() and f["sparse"][:, 0].max() == 4
        assert list(f.attrs["cardinalities"]) == list(d0.attrs["cardinalities"])


def unlabeled_made(out, cwd):
    """test.txt is train.txt.gz's first 20 lines without their label: the features of those
    lines prepped with it, no labels."""
    from pshybrid.cli import main

    assert main(["prep", "criteo", str(cwd / "train20.txt"), str(cwd / "train20.h5")]) == 0
    with h5py.File(cwd / "test.h5") as f, h5py.File(cwd / "train20.h5") as t:
        assert f.attrs["unlabeled"] == 1 and not f["label"][:].any() and len(f["label"]) == 20
        for key in ("dense", "sparse"):
            assert (f[key][:] == t[key][:]).all(), key


def genres_made(out, cwd):
    with h5py.File(cwd / "mlg.h5") as f:
        assert list(f.attrs["multi_hot"]) == ["genres"] and len(f["label"]) == 8
        offsets = f["multi_hot/genres/offsets"][:]
        assert offsets.tolist() == [0, 2, 3, 4, 7, 8, 9, 11, 13]  # no genre: one id, 0
        assert f["sparse"][0, 2] == 1 + zlib.crc32(b"Heat, The (1995)") % (10**6 - 1)


def synthetic_made(out, cwd):
    with h5py.File(cwd / "syn.h5") as f, h5py.File(cwd / "syn.valid.h5") as v:
        assert (len(f["label"]), len(v["label"])) == (18000, 2000)
        assert 0.5 < f.attrs["planted_auc"] < 1


def shm_cleaned(out, cwd):
    assert not (cwd / "shm" / "mpich_shm_stale").exists()
    assert (cwd / "shm" / "mpich_shm_live").exists()  # mapped by this test's process


def checkpoints_written(out, cwd):
    assert sorted(p.name for p in (cwd / "ck").iterdir()) == \
        ["latest", "step-2", "step-4", "step-6"]  # --keep-last 3 keeps all three


def resumed_to_8(out, cwd):
    assert out.startswith("resume: the options of ck/step-6/meta.json, changed: --steps 8 "
                          "(was 6)\n"), out
    assert "done: hybrid wdl  8 steps" in summary_of(out)
    assert "step 7/8" in out and "step 6/8" not in out  # continued from step 6
    assert (cwd / "ck" / "latest").read_text().strip() == "step-8"  # the stored --checkpoint-dir


def resumed_not_saved(out, cwd):
    assert "--checkpoint-dir none (was ck)" in out.splitlines()[0], out
    assert "done: hybrid wdl  10 steps" in summary_of(out)
    assert (cwd / "ck" / "latest").read_text().strip() == "step-8"


def resharded(out, cwd):
    assert "done: hybrid wdl  6 steps" in summary_of(out) and "workers 3 servers 3" in out
    assert "step 5/6" in out and "step 4/6" not in out
    assert (cwd / "ck64" / "latest").read_text().strip() == "step-6"


def exported(out, cwd):
    assert "exported step 8" in out
    with h5py.File(cwd / "run.h5") as f:
        assert set(f) == {"dense", "embeddings", "linear", "optimizer"}
        assert set(f["optimizer"]) == {"dense", "embeddings"}
        field0 = sorted(f["embeddings"])[0]
        assert set(f["optimizer/embeddings"][field0]) == {"acc"}  # adagrad
        assert set(f["optimizer/dense"]) == {"m", "v"}  # adam
        assert f["embeddings"][field0].shape[1] == 4 and f.attrs["step"] == 8


def scaled(out, cwd):
    assert (cwd / "S.png").exists() or "matplotlib is not installed" in out
    assert "ASSUMPTION: GPU-class workers" in out and "measured / 50" in out, out[-2000:]


def stale_reads(out, cwd):
    """docs/consistency.md: ssp:4 with a cache logs its reads as docs/training.md says."""
    recs = jsonl(cwd / "ssp.jsonl")
    logs, summary = recs[1:-1], recs[-1]
    assert [r["step"] for r in logs] == [1, 2, 3]
    assert all(set(r["reads"]) == {"cache_rows", "pulled_rows", "pulled_bytes", "max_staleness"}
               and r["reads"]["max_staleness"] <= 4 for r in logs), logs
    reads = summary["reads"]
    assert set(reads) == {"cache_hit_rate", "mean_staleness", "max_staleness",
                          "cache_rows_per_step", "pulled_rows_per_step", "pulled_bytes_per_step"}
    served = sum(r["reads"]["cache_rows"] for r in logs)
    assert served == round(reads["cache_rows_per_step"] * 3) and reads["max_staleness"] <= 4
    assert sum(r["reads"]["pulled_rows"] for r in logs) == round(reads["pulled_rows_per_step"] * 3)


SMALL_BUT_BATCH = ("--steps", "3", "--mlp", "8", "--embedding-dim", "4", "--log-every", "1")
COMMANDS = {
    # README.md, Quick start
    "python3 -m venv .venv": Skip("makes a new environment; the tests run in the one it "
                                  "made"),
    ". .venv/bin/activate": Skip("a shell's environment; the tests run inside it"),
    'pip install -e ".[test]"': Skip("needs the network and minutes; installed before the "
                                     "tests run", extras),
    "mpiexec -n 4 python -m pshybrid train": Run("quick", SMALL + ("--metrics", "m.jsonl"),
                                                 expect=quick_start),
    "python -m pshybrid info": Run("info", expect=info_alone),
    "mpiexec -n 4 python -m pshybrid info": Run("info", expect=info_four),
    "python tests/run.py": Skip("the whole suite (minutes), which runs this test", exists),
    # docs/training.md
    "mpiexec -n 4 python -m pshybrid train --mode ps --model dlrm --steps 500 --metrics "
    "run.jsonl": Run("train", SMALL, expect=ps_metrics),
    "mpiexec -n 4 python -m pshybrid train --config run.toml --lr 0.1": Run(
        "train", expect=lambda out, cwd: "done: hybrid dcn  3 steps" in summary_of(out)),
    "python -m pshybrid train --help": Run("train", expect=train_help),
    # docs/consistency.md
    "mpiexec -n 3 python -m pshybrid train --servers 1 --consistency ssp:4 --cache-rows 20000 "
    "--metrics ssp.jsonl": Run("train", SMALL, expect=stale_reads),
    # docs/data.md
    "python -m pshybrid prep criteo train.txt.gz criteo.h5 --valid-fraction 0.1": Run(
        "prep", expect=criteo_hashed),
    "python -m pshybrid prep criteo day_0 day0.h5 --min-count 5 --max-rows 50000000": Run(
        "prep", expect=vocabulary),
    "python -m pshybrid prep csv ratings.csv ml.h5 --label rating --label-threshold 4 "
    "--sparse userId,movieId --dense timestamp --dense-transform log": Run(
        "prep", expect=csv_made),
    "python -m pshybrid prep synthetic syn.h5 --rows 1000000 --valid-fraction 0.1": Run(
        "prep", ("--rows", "20000"), expect=synthetic_made),
    "python -m pshybrid prep criteo day_0.gz day_1.gz days.h5 --compression gzip": Run(
        "prep", expect=two_days),
    "python -m pshybrid prep criteo --unlabeled test.txt test.h5": Run("prep",
                                                                      expect=unlabeled_made),
    "python -m pshybrid prep criteo day_1 day1.h5 --vocabulary day0.h5": Run(
        "prep", expect=day0_ids),
    "python -m pshybrid prep csv ratings_genres.csv mlg.h5 --label rating --label-threshold 4 "
    "--sparse userId,movieId,title --multi-hot genres --valid-fraction 0.2": Run(
        "prep", expect=genres_made),
    "mpiexec -n 3 python -m pshybrid train --data mlg.h5 --eval-data mlg.valid.h5 --pooling "
    "mean": Run("prep", SMALL_BUT_BATCH + ("--batch-size", "2"), expect=lambda out, cwd:
                "eval at step 3" in out and "done: hybrid wdl  3 steps" in summary_of(out)),
    # docs/checkpoints.md (in this order: each continues the last)
    "mpiexec -n 4 python -m pshybrid train --checkpoint-dir ck --checkpoint-every 500 "
    "--keep-last 3": Run("ckpt", SMALL + ("--steps", "6", "--checkpoint-every", "2"),
                         expect=checkpoints_written),
    "mpiexec -n 4 python -m pshybrid train --resume ck --steps 4000": Run(
        "ckpt", SMALL + ("--steps", "8"), expect=resumed_to_8),
    "mpiexec -n 4 python -m pshybrid train --resume ck --steps 8000 --checkpoint-dir none": Run(
        "ckpt", SMALL + ("--steps", "10"), expect=resumed_not_saved),
    "mpiexec -n 6 python -m pshybrid train --resume ck/step-2000 --checkpoint-dir ck64 "
    "--servers 3 --batch-size 64":
        Run("ckpt", SMALL_BUT_BATCH + ("--steps", "6"), {"ck/step-2000": "ck/step-4"},
            expect=resharded),
    "python -m pshybrid export ck run.h5": Run("ckpt", expect=exported),
    # docs/gpu.md
    'pip install -e ".[test,gpu]"': Skip("needs the network and a CUDA machine", extras),
    "mpiexec -n 5 python -m pshybrid train --device cuda --servers 1 --model dlrm "
    "--batch-size 2048": Skip("needs a GPU", parses),
    "python -m pshybrid info --device cuda": Skip("needs a GPU", parses),
    "sbatch jobs/slurm_gpu.sh": Skip("needs Slurm and GPU nodes", bash_n),
    "python bench/gpu_check.py": Run("gpu"),  # see test_gpu_check_without_a_gpu
    "nvidia-smi": Skip("needs an NVIDIA driver"),
    'pip install -e ".[test,gpu-cuda13]"': Skip("needs the network and a CUDA machine", extras),
    'pip install -e ".[test,gpu-libs]"': Skip("needs the network and a CUDA machine", extras),
    "python bench/gpu_check.py --quick": Skip("needs a GPU", flags_in_help),
    "python bench/gpu_check.py --speed": Skip("needs a GPU (tests/test_gpu_check.py runs the step "
                                              "on stand-ins)", flags_in_help),
    # docs/clusters.md
    "module load openmpi": Skip("needs a cluster's environment modules"),
    "export MPI4PY_LIBMPI=libmpi.so.40": Skip("a setting; tests/test_system_mpi.py uses it"),
    "mpiexec.openmpi -n 3 -x MPI4PY_LIBMPI python -m pshybrid info": Skip(
        "needs Open MPI's launcher: tests/test_system_mpi.py runs it where present", parses),
    "bash jobs/local.sh 3 --config jobs/local.toml --checkpoint-dir ckpt-local": Skip(
        "2000 steps: tests/test_jobs_preempt.py runs this script, signals and resumes it", bash_n),
    # docs/benchmarks.md
    "mpiexec -n 3 python bench/modes_bench.py --workload paper --steps 200 --wire-only "
    "--json P1.json": Skip("a benchmark: minutes and GiBs (bench/sample_modes.json is such an "
                           "output; tests/test_wire_bench.py checks the wire-only runs)",
                           flags_in_help),
    "mpiexec -n 3 python bench/modes_bench.py --workload light --steps 200 --wire-only "
    "--json L1.json": Skip("a benchmark: minutes on 2 cores (its numbers are in the text)",
                           flags_in_help),
    "python -m pshybrid prep synthetic stale.h5 --rows 200000 --valid-fraction 0.2": Run(
        "prep", ("--rows", "20000"), expect=lambda out, cwd: "16000 rows -> stale.h5" in out
        and "4000 rows -> stale.valid.h5" in out),
    "mpiexec -n 3 python bench/modes_bench.py --workload light --modes hybrid,ps --data stale.h5 "
    "--eval-data stale.valid.h5 --consistency bsp,ssp:1,ssp:4,asp --cache-rows 0,15000 --steps 300 "
    "--warmup 30 --repeat 1": Skip("a benchmark: minutes on 2 cores", flags_in_help),
    "python bench/scaling.py P1.json P2.json P3.json": Run("bench"),
    "mpiexec -n 3 python bench/auto_bench.py --workload paper --steps 40 --warmup 10 --repeat 2 "
    "--no-hot --json auto_paper.json": Skip("a benchmark: minutes on 2 cores (its numbers are in "
                                            "the text)", flags_in_help),
    "python bench/scaling.py P1.json --cross L1.json": Run("bench"),
    "python bench/scaling.py P1.json --compute-speedup 50 --workers-per-node 1,4,8 --png S.png":
        Run("bench", expect=scaled),
    "mpiexec -n 2 python bench/modes_bench.py --workload paper --steps 200 --wire-only "
    "--json O1.json": Skip("a benchmark: minutes (its numbers are in the text)", flags_in_help),
    "python bench/scaling.py P1.json --compute-speedup 50 --workers-per-node 1,4,8 "
    "--servers-from O1.json": Run("bench", expect=lambda out, cwd:
                                  "servers' terms of ps from O1.json" in out),
    "python bench/gpu_check.py --compute-only --json gpu.json": Skip(
        "needs a GPU (the JSON it writes is faked for the next command)", flags_in_help),
    "python bench/scaling.py P1.json --compute-from gpu.json --workers-per-node 1,4,8": Run(
        "bench", expect=lambda out, cwd: "fake-gpu" in out),
    # docs/torch.md (its WDL and DLRM are python snippets, run below)
    'pip install -e ".[torch]"': Skip("needs the network and minutes; installed before the "
                                      "tests run (the test extra pins torch)", extras),
    "python bench/torch_bench.py --repeat 3 --json bench_torch.json": Skip(
        "a benchmark: minutes and GiBs (docs/torch.md gives its numbers)", flags_in_help),
}


def scored_run(out, cwd):
    recs = jsonl(cwd / "run.jsonl")
    assert [r["step"] for r in recs if r.get("eval")] == [3, 6], recs
    assert all({"time", "epoch", "lr"} <= set(r) for r in recs if "config" not in r)


def evaluated(out, cwd):
    last = [r for r in jsonl(cwd / "run.jsonl") if r.get("eval")][-1]  # the training's
    assert f"eval at step 6: auc {last['auc']:.4f}  logloss {last['logloss']:.4f}" in out, out


def evaluated_step(out, cwd):
    first = next(r for r in jsonl(cwd / "run.jsonl") if r.get("eval"))
    assert f"eval at step 3: auc {first['auc']:.4f}" in out, out


def predicted(out, cwd):
    with h5py.File(cwd / "scores.h5") as f, h5py.File(cwd / "test.h5") as t:
        assert f["score"].shape == t["label"].shape and f.attrs["step"] == 6
        assert ((f["score"][...] > 0) & (f["score"][...] < 1)).all()


def plotted(out, cwd):
    assert (cwd / "run.png").read_bytes()[:4] == b"\x89PNG", out


SCORE = ("--steps", "6", "--batch-size", "8", "--mlp", "8", "--embedding-dim", "4",
         "--log-every", "2", "--eval-every", "3", "--warmup-steps", "2", "--checkpoint-every",
         "3")
COMMANDS.update({  # docs/training.md, "Scoring a checkpoint" (in this order)
    "mpiexec -n 4 python -m pshybrid train --data train.h5 --eval-data valid.h5 --eval-every "
    "500 --checkpoint-dir ck --metrics run.jsonl --l2 1e-5 --lr-schedule cosine "
    "--warmup-steps 200": Run("score", SCORE, expect=scored_run),
    "mpiexec -n 4 python -m pshybrid eval ck valid.h5": Run("score", expect=evaluated),
    "python -m pshybrid eval ck/step-1000 valid.h5": Run("score", (), {"ck/step-1000":
                                                                       "ck/step-3"},
                                                         expect=evaluated_step),
    "mpiexec -n 4 python -m pshybrid predict ck test.h5 scores.h5": Run("score",
                                                                        expect=predicted),
    "python -m pshybrid plot run.jsonl run.png": (
        Run("score", expect=plotted) if importlib.util.find_spec("matplotlib")
        else Skip("needs matplotlib (the plot extra), not installed here", parses)),
})
SHM_SCRIPT = "\n".join(ln.rstrip() for ln in """\
ls -l /dev/shm/mpich_shm_*
for f in /dev/shm/mpich_shm_*; do
  [ -O "$f" ] || continue                               # yours only
  grep -qs -- "$f" /proc/[0-9]*/maps || rm -f -- "$f"   # not mapped by a live process
done
""".splitlines()) + "\n"
COMMANDS[SHM_SCRIPT] = Run("shm", expect=shm_cleaned)  # docs/training.md, a killed job


def test_every_documented_command_is_in_the_table():
    found = documented_commands()
    missing = {c: where for c, where in found.items() if c not in COMMANDS}
    stale = [c for c in COMMANDS if c not in found]
    assert not missing, "documented but neither run nor allow-listed in tests/test_docs.py " \
        "COMMANDS (a changed command? add it):\n" + "\n".join(f"{w}: {c!r}"
                                                             for c, w in missing.items())
    assert not stale, "in COMMANDS but no longer documented:\n" + "\n".join(map(repr, stale))
    for cmd, how in COMMANDS.items():
        assert isinstance(how, Skip) or how.group in GROUPS, (cmd, how)


@pytest.mark.parametrize("cmd", [c for c, how in COMMANDS.items() if isinstance(how, Skip)])
def test_allow_listed_command_checks(cmd):
    how = COMMANDS[cmd]
    assert how.reason
    if how.check is not None:
        how.check(cmd)


# -- the groups: set-up, then their commands in the table's order ---------------------------------

def setup_train(cwd: pathlib.Path) -> None:
    (cwd / "run.toml").write_text('model = "dcn"\nsteps = 3\nbatch-size = 8\nmlp = [8]\n'
                                  'embedding_dim = 4\nlog_every = 1\nlr = 0.5\n')


def criteo_line(rng, vocab=None) -> bytes:
    label = str(rng.integers(2)).encode()
    dense = [b"" if rng.random() < 0.1 else str(rng.integers(-2, 500)).encode()
             for _ in range(13)]
    if vocab is None:
        cats = [b"" if rng.random() < 0.1 else rng.bytes(4).hex().encode() for _ in range(26)]
    else:
        cats = [vocab[rng.integers(len(vocab))] for _ in range(26)]
    return b"\t".join([label, *dense, *cats]) + b"\n"


def setup_prep(cwd: pathlib.Path) -> None:
    rng = np.random.default_rng(0)
    (cwd / "train.txt.gz").write_bytes(gzip.compress(b"".join(criteo_line(rng)
                                                              for _ in range(100))))
    # C1 of day_0: "a", "b", "c" 10 times each and "d" 3 times (under --min-count 5)
    lines = [criteo_line(rng, [b"x", b"y"]) for _ in range(33)]
    lines = [b"\t".join(ln.split(b"\t")[:14] + [v] + ln.split(b"\t")[15:])
             for ln, v in zip(lines, [b"a", b"b", b"c"] * 10 + [b"d"] * 3)]
    (cwd / "day_0").write_bytes(b"".join(lines))
    train = gzip.decompress((cwd / "train.txt.gz").read_bytes()).splitlines(keepends=True)
    (cwd / "test.txt").write_bytes(b"".join(ln.split(b"\t", 1)[1] for ln in train[:20]))
    (cwd / "train20.txt").write_bytes(b"".join(train[:20]))
    (cwd / "day_0.gz").write_bytes(gzip.compress(b"".join(lines)))
    (cwd / "day_1.gz").write_bytes(gzip.compress(b"".join(lines[::-1])))
    (cwd / "day_1").write_bytes(b"".join(lines[::-1]))
    (cwd / "ratings_genres.csv").write_text("".join(line + "\n" for line in [
        "userId,movieId,title,genres,rating", '1,6,"Heat, The (1995)",Action|Crime,4.5',
        "2,1,Toy Story (1995),Animation,3", "3,2,Jumanji (1995),,4",
        '1,6,"Heat, The (1995)",Action|Crime|Thriller,5', "4,3,Up (2009),Animation,2",
        "4,3,Up (2009),Animation,2", "5,1,Toy Story (1995),Animation|Children,5",
        "6,2,Jumanji (1995),Adventure|Fantasy,1", "7,1,Toy Story (1995),Comedy,4",
        "8,3,Up (2009),Animation,4.5"]))
    (cwd / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,10,4.5,964982703\n"
                                     "2,11,3.0,964981247\n1,12,5,964982224\n3,10,4,964983815\n"
                                     "3,13,0.5,964982931\n2,10,2,964982400\n")


def setup_bench(cwd: pathlib.Path) -> None:
    """Copies of bench/sample_modes.json (the paper workload) stand in for every run; the
    GPU compute file is what gpu_check --compute-only writes, with made-up times."""
    for name in ("P1.json", "P2.json", "P3.json", "L1.json", "O1.json"):
        shutil.copy(ROOT / "bench" / "sample_modes.json", cwd / name)
    args = json.loads((ROOT / "bench" / "sample_modes.json").read_text())["args"]
    (cwd / "gpu.json").write_text(json.dumps({"device": "fake-gpu", "compute": {"paper": {
        "mlp": args["mlp"], "batch_size": args["batch_size"], "fwd_bwd_seconds": 0.001,
        "dense_apply_seconds": 0.0002}}}))


def setup_score(cwd: pathlib.Path) -> None:
    """train.h5, valid.h5 and test.h5 (a copy of valid.h5): small synthetic files."""
    p = execute([sys.executable, "-m", "pshybrid", "prep", "synthetic", "train.h5", "--rows",
                 "2000", "--valid-fraction", "0.2", "--valid-out", "valid.h5"], cwd, 120)
    ok(p)
    shutil.copy(cwd / "valid.h5", cwd / "test.h5")


GROUPS = {"quick": None, "info": None, "train": setup_train, "prep": setup_prep,
          "ckpt": None, "bench": setup_bench, "shm": None, "gpu": None, "score": setup_score}


def run_group(name: str, cwd: pathlib.Path, env=None) -> None:
    if GROUPS[name]:
        GROUPS[name](cwd)
    cmds = [(c, how) for c, how in COMMANDS.items() if isinstance(how, Run) and how.group == name]
    assert cmds, name
    for cmd, how in cmds:
        out = ok(execute(argv_of(cmd, cwd, how), cwd, env=env))
        if how.expect is not None:
            assert how.expect(out, cwd) is not False, (cmd, out)


@pytest.mark.parametrize("group", ["quick", "info", "train", "prep", "ckpt", "bench",
                                   "score"])
def test_documented_commands_run(group, tmp_path):
    run_group(group, tmp_path)


def test_killed_job_cleanup_script(tmp_path):
    """The /dev/shm clean-up of docs/training.md, on a directory of its own: it removes this
    user's segment that no live process maps and keeps the one this process maps."""
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "mpich_shm_stale").write_bytes(b"x" * 4096)
    (shm / "mpich_shm_live").write_bytes(b"x" * 4096)
    with open(shm / "mpich_shm_live", "r+b") as fh, mmap.mmap(fh.fileno(), 4096):
        ok(execute(["bash", "-c", SHM_SCRIPT.replace("/dev/shm", str(shm))], tmp_path, 60))
    shm_cleaned("", tmp_path)


def test_gpu_check_without_a_gpu(tmp_path):
    """docs/gpu.md: without a GPU, bench/gpu_check.py says so and exits with status 2."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a GPU is visible: bench/gpu_check.py is the GPU machine's check")
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: the case checked here
        pass
    p = execute([sys.executable, str(ROOT / "bench" / "gpu_check.py")], tmp_path, 60)
    assert p.returncode == 2 and "no usable CUDA device" in p.stdout + p.stderr, p


# -- the Python snippets ------------------------------------------------------------------------

@pytest.mark.parametrize("where,code", snippets(), ids=[w for w, _ in snippets()])
def test_python_snippet_runs(where, code, tmp_path):
    if re.search(r"^import torch\b", code, re.M):
        pytest.importorskip("torch")  # the [torch] extra (.ci/run installs its CPU build)
    first = code.splitlines()[0]
    m = re.fullmatch(r"# mpiexec -n (\d+) python (\S+\.py)", first.strip())
    script = tmp_path / (m.group(2) if m else "snippet.py")
    script.write_text(code)
    argv = [sys.executable, str(script)]
    if m:
        argv = [mpiexec(), "-n", m.group(1)] + argv
    else:
        assert "mpiexec" not in first, f"{where}: write '# mpiexec -n N python FILE.py'"
    ok(execute(argv, tmp_path))


# -- statements the commands above do not show ----------------------------------------------------

def test_training_options_paragraph_lists_every_option():
    from pshybrid.config import TrainConfig

    text = (ROOT / "docs" / "training.md").read_text()
    para = text[text.index("Options (`pshybrid/config.py`"):text.index("**Before step 1.**")]
    doc = set(re.findall(r"--([a-z][a-z0-9-]*)", para))
    fields = dataclasses.fields(TrainConfig)
    code = {f.name.replace("_", "-") for f in fields}
    negated = {"no-" + f.name.replace("_", "-") for f in fields if f.type in (bool, "bool")}
    assert doc - negated == code, (sorted(doc - negated - code), sorted(code - doc))
    # `--mode {hybrid,ps,allreduce}` and `--cuda-aware auto|on|off`: the choices, exactly
    choices = {f.name.replace("_", "-"): f.metadata["choices"] for f in fields}
    listed = [(flag, values) for flag, values in
              re.findall(r"`--([a-z-]+) \{?([a-z0-9]+(?:[,|][a-z0-9]+)+)\}?`", para)
              if choices[flag]]  # not `--mlp 256,128`
    assert len(listed) >= 8, listed
    for flag, values in listed:
        assert tuple(re.split(r"[,|]", values)) == tuple(choices[flag]), flag


def test_output_keys_are_documented():
    text = (ROOT / "docs" / "training.md").read_text()
    out = text[text.index("## Output"):text.index("## After a killed job")]
    for key in SUMMARY_KEYS | LOG_KEYS | set().union(*TRAFFIC.values()):
        assert f"`{key}`" in out, key
    for mode, keys in TRAFFIC.items():
        row = re.search(rf"^\| `{mode}` \| (.*) \|$", out, re.M).group(1)
        assert set(re.findall(r"`([a-z0-9_]+_bytes)`", row)) == keys, mode


def test_prep_help_states_the_hashing_rule():
    """docs/data.md: ``prep criteo --help`` and ``prep csv --help`` state the hash."""
    for kind in ("criteo", "csv"):
        out = ok(execute([sys.executable, "-m", "pshybrid", "prep", kind, "--help"], ROOT, 60))
        assert "1 + zlib.crc32(v) % (B - 1)" in " ".join(out.split()), out


def one_process(tmp_path, **kw):
    """train() in this process on COMM_SELF (allreduce mode: no server), output captured."""
    from mpi4py import MPI

    from pshybrid.config import TrainConfig
    from pshybrid.train import train

    opts = dict(mode="allreduce", steps=3, batch_size=8, mlp=(8,), embedding_dim=4,
                log_every=1, dtype="float64", metrics=str(tmp_path / "m.jsonl"))
    opts.update(kw)
    out = io.StringIO()
    result = train(TrainConfig(**opts), MPI.COMM_SELF, out=out)
    return result, out.getvalue()


def test_log_numbering_and_loss_as_documented(tmp_path):
    """docs/training.md, "Steps and logs": logs after multiples of --log-every and the last
    step; a log's loss is the mean over the rows of the steps since the previous log, each
    from its step's forward pass (before that step's update)."""
    every1, _ = one_process(tmp_path, steps=5, log_every=1)
    every2, _ = one_process(tmp_path, steps=5, log_every=2)
    metrics_as_documented(tmp_path / "m.jsonl", "allreduce", [2, 4, 5])
    one = [r["loss"] for r in every1.log]
    assert [r["loss"] for r in every2.log] == pytest.approx(
        [(one[0] + one[1]) / 2, (one[2] + one[3]) / 2, one[4]], rel=1e-12)
    frozen, _ = one_process(tmp_path, steps=2, lr=0.0, dense_lr=0.0)
    # step 1's loss is the initial model's; step 2's already sees step 1's update
    assert frozen.log[0]["loss"] == one[0] and frozen.log[1]["loss"] != one[1]


def test_zero_steps_write_no_checkpoint_and_sgd_exports_no_optimizer(tmp_path):
    """docs/checkpoints.md: --steps 0 writes none; an sgd/sgd export has no /optimizer."""
    from pshybrid.export import export

    one_process(tmp_path, steps=0, checkpoint_dir=str(tmp_path / "none"))
    assert not (tmp_path / "none").exists() or not any((tmp_path / "none").iterdir())
    one_process(tmp_path, steps=2, checkpoint_dir=str(tmp_path / "ck"),
                sparse_optimizer="sgd", dense_optimizer="sgd")
    export(str(tmp_path / "ck"), str(tmp_path / "out.h5"))
    with h5py.File(tmp_path / "out.h5") as f:
        assert set(f) == {"dense", "embeddings", "linear"}, set(f)


@pytest.mark.parametrize("progress,newlines", [("bar", 2), ("lines", 4), ("none", 1),
                                               ("auto", 4)])  # a StringIO is no terminal
def test_progress_modes(tmp_path, progress, newlines):
    """docs/training.md, "Progress": bar, lines, none; the summary line in every case; the
    plan first, in every case (its indented lines: a warning and a note may follow)."""
    _, out = one_process(tmp_path, progress=progress)
    assert out.startswith("plan: allreduce wdl on 1 rank, 1 node: 1 worker, no server\n"), out
    out = "".join(ln for ln in out.splitlines(keepends=True)
                  if not ln.startswith(("plan: ", "  ")))
    assert ("\r[" in out) == (progress == "bar"), out
    assert ("step 2/3  loss" in out) == (progress != "none"), out
    assert out.count("\n") == newlines and out.splitlines()[-1].startswith("done: "), out


def test_progress_auto_draws_a_bar_on_the_launching_terminal(tmp_path):
    """docs/training.md: under mpiexec on a terminal (a pseudo-terminal here), --progress
    auto draws the bar; the same job into a pipe prints lines (every other test here)."""
    import pty
    import select
    import time

    argv = [mpiexec(), "-n", "2", sys.executable, "-m", "pshybrid", "train", *SMALL]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the launcher, on the pseudo-terminal
        try:
            os.chdir(tmp_path)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    chunks, deadline = [], time.monotonic() + JOB_TIMEOUT
    try:
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 1.0)[0]:
                try:
                    data = os.read(fd, 4096)
                except OSError:  # the launcher exited: EIO
                    break
                if not data:
                    break
                chunks.append(data)
        else:
            os.kill(pid, 9)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    out = b"".join(chunks).decode()
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert "\r[##########....................] step 1/3" in out and "\nstep 1/3" not in out, out


@pytest.mark.parametrize("chain,want", [
    ([("hydra_pmi_proxy", None), ("mpiexec", "/dev/pts/3")], True),  # MPICH, on a terminal
    ([("hydra_pmi_proxy", None), ("mpiexec", "pipe:[7]")], False),   # mpiexec ... | tee
    ([("mpirun", "/dev/tty1")], True),                               # Open MPI: its child
    ([("mpiexec.openmpi", "/dev/tty1")], True),                      # Debian's name for it
    ([("orted", None), ("mpirun.mpich", "/dev/pts/3")], True),       # (and MPICH's)
    ([("mpiexecutor", "/dev/tty1")], False),                         # no launcher
    ([("hydra_pmi_proxy", None), ("sshd", "/dev/pts/3")], False),    # another node
    ([("bash", None), ("mpiexec", "/dev/pts/3")], False),            # not the launcher's pipe
    ([("hydra_pmi_proxy", None), ("a", None), ("b", None), ("mpiexec", "/dev/pts/3")], False),
])
def test_progress_auto_rule(tmp_path, chain, want):
    """docs/training.md, "Progress": the rule of --progress auto on a made-up /proc."""
    from pshybrid.report import interactive

    pids = [os.getpid(), *range(9001, 9001 + len(chain))]
    for i, (name, stdout) in enumerate([("python", None), *chain]):
        d = tmp_path / str(pids[i])
        (d / "fd").mkdir(parents=True)
        ppid = pids[i + 1] if i + 1 < len(pids) else 1
        (d / "stat").write_text(f"{pids[i]} ({name}) S {ppid} 0 0\n")
        if stdout:
            os.symlink(stdout, d / "fd" / "1")

    class Stdout:  # the rank's stdout: fd 1, not a terminal (a pipe to the launcher)
        def fileno(self):
            return 1

    if os.isatty(1):
        pytest.skip("this test's own stdout is a terminal")
    assert interactive(Stdout(), environ={}, root=str(tmp_path)) is want
    assert interactive(io.StringIO(), environ={}, root=str(tmp_path)) is False
