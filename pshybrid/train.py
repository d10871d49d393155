"""The training loop: ``setup``, ``loop`` (one piece of code for every mode), ``finish``.

Step ``t`` trains on the global batch of rows ``[t*W*b, (t+1)*W*b)``; worker ``w`` takes
rows ``[t*W*b + w*b, t*W*b + (w+1)*b)``. The loss is the mean over the global batch, so
every worker scales its gradients by ``1/(W*b)`` and the sums over workers (Allreduce,
Accumulate, Allgather) are exactly the single-process gradient with batch ``W*b`` (BSP).

``--device cuda``: each worker pins GPU ``local_rank % device_count`` and holds the dense
parameters, the batch's dense features and labels, and every activation there (CuPy); the
mode moves embedding rows and gradients over PCIe (``modes``, ``docs/gpu.md``). Servers and
the data pipeline stay on the CPU."""

from __future__ import annotations

import gc
import resource
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from . import auto, checkpoint, checkpoint_files
from .backend import to_device
from .config import TrainConfig, from_dict, to_dict
from .batches import (BatchPlan, Upcoming, global_batch, prefetch, training_data,
                      worker_batches)
from .files import not_trained_on, open_dataset, scan_keys, validate_unscanned
from .graphs import DeviceStep
from .devices import cuda_aware_mpi, pick_device
from .errors import ConfigError, InputError, PshybridError
from .layers import ParamSpace, bce_with_logits
from .models import build_model, checked_demb
from .modes import MODES, build_mode
from .modes.hot import hottest_rows
from .optim import Optimizer, Schedule
from .preempt import CAUGHT, Preemption, notice
from .preflight import lock_checkpoint_dir, preflight, total_steps
from .registry import is_colocated
from .report import Reporter, banner, counted
from .summary import summarize
from .stall import FIRST, Pulse, Watch, step_watch
from .steplog import (StepLog, TrainingDiverged, check_loss, evaluate, save,  # noqa: F401
                      score_rows, together, worker_logits)
from .threads import rank_cores
from .topology import SHARED_MEMORY, Topology
from .transport import abort_on_error, agree, same_arguments


@dataclass
class TrainResult:
    role: str
    log: list = field(default_factory=list)  # reporter: the last logged steps (steplog.LOG_KEPT)
    evals: list = field(default_factory=list)    # reporter only: one dict per evaluation
    step_seconds: list = field(default_factory=list)  # reporter: the first steps' wall times
    summary: dict = field(default_factory=dict)  # reporter only
    preempted: int | None = None                 # the step a signal stopped the run at
    signal: int = 0                              # ... and that signal's number
    metrics_failed: str | None = None            # reporter: why --metrics stopped (a full disk)
    dense: np.ndarray | None = None              # workers, when collect=True
    table: np.ndarray | None = None              # workers, when collect=True


def train(cfg: TrainConfig, comm: MPI.Comm, dataset=None, collect: bool = False,
          out=None, on_step=None) -> TrainResult:
    """Train per ``cfg`` on ``comm`` (collective; the options are validated as on the
    command line). ``dataset``: an object with ``schema`` and ``rows(start, stop)``
    (``docs/data.md``; default: the synthetic stream seeded by ``cfg.seed``). ``collect``:
    return the final dense parameters and the whole fused table on workers. ``on_step``:
    called on each worker after each step with the number of steps done.

    Abort-on-error, as the command line: a user error found on every rank (bad options,
    files, ids) raises the same ``PshybridError`` on every rank; any other failure on any
    rank prints the rank and the error and ends the whole job (``MPI_Abort``), never a hang.
    """
    if not isinstance(cfg, TrainConfig):  # the same on every rank: no rank is left waiting
        raise ConfigError(f"train: cfg must be a pshybrid.config.TrainConfig, got "
                          f"{type(cfg).__name__} (TrainConfig(**d), or "
                          "config.from_dict(TrainConfig, d, 'where') for a checked dict of "
                          "options)", collective=True)
    CAUGHT.install()  # from now on a signal is a request to stop (``preempt``)
    try:
        return _train(cfg, comm, dataset, collect, out, on_step)
    finally:
        CAUGHT.uninstall()


