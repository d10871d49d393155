"""The subprocesses of the GPU check (bench/gpu_check.py, bench/gpu_speed.py), all under one
time budget: ``run_limited`` runs a command under ``timeout``, ``train_job`` one
``pshybrid train --device cuda`` job under mpiexec and returns its ``--metrics`` records, and
``steady`` reads the steady-state rate and the summary out of those records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_T0 = time.time()  # the check's start: the budget counts from here
_BUDGET = [420]  # seconds for all subprocesses; gpu_check.main sets it (set_budget)


def set_budget(seconds: int) -> None:
    """The seconds from the check's start within which every subprocess must end."""
    _BUDGET[0] = seconds


def budget() -> int:
    return _BUDGET[0]


def run_limited(label: str, cmd: list[str], limit: float, until: float | None = None, **kw):
    """``subprocess.run(cmd)`` under ``timeout -k 10`` (mpiexec cleans up its ranks on
    SIGTERM) with ``limit`` seconds, cut to what is left of the budget and, given ``until``
    (a ``time.time()``: a step's own deadline), to what is left before it; None (reported)
    when it was not started for want of time or ran out of it."""
    now = time.time()
    left = int(min(limit, _BUDGET[0] - (now - _T0), (until or float("inf")) - now))
    if left < 20:
        why = f"{_BUDGET[0]}s for the check" + ("" if until is None else " or this step's own")
        print(f"  {label}: NOT RUN (the time budget is spent: {why})")
        return None
    try:
        return subprocess.run(["timeout", "-k", "10", str(left)] + cmd, timeout=left + 30,
                              capture_output=True, text=True, cwd=ROOT, **kw)
    except subprocess.TimeoutExpired:
        print(f"  {label}: TIMED OUT after {left}s")
        return None


def train_job(mpi: dict, label: str, ranks: int, options: list[str], metrics: str,
              limit: float, until: float | None = None) -> list[dict] | None:
    """``mpiexec -n ranks python -m pshybrid train --device cuda *options --metrics
    metrics`` under ``run_limited``; its metrics records, or None when it did not run, ran
    out of time or failed (a failure prints its exit status and output tails)."""
    cmd = [mpi["mpiexec"], "-n", str(ranks), sys.executable, "-m", "pshybrid", "train",
           "--device", "cuda", *options, "--metrics", metrics]
    p = run_limited(label, cmd, limit, until)
    if p is None:
        return None
    if p.returncode:
        print(f"  {label}: FAILED (exit {p.returncode})\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
        return None
    try:
        with open(metrics) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:  # exit 0 without its metrics: a failed run too
        print(f"  {label}: FAILED (its metrics file: {type(e).__name__}: {e})")
        return None


def steady(recs: list[dict]) -> tuple[float, dict]:
    """(samples/s of the last logged interval: the steady state, the run's summary record)
    from a run's metrics records (interval records have ``loss`` and ``samples_per_s``;
    the summary has ``summary``); ValueError when either is missing."""
    steps = [r for r in recs if "loss" in r and "samples_per_s" in r and not r.get("summary")]
    summaries = [r for r in recs if r.get("summary")]
    if not steps or not summaries:
        raise ValueError(f"metrics without {'a logged interval' if not steps else 'a summary'}"
                         f" ({len(recs)} records)")
    return float(steps[-1]["samples_per_s"]), summaries[-1]
