# run by bench/modes_bench.py (mpiexec -n 3 python bench/modes_bench.py ...), on rank 0
"""What bench/modes_bench.py prints and writes once its runs are done (rank 0): the table of
samples/s, step and phases per variant, the bytes per step beside the analytic formula and
beside the real runs' (wire-only runs), the consistency runs beside bsp, Hybrid against the
other modes, the JSON and the PNG. ``b`` is the benchmark's ``Bench`` (its flags ``a``,
``world``, ``W`` workers, ``cards``); no MPI call here."""

from __future__ import annotations

import math

import numpy as np

from pshybrid.registry import is_colocated
from pshybrid.threads import rank_cores
from timing import machine, write_json
from wire import WIRE


def print_reads(results: dict, W: int, row_bytes: int) -> None:
    """The consistency runs beside their mode's bsp run (same rounds, same samples): the
    embedding rows a worker pulled for training (the library's read counters; bsp: the
    distinct ids of its batches, what its pulls read), so the evaluation's pulls are not
    in them."""
    rows = [(k, r) for k, r in results.items() if r["reads"] or (k in ("hybrid", "ps") and any(
        o["mode"] == k and o["reads"] for o in results.values()))]
    if not rows:
        return
    print("consistency: vs the same mode's bsp run; embedding rows pulled for training per "
          "step per worker; AUC after the same samples")
    print(f"{'run':<22}{'samples/s':>11}{'x bsp':>7}{'rows':>9}{'bytes':>11}{'x bsp':>7}"
          f"{'hit':>7}{'ideal':>7}{'stale mean/max':>16}{'AUC':>8}{'dAUC':>8}")

    def pulled(r):
        return (r["reads"]["pulled_rows_per_step"] / W if r["reads"] else
                float(np.mean(r["unique_ids_per_worker_step"])))

    for k, r in rows:
        ref = results[r["mode"]]
        reads = r["reads"] or {}
        got, base = pulled(r), pulled(ref)
        r["pulled_rows_per_worker_step"] = got
        auc = f"{r['auc']:.4f}{r['auc'] - ref['auc']:>+8.4f}" if r["auc"] is not None else ""
        stale = f"{reads.get('mean_staleness', 0):.2f}/{reads.get('max_staleness', 0)}"
        print(f"{k:<22}{r['samples_per_s']:>11,.0f}"
              f"{r['samples_per_s'] / ref['samples_per_s']:>7.2f}"
              f"{got:>9,.0f}{got * row_bytes:>11,.0f}{got / max(base, 1e-9):>7.2f}"
              f"{reads.get('cache_hit_rate', 0):>7.1%}"
              f"{r.get('ideal_hit_rate', 0):>7.1%}{stale:>16}{auc:>16}")


def print_wire_bytes(results: dict) -> None:
    """Each wire-only run's byte counters beside its real run's (same data, same steps:
    they must agree; the wire-only run moves what the real one does)."""
    pairs = [(k, results[k[:-len(WIRE)]]) for k in results
             if k.endswith(WIRE) and k[:-len(WIRE)] in results]
    if pairs:
        print("wire-only runs: bytes per step per worker (library counters) vs the real run's")
    w = label_width(results)
    for k, ref in pairs:
        got = results[k]["bytes_per_step"]
        for kind in sorted(set(got) | set(ref["bytes_per_step"])):
            g, r = got.get(kind, 0.0), ref["bytes_per_step"].get(kind, 0.0)
            if g or r:
                print(f"  {k:<{w}}{kind:<18}{g:>14,.0f}{r:>14,.0f}   "
                      f"{g / r - 1 if r else math.inf:+.2%}")


def steady_phases(r: dict) -> dict:
    """A run's phases over its timed steps (medians, seconds), as the step time is: the
    workers' timed phases, ``other`` (the reporter's step that no phase timer covers) and
    ``apply`` (the slowest server's optimizer, overlapping the workers' phases)."""
    return {**r["phase_seconds_timed_median"], "other": r["untimed_seconds_timed_median"],
            "apply": r["server_apply_seconds_timed_median"]}