def _train(cfg, comm, dataset, collect, out, on_step) -> TrainResult:
    with abort_on_error(comm):
        try:
            err = None
            cfg = from_dict(TrainConfig, to_dict(cfg), "TrainConfig",
                            finite_data=getattr(dataset, "n_rows", None) is not None)
        except ConfigError as e:   # (a registry differing between ranks: not the same verdict)
            err = e
        agree(comm, err)  # Wire: verdict allgather; every rank raises, or none
        # Wire: allgather of the options (an MPMD launch may give ranks others: they part)
        same_arguments(comm, "train", "rank", "every rank is given the same options",
                       **to_dict(cfg))
        planned = None
        if MODES[cfg.mode].chosen:  # --mode auto: probe, price, pick; the same on every rank
            cfg, planned, dataset = auto.resolve(cfg, comm, dataset, out or sys.stdout,
                                                 trial=train)  # trials: train itself
        spec = MODES[cfg.mode]
        topo = Topology.create(comm, cfg.servers if spec.needs_servers else 0,
                               need_servers=spec.needs_servers,
                               colocated=is_colocated(cfg.placement))
        job, opened, out = None, [], out or sys.stdout
        try:
            data, evdata = _open_data(cfg, topo, dataset, opened)
            idle = preflight(cfg, topo, data, evdata, out, collect)  # resumed, nothing to do
            if idle and evdata is None:
                return TrainResult(topo.role)
            if cfg.checkpoint_dir and not idle:  # released by ``opened``'s close below
                lock_checkpoint_dir(cfg, topo, out, opened)
            if topo.rank == topo.worker_ranks[0] and not idle:
                _announce(cfg, topo, data, evdata, out, planned is not None)
            job = setup(cfg, topo, data, evdata, out)
            job.auto = planned
            if idle:  # --eval-data: evaluate the resumed model
                return score_only(job)
            job.stop, job.pulse = Preemption(topo), Pulse(topo, cfg.step_timeout)
            if not topo.is_worker:
                with job.pulse.watching():
                    job.mode.serve(job.start, job.save, job.stop.poll)
            else:
                loop(job, on_step)
                if collect:
                    job.result.dense = job.mode.full_dense()
                    job.result.table = job.mode.full_table()
            job.stop.close()
            result = finish(job)
            job.pulse.close()
            result.preempted, result.signal = job.stop.outcome(result.preempted)
            return result
        finally:
            if job is not None:
                _release(job)
            gc.unfreeze()  # a later run in this process (tests, benchmarks) may collect them
            for d in opened:
                d.close()
            topo.free()


def _release(job: Job) -> None:  # a run's end, also after an error (collective: as topo.free)
    if job.stop is not None:
        job.stop.close(complete=False)  # an error: drop the agreement in flight
    if job.device is not None:
        job.device.close()
    if job.watch is not None:
        job.watch.close()
    if job.pulse is not None:
        job.pulse.free()  # (an error: after close, nothing)
    if job.reporter:
        job.result.metrics_failed = job.reporter.close_file()


@dataclass
class Job:
    """Everything ``setup`` builds for one run."""

    cfg: TrainConfig
    topo: Topology
    data: object
    evdata: object
    model: object
    layout: object    # schema.FusedTable
    params: ParamSpace
    mode: object      # modes.Mode
    plan: BatchPlan
    steps: int        # the step count to reach
    start: int        # the step a resumed run starts from
    reporter: Reporter | None
    t_begin: float
    result: TrainResult = None
    stop: Preemption | None = None  # a signal -> stop at a step boundary (``loop``)
    t_start: float = 0.0
    totals: np.ndarray = field(default_factory=lambda: np.zeros(3))  # loss, samples, labels
    auto: dict | None = None  # --mode auto: the decision (auto.resolve), into the summary
    device: DeviceStep | None = None  # GPU workers: the step's device work (``graphs``)
    untrained: dict = field(default_factory=dict)  # bytes moved by start-up and evaluations
    watch: Watch | None = None  # workers: the time limit on a step (``--step-timeout``)
    pulse: Pulse | None = None  # the servers' watch on the workers' processes

    def bytes_moved(self) -> dict:
        """The mode's byte counters so far (not ``reads``: the training reads' own counts)."""
        return {k: v for k, v in self.mode.traffic().items() if not isinstance(v, dict)}

    def not_training(self, work) -> None:
        """Run ``work`` (an evaluation), its traffic counted apart from training's."""
        before = self.bytes_moved()
        work()
        for k, v in self.bytes_moved().items():
            self.untrained[k] = self.untrained.get(k, 0) + v - before.get(k, 0)

    def trained_traffic(self) -> dict:
        """This rank's bytes moved by the training steps, by kind (and ``reads``)."""
        return {**self.mode.traffic(), **{k: v - self.untrained.get(k, 0)
                                          for k, v in self.bytes_moved().items()}}

    def save(self, step: int) -> str:
        """Collective: write checkpoint ``step`` (servers join through their loop), with
        worker 0's evaluation of that step where it ran before (a signal's stop after an
        evaluated step: the loop's checkpoints come before their evaluation)."""
        ev = next((e for e in self.result.evals[-1:] if e["step"] == step), None)
        scanned = [k for d in (self.data, self.evdata) for k in scan_keys(d)]
        return checkpoint.save(self.cfg.checkpoint_dir, step, self.cfg, self.topo, self.mode,
                               self.params, self.data.schema, getattr(self.data, "n_rows", None),
                               ev, scanned)


