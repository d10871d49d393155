"""What a training run prints and writes: progress lines, evaluations, ``--metrics`` JSON
lines and the final summary (built from every rank's timers and traffic counters)."""

from __future__ import annotations

import json
import math

import numpy as np

PHASES = ("data", "pull", "fwd_bwd", "push", "allreduce", "dense_apply", "server_apply", "wait",
          "eval")  # server_apply: on workers only with --placement colocated


class Reporter:
    """The rank that prints progress and writes --metrics (worker 0)."""

    def __init__(self, cfg, out, W: int, total_steps: int):
        self.cfg, self.out, self.W, self.total_steps = cfg, out, W, total_steps
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
        split = "  ".join(f"{k} {v:.0%}" for k, v in summary["phase_fraction"].items()
                          if v >= 0.005)
        if summary["servers"] and summary["steps_run"]:  # what the workers' wait is made of
            per = 1e3 / summary["steps_run"]
            split += (f"  |  wait {summary['phase_seconds']['wait'] * per:.2f} ms/step, "
                      f"servers' apply {summary['server_apply_seconds'] * per:.2f} ms/step")
        self.out.write(
            f"done: {summary['mode']} {summary['model']}  {summary['steps']} steps  "
            f"{summary['samples_per_s']:,.0f} samples/s  final loss {summary['final_loss']:.4f} "
            f"(base rate {summary['base_rate_logloss']:.4f})  workers {self.W} servers "
            f"{summary['servers']}  |  {split}\n")
        self.out.flush()
        self.close_file()

    def close_file(self) -> None:
        """Close the metrics file (also when training fails)."""
        if self.metrics:
            self.metrics.close()
            self.metrics = None


def _base_rate_logloss(p: float) -> float:
    """Logloss of always predicting the base rate ``p``."""
    return -(p * math.log(p) + (1 - p) * math.log(1 - p)) if 0 < p < 1 else 0.0


def summarize(cfg, topo, stats, totals, log, evals, steps: int, steps_run: int,
              elapsed: float, startup: float) -> dict:
    """The run's summary from ``stats`` = every rank's (role, timers, traffic, peak RSS MB)
    and ``totals`` = (loss sum, samples, label sum) over the workers."""
    W, reporter = topo.n_workers, topo.worker_ranks[0]
    worker_t = {k: float(np.mean([s[1].get(k, 0.0) for s in stats if s[0] == "worker"]))
                for k in PHASES}
    server_apply = [s[1].get("server_apply", 0.0) for s in stats]  # servers, or colocated
    busy = sum(worker_t.values()) or 1.0
    base = totals[2] / max(totals[1], 1)
    summary = {
        "summary": True, "mode": cfg.mode, "model": cfg.model, "steps": steps,
        "workers": W, "servers": topo.n_servers, "batch_size": cfg.batch_size,
        "steps_run": steps_run,
        "samples_per_s": steps_run * W * cfg.batch_size / max(elapsed - worker_t["eval"], 1e-9),
        "seconds": elapsed, "startup_seconds": startup,
        "final_loss": log[-1]["loss"] if log else float("nan"), "base_rate": base,
        "base_rate_logloss": _base_rate_logloss(base), "phase_seconds": worker_t,
        "phase_fraction": {k: v / busy for k, v in worker_t.items()},
        "server_apply_seconds": max(server_apply, default=0.0),
        "traffic_per_step": {k: v / max(steps_run, 1) for k, v in stats[reporter][2].items()},
        "peak_rss_mb": {role: max((s[3] for s in stats if s[0] == role), default=0.0)
                        for role in ("worker", "server")},
    }
    if evals:
        summary["auc"] = evals[-1]["auc"]
        summary["eval_logloss"] = evals[-1]["logloss"]
    return summary
