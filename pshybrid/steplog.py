"""What a worker keeps of the training steps between log lines, and the evaluation: the
loss and throughput of each ``--log-every`` window reduced over the workers (``StepLog``;
on a GPU the loss and label sums stay on the device until the window's read-back), the
divergence check, and the exact AUC / logloss of the whole ``--eval-data`` file
(``evaluate``, ``score_rows``: also ``pshybrid eval`` / ``predict``). ``job`` is
``train.Job``."""

from __future__ import annotations

import math
import time

import numpy as np
from mpi4py import MPI

from . import checkpoint, checkpoint_files
from .backend import to_host
from .batches import read_ids
from .data import EVAL_BATCH
from .errors import PshybridError
from .limits import gib
from .metrics import auc, base_rate_logloss, logloss_from_logits
from .timers import PHASES


class TrainingDiverged(PshybridError):
    """The loss became NaN or infinite, or its mean per sample passed ``DIVERGED``."""


# A diverged run's mean loss per sample: 10^6 times an untrained model's (log 2, the loss
# of logit 0). Binary cross-entropy of logit z is at most |z| + log 2: a trained model's
# logits are never near 10^6, a run with --lr 1e30 reached 2e30 and exited 0.
DIVERGED = 1e6 * math.log(2)
STEP_SECONDS_KEPT = 4096  # TrainResult.step_seconds: the first steps' (bounded: long runs)
LOG_KEPT = 10_000  # TrainResult.log: at least the last this many records, at most twice
#                    (--metrics has them all; every one kept grew for good on long runs)


def check_loss(job, loss_sum: float, rows: int, when: str, since: int) -> None:
    """Stop the run if the loss summed over ``rows`` samples is NaN or infinite, or its
    mean per sample is above ``DIVERGED``. ``since``: the step whose parameters gave the
    first of those losses (a checkpoint from it on may hold the diverging parameters)."""
    mean = loss_sum / max(rows, 1)
    if math.isfinite(mean) and mean <= DIVERGED:
        return
    what = f"{mean:.3g} per sample (above 1e6 x log 2 = {DIVERGED:.3g}: diverging)" \
        if math.isfinite(mean) else f"{loss_sum}"
    ck = job.cfg.checkpoint_dir
    try:
        latest = checkpoint_files.read_latest(ck) if ck else None
    except PshybridError:
        latest = None
    if latest and int(latest.removeprefix("step-")) >= since:  # (a checkpoint since then)
        where = (f"{ck}/latest names {latest}, whose parameters (finite) the steps of that "
                 "loss started from: it may diverge again; an earlier step-N, if one is "
                 "kept, or the start is safer to resume from")
    else:
        where = (f"{ck}/latest names the last good checkpoint ({latest})" if latest else
                 f"no checkpoint was written in {ck} yet" if ck else
                 "no checkpoint directory was given")
    raise TrainingDiverged(f"loss is {what} {when} on worker {job.topo.worker_index}: "
                           f"training stopped; {where}")


class StepLog:
    """Loss and throughput over each ``--log-every`` window, reduced over the workers. On a
    GPU the loss and label sums accumulate on the device and are read back once per log
    interval (and before a checkpoint): one device-to-host copy instead of two per step."""

    def __init__(self, job):
        self.job = job
        self.acc = np.zeros(3)  # loss sum, samples, label sum since the last log
        self.dev = None         # GPU: (loss sum, label sum) on the device since the last read
        self.dev_rows = 0       # GPU: the samples of those sums
        self.read_at = job.start  # GPU: the step of the last read (the sums' first loss's)
        self.t_log = self.t_step = time.perf_counter()

    def add(self, done: int, loss_sum, label) -> None:
        job, xp = self.job, self.job.mode.xp
        now = time.perf_counter()
        if job.reporter and len(job.result.step_seconds) < STEP_SECONDS_KEPT:
            job.result.step_seconds.append(now - self.t_step)  # (what --mode auto's trials time)
        self.t_step = now
        if xp is np:
            self.acc += (loss_sum, job.cfg.batch_size, float(label.sum()))
        else:  # kernels queued on the stream: no wait
            # label None: loss_sum is the step's (loss sum, label sum) pair (graphs.DeviceStep)
            sums = (loss_sum if label is None
                    else xp.stack((loss_sum, label.sum())).astype(np.float64))
            self.dev = sums.copy() if self.dev is None else self.dev + sums
            self.dev_rows += job.cfg.batch_size
            self.acc[1] += job.cfg.batch_size
        every = job.cfg.checkpoint_every if job.cfg.checkpoint_dir else 0
        if every and done % every == 0:
            self.read_back(done)
        if done % job.cfg.log_every and done != job.steps:
            return
        self.emit(done, now)

    def flush(self, done: int) -> None:
        """Workers, collectively (the same ``done`` on each): log the steps since the last
        log, if any (a run stopped between logs: its last log is its last step)."""
        if done % self.job.cfg.log_every:
            self.emit(done, time.perf_counter())

    def emit(self, done: int, now: float) -> None:
        """Workers, collectively: the log record of the steps up to ``done``."""
        job = self.job
        self.read_back(done)
        # Wire: Allreduce of 3 doubles (loss sum, samples, labels) over the workers (the
        # buffer call: a first pickled allreduce kept the GIL while it waited, the step
        # timer's thread with it)
        glob = self.acc.copy()
        job.topo.workers.Allreduce(MPI.IN_PLACE, glob, op=MPI.SUM)
        job.totals += glob
        rec = {"step": done, "loss": glob[0] / glob[1],
               "samples_per_s": glob[1] / (now - self.t_log),
               "seconds": {k: job.mode.timers[k] for k in PHASES}}
        if job.mode.stale is not None:  # Wire: see stale.Pipeline.log
            rec["reads"] = job.mode.stale.log(job.topo.workers)
        if job.reporter:
            job.result.log.append(rec)
            if len(job.result.log) > 2 * LOG_KEPT:
                del job.result.log[:-LOG_KEPT]
            job.reporter.step(rec)
        self.acc[:] = 0
        self.t_log = now

    def read_back(self, done: int) -> None:
        """GPU: add the device sums to the log's and check the loss (one D2H, a sync)."""
        if self.dev is not None:
            loss_sum, label_sum = (float(v) for v in to_host(self.dev))
            self.dev = None
            self.job.mode.kernel_timers.fold()  # the copy waited: the phases' device times
            check_loss(self.job, loss_sum, self.dev_rows, f"in the steps up to {done}",
                       self.read_at)
            self.dev_rows = 0
            self.read_at = done
            self.acc += (loss_sum, 0.0, label_sum)

    def pause(self, work, phase: str = "eval") -> float:
        """Run ``work`` (an evaluation, a checkpoint: ``phase``) outside the training clock,
        phases and traffic; -> its seconds."""
        timers = self.job.mode.timers
        t0, before = time.perf_counter(), dict(timers)
        self.job.not_training(work)
        timers.update(before)  # the eval's pulls count as eval, not as training
        elapsed = time.perf_counter() - t0
        timers[phase] += elapsed
        self.t_log += elapsed  # samples/s excludes evaluations and checkpoints
        self.t_step += elapsed
        return elapsed