def setup(cfg: TrainConfig, topo: Topology, data, evdata, out, score: bool = False) -> Job:
    """Model, parameters, mode (its tables on the servers), resume; collective. ``score``:
    for scoring only, the optimizers keep no state (plain SGD) and none is loaded."""
    t_begin = time.perf_counter()
    params = ParamSpace()
    model, layout = build_model(cfg.model, data.schema, cfg.embedding_dim, cfg.mlp, params,
                                cfg.dtype, cfg.cross_layers, cfg.pooling, cfg.bottom_mlp)
    if cfg.device == "cuda" and cfg.cuda_graphs == "on" and data.schema.multi_hot:
        raise ConfigError("--cuda-graphs on: the data has multi-hot fields, whose pooling "
                          "differs batch by batch and cannot be captured; use auto or off",
                          collective=True)  # (every rank reads the same schema)
    xp = _use_gpu(topo) if cfg.device == "cuda" else np
    params.build(xp, np.dtype(cfg.dtype), cfg.seed)
    plan = BatchPlan(getattr(data, "n_rows", None), global_batch(cfg, topo.n_workers),
                     cfg.shuffle, cfg.seed)
    hot = (hottest_rows(data, plan, layout, cfg.replicate_rows)
           if cfg.replicate_rows and topo.is_worker else None)
    steps = cfg.epochs * plan.steps_per_epoch if cfg.epochs else cfg.steps
    opt = cfg.stateless() if score else cfg  # (servers: the schedule's factors too)
    rule = dict(l2=opt.l2, beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps,
                schedule=Schedule(cfg.lr_schedule, cfg.warmup_steps, steps),
                steps_before=checkpoint_files.steps_before(cfg))
    mode = build_mode(cfg.mode, topo, layout, params,
                      Optimizer(opt.sparse_optimizer, cfg.sparse_lr, **rule),
                      Optimizer(opt.dense_optimizer, cfg.dense_rate, **rule), cfg.seed,
                      bucket_bytes=int(cfg.bucket_mb * 2**20),
                      shared_memory=SHARED_MEMORY[cfg.shared_memory],
                      cuda_aware=xp is not np and cuda_aware_mpi(cfg.cuda_aware)[0],  # or staged
                      hot_rows=hot, consistency=cfg.consistency, cache_rows=cfg.cache_rows,
                      apply_threads=cfg.server_threads)  # None: one per core of the rank
    reporter = (Reporter(cfg, out, topo.n_workers, steps, mode.sparse.opt.lr_at,
                         plan.steps_per_epoch)
                if topo.rank == topo.worker_ranks[0] else None)
    begin = cfg.resume or cfg.init_from  # (--init-from: its state, and a new run at step 0)
    loaded, took = checkpoint.load(begin, cfg, topo, mode, params, data.schema, score)
    start = 0 if cfg.init_from else loaded
    if reporter:
        reporter.header("eval" if score else "train", start, topo.n_workers, topo.n_servers)
    if topo.is_worker:
        mode.ready()
    if reporter and begin:
        reporter.loaded(begin, loaded, "eval" if score else "resume" if cfg.resume else "init",
                        *took)
    job = Job(cfg, topo, data, evdata, model, layout, params, mode, plan, steps, start, reporter,
              t_begin, TrainResult(topo.role))
    if xp is not np and topo.is_worker and not data.schema.multi_hot:
        job.device = DeviceStep(xp, model, params, cfg.dtype, cfg.batch_size,
                                data.schema.n_sparse, layout.table.dim, data.schema.n_dense,
                                1.0 / global_batch(cfg, topo.n_workers),
                                graphs=cfg.cuda_graphs != "off")
    # Little cyclic garbage in the steady state: the start-up objects leave every later GC pass;
    # only the young are collected first (a full pass walks all, torch's too, to find a few).
    gc.collect(1)
    gc.freeze()
    # Wire: zero-byte barrier over every rank: the clocks of the run (its seconds, each rank's
    # phase timers) start together, so worker 0's longer start-up (its reporter: --metrics,
    # --tensorboard) is start-up, not the other workers' first Allreduce wait
    topo.world.Barrier()
    job.t_start = time.perf_counter()
    return job


