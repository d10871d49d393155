#!/usr/bin/env python3
# mpiexec -n 3 python bench/auto_bench.py [--workload light|paper|big --steps 150 --repeat 2 --json auto.json]
"""--mode auto beside every fixed alternative it priced, in one run, alternating.

Each round trains ``--mode auto`` (which probes, prices and picks) and every alternative of
its first table that was not refused, one after another on the same ranks, data and seed;
rounds repeat (``--repeat``), each starting one variant later, so that the machine's drift
hits every variant alike and none is always first. Per
variant: the median step after the first ``--warmup`` steps, per round, and the median of
the rounds. Rank 0 prints auto's choice and its measured step beside the best fixed
alternative's (the ratio of samples/s: the target is >= 0.95x) and, for every
alternative, the step auto's model predicted and, for those auto trained in its trial
(``--auto-trial-steps``), the trial's median step, beside the step measured (the target is
within 20%).

Workloads: ``light`` (WDL, MLP 64-32), ``paper`` (MLP 1024-512-256), both on the built-in
synthetic stream (26 Criteo-like fields), batch 256 per worker, Adagrad / Adam; ``big``:
the light model on a 100M-row fused table (the Criteo Kaggle cardinalities scaled up),
float32, dim 16, plain SGD rows (6.8 GB of weights): the allreduce mode needs the whole
table on every worker and is refused by auto's memory check.
"""

from __future__ import annotations

from pshybrid.threads import apply_thread_limits

apply_thread_limits()  # before NumPy loads its BLAS, as `python -m pshybrid` does

import argparse  # noqa: E402
import io
import statistics
import sys
from dataclasses import replace

from mpi4py import MPI

from pshybrid.config import TrainConfig
from pshybrid.registry import MODES, is_colocated, placement_name
from pshybrid.synthetic import CRITEO_LIKE, SyntheticCTR
from pshybrid.train import train
from timing import at_least, check_outputs, description, write_json  # bench/timing.py

KAGGLE = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
          27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
BIG_ROWS = 100_000_000
WORKLOADS = {"light": dict(mlp=(64, 32)), "paper": dict(mlp=(1024, 512, 256)),
             "big": dict(mlp=(64, 32), sparse_optimizer="sgd")}


def big_cardinalities(total: int = BIG_ROWS) -> tuple[int, ...]:
    """The Kaggle cardinalities scaled so that they sum to ``total`` (the last absorbs the
    rounding)."""
    f = total / sum(KAGGLE)
    cards = [max(1, round(c * f)) for c in KAGGLE]
    cards[2] += total - sum(cards)
    return tuple(cards)


def fixed_config(cfg: TrainConfig, alt: dict) -> TrainConfig:
    """The options of one row of auto's table."""
    colocated = is_colocated(alt["placement"])
    return replace(cfg, mode=alt["mode"], replicate_rows=alt["replicate_rows"],
                   placement=placement_name(colocated),
                   servers=None if colocated or not MODES[alt["mode"]].needs_servers
                   else alt["servers"])