def together(job) -> None:
    """After an evaluation or a checkpoint: worker 0 ends it alone (the AUC, its report;
    --keep-last's pruning), which the others waited for inside their next step, whose
    --step-timeout ended the job; they wait here, in the call's time, which only warns."""
    job.topo.workers.Barrier()  # Wire: zero-byte barrier over the workers


def save(job, log: StepLog, step: int, stopping: bool = False) -> None:
    """Workers (collective, the servers join through their loop): checkpoint ``step``
    outside the training clock (phase ``checkpoint``); worker 0 says where, its size and
    its seconds (``stopping``: a signal's stop, whose line says so instead)."""
    written = []

    def write():
        written.append(job.save(step))
        if not stopping:
            together(job)

    seconds = log.pause(write, "checkpoint")
    if job.reporter and not stopping:
        size = gib(checkpoint_files.step_bytes(written[0]))
        job.reporter.say(f"checkpoint {written[0]}: {size} in {seconds:.1f} s")


def evaluate(job, step: int, saved: bool = False) -> None:
    """Exact AUC and logloss over the whole eval file, scored by ``score_rows``; worker 0
    reports them (``saved``: checkpoint ``step`` was just written, and gets them too)."""
    allz, ally = score_rows(job, step)
    if allz is not None:
        rec = {"eval": True, "step": step, "auc": auc(allz, ally),
               "logloss": logloss_from_logits(allz, ally), "rows": int(allz.size),
               "base_rate_logloss": base_rate_logloss(float(ally.mean())) if ally.size else None}
        if saved:
            checkpoint.record_evaluation(job.cfg.checkpoint_dir, step, rec, job.cfg.keep_last)
        job.result.evals.append(rec)
        job.reporter.evaluation(rec)


def score_rows(job, step: int):
    """Workers (collective): the model's logits and the labels of every row of
    ``job.evdata``, in row order, as float64 on worker 0; (None, None) on the others."""
    z, y = worker_logits(job, step)
    topo = job.topo
    if topo.n_workers == 1:  # (its rows are all of them: no copy beside them)
        return z, y
    counts = np.array(topo.workers.allgather(z.size))
    root = topo.worker_index == 0
    allz, ally = (np.empty(counts.sum()), np.empty(counts.sum())) if root else (None, None)
    # Wire: Gatherv of logits and labels (8 B each per row) to worker 0; all workers wait.
    topo.workers.Gatherv(z, [allz, counts, MPI.DOUBLE] if root else None, 0)
    topo.workers.Gatherv(y, [ally, counts, MPI.DOUBLE] if root else None, 0)
    return allz, ally


def worker_logits(job, step: int):
    """Workers: the model's logits and the labels (float64) of this worker's rows of
    ``job.evdata``. The rows go in batches of ``EVAL_BATCH`` from row 0, worker w taking
    batches ``[C*w/W, C*(w+1)/W)`` of the C: a row is scored in the same batch whatever the
    worker count, so its logit is the same to the bit (a matrix product's rounding depends
    on its rows), and worker w's rows follow worker w - 1's."""
    mode, topo, ev = job.mode, job.topo, job.evdata
    mode.begin(step)  # ps: pull the current dense weights
    W, w, n = topo.n_workers, topo.worker_index, ev.n_rows
    C = -(-n // EVAL_BATCH)
    a, b = (min(n, C * k // W * EVAL_BATCH) for k in (w, w + 1))
    z, y = np.empty(b - a), np.empty(b - a)  # (float64, filled batch by batch)
    for s in range(a, b, EVAL_BATCH):
        e = min(b, s + EVAL_BATCH)
        label, dense, ids, *bags = read_ids(ev, [(s, e)], job.layout.offsets)
        dense = mode.xp.asarray(dense.astype(job.cfg.dtype))  # GPU worker: H2D
        batch = mode.prepare(ids)
        z[s - a:e - a] = to_host(job.model.forward(dense, mode.lookup(batch), *bags))
        batch.release()
        y[s - a:e - a] = label
    return z, y
