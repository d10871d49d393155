"""``--mode auto``'s trial: a few real training steps of the cost model's leading
alternatives, timed, and the fastest measured one picked, the same on every rank.

The model prices every alternative from its parts; a real step also pays what the parts
miss (a server woken from its back-off sleep, rows scattered over a large table, a busy
node's time slices). So the leaders of the model's table, those memory allows, are each
trained for ``WARM`` + ``--auto-trial-steps`` steps through the library's own training
path (``train.train``, handed in by the caller: this layer does not import it) on the same
communicator and data, with no evaluation, checkpoint, metrics file or output; each step
after the warm-up is timed on the reporter, the median is shared (the largest over the
ranks: only the reporter holds one) and the alternative with the least measured seconds
per sample (median step / (workers * batch): placements change the workers) is chosen;
those within ``TIE`` of it count as tied, and the first of them in the table's fixed order
(``planner.alternatives``: hybrid before ps before allreduce, fewer replicated rows first)
is chosen, so that a few percent of a busy node's noise does not flip the pick run to run.
Nothing a trial trains persists, and the real run starts at step 0 of the data's order
as before (the data is read by position, never consumed).
"""

from __future__ import annotations

import io
import statistics
import time
from dataclasses import replace

from mpi4py import MPI

WARM = 3      # untimed steps of each trial (first-use compilation, page faults, caches)
LEADERS = 3   # the model's best alternatives that are always tried
FAMILY = 3.0  # ... and each (mode, placement)'s best predicted within this factor
TIE = 0.05    # measured within this share of the fastest per sample: tied (the first wins)


def per_sample(row: dict, batch: int, step: float) -> float:
    """Seconds per sample of ``row``'s alternative at ``step`` seconds per step."""
    return step / (row["workers"] * batch)


def candidates(rows: list[dict], leaders: int = LEADERS, family: float = FAMILY) -> list[dict]:
    """The rows to try, in the model's order: its ``leaders`` best that are not refused,
    and the best of each family, a mode and placement (hybrid dedicated, hybrid colocated,
    ps dedicated, ...; its --replicate-rows variants compete inside it), predicted within
    ``family`` times the best's samples per second. (Why each family: the model can price a
    family's best just behind another family's, within its error, and an alternative that
    is never tried is never picked; docs/benchmarks.md.)"""
    ok = sorted((r for r in rows if r["refused"] is None), key=lambda r: -r["samples_per_s"])
    if not ok:
        return []
    keep = {r["key"] for r in ok[:leaders]}
    firsts = {}
    for r in ok:  # best first: the first row of each family is its best
        firsts.setdefault((r["mode"], r.get("placement")), r)
    keep |= {r["key"] for r in firsts.values()
             if r["samples_per_s"] * family >= ok[0]["samples_per_s"]}
    return [r for r in ok if r["key"] in keep]


def trial_steps(cfg, n_rows: int | None, ranks: int, start: int = 0) -> int:
    """The timed steps of each trial: ``--auto-trial-steps``, at most the steps the run has
    left after ``start`` (a resumed checkpoint's step) of its own (``--steps``; with
    ``--epochs``, the epochs' steps with every rank a worker, the fewest any alternative
    has), so a trial never trains longer than the run it prepares."""
    run = cfg.steps if cfg.epochs is None else \
        cfg.epochs * max((n_rows or 0) // (ranks * cfg.batch_size), 1)
    return max(min(cfg.auto_trial_steps, run - start), 0)


def trial_config(cfg, steps: int):
    """``cfg`` (already one alternative's options) as a trial: ``WARM + steps`` steps from
    step 0, and nothing written: no evaluation, checkpoint, resume (nor a start from one:
    --init-from), metrics, TensorBoard events or progress; ``data`` None: the trial reads
    the dataset ``measure`` is given (--data as opened by the probe; ``train`` refuses
    both)."""
    return replace(cfg, steps=WARM + steps, epochs=None, data=None, eval_data=None, eval_every=0,
                   checkpoint_dir=None, checkpoint_every=0, keep_last=0, resume=None,
                   init_from=None, metrics=None, tensorboard=None, progress="none",
                   auto_trial_steps=0)


def measure(rows: list[dict], configure, train_fn, comm, dataset, steps: int):
    """Collective over ``comm``: {key: median seconds of a timed step} of each candidate
    (``configure(row)`` -> its TrainConfig), the same on every rank; None where a signal
    stopped a trial (a stop request: the run, not its trials, takes it; ``preempt``)."""
    out = {}
    for row in candidates(rows):
        r = train_fn(trial_config(configure(row), steps), comm, dataset=dataset,
                     out=io.StringIO())
        if r.preempted is not None:  # (the same on every rank: ``Preemption.outcome``)
            return None
        timed = r.step_seconds[WARM:]
        mine = statistics.median(timed) if timed else 0.0  # only the reporter holds steps
        # Wire: Allreduce(MAX) of one double, every rank: the reporter's median to all.
        out[row["key"]] = comm.allreduce(mine, op=MPI.MAX)
    return out


def settle(rows: list[dict], configure, train_fn, comm, dataset, steps: int, batch: int):
    """Collective: (the key of the chosen alternative, or None where a signal stopped the
    trials, seconds the trials took); each row of ``rows`` (in the table's fixed order)
    gains ``measured_step`` (seconds, or None where not tried). The choice: the first row
    measured within ``TIE`` of the least seconds per sample."""
    t0 = time.perf_counter()
    measured = measure(rows, configure, train_fn, comm, dataset, steps)
    if measured is None:
        return None, time.perf_counter() - t0
    for r in rows:
        r["measured_step"] = measured.get(r["key"])
    tried = [(r, per_sample(r, batch, r["measured_step"])) for r in rows
             if r["measured_step"] is not None]
    fastest = min(t for _, t in tried)
    best = next(r for r, t in tried if t <= fastest * (1 + TIE))
    return best["key"], time.perf_counter() - t0