def print_table(b, results: dict, P: int) -> None:
    """The run's description, then per variant samples/s, step, phases and peak RSS."""
    a, W = b.a, b.W
    print(f"modes benchmark: WDL, 26 tables ({sum(b.cards) / 1e6:.1f}M rows, dim 16), MLP "
          f"{a.mlp} ({P / 1e6:.2f}M dense params), batch {a.batch_size}/worker, {W} workers"
          + (" each owning a shard (colocated)" if is_colocated(a.placement) else
             f" + {b.world.size - W} server(s) ({a.placement})") + f", {a.steps} steps ({a.warmup} "
          f"warm-up), {a.sparse_optimizer}/adam, median of {a.repeat} interleaved run(s) "
          f"per mode; {machine()}")
    w = label_width(results)
    print(f"{'mode':<{w}}{'samples/s':>11}{'step ms':>9}  "
          f"{'phases after warm-up (ms/step, medians)':<62}{'RSS w/s MB':>12}")
    for m, r in results.items():
        ph = " ".join(f"{k}={v * 1e3:.2f}" for k, v in steady_phases(r).items()
                      if v * 1e3 >= 0.005)
        rss = r["peak_rss_mb"]
        print(f"{m:<{w}}{r['samples_per_s']:>11,.0f}{r['step_seconds_median'] * 1e3:>9.1f}  "
              f"{ph:<62}{rss['worker']:>6.0f}/{server_rss(rss):<5}")


def server_rss(rss: dict) -> str:
    """The servers' peak RSS in MB; '-' for a run without server ranks (was 0 MB)."""
    return f"{rss['server']:.0f}" if rss.get("server") else "-"


def label_width(results: dict) -> int:
    """The label column: 16, or the longest variant's label and a space."""
    return max([16] + [len(m) + 1 for m in results])


def print_bytes(b, results: dict) -> None:
    """Bytes per step per worker: the library's counters beside the analytic formula."""
    print("bytes per step per worker: measured (library counters) vs analytic (from the data)"
          + ("; the analytic pulls and pushes count the --replicate-rows rows too, which "
             "are read locally and summed by an Allreduce" if b.a.replicate_rows else ""))
    w = label_width(results)
    for m, r in results.items():
        for k, v in r["bytes_analytic"].items():
            if b.a.shared_memory and k == "rma_get_bytes":
                continue  # pulls went through shared memory (shm_read_bytes)
            got = r["bytes_per_step"].get(k, 0.0)
            print(f"  {m:<{w}}{k:<18}{got:>14,.0f}{v:>14,.0f}   {got / v - 1:+.2%}")


def print_auc(b, results: dict) -> None:
    """``--eval-data``: every run's AUC after the same samples, beside hybrid's (the
    consistency table shows only its own runs'; without one the AUCs were in the JSON only)."""
    aucs = {k: r["auc"] for k, r in results.items() if r.get("auc") is not None}
    if aucs:
        print(f"AUC on {b.a.eval_data} after the same samples: "
              + ", ".join(f"{k} {v:.4f}" for k, v in aucs.items()))


def print_ratios(b, results: dict, P: int, dense_allreduce: float | None) -> None:
    """The dense Allreduce alone, and Hybrid against every other mode."""
    if dense_allreduce is not None:
        print(f"dense Allreduce alone ({P * 4:,} bytes, {b.W} workers, median of 20): "
              f"{dense_allreduce * 1e3:.3f} ms")
    h = results.get("hybrid")
    for other in ("ps", "allreduce", "compute"):
        if h and other in results:
            ratio = h["samples_per_s"] / results[other]["samples_per_s"]
            label = "step time / compute-only step" if other == "compute" else f"Hybrid/{other}"
            value = 1 / ratio if other == "compute" else ratio
            print(f"{label:<32}= {value:.2f}x")


def write(b, results: dict, dense_allreduce: float | None) -> None:
    """``--json``, and ``--png`` (per-phase step time per variant) where matplotlib is."""
    a = b.a
    write_json(a.json, {"args": vars(a), "results": results, "ranks": b.world.size,
                        "cores_per_rank": rank_cores(), "machine": machine(),
                        "dense_allreduce_seconds": dense_allreduce,
                        "table_rows": int(sum(b.cards))})  # (--data: the file's own)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        bottom = np.zeros(len(results))
        means = [{**r["phase_seconds_timed_mean"], "other": r["untimed_seconds_timed_mean"]}
                 for r in results.values()]  # stacked: they sum to the mean step
        for ph in means[0]:
            vals = np.array([m.get(ph, 0) * 1e3 for m in means])
            ax.bar(list(results), vals, bottom=bottom, label=ph)
            bottom += vals
        ax.set_ylabel("ms per step after warm-up (means)")
        ax.set_title("pshybrid modes: per-phase step time")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.png, dpi=120)
        print(f"wrote {a.json} and {a.png}")
    except ImportError:
        print(f"wrote {a.json} (no PNG: pip install 'pshybrid[bench]' for matplotlib)")
