"""``pshybrid plot RUN.jsonl [RUN2.jsonl ...] OUT.png``: the curves of ``--metrics`` files
(training loss, samples/s, and the evaluations' AUC and logloss, against the step) in one
image; several runs are overlaid, one colour each, labelled by file name.

Needs matplotlib (the ``plot`` or ``bench`` extra). Every file is checked whole before
anything is drawn; the image is written atomically (a failed run leaves nothing).
"""

from __future__ import annotations

import json
import math
import os

from . import safeio
from .errors import ConfigError, InputError

NEEDS = "pshybrid plot needs matplotlib: pip install 'pshybrid[plot]'"


def read_metrics(path: str) -> tuple[list[dict], list[dict]]:
    """(step records, evaluation records) of a ``--metrics`` file, in file order; an
    InputError names the file and line of anything else. A line cut short by a killed job
    (the last line, or one a resumed run's config record follows) is skipped, and so is a
    record whose number is null (an AUC of a one-class file: its logloss is kept); a resumed
    run's config record drops what it redoes (``_redone``)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:  # (a binary file: an HDF5 dataset, an image)
        line = 1 + data.count(b"\n", 0, e.start)
        raise InputError(f"{path}:{line}: not UTF-8 text (a --metrics file of pshybrid "
                         "train?)") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    lines = [(i, x) for i, x in enumerate(text.splitlines(), 1) if x.strip()]
    recs = [(i, _record(line)) for i, line in lines]
    steps, evals, runs = [], [], []  # (run, record); runs: each run's --checkpoint-dir
    for k, (i, rec) in enumerate(recs):
        if rec is None:
            cut = recs[0][1] is not None and "config" in recs[0][1] and (
                k + 1 == len(recs) or (recs[k + 1][1] or {}).get("config") is not None)
            if cut:
                continue
            raise InputError(f"{path}:{i}: not a JSON object (a --metrics file of "
                             "pshybrid train?)")
        if "config" in rec:  # a run's config record
            steps, evals = (_redone(rec, runs, x) for x in (steps, evals))
            ck = (rec["config"] if isinstance(rec["config"], dict) else {}).get("checkpoint_dir")
            runs.append(os.path.normpath(ck) if isinstance(ck, str) else None)
        if rec.get("summary") or "config" in rec:
            continue
        keys = ("step", "auc", "logloss") if rec.get("eval") else ("step", "loss",
                                                                    "samples_per_s")
        if any(rec.get(k, 0) is None for k in keys if k != "auc"):
            continue
        for k in keys:
            if k == "auc" and rec.get(k, 0) is None:  # (one class: the logloss is drawn)
                continue
            if not isinstance(rec.get(k), (int, float)) or isinstance(rec.get(k), bool):
                raise InputError(f"{path}:{i}: key {k!r} missing or not a number")
        (evals if rec.get("eval") else steps).append((len(runs) - 1, rec))
    if not steps and not evals:
        raise InputError(f"{path}: no step or evaluation records (a --metrics file of "
                         "pshybrid train or eval?)")
    return [r for _, r in steps], [r for _, r in evals]


def _redone(rec: dict, runs: list, tagged: list) -> list:
    """``tagged`` (run, record) less what a resumed run's config record ``rec`` (train,
    ``start_step`` s > 0, ``resume`` a step of directory D) redoes: the records after step
    s of the earlier runs that saved into D (a run killed after its last checkpoint logged
    them; the resumed run logs them again). Other runs' records in the file stay."""
    cfg = rec["config"] if isinstance(rec["config"], dict) else {}
    s, at = rec.get("start_step"), cfg.get("resume")
    if rec.get("command") != "train" or type(s) is not int or s <= 0 or not isinstance(at, str):
        return tagged
    at = os.path.normpath(at)
    of = os.path.dirname(at) if safeio.STEP_RE.fullmatch(os.path.basename(at)) else at
    return [(r, x) for r, x in tagged if x["step"] <= s or r < 0 or runs[r] != of]


def _record(line: str) -> dict | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


IMAGE_MAGIC = (b"\x89PNG", b"%PDF", b"<?xml", b"<svg", b"%!PS", b"\xff\xd8\xff", b"GIF8",
               b"II*\x00", b"MM\x00*")  # (and WebP: RIFF....WEBP)