def _announce(cfg, topo, data, evdata, out, auto: bool) -> None:
    """Worker 0, before the tables are built: the run's plan (``report.banner``)."""
    n_rows = getattr(data, "n_rows", None)
    out.write(banner(cfg, topo, data.schema, total_steps(cfg, n_rows, topo.n_workers), n_rows,
                     getattr(data, "compression", None), getattr(evdata, "n_rows", 0), auto,
                     getattr(data, "n_ids", None)))
    out.flush()


def _open_data(cfg, topo, dataset, opened):
    """Open and validate --data and --eval-data on every rank (workers scan their share of
    the rows) with one shared verdict, before the first step. Returns (train, eval)."""
    err = data = evdata = None
    try:
        skip = checkpoint_files.scanned_before(cfg.resume or cfg.init_from)
        data = training_data(cfg, dataset, opened)
        if cfg.eval_data:
            if dataset is None and cfg.data:
                not_trained_on(cfg.eval_data, cfg.data)
            evdata = open_dataset(cfg.eval_data)
            opened.append(evdata)
            why = data.schema.difference(evdata.schema, "the training data", cfg.eval_data)
            if why is not None:
                raise InputError(f"{cfg.eval_data}: its fields differ from the training "
                                 f"data's: {why}")
        G = global_batch(cfg, topo.n_workers)
        for d in (data, evdata):
            n = getattr(d, "n_rows", None)
            if n is None:
                continue
            if d is data and n < G:
                W = counted(topo.n_workers, "worker")
                raise InputError(f"{getattr(d, 'path', 'the dataset')}: {counted(n, 'row')}"
                                 f", fewer than one global batch ({W} x --batch-size "
                                 f"{cfg.batch_size} = {G})")
            if topo.is_worker and hasattr(d, "validate"):  # each worker scans its share
                W, w = topo.n_workers, topo.worker_index  # (a resumed run's files: skipped)
                validate_unscanned(d, n * w // W, n * (w + 1) // W, skip)
    except PshybridError as e:
        err = e
    agree(topo.world, err)  # Wire: allgather of each rank's verdict; everyone raises the same
    return data, evdata


def _use_gpu(topo):
    """``--device cuda``: workers pin GPU ``local_rank % device_count`` and build the CUDA
    kernels; servers stay on the CPU. Returns the workers' array module (cupy; numpy on
    servers). No visible GPU, or kernels that do not build, fail every rank the same way."""
    err, xp = None, np
    if topo.is_worker:
        try:
            device = pick_device("cuda", topo.local_rank)  # ConfigError without a GPU
            import cupy

            from . import cuda

            cupy.cuda.Device(int(device.split(":")[1])).use()
            cuda.module()  # NVRTC compile now (counted as startup), not in the first step
            xp = cupy
        except Exception as e:  # noqa: BLE001 - becomes the shared verdict below
            err = e if isinstance(e, PshybridError) else PshybridError(
                f"--device cuda on worker {topo.worker_index}: {type(e).__name__}: {e}")
    agree(topo.world, err)  # Wire: allgather of each rank's verdict; everyone raises the same
    return xp


# -- the loop (workers) --------------------------------------------------------------------

def loop(job: Job, on_step=None) -> None:
    """Workers: steps ``job.start .. job.steps``, logging, evaluating and checkpointing; a
    SIGUSR1, SIGTERM or SIGINT reaching any rank stops every worker at the same step
    boundary, after a checkpoint with --checkpoint-dir (``preempt``)."""
    cfg, mode = job.cfg, job.mode
    job.untrained = job.bytes_moved()  # start-up's (the hot rows' first pull)
    log = StepLog(job)
    batches = _batches(job)
    stop = job.stop
    if mode.stale is not None:  # --consistency ssp:K/asp, --cache-rows: one batch ahead
        batches = mode.stale.ahead(batches, mode.prepare)
    upcoming = Upcoming(batches, mode)
    # (the topology and timers, not job: job.watch would make a cycle that gc.freeze keeps,
    # and a run's arrays would outlive it: train called again, auto trials)
    watch = job.watch = step_watch(job.topo, job.cfg.step_timeout, mode.timers, job.pulse)
    for step in range(job.start, job.steps):
        label, dense, ids, bags, batch = upcoming.take()
        # the next batch is made while the servers apply this step (stale: made already)
        idle = upcoming.make if step + 1 < job.steps and mode.stale is None else None
        done = step + 1
        # (the first: compiles; the log's Allreduce too: a worker stopped after the step's
        # collective calls leaves the others waiting there at a --log-every step)
        with watch.inside("a step", step, ends=True if step > job.start else FIRST):
            loss_sum = _step(job, step, label, dense, batch, bags, idle)
            log.add(done, loss_sum, None if job.device is not None else label)
        if on_step is not None:
            on_step(done)
        # the checkpoint before the evaluation: one that fails (its memory, its file) ends
        # the run with the steps kept; the evaluation is added to the checkpoint after
        saved = cfg.checkpoint_dir and ((cfg.checkpoint_every and done % cfg.checkpoint_every
                                         == 0) or done == job.steps)
        if saved:
            mode.request_checkpoint(done)
            with watch.inside("a checkpoint", done, ends=False):  # (its length: the disk's)
                save(job, log, done)
        if job.evdata is not None and ((cfg.eval_every and done % cfg.eval_every == 0)
                                       or done == job.steps):
            with watch.inside("an evaluation", done, ends=False):  # (its length: the file's)
                log.pause(lambda: (evaluate(job, done, saved), together(job)))
        if done < job.steps and stop.stop():  # collective: every worker stops here
            upcoming.drop()
            _preempted(job, done, log)
            break
    if job.start >= job.steps and job.evdata is not None:  # resumed at the end (collect=True)
        log.pause(lambda: evaluate(job, job.start))


def _preempted(job: Job, done: int, log) -> None:
    """A signal stopped the workers after step ``done``: checkpoint it (with
    --checkpoint-dir, unless the loop just did), say so."""
    log.flush(done)  # the steps since the last log (collective over the workers)
    every = job.cfg.checkpoint_every
    if job.cfg.checkpoint_dir and not (every and done % every == 0):
        log.read_back(done)  # GPU: a diverged loss stops the run before it is saved
        job.mode.request_checkpoint(done)
        save(job, log, done, stopping=True)
    job.result.preempted = done
    if job.reporter:
        job.reporter.say(notice(job.stop.agreed, done, job.cfg.checkpoint_dir))


def _batches(job: Job):
    """This worker's batches from ``job.start`` on: (label, dense, global ids, Batch or None)
    in the model's array module. Read ``depth`` batches ahead on a data thread only where the
    rank has a spare core (else that thread slows the step); the thread also prepares each
    step's Batch (dedup, owners, datatypes) where MPI allows calls from it."""
    cfg, topo, mode = job.cfg, job.topo, job.mode
    b, offset = cfg.batch_size, topo.worker_index * cfg.batch_size
    depth = cfg.prefetch if cfg.prefetch is not None else (2 if rank_cores() >= 2 else 0)
    ahead = depth > 0 and (not mode.prepare_uses_mpi
                           or MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    dtype, xp = np.dtype(cfg.dtype), mode.xp
    n = max(job.steps - job.start, 0)
    # ids: fused-table rows; buffers reused (a ring of depth + 3 batches, see worker_batches)
    rows = worker_batches(job.data, job.plan, job.start, n, offset, b, job.layout, depth)

    def produce(i):
        label, dense, ids, *bags = next(rows)  # bags: [lengths] with multi-hot fields
        return label, dense, ids, bags, (mode.prepare(ids) if ahead else None)

    for label, dense, ids, bags, batch in prefetch(produce, n, depth):
        if job.device is not None:  # GPU: packed with the rows into the step's one copy
            yield label, dense, ids, bags, batch
            continue
        # GPU workers: H2D of the batch's dense features and labels (async, pinned staging)
        yield to_device(xp, label, dtype), to_device(xp, dense, dtype), ids, bags, batch


def _step(job: Job, step: int, label, dense, batch, bags=(), idle=None):
    """One training step (0-based ``step``): pull, forward, backward, update. Returns the
    worker's loss sum: a float, checked, on CPU; on a GPU a device scalar (with
    ``job.device``: the (loss sum, label sum) pair) that ``steplog.StepLog`` reads back
    (and checks) once per log interval and before a checkpoint."""
    mode, model, params = job.mode, job.model, job.params
    mode.begin(step)
    if job.device is not None:  # GPU: one copy in (the rows pulled straight into its
        # pinned buffer), the step's kernels (one graph); their device time in fwd_bwd
        rows = mode.unique_rows(batch, job.device.rows_out(batch.unique.size))
        loss_sum, batch.dev_sums = job.device.run(label, dense, rows, batch.inverse,
                                                  mode.kernel_timers)
        mode.update(batch, None, step + 1, idle)
        batch.release()
        return loss_sum  # (loss sum, label sum) on the device (``steplog``)
    emb = mode.lookup(batch)
    with mode.kernel_timers.time("fwd_bwd"):  # GPU: CUDA events (device time, no wait)
        logits = model.forward(dense, emb, *bags)
        losses, dz = bce_with_logits(logits, label, 1 / global_batch(job.cfg, job.topo.n_workers))
        params.zero_grad()
        demb = checked_demb(model.backward(dz), emb)
    loss_sum = losses.sum()  # GPU: stays on the device (no host sync per step)
    if job.mode.xp is np:
        loss_sum = float(loss_sum)
        check_loss(job, loss_sum, len(label), f"at step {step + 1}", step)
    mode.update(batch, demb, step + 1, idle)
    batch.release()
    return loss_sum


def score_only(job: Job, work=None) -> TrainResult:
    """Collective: no training; workers run ``work(job)`` (default: evaluate the loaded
    model on ``job.evdata``), servers serve until the workers stop them."""
    if job.topo.is_worker:
        (work or (lambda j: evaluate(j, j.start)))(job)
    else:
        job.mode.serve(job.start, job.save)
    job.mode.finish()
    return job.result


# -- the end ---------------------------------------------------------------------------------

def finish(job: Job) -> TrainResult:
    """Collective: stop the servers, free the store, gather every rank's timers and traffic
    to the reporter, which prints and writes the summary."""
    topo, mode = job.topo, job.mode
    elapsed = time.perf_counter() - job.t_start
    mode.finish()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    # Wire: gather of each rank's phase timers and traffic to the reporter; all wait.
    stats = topo.world.gather((topo.role, dict(mode.timers), job.trained_traffic(), peak_mb),
                              root=topo.worker_ranks[0])
    if job.reporter:
        last = job.steps if job.result.preempted is None else job.result.preempted
        job.result.summary = summarize(job.cfg, topo, stats, job.totals, job.result.log,
                                       job.result.evals, last, max(last - job.start, 0),
                                       elapsed, job.t_start - job.t_begin)
        if job.auto is not None:
            job.result.summary["auto"] = job.auto
        if mode.xp is not np:  # GPU: worker 0's host waits for its device, per step; the
            s = job.result.summary  # share of the wall time its device was busy (events)
            s["host_syncs_per_step"] = mode.host_syncs() / max(last - job.start, 1)
            s["gpu_busy"] = mode.kernel_timers.device_seconds / max(elapsed, 1e-12)
            s["cuda_graphs"] = (job.device.status if job.device is not None
                                else "off: multi-hot fields")
        job.reporter.close(job.result.summary)
    return job.result
