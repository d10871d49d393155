# imported by bench/scaling.py (python bench/scaling.py ...)
"""The scaling model's checks against measurements: bytes per step beside the library's
counters, validation at 1 node, the compute replacement across workloads, what ``--mode
auto`` would pick, and the table's size for the memory line. Pure functions on
``bench/modes_bench.py`` JSON, no MPI; the model itself is ``bench/scaling.py``."""

from __future__ import annotations

import statistics

from pshybrid.planner import MEMORY_SHARE, PRESETS
from pshybrid.synthetic import CRITEO_KAGGLE

from scaling import (
    MODES,
    ROW_WIDTH,
    Calib,
    calibrate,
    calibrate_gpu,
    facts,
    predict,
    with_dense_params,
    with_speedup,
)

COUNTERS = {"pull": ("rma_get_bytes", "shm_read_bytes"), "rma_acc": ("rma_acc_bytes",),
            "p2p": ("p2p_bytes",), "allreduce": ("allreduce_bytes",),
            "allgather": ("allgather_bytes",)}


def model_bytes(c: Calib) -> dict:
    """Bytes per worker per step the model moves at the measured configuration, by the
    library's counter kinds: the catalogue's flows of the mode (``ModeSpec.flows``; pull:
    RMA Get or the same-node shared-memory read; Allgather: all W0 blocks, own included;
    its 8-byte counts are not counted by the library)."""
    out = {}
    for f in facts(c.mode).flows(c.E, c.P, 4, c.ids):
        out[f.kind] = out.get(f.kind, 0) + f.step_bytes(c.U, c.workers * c.U)
    return out


def counted_bytes(bytes_per_step: dict) -> dict:
    """The library's counters (bytes per step) grouped as ``model_bytes`` kinds; kinds the
    model does not know under their own name."""
    out, known = {}, set()
    for kind, keys in COUNTERS.items():
        known.update(keys)
        v = sum(bytes_per_step.get(key, 0.0) for key in keys)
        if v:
            out[kind] = v
    out.update({k: v for k, v in bytes_per_step.items() if k not in known and v})
    return out


def validate(runs: list[tuple[str, dict]], row_width: int = ROW_WIDTH) -> list[dict]:
    """The model calibrated on the first run, at 1 node with each run's workers, vs that
    run's measured median step. The first run itself: the residual of the phase
    accounting (legacy runs, anchored on their median: the raw phase means instead)."""
    out = []
    (n0, r0) = runs[0]
    for nj, rj in runs:
        for m in MODES:
            if m not in r0["results"] or m not in rj["results"]:
                continue
            c, t = calibrate(r0, m, row_width), rj["results"][m]
            own = nj == n0 and rj is r0
            pred = c.raw if own and c.stat.startswith("legacy") else \
                predict(c, 1, t["workers"], PRESETS["eth25"])["step"]
            meas = t["step_seconds_median"]
            out.append(dict(calibration=n0, target=nj, mode=m, workers=t["workers"],
                            measured_s=meas, predicted_s=pred, error=pred / meas - 1))
    return out


def validation_summary(val: list[dict]) -> dict:
    """Per mode, over the validating runs (every run but the first, at the first's worker
    count): the model vs the median of their measured steps, and the spread of the
    per-run errors. {mode: dict(runs, measured_s, predicted_s, error, min_error,
    max_error)}; modes with no validating run are left out."""
    out = {}
    for m in MODES:
        vs = [v for v in val if v["mode"] == m and v["target"] != v["calibration"]]
        if vs:
            meas = statistics.median(v["measured_s"] for v in vs)
            pred = vs[0]["predicted_s"]
            out[m] = dict(runs=len(vs), measured_s=meas, predicted_s=pred,
                          error=pred / meas - 1, min_error=min(v["error"] for v in vs),
                          max_error=max(v["error"] for v in vs))
    return out


def compute_ratio(src: dict, dst: dict, row_width: int = ROW_WIDTH) -> float:
    """Measured fwd_bwd of ``src`` / of ``dst``: the compute-only mode's (no server beside
    the workers), else the median over the modes both runs have."""
    both = [m for m in MODES if m in src["results"] and m in dst["results"]]
    pick = ["compute"] if "compute" in both else both
    return statistics.median(calibrate(src, m, row_width).local["fwd_bwd"]
                             / calibrate(dst, m, row_width).local["fwd_bwd"] for m in pick)


def cross_workload(src: dict, dst: dict, row_width: int = ROW_WIDTH) -> list[dict]:
    """The compute replacement checked on measured workloads: calibrated on ``src`` (say
    the paper workload), its fwd_bwd and dense_apply divided by the measured compute
    ratio (``compute_ratio``) and its dense size set to ``dst``'s, at 1 node with dst's
    workers: predicted vs dst's median step (also without the dense resize)."""
    x = compute_ratio(src, dst, row_width)
    out = []
    for m in MODES:
        if m not in src["results"] or m not in dst["results"]:
            continue
        t = dst["results"][m]
        c = with_speedup(calibrate_gpu(src, m, row_width), x)
        cp = with_dense_params(c, t["dense_params"])
        pred = predict(cp, 1, t["workers"], PRESETS["eth25"])
        same_p = predict(c, 1, t["workers"], PRESETS["eth25"])["step"]
        meas = t["step_seconds_median"]
        out.append(dict(mode=m, ratio=x, measured_s=meas, predicted_s=pred["step"],
                        error=pred["step"] / meas - 1, predicted_same_dense_s=same_p,
                        error_same_dense=same_p / meas - 1, terms=c.terms,
                        diff=term_diff(cp, pred, calibrate(dst, m, row_width))))
    return out


def term_diff(c: Calib, pred: dict, d: Calib) -> dict:
    """Predicted minus measured per term at 1 node (seconds per step): each local phase,
    other, imbalance and wait of the prediction ``pred`` (``predict(c, 1, ...)``) vs the
    target run's calibration ``d`` (the middle-half means), and ``residual``: the target's
    middle-half mean step minus its median step (what no term carries); they add up to
    predicted minus measured."""
    out = {p: c.local.get(p, 0.0) - d.local.get(p, 0.0) for p in sorted(set(c.local) |
                                                                          set(d.local))}
    out.update(other=c.other - d.other, imbalance=c.imbalance - d.imbalance,
               wait=pred["wait"] - d.wait, residual=d.modeled - d.step)
    return out


def auto_picks(proj: dict, worker_bytes: float, node_memory: float) -> dict:
    """What --mode auto would pick at each projected node count: {preset: {k: [mode per
    N]}}: the most samples/s among hybrid, ps and allreduce (the compute-only floor is no
    alternative), allreduce only where a node's k workers' whole tables fit
    ``MEMORY_SHARE`` of ``node_memory`` (the same rule as auto's). Colocated placements and
    hot rows are not in this projection."""
    out = {}
    for p, byk in proj.items():
        for k, res in byk.items():
            ok = [m for m in ("hybrid", "ps", "allreduce") if m in res and (
                m != "allreduce" or int(k) * worker_bytes <= MEMORY_SHARE * node_memory)]
            n = len(next(iter(res.values()))["samples_per_s"])
            out.setdefault(p, {})[k] = [max(ok, key=lambda m: res[m]["samples_per_s"][i])
                                        for i in range(n)]
    return out


def table_rows(max_cardinality: int) -> int:
    """Rows of modes_bench's fused table: Criteo Kaggle's cardinalities, capped."""
    return sum(min(c, max_cardinality) for c in CRITEO_KAGGLE)