# The formats plot writes: those whose files ``_image`` knows again, so --overwrite can
# replace its own output (matplotlib's svgz, raw and rgba it could not).
FORMATS = ("png", "pdf", "svg", "eps", "ps", "jpg", "jpeg", "gif", "tif", "tiff", "webp")


def _image(path: str) -> str | None:
    """Why the existing ``path`` may not be replaced with --overwrite: not an image."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(12)
    except OSError as e:
        return f"{path}: cannot read: {e.strerror or e}"
    if head.startswith(IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:] == b"WEBP"):
        return None
    return (f"{path} exists and is not an image (PNG, PDF, SVG, PostScript, JPEG, GIF, TIFF, "
            "WebP): not replaced, even with --overwrite; remove it yourself or choose another "
            "name")


def labels(paths: list[str]) -> list[str]:
    """Each run's label: its file name, or its path where two runs share a file name."""
    names = [os.path.basename(p) for p in paths]
    return [p if names.count(n) > 1 else n for p, n in zip(paths, names)]


def plot(paths, out: str, overwrite: bool = False) -> tuple[int, int]:
    """Draw the curves of the ``--metrics`` file(s) ``paths`` (one path or a list) into
    ``out`` (its format from the extension): a new file, or, with ``overwrite``, an
    existing image replaced. Returns the number of (step, evaluation) records drawn, over
    all runs."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    problem = safeio.check_output(out, "", [("RUN", p) for p in paths], existing=lambda p: (
        _image(p) if overwrite else f"{p} exists; pass --overwrite to replace an image"))
    problem = problem or safeio.check_writable_file(out)  # (its directory exists, writable)
    if problem:
        raise InputError(problem if problem.startswith(out) else f"{out}: {problem}")
    runs = [read_metrics(p) for p in paths]  # all checked before anything is drawn
    fig = figure(paths, runs)
    fmt = os.path.splitext(out)[1][1:].lower() or "png"
    known = [f for f in FORMATS if f in fig.canvas.get_supported_filetypes()]
    if fmt not in known:
        raise InputError(f"{out}: unknown image format {fmt!r}: use one of {', '.join(known)}")
    try:
        with safeio.atomic_output(out) as tmp:
            fig.savefig(tmp, format=fmt)
    except OSError as e:
        raise InputError(f"{out}: cannot write: {e.strerror or e}") from None
    return sum(len(s) for s, _ in runs), sum(len(e) for _, e in runs)


def figure(paths: list[str], runs: list):
    """The matplotlib Figure of ``runs`` (``read_metrics`` of each of ``paths``): panels
    loss, samples/s and evaluation (AUC on the left axis, logloss on its twin), one line
    per run in each, colour ``Ci`` for run i."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(NEEDS) from None
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    ax = fig.subplots(1, 3)
    twin = ax[2].twinx()
    for i, (label, (steps, evals)) in enumerate(zip(labels(paths), runs)):
        color = f"C{i % 10}"
        x = [r["step"] for r in steps]
        ax[0].plot(x, [r["loss"] for r in steps], marker=".", color=color, label=label)
        ax[1].plot(x, [r["samples_per_s"] for r in steps], marker=".", color=color)
        ex = [r["step"] for r in evals]
        ax[2].plot(ex, [math.nan if r["auc"] is None else r["auc"] for r in evals],
                   marker="o", color=color)
        twin.plot(ex, [r["logloss"] for r in evals], marker="s", linestyle="--", color=color)
    ax[0].set(title="training loss", xlabel="step", ylabel="logloss")
    ax[1].set(title="throughput", xlabel="step", ylabel="samples/s")
    any_evals = any(evals for _, evals in runs)
    ax[2].set(title="evaluation: AUC (o), logloss (s, dashed)" if any_evals
              else "evaluation (none in these files)", xlabel="step", ylabel="AUC")
    twin.set_ylabel("logloss")
    if len(paths) > 1:
        ax[0].legend(fontsize="small")
    fig.suptitle(os.path.basename(paths[0]) if len(paths) == 1 else f"{len(paths)} runs")
    return fig