def timed(cfg, comm, data, warmup: int):
    """(median step after warm-up, summary): rank 0 (a worker in every placement) only."""
    r = train(cfg, comm, dataset=data, out=io.StringIO())
    if comm.rank != 0:
        return None, None
    return statistics.median(r.step_seconds[warmup:]), r.summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--workload", choices=tuple(WORKLOADS), default="light")
    ap.add_argument("--steps", type=at_least(1), default=150)
    ap.add_argument("--warmup", type=at_least(0), default=30)
    ap.add_argument("--repeat", type=at_least(1), default=2)
    ap.add_argument("--batch-size", type=at_least(1), default=256)
    ap.add_argument("--no-hot", action="store_true",
                    help="leave out the --replicate-rows alternatives (faster)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.steps <= a.warmup:  # (every rank alike, before any collective: was a hang)
        ap.error(f"--steps {a.steps} leaves no timed step after --warmup {a.warmup}")
    check_outputs(ap, a.json)
    comm = MPI.COMM_WORLD
    w = WORKLOADS[a.workload]
    cards = big_cardinalities() if a.workload == "big" else CRITEO_LIKE
    data = SyntheticCTR(seed=0, cardinalities=cards)
    cfg = TrainConfig(batch_size=a.batch_size, steps=a.steps, log_every=10**6, progress="none",
                      embedding_dim=16, **w)
    runs = {"auto": []}
    decisions = []
    alts = None
    for rnd in range(a.repeat):
        # auto first in round 1, then one place later each round (no variant always first)
        order = ["auto"] + (alts or [])
        order = order[-rnd % len(order):] + order[:-rnd % len(order)] if rnd else order
        for key in order:
            if key == "auto":
                step, summ = timed(replace(cfg, mode="auto"), comm, data, a.warmup)
                rec = comm.bcast(summ["auto"] if comm.rank == 0 else None, root=0)
                decisions.append(rec)
                runs["auto"].append(step)
                if alts is None:  # round 1: the alternatives auto priced, in its order
                    alts = [x["key"] for x in rec["alternatives"] if not x["refused"]
                            and not (a.no_hot and x["replicate_rows"])]
                    order += alts
                    table = {x["key"]: x for x in rec["alternatives"]}
                continue
            step, _ = timed(fixed_config(cfg, table[key]), comm, data, a.warmup)
            runs.setdefault(key, []).append(step)
        if comm.rank == 0:
            print(f"round {rnd + 1}/{a.repeat}: auto chose {rec['choice']}", flush=True)
    if comm.rank == 0:
        report(a, runs, decisions)
    return 0


def report(a, runs, decisions) -> None:
    med = {k: statistics.median(v) for k, v in runs.items() if v}
    last = decisions[-1]
    B = {x["key"]: x["workers"] * a.batch_size for x in last["alternatives"]}
    sps = {k: B[k] / s for k, s in med.items() if k in B}
    chosen = [d["choice"] for d in decisions]
    auto_sps = statistics.median(B[c] / s for c, s in zip(chosen, runs["auto"]))
    best = max(sps, key=sps.get)
    print(f"\n{a.workload}: {MPI.COMM_WORLD.size} ranks, {a.steps} steps ({a.warmup} warm-up), "
          f"{a.repeat} alternating rounds; auto chose {', '.join(chosen)}")
    print(f"auto {auto_sps:,.0f} samples/s vs best fixed ({best}) {sps[best]:,.0f}: "
          f"{auto_sps / sps[best]:.2f}x")
    pick = max(set(chosen), key=chosen.count)
    if pick in sps:
        print(f"auto's pick ({pick}) run as a fixed alternative: {sps[pick]:,.0f} samples/s, "
              f"{sps[pick] / sps[best]:.2f}x the best fixed")
    trial = [d.get("trial_seconds") for d in decisions if d.get("trial_seconds")]
    if trial:
        print(f"auto's trials took {statistics.median(trial):.2f} s per run (median), its "
              f"probe {statistics.median(d['probe_seconds'] for d in decisions):.2f} s")
    print(f"{'alternative':<42}{'predicted ms':>13}{'trial ms':>10}{'measured ms':>12}"
          f"{'error':>8}{'trial err':>10}{'samples/s':>12}")
    rows = []
    for x in last["alternatives"]:
        k = x["key"]
        if x["refused"]:
            print(f"{k:<42} refused: {x['refused'][:70]}")
            continue
        if k not in med:
            continue
        err = x["step"] / med[k] - 1
        tried = [d_x["measured_step"] for d in decisions for d_x in d["alternatives"]
                 if d_x["key"] == k and d_x.get("measured_step")]
        tr = statistics.median(tried) if tried else None  # auto's trial steps, over runs
        terr = tr / med[k] - 1 if tr else None
        rows.append(dict(key=k, predicted_s=x["step"], trial_s=tr, measured_s=med[k],
                         error=err, trial_error=terr, samples_per_s=sps[k], per_round=runs[k]))
        print(f"{k:<42}{x['step'] * 1e3:>13.2f}"
              + (f"{tr * 1e3:>10.2f}" if tr else f"{'-':>10}")
              + f"{med[k] * 1e3:>12.2f}{err:>+8.1%}"
              + (f"{terr:>+10.1%}" if tr else f"{'-':>10}")
              + f"{sps[k]:>12,.0f}" + ("  <- auto" if k == chosen[-1] else ""))
    if a.json:
        write_json(a.json, dict(workload=a.workload, ranks=MPI.COMM_WORLD.size, steps=a.steps,
                                warmup=a.warmup, repeat=a.repeat, chosen=chosen,
                                auto_runs=runs["auto"], auto_samples_per_s=auto_sps, best=best,
                                best_samples_per_s=sps[best], alternatives=rows,
                                decisions=decisions))


if __name__ == "__main__":
    from pshybrid.launch import run

    sys.exit(run(main))  # an error on one rank ends the whole job, never a hang
