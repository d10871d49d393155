"""The training loop: one piece of code for every mode (``modes``), BSP consistency.

Step ``t`` trains on the global batch of rows ``[t*W*b, (t+1)*W*b)``; worker ``w`` takes
rows ``[t*W*b + w*b, t*W*b + (w+1)*b)``. The loss is the mean over the global batch, so
every worker scales its gradients by ``1/(W*b)`` and the sums over workers (Allreduce,
Accumulate, Allgather) are exactly the single-process gradient with batch ``W*b``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from . import __version__
from .config import TrainConfig
from .errors import ConfigError
from .layers import ParamSpace, bce_with_logits
from .models import build_model
from .modes import MODES
from .optim import Optimizer
from .synthetic import SyntheticCTR
from .topology import Topology

PHASES = ("data", "pull", "fwd_bwd", "push", "allreduce", "dense_apply", "wait")


def check_supported(cfg: TrainConfig) -> None:
    """Options that are fixed names (DESIGN §10) but not built yet: one clear error."""
    def no(what):
        raise ConfigError(f"{what} is not available yet in pshybrid {__version__}",
                          collective=True)
    if cfg.mode == "auto":
        no("--mode auto (cost-model table placement)")
    if cfg.consistency != "bsp":
        no(f"--consistency {cfg.consistency} (only bsp)")
    if cfg.device != "cpu":
        no(f"--device {cfg.device}")
    if cfg.data or cfg.eval_data or cfg.epochs:
        no("training from a dataset file (--data, --eval-data, --epochs)")
    if cfg.checkpoint_dir or cfg.resume or cfg.checkpoint_every:
        no("checkpointing (--checkpoint-dir, --checkpoint-every, --resume)")
    if cfg.mode == "allreduce" and cfg.servers:
        raise ConfigError(f"--mode allreduce keeps every table on every worker and uses no "
                          f"server: drop --servers {cfg.servers} (or use --servers 0)",
                          collective=True)


@dataclass
class TrainResult:
    role: str
    log: list = field(default_factory=list)      # reporter only: one dict per logged step
    summary: dict = field(default_factory=dict)  # reporter only
    dense: np.ndarray | None = None              # workers, when collect=True
    table: np.ndarray | None = None              # workers, when collect=True


class _Reporter:
    """Rank that prints progress and writes --metrics (worker 0)."""

    def __init__(self, cfg: TrainConfig, out, W: int):
        self.cfg, self.out, self.W = cfg, out, W
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.metrics = open(cfg.metrics, "w") if cfg.metrics else None  # noqa: SIM115

    def step(self, rec: dict) -> None:
        total = self.cfg.steps
        msg = (f"step {rec['step']}/{total}  loss {rec['loss']:.4f}  "
               f"{rec['samples_per_s']:,.0f} samples/s")
        if self.tty:
            done = int(30 * rec["step"] / max(total, 1))
            self.out.write(f"\r[{'#' * done}{'.' * (30 - done)}] {msg}   ")
        else:
            self.out.write(msg + "\n")
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
    topo = Topology.create(comm, 0 if cfg.mode == "allreduce" else cfg.servers,
                           need_servers=cfg.mode != "allreduce")
    try:
        return _train(cfg, topo, dataset or SyntheticCTR(seed=cfg.seed), collect, out)
    finally:
        topo.free()


def _train(cfg, topo, data, collect, out) -> TrainResult:
    ps = ParamSpace()
    model, sparse = build_model(cfg.model, data.schema, cfg.embedding_dim, cfg.mlp, ps,
                                cfg.dtype, cfg.cross_layers)
    ps.build(np, np.dtype(cfg.dtype), cfg.seed)
    dense_lr = cfg.lr if cfg.dense_lr is None else cfg.dense_lr
    mode = MODES[cfg.mode](topo, sparse, ps, Optimizer(cfg.sparse_optimizer, cfg.lr),
                           Optimizer(cfg.dense_optimizer, dense_lr), cfg.seed)
    result = TrainResult(topo.role)
    W, b = topo.n_workers, cfg.batch_size
    reporter_rank = topo.worker_ranks[0]
    reporter = _Reporter(cfg, out, W) if topo.rank == reporter_rank else None
    t_start = time.perf_counter()

    if topo.is_server:
        mode.serve()
    else:
        timers = mode.timers
        dtype = np.dtype(cfg.dtype)
        scale = 1.0 / (W * b)
        acc = np.zeros(3)  # loss sum, samples, label sum since the last log
        totals = np.zeros(3)
        t_log = time.perf_counter()
        last_log = 0
        for step in range(cfg.steps):
            with timers.time("data"):
                a = step * W * b + topo.worker_index * b
                label, dense, sparse_ids = data.rows(a, a + b)
                dense = dense.astype(dtype, copy=False)
                label = label.astype(dtype, copy=False)
                ids = sparse.global_ids(sparse_ids)
            mode.begin_step(step)
            emb = mode.lookup(ids)
            with timers.time("fwd_bwd"):
                logits = model.forward(dense, emb)
                losses, dz = bce_with_logits(logits, label)
                ps.zero_grad()
                demb = model.backward(dz * scale)
            mode.update(ids, demb, step + 1)
            acc += (float(losses.sum()), b, float(label.sum()))
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
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
                if not math.isfinite(rec["loss"]):
                    raise FloatingPointError(f"loss is {rec['loss']} at step {step + 1}")
                acc[:] = 0
                t_log, last_log = now, step + 1
        if collect:
            result.dense = mode.full_dense()
            result.table = mode.full_table()
    elapsed = time.perf_counter() - t_start
    mode.finish()

    # Wire: gather of each rank's phase timers and traffic to the reporter; all wait.
    stats = topo.world.gather((topo.role, dict(mode.timers), mode.traffic()), root=reporter_rank)
    if reporter:
        worker_t = {k: float(np.mean([s[1].get(k, 0.0) for s in stats if s[0] == "worker"]))
                    for k in PHASES}
        server_apply = [s[1].get("server_apply", 0.0) for s in stats if s[0] == "server"]
        busy = sum(worker_t.values()) or 1.0
        base = totals[2] / max(totals[1], 1)
        base_ll = -(base * math.log(base) + (1 - base) * math.log(1 - base)) if 0 < base < 1 else 0.0
        final = result.log[-1]["loss"] if result.log else float("nan")
        steps = cfg.steps
        result.summary = {
            "summary": True, "mode": cfg.mode, "model": cfg.model, "steps": steps,
            "workers": W, "servers": topo.n_servers, "batch_size": b,
            "samples_per_s": steps * W * b / elapsed if elapsed > 0 else 0.0,
            "seconds": elapsed, "final_loss": final, "base_rate": base,
            "base_rate_logloss": base_ll, "phase_seconds": worker_t,
            "phase_fraction": {k: v / busy for k, v in worker_t.items()},
            "server_apply_seconds": max(server_apply, default=0.0),
            "traffic_per_step": {k: v / max(steps, 1) for k, v in stats[reporter_rank][2].items()},
        }
        reporter.close(result.summary)
    return result
