"""The training loop: one piece of code for every mode (``modes``), BSP consistency.

Step ``t`` trains on the global batch of rows ``[t*W*b, (t+1)*W*b)``; worker ``w`` takes
rows ``[t*W*b + w*b, t*W*b + (w+1)*b)``. The loss is the mean over the global batch, so
every worker scales its gradients by ``1/(W*b)`` and the sums over workers (Allreduce,
Accumulate, Allgather) are exactly the single-process gradient with batch ``W*b``.

``--device cuda``: each worker pins GPU ``local_rank % device_count`` and holds the dense
parameters, the batch's dense features and labels, and every activation there (CuPy); the
mode moves embedding rows and gradients over PCIe (``modes``, ``docs/gpu.md``). Servers and
the data pipeline stay on the CPU.
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from . import __version__, checkpoint
from .backend import synchronize, to_host
from .config import TrainConfig
from .data import BatchPlan, H5Dataset, prefetch, worker_batches
from .devices import cuda_aware_mpi, pick_device
from .errors import ConfigError, InputError, PshybridError
from .metrics import auc, logloss_from_logits
from .layers import ParamSpace, bce_with_logits
from .models import build_model
from .modes import MODES
from .optim import Optimizer
from .synthetic import SyntheticCTR
from .threads import rank_cores
from .topology import Topology
from .transport import agree

PHASES = ("data", "pull", "fwd_bwd", "push", "allreduce", "dense_apply", "wait", "eval")
EVAL_BATCH = 4096


def check_supported(cfg: TrainConfig) -> None:
    """Options that are fixed names (DESIGN §10) but not built yet: one clear error."""
    def no(what):
        raise ConfigError(f"{what} is not available yet in pshybrid {__version__}",
                          collective=True)
    if cfg.mode == "auto":
        no("--mode auto (cost-model table placement)")
    if cfg.consistency != "bsp":
        no(f"--consistency {cfg.consistency} (only bsp)")
    if cfg.mode in MODES and not MODES[cfg.mode].needs_servers and cfg.servers:
        raise ConfigError(f"--mode {cfg.mode} keeps every table on every worker and uses no "
                          f"server: drop --servers {cfg.servers} (or use --servers 0)",
                          collective=True)


@dataclass
class TrainResult:
    role: str
    log: list = field(default_factory=list)      # reporter only: one dict per logged step
    evals: list = field(default_factory=list)    # reporter only: one dict per evaluation
    step_seconds: list = field(default_factory=list)  # reporter only: wall time of each step
    summary: dict = field(default_factory=dict)  # reporter only
    dense: np.ndarray | None = None              # workers, when collect=True
    table: np.ndarray | None = None              # workers, when collect=True


class _Reporter:
    """Rank that prints progress and writes --metrics (worker 0)."""

    def __init__(self, cfg: TrainConfig, out, W: int):
        self.cfg, self.out, self.W = cfg, out, W
        self.total_steps = cfg.steps  # set by the loop once epochs are known
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.metrics = open(cfg.metrics, "w") if cfg.metrics else None  # noqa: SIM115

    def step(self, rec: dict) -> None:
        total = self.total_steps
        msg = (f"step {rec['step']}/{total}  loss {rec['loss']:.4f}  "
               f"{rec['samples_per_s']:,.0f} samples/s")
        if self.tty:
            done = int(30 * rec["step"] / max(total, 1))
            self.out.write(f"\r[{'#' * done}{'.' * (30 - done)}] {msg}   ")
        else:
            self.out.write(msg + "\n")
        self.out.flush()
        self._write(rec)

    def evaluation(self, rec: dict) -> None:
        if self.tty:
            self.out.write("\n")
        self.out.write(f"eval at step {rec['step']}: auc {rec['auc']:.4f}  logloss "
                       f"{rec['logloss']:.4f}  ({rec['rows']} rows)\n")
        self.out.flush()
        self._write(rec)

    def _write(self, rec: dict) -> None:
        if self.metrics:
            self.metrics.write(json.dumps(rec) + "\n")
            self.metrics.flush()

    def close(self, summary: dict) -> None:
        if self.tty:
            self.out.write("\n")
        self._write(summary)
        split = "  ".join(f"{k} {v:.0%}" for k, v in summary["phase_fraction"].items() if v >= 0.005)
        self.out.write(
            f"done: {summary['mode']} {summary['model']}  {summary['steps']} steps  "
            f"{summary['samples_per_s']:,.0f} samples/s  final loss {summary['final_loss']:.4f} "
            f"(base rate {summary['base_rate_logloss']:.4f})  workers {self.W} servers "
            f"{summary['servers']}  |  {split}\n")
        self.out.flush()
        if self.metrics:
            self.metrics.close()


def train(cfg: TrainConfig, comm: MPI.Comm, dataset=None, collect: bool = False,
          out=None) -> TrainResult:
    """Train per ``cfg`` on ``comm`` (collective). ``dataset``: an object with ``schema``
    and ``rows(start, stop)`` (default: the synthetic stream seeded by ``cfg.seed``).
    ``collect``: return the final dense parameters and the whole fused table on workers."""
    check_supported(cfg)
    out = out or sys.stdout
    needs_servers = MODES[cfg.mode].needs_servers
    topo = Topology.create(comm, cfg.servers if needs_servers else 0, need_servers=needs_servers)
    opened = []
    try:
        data, evdata = _open_data(cfg, topo, dataset, opened)
        return _train(cfg, topo, data, evdata, collect, out)
    finally:
        gc.unfreeze()  # a later run in this process (tests, benchmarks) may collect them
        for d in opened:
            d.close()
        topo.free()


class TrainingDiverged(PshybridError):
    """The loss became NaN or infinite."""


def _injected_fault(topo) -> int | None:
    """Testing hook: ``PSHYBRID_INJECT_FAULT=RANK:STEP`` makes world rank RANK raise at STEP."""
    spec = os.environ.get("PSHYBRID_INJECT_FAULT", "")
    if ":" in spec:
        rank, step = spec.split(":", 1)
        if int(rank) == topo.rank:
            return int(step)
    return None


def _open_data(cfg, topo, dataset, opened):
    """Open and validate --data and --eval-data on every rank (workers scan their share of
    the rows) with one shared verdict, before the first step. Returns (train, eval)."""
    err = None
    data = evdata = None
    try:
        if dataset is not None:
            data = dataset
        elif cfg.data:
            data = H5Dataset(cfg.data)
            opened.append(data)
        else:
            data = SyntheticCTR(seed=cfg.seed)
        if cfg.eval_data:
            evdata = H5Dataset(cfg.eval_data)
            opened.append(evdata)
            if evdata.schema != data.schema:
                raise InputError(f"{cfg.eval_data}: fields or cardinalities differ from the "
                                 f"training data's ({evdata.schema} vs {data.schema})")
        G = topo.n_workers * cfg.batch_size
        for d in (data, evdata):
            n = getattr(d, "n_rows", None)
            if n is None:
                continue
            if d is data and n < G:
                raise InputError(f"{d.path}: {n} rows, fewer than one global batch "
                                 f"({topo.n_workers} workers x --batch-size {cfg.batch_size} = {G})")
            if not topo.is_server:  # each worker scans its share
                W, w = topo.n_workers, topo.worker_index
                d.validate(n * w // W, n * (w + 1) // W)
    except PshybridError as e:
        err = e
    agree(topo.world, err)  # Wire: allgather of each rank's verdict; everyone raises the same
    return data, evdata


def _use_gpu(topo):
    """``--device cuda``: workers pin GPU ``local_rank % device_count`` and build the CUDA
    kernels; servers stay on the CPU. Returns the workers' array module (cupy; numpy on
    servers). No visible GPU, or kernels that do not build, fail every rank the same way."""
    err, xp = None, np
    if not topo.is_server:
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


def _evaluate(cfg, topo, mode, model, sparse, ev, step) -> dict | None:
    """Exact AUC and logloss over the whole eval file: worker w scores rows
    [n*w/W, n*(w+1)/W); logits and labels are gathered to worker 0."""
    mode.begin_step(step)  # ps: pull the current dense weights
    W, w, n = topo.n_workers, topo.worker_index, ev.n_rows
    a, b = n * w // W, n * (w + 1) // W
    zs, ys = [np.zeros(0)], [np.zeros(0)]
    for s in range(a, b, EVAL_BATCH):
        label, dense, sp = ev.rows(s, min(b, s + EVAL_BATCH))
        dense = mode.xp.asarray(dense.astype(cfg.dtype))  # GPU worker: H2D
        zs.append(to_host(model.forward(dense, mode.lookup(sparse.global_ids(sp)))))
        ys.append(label)
    z = np.concatenate(zs).astype(np.float64)
    y = np.concatenate(ys).astype(np.float64)
    counts = np.array(topo.workers.allgather(z.size))
    root = 0
    allz = np.empty(counts.sum()) if w == root else None
    ally = np.empty(counts.sum()) if w == root else None
    # Wire: Gatherv of logits and labels (8 B each per row) to worker 0; all workers wait.
    topo.workers.Gatherv(z, [allz, counts, MPI.DOUBLE] if w == root else None, root)
    topo.workers.Gatherv(y, [ally, counts, MPI.DOUBLE] if w == root else None, root)
    if w != root:
        return None
    return {"eval": True, "step": step, "auc": auc(allz, ally),
            "logloss": logloss_from_logits(allz, ally), "rows": int(counts.sum())}


def _train(cfg, topo, data, evdata, collect, out) -> TrainResult:
    t_begin = time.perf_counter()
    ps = ParamSpace()
    model, sparse = build_model(cfg.model, data.schema, cfg.embedding_dim, cfg.mlp, ps,
                                cfg.dtype, cfg.cross_layers)
    xp = _use_gpu(topo) if cfg.device == "cuda" else np
    ps.build(xp, np.dtype(cfg.dtype), cfg.seed)
    dense_lr = cfg.lr if cfg.dense_lr is None else cfg.dense_lr
    mode = MODES[cfg.mode](topo, sparse, ps, Optimizer(cfg.sparse_optimizer, cfg.lr),
                           Optimizer(cfg.dense_optimizer, dense_lr), cfg.seed)
    if xp is not np:
        mode.cuda_aware = cuda_aware_mpi()[0]  # else the dense Allreduce is staged on the host
    mode.overlap_allreduce(int(cfg.bucket_mb * 2**20))
    result = TrainResult(topo.role)
    W, b = topo.n_workers, cfg.batch_size
    reporter_rank = topo.worker_ranks[0]
    reporter = _Reporter(cfg, out, W) if topo.rank == reporter_rank else None

    plan = BatchPlan(getattr(data, "n_rows", None), W * b, cfg.shuffle, cfg.seed)
    steps = cfg.epochs * plan.steps_per_epoch if cfg.epochs else cfg.steps
    if reporter:
        reporter.total_steps = steps
    start = checkpoint.load(cfg.resume, cfg, topo, mode, ps, data.schema) if cfg.resume else 0
    saved = start

    def save(step):
        return checkpoint.save(cfg.checkpoint_dir, step, cfg, topo, mode, ps, data.schema)

    fault = _injected_fault(topo)
    # The steady state makes little cyclic garbage; exclude the tens of thousands of
    # start-up objects (numba, h5py, the model) from every later GC pass.
    gc.collect()
    gc.freeze()
    t_start = time.perf_counter()
    startup = t_start - t_begin  # model, tables (servers initialise them), resume
    if topo.is_server:
        mode.serve(on_checkpoint=save)
    else:
        timers = mode.timers
        dtype = np.dtype(cfg.dtype)
        scale = 1.0 / (W * b)
        acc = np.zeros(3)  # loss sum, samples, label sum since the last log
        totals = np.zeros(3)
        t_log = time.perf_counter()
        t_step = time.perf_counter()
        offset = topo.worker_index * b
        # Batches are prepared `depth` steps ahead on a data thread, only where the rank has
        # a spare core (else that thread slows the step). The thread also makes each step's
        # pull plan (dedup, owner groups, datatypes: MPI calls, so only under
        # MPI_THREAD_MULTIPLE); otherwise lookup makes it.
        depth = cfg.prefetch if cfg.prefetch is not None else (2 if rank_cores() >= 2 else 0)
        ahead = depth > 0 and MPI.Query_thread() == MPI.THREAD_MULTIPLE

        rows = worker_batches(data, plan, start, max(steps - start, 0), offset, b, sparse, depth)

        def produce(i):
            label, dense, ids = next(rows)  # ids: fused-table rows; buffers reused (depth + 3)
            return label, dense, ids, (mode.prepare(ids) if ahead else None)

        batches = prefetch(produce, max(steps - start, 0), depth)
        for step in range(start, steps):
            if step == fault:
                raise RuntimeError(f"injected fault (PSHYBRID_INJECT_FAULT) at step {step}")
            with timers.time("data"):
                label, dense, ids, prepared = next(batches)
                dense = xp.asarray(dense.astype(dtype, copy=False))  # GPU: H2D of the batch
                label = xp.asarray(label.astype(dtype, copy=False))
            mode.begin_step(step)
            emb = mode.lookup(ids, prepared)
            with timers.time("fwd_bwd"):
                logits = model.forward(dense, emb)
                losses, dz = bce_with_logits(logits, label)
                ps.zero_grad()
                demb = model.backward(dz * scale)
                synchronize(demb)  # GPU: the timer measures the kernels, not their launches
            loss_sum = float(losses.sum())
            if not math.isfinite(loss_sum):
                where = (f"{cfg.checkpoint_dir}/latest names the last good checkpoint"
                         if cfg.checkpoint_dir else "no checkpoint directory was given")
                raise TrainingDiverged(f"loss is {loss_sum} at step {step + 1} on worker "
                                       f"{topo.worker_index}: training stopped; {where}")
            mode.update(ids, demb, step + 1)
            if reporter:
                now = time.perf_counter()
                result.step_seconds.append(now - t_step)
                t_step = now
            acc += (loss_sum, b, float(label.sum()))
            if (step + 1) % cfg.log_every == 0 or step + 1 == steps:
                # Wire: Allreduce of 3 doubles (loss sum, samples, labels) over the workers.
                glob = topo.workers.allreduce(acc, op=MPI.SUM)
                totals += glob
                now = time.perf_counter()
                rec = {"step": step + 1, "loss": glob[0] / glob[1],
                       "samples_per_s": glob[1] / (now - t_log),
                       "seconds": {k: timers[k] for k in PHASES}}
                if reporter:
                    result.log.append(rec)
                    reporter.step(rec)
                acc[:] = 0
                t_log = now
            if evdata is not None and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0)
                                       or step + 1 == steps):
                t_eval, before = time.perf_counter(), dict(timers)
                rec = _evaluate(cfg, topo, mode, model, sparse, evdata, step + 1)
                timers.update(before)  # the eval's pulls count as eval, not as training
                timers["eval"] += time.perf_counter() - t_eval
                if reporter:
                    result.evals.append(rec)
                    reporter.evaluation(rec)
                t_log += time.perf_counter() - t_eval  # samples/s excludes evaluation
            if cfg.checkpoint_dir and ((cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every
                                        == 0) or step + 1 == steps) and saved != step + 1:
                mode.request_checkpoint(step + 1)
                save(step + 1)
                saved = step + 1
        if collect:
            result.dense = mode.full_dense()
            result.table = mode.full_table()
    elapsed = time.perf_counter() - t_start
    mode.finish()
    mode.overlap_allreduce(0)  # drop the mode <-> GradBuckets cycle: the tables go with the mode

    # Wire: gather of each rank's phase timers and traffic to the reporter; all wait.
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    stats = topo.world.gather((topo.role, dict(mode.timers), mode.traffic(), peak_mb),
                              root=reporter_rank)
    if reporter:
        worker_t = {k: float(np.mean([s[1].get(k, 0.0) for s in stats if s[0] == "worker"]))
                    for k in PHASES}
        server_apply = [s[1].get("server_apply", 0.0) for s in stats if s[0] == "server"]
        busy = sum(worker_t.values()) or 1.0
        base = totals[2] / max(totals[1], 1)
        base_ll = -(base * math.log(base) + (1 - base) * math.log(1 - base)) if 0 < base < 1 else 0.0
        final = result.log[-1]["loss"] if result.log else float("nan")
        result.summary = {
            "summary": True, "mode": cfg.mode, "model": cfg.model, "steps": steps,
            "workers": W, "servers": topo.n_servers, "batch_size": b,
            "steps_run": steps - start,
            "samples_per_s": (steps - start) * W * b / max(elapsed - worker_t["eval"], 1e-9),
            "seconds": elapsed, "startup_seconds": startup, "final_loss": final, "base_rate": base,
            "base_rate_logloss": base_ll, "phase_seconds": worker_t,
            "phase_fraction": {k: v / busy for k, v in worker_t.items()},
            "server_apply_seconds": max(server_apply, default=0.0),
            "traffic_per_step": {k: v / max(steps - start, 1)
                                 for k, v in stats[reporter_rank][2].items()},
            "peak_rss_mb": {role: max((s[3] for s in stats if s[0] == role), default=0.0)
                            for role in ("worker", "server")},
        }
        if result.evals:
            result.summary["auc"] = result.evals[-1]["auc"]
            result.summary["eval_logloss"] = result.evals[-1]["logloss"]
        reporter.close(result.summary)
    return result
