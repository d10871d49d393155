"""The summary of a run (``train``'s last record): from every rank's phase timers, traffic and
peak memory, gathered to the reporter, and the workers' loss and label totals."""

from __future__ import annotations

from statistics import median

import numpy as np

from .batches import global_batch
from .metrics import base_rate_logloss
from .timers import OWN_WORK, PHASES, UNTRAINED  # (OWN_WORK: the slowest worker's)


def summarize(cfg, topo, stats, totals, log, evals, steps: int, steps_run: int,
              elapsed: float, startup: float) -> dict:
    """The run's summary from ``stats`` = every rank's (role, timers, traffic, peak RSS MB),
    by world rank, and ``totals`` = (loss sum, samples, label sum) over the workers."""
    W, reporter = topo.n_workers, topo.worker_ranks[0]
    worker_t = {k: float(np.mean([s[1].get(k, 0.0) for s in stats if s[0] == "worker"]))
                for k in PHASES}
    server_apply = [s[1].get("server_apply", 0.0) for s in stats]  # servers, or colocated
    busy = sum(worker_t.values()) or 1.0
    base = totals[2] / totals[1] if totals[1] else None  # no step trained: no base rate
    summary = {
        "summary": True, "mode": cfg.mode, "model": cfg.model, "steps": steps,
        "workers": W, "servers": topo.n_servers, "batch_size": cfg.batch_size,
        "steps_run": steps_run,
        "samples_per_s": steps_run * global_batch(cfg, W) / max(
            elapsed - sum(worker_t[k] for k in UNTRAINED), 1e-9),
        "seconds": elapsed, "startup_seconds": startup,
        "final_loss": log[-1]["loss"] if log else None, "base_rate": base,
        "base_rate_logloss": None if base is None else base_rate_logloss(base),
        "phase_seconds": worker_t,
        "phase_fraction": {k: v / busy for k, v in worker_t.items()},
        "server_apply_seconds": max(server_apply, default=0.0),
        "traffic_per_step": {k: v / max(steps_run, 1) for k, v in stats[reporter][2].items()
                             if k != "reads"},
        "peak_rss_mb": {role: max((s[3] for s in stats if s[0] == role), default=0.0)
                        for role in ("worker", "server")},
    }
    reads = [s[2]["reads"] for s in stats if "reads" in s[2]]
    if reads:
        summary["reads"] = _reads(reads, steps_run)
    own = [sum(stats[r][1].get(k, 0.0) for k in OWN_WORK) for r in topo.worker_ranks]
    w = int(np.argmax(own))
    summary["slowest_worker"] = {"worker": w, "rank": topo.worker_ranks[w],
                                 "own_seconds": own[w],  # vs the others' (1 worker: itself)
                                 "median_own_seconds": median(own[:w] + own[w + 1:] or own)}
    if evals:
        summary["auc"] = evals[-1]["auc"]
        summary["eval_logloss"] = evals[-1]["logloss"]
    return summary


def reads_note(summary: dict) -> str:
    """The done line's note of the workers' embedding reads (``--consistency ssp:K|asp``,
    ``--cache-rows``): the share the cache served and the staleness read."""
    r = summary.get("reads")
    return "" if not r else (f"  |  reads: {r['cache_hit_rate']:.1%} from the cache, "
                             f"staleness mean {r['mean_staleness']:.2f}, max "
                             f"{r['max_staleness']}")


def _reads(reads: list, steps_run: int) -> dict:
    """--consistency ssp:K/asp, --cache-rows: the workers' embedding reads in total."""
    tot = {k: sum(r[k] for r in reads) for k in ("cache_rows", "pulled_rows", "pulled_bytes",
                                                 "staleness_sum")}
    n, steps = max(tot["cache_rows"] + tot["pulled_rows"], 1), max(steps_run, 1)
    return {"cache_hit_rate": tot["cache_rows"] / n, "mean_staleness": tot["staleness_sum"] / n,
            "max_staleness": max(r["max_staleness"] for r in reads),
            "cache_rows_per_step": tot["cache_rows"] / steps,
            "pulled_rows_per_step": tot["pulled_rows"] / steps,
            "pulled_bytes_per_step": tot["pulled_bytes"] / steps}
