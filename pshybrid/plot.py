"""``pshybrid plot RUN.jsonl OUT.png``: the curves of a ``--metrics`` file (training loss,
samples/s, and the evaluations' AUC and logloss, against the step) in one image.

Needs matplotlib (the ``plot`` or ``bench`` extra). The file is checked whole before
anything is drawn; the image is written atomically (a failed run leaves nothing).
"""

from __future__ import annotations

import json
import os

from . import safeio
from .errors import ConfigError, InputError

NEEDS = "pshybrid plot needs matplotlib: pip install 'pshybrid[plot]'"


def read_metrics(path: str) -> tuple[list[dict], list[dict]]:
    """(step records, evaluation records) of a ``--metrics`` file, in file order; an
    InputError names the file and line of anything else."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    steps, evals = [], []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise InputError(f"{path}:{i}: not a JSON object (a --metrics file of "
                             "pshybrid train?)")
        if rec.get("summary") or "config" in rec:  # the summary, a run's config record
            continue
        keys = ("step", "auc", "logloss") if rec.get("eval") else ("step", "loss",
                                                                    "samples_per_s")
        for k in keys:
            if not isinstance(rec.get(k), (int, float)) or isinstance(rec.get(k), bool):
                raise InputError(f"{path}:{i}: key {k!r} missing or not a number")
        (evals if rec.get("eval") else steps).append(rec)
    if not steps:
        raise InputError(f"{path}: no step records (a --metrics file of pshybrid train?)")
    return steps, evals


IMAGE_MAGIC = (b"\x89PNG", b"%PDF", b"<?xml", b"<svg", b"%!PS", b"\xff\xd8\xff")


def _image(path: str) -> str | None:
    """Why the existing ``path`` may not be replaced with --overwrite: not an image."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as e:
        return f"{path}: cannot read: {e.strerror or e}"
    if head.startswith(IMAGE_MAGIC):
        return None
    return (f"{path} exists and is not an image (PNG, PDF, SVG, PostScript, JPEG): not "
            "replaced, even with --overwrite; remove it yourself or choose another name")


def plot(path: str, out: str, overwrite: bool = False) -> tuple[int, int]:
    """Draw ``path``'s curves into ``out`` (its format from the extension): a new file, or,
    with ``overwrite``, an existing image replaced. Returns the number of (step,
    evaluation) records drawn."""
    problem = safeio.check_output(out, "", [("RUN", path)], existing=lambda p: (
        _image(p) if overwrite else f"{p} exists; pass --overwrite to replace an image"))
    if problem:
        raise InputError(problem)
    steps, evals = read_metrics(path)
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(NEEDS) from None
    fmt = os.path.splitext(out)[1][1:].lower() or "png"
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    ax = fig.subplots(1, 3)
    x = [r["step"] for r in steps]
    ax[0].plot(x, [r["loss"] for r in steps], marker=".")
    ax[0].set(title="training loss", xlabel="step", ylabel="logloss")
    ax[1].plot(x, [r["samples_per_s"] for r in steps], marker=".")
    ax[1].set(title="throughput", xlabel="step", ylabel="samples/s")
    ex = [r["step"] for r in evals]
    ax[2].plot(ex, [r["auc"] for r in evals], marker="o", label="AUC")
    twin = ax[2].twinx()
    twin.plot(ex, [r["logloss"] for r in evals], marker="s", color="tab:red", label="logloss")
    ax[2].set(title="evaluation" if evals else "evaluation (none in this file)",
              xlabel="step", ylabel="AUC")
    twin.set_ylabel("logloss")
    fig.suptitle(os.path.basename(path))
    if fmt not in fig.canvas.get_supported_filetypes():
        raise InputError(f"{out}: unknown image format {fmt!r}: use one of "
                         f"{', '.join(sorted(fig.canvas.get_supported_filetypes()))}")
    try:
        with safeio.atomic_output(out) as tmp:
            fig.savefig(tmp, format=fmt)
    except OSError as e:
        raise InputError(f"{out}: cannot write: {e}") from None
    return len(steps), len(evals)
