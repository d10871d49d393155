"""bench/scaling.py: the scaling model's formulas against analytic cases (serial, no MPI)."""

from __future__ import annotations

import json
import math
import statistics
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, "bench")
sys.path.insert(0, BENCH)
import scaling as sc  # noqa: E402

SAMPLE = os.path.join(BENCH, "sample_modes.json")
from pshybrid.timers import PHASES  # noqa: E402  (what modes_bench records per step)


def fake_run(modes=("hybrid", "ps", "allreduce", "compute"), W0=2, U=1000.0, P=100_000,
             phases=None, step=None, server=None, batch=8, p2p=True):
    """A modes_bench-shaped dict: every mode with the same phases (s/step) unless given."""
    phases = phases or dict(data=0.001, pull=0.002, fwd_bwd=0.010, push=0.003,
                            allreduce=0.001, dense_apply=0.002, wait=0.001, eval=0.0)
    res = {}
    for m in modes:
        ph = {k: phases.get(k, 0.0) for k in PHASES}
        res[m] = dict(phase_seconds_per_step=ph,
                      step_seconds_median=step if step is not None else sum(ph.values()),
                      server_apply_seconds_per_step=(server or {}).get(m, 0.0),
                      bytes_per_step={"p2p_bytes": U * 8.0 if p2p else 0.0},
                      unique_ids_per_worker_step=[U] * W0, workers=W0,
                      servers=1 if m in ("hybrid", "ps") else 0, dense_params=P)
    return {"args": {"batch_size": batch, "max_cardinality": 10, "sparse_optimizer": "adagrad"},
            "results": res}


@pytest.fixture(scope="module")
def sample():
    with open(SAMPLE) as f:
        return json.load(f)


def test_ring_allreduce_is_the_textbook_formula():
    lk = sc.Link(7e-6, 2e9)
    for W in (2, 3, 8, 256):
        nb = 4e6
        assert sc.ring_allreduce(nb, W, lk) == pytest.approx(
            2 * (W - 1) / W * nb / 2e9 + 2 * (W - 1) * 7e-6, rel=1e-12)
    assert sc.ring_allreduce(4e6, 1, lk) == 0.0


@pytest.mark.parametrize("nodes,k", [(2, 1), (4, 2), (16, 4), (128, 2)])
def test_zero_compute_hybrid_step_is_the_ring_exactly(nodes, k):
    """No compute, no sparse rows, no ids: the hybrid step is the dense ring Allreduce
    plus the latency of the two (empty) server rounds; the component is the ring alone."""
    P, lk = 1_000_000, sc.PRESETS["eth25"]
    run = fake_run(("hybrid",), U=0.0, P=P, phases={k_: 0.0 for k_ in PHASES}, step=0.0,
                   p2p=False)
    out = sc.predict(sc.calibrate(run, "hybrid"), nodes, k, lk)
    W = nodes * k
    ring = 2 * (W - 1) / W * P * 4 / lk.bandwidth + 2 * (W - 1) * lk.latency
    assert out["allreduce"] == pytest.approx(ring, rel=1e-12)
    assert out["step"] == pytest.approx(ring + 2 * (nodes - 1) * lk.latency, rel=1e-12)


def test_ps_server_load_and_linear_growth_in_workers():
    P4 = 4.0 * 1_000_000
    for N in (2, 4, 16, 128):
        for k in (1, 2, 8):  # S = N servers, W = N*k workers: each server carries k*P*4
            assert sc.server_nic_bytes(P4, N, k) == pytest.approx(k * P4 * (N - 1) / N)
    lk = sc.Link(0.0, 1e9)  # no latency: the exchange is pure bytes
    t = [sc.server_exchange(P4, P4, 4, k, lk, 2) for k in (1, 2, 3, 4)]  # S = 4, W = 4..16
    assert t == pytest.approx([k * t[0] for k in (1, 2, 3, 4)], rel=1e-12)
    assert t[0] == pytest.approx(2 * P4 * 3 / 4 / 1e9, rel=1e-12)


def test_one_worker_per_node_ps_dense_moves_the_ring_bytes():
    """k = 1: sharding the dense buffer over all nodes is reduce-scatter + allgather, the
    ring's bandwidth cost; Hybrid's wire advantage needs k > 1 workers per node."""
    lk, P4 = sc.Link(0.0, 1e9), 4.0 * 256 * 1000
    for N in (2, 8, 64):
        assert sc.server_exchange(P4, P4, N, 1, lk, 2) == pytest.approx(
            sc.ring_allreduce(P4, N, lk), rel=1e-12)


def test_allgather_receives_w_minus_1_blocks():
    lk = sc.Link(3e-6, 1e9)
    U, E, W = 500.0, 17, 32
    run = fake_run(("allreduce",), U=U, phases={k: 0.0 for k in PHASES}, step=0.0)
    out = sc.predict(sc.calibrate(run, "allreduce"), 16, 2, lk)
    assert out["allgather"] == pytest.approx(
        (W - 1) * (U * (8 + 4 * E) + 8) / 1e9 + 3 * (W - 1) * 3e-6, rel=1e-12)


def test_one_node_reproduces_the_measured_step(sample):
    """At 1 node with the measured workers every wire term is 0 and the phases are put on
    the median step: the prediction is the measurement (1e-9 relative)."""
    for run in (sample, fake_run(step=0.05, server={"hybrid": 0.004, "ps": 0.01})):
        for m, r in run["results"].items():
            c = sc.calibrate(run, m)
            for lk in sc.PRESETS.values():
                out = sc.predict(c, 1, r["workers"], lk)
                assert out["step"] == pytest.approx(r["step_seconds_median"], rel=1e-9)
                assert out["exchange"] == out["allgather"] == out["allreduce"] == 0.0


def test_validation_residuals(sample):
    val = [v for v in sc.validate([("s", sample)]) if v["calibration"] == v["target"]]
    assert {v["mode"] for v in val} == set(sample["results"])
    for v in val:
        r = sample["results"][v["mode"]]
        assert v["error"] == pytest.approx(
            sum(r["phase_seconds_per_step"].values()) / r["step_seconds_median"] - 1)


def test_cross_run_validation_of_a_run_the_model_describes():
    """Run B (4 workers) built as the model says it should look given run A (2 workers):
    the allreduce mode's push grows by row_apply * U * 2, hybrid's Allreduce phase by the
    ring's on-node bytes and its wait by the server's extra rows. Calibrated on A,
    predicting B: error 0."""
    ph = dict(data=0.001, pull=0.002, fwd_bwd=0.010, push=0.004, allreduce=0.001,
              dense_apply=0.002, wait=0.003, eval=0.0)
    a = fake_run(("hybrid", "allreduce", "compute"), W0=2, U=1000.0, phases=ph,
                 server={"hybrid": 0.0025})
    row_apply = ph["push"] / 1000.0  # compute mode's push per row
    b = fake_run(("hybrid", "allreduce"), W0=4, U=1000.0, phases=ph, server={"hybrid": 0.005})
    b["results"]["allreduce"]["step_seconds_median"] += row_apply * 1000.0 * 2
    # 4 workers on the node: the ring moves 1.5x the dense bytes per worker on the node
    # (Allreduce phase 1 -> 1.5 ms); server rows 2U -> 4U: its apply 2.5 -> 5 ms, of which
    # the next batch's data phase, the Allreduce phase and the dense Adam (1 + 1.5 + 2 ms)
    # hide 4.5 (in A all of it): the wait grows by 0.5 ms
    b["results"]["hybrid"]["step_seconds_median"] += 0.0005 + 0.0005
    cross = [v for v in sc.validate([("a", a), ("b", b)])
             if (v["calibration"], v["target"]) == ("a", "b")]
    assert {v["mode"] for v in cross} == {"hybrid", "allreduce"}
    for v in cross:
        assert v["error"] == pytest.approx(0.0, abs=1e-12)


def test_saturation_on_a_hand_made_curve():
    nodes = (1, 2, 4, 8, 16)
    assert sc.saturation(nodes, (100, 200, 380, 400, 700)) == (16, 8)  # eff 0.44; +5% at 8
    assert sc.saturation(nodes, [100 * n for n in nodes]) == (None, None)
    assert sc.saturation((1, 4), (100, 150)) == (4, None)  # two doublings: +22% each


def test_hybrid_beats_ps_when_dense_bytes_dominate():
    run = fake_run(("hybrid", "ps"), U=10.0, P=5_000_000)
    h, p = sc.calibrate(run, "hybrid"), sc.calibrate(run, "ps")
    for lk in sc.PRESETS.values():
        for N in sc.NODES[1:]:
            for k in (2, 4, 8):
                assert sc.predict(h, N, k, lk)["step"] < sc.predict(p, N, k, lk)["step"]


def test_more_bandwidth_or_less_latency_never_slows_a_mode(sample):
    for m in sample["results"]:
        c = sc.calibrate(sample, m)
        for N in sc.NODES:
            for k in (1, 2, 8):
                for kw in ({}, {"overlap": True}, {"ps_server_dense": "received"},
                           {"ps_local_dense": "full"}):
                    bw = [sc.predict(c, N, k, sc.Link(1e-5, b), **kw)["step"]
                          for b in (1e8, 1e9, 3.1e9, 1.25e10, 1e12)]
                    lat = [sc.predict(c, N, k, sc.Link(t, 3.1e9), **kw)["step"]
                           for t in (1e-4, 1e-5, 1.5e-6, 0.0)]
                    assert all(x >= y for x, y in zip(bw, bw[1:]))
                    assert all(x >= y for x, y in zip(lat, lat[1:]))
                    assert sc.predict(c, N, k, sc.PRESETS["eth25"], overlap=True)["step"] <= \
                        sc.predict(c, N, k, sc.PRESETS["eth25"])["step"]


def test_byte_model_matches_the_counters_and_the_bench_analytic(sample):
    """E, P and the ps padding: the model's bytes beside the library's counters, and the
    ps dense Get exactly as modes_bench's analytic formula (DENSE_ROW padding)."""
    res = sample["results"]
    for m in ("hybrid", "ps", "allreduce"):
        got = sum(res[m]["bytes_per_step"].values())
        assert sum(sc.model_bytes(sc.calibrate(sample, m)).values()) == pytest.approx(got, rel=5e-3)
    u, P = res["ps"]["unique_ids_per_worker_step"][0], res["ps"]["dense_params"]
    assert u * sc.ROW_WIDTH * 4 + sc.padded(P) * 4 == res["ps"]["bytes_analytic"]["rma_get_bytes"]


def test_byte_model_by_kind_after_the_step_message():
    """A server-side optimizer: rows and gradient sums two-sided (p2p = U*8 + U*E*4), no
    Accumulate for the rows; ps still Accumulates its dense table; direct SGD: one
    Accumulate of the rows, nothing two-sided."""
    U, P, E = 1000.0, 1000, 17
    run = fake_run(("hybrid", "ps", "allreduce"), U=U, P=P)
    rows = U * E * 4
    assert sc.model_bytes(sc.calibrate(run, "hybrid")) == {
        "pull": rows, "p2p": U * 8 + rows, "allreduce": P * 4}
    assert sc.model_bytes(sc.calibrate(run, "ps")) == {
        "pull": rows + 1024 * 4, "rma_acc": 1024 * 4, "p2p": U * 8 + rows}
    assert sc.model_bytes(sc.calibrate(run, "allreduce")) == {
        "allgather": 2 * U * (8 + E * 4), "allreduce": P * 4}
    sgd = fake_run(("hybrid", "ps"), U=U, P=P, p2p=False)
    assert sc.model_bytes(sc.calibrate(sgd, "hybrid")) == {
        "pull": rows, "rma_acc": rows, "allreduce": P * 4}
    assert sc.model_bytes(sc.calibrate(sgd, "ps")) == {
        "pull": rows + 1024 * 4, "rma_acc": rows + 1024 * 4}


def test_counters_grouped_as_the_model_counts_them():
    got = sc.counted_bytes({"rma_get_bytes": 10.0, "shm_read_bytes": 5.0, "rma_acc_bytes": 0.0,
                            "p2p_bytes": 7.0, "allreduce_bytes": 3.0, "new_bytes": 2.0})
    assert got == {"pull": 15.0, "p2p": 7.0, "allreduce": 3.0, "new_bytes": 2.0}


def test_messages_per_server_after_the_step_message():
    """Latency only (no bytes): hybrid = Get + ids + sums, ps + the dense Get and
    Accumulate; direct SGD one Accumulate instead of the two sends."""
    assert (sc.server_messages("hybrid", True), sc.server_messages("ps", True)) == (3, 5)
    assert (sc.server_messages("hybrid", False), sc.server_messages("ps", False)) == (2, 4)
    lk = sc.Link(1e-5, 1e30)
    zero = {k: 0.0 for k in PHASES}
    for m, n in (("hybrid", 3), ("ps", 5)):
        run = fake_run((m,), U=1.0, P=0, phases=zero, step=0.0)
        out = sc.predict(sc.calibrate(run, m), 8, 2, lk)
        assert out["exchange"] == pytest.approx(n * 7 * 1e-5, rel=1e-9)


def test_table_rows_read_from_modes_bench():
    assert sc.table_rows(1) == 26  # 26 tables, each capped at one row
    assert 5e6 < sc.table_rows(10**6) < 6e6


def test_cli_writes_the_projection(sample, tmp_path, capsys):
    out = tmp_path / "scaling.json"
    assert sc.main([SAMPLE, "--json", str(out), "--nodes", "1,2,16"]) == 0
    text = capsys.readouterr().out
    assert "Hybrid/PS at 16 nodes" in text and "paper: 1.48x" in text
    got = json.loads(out.read_text())
    assert set(got["projection"]) == {"eth25", "ib100"}
    for p in got["projection"].values():
        assert set(p) == {"2"}  # the measured workers per node
        for m, r in p["2"].items():
            assert r["samples_per_s"][0] == pytest.approx(
                sample["results"][m]["samples_per_s"], rel=1e-9)
            assert r["nodes"] == [1, 2, 16]
    assert math.isfinite(got["hybrid_over_ps_16"]["eth25"]["2"])
    lk = json.loads(out.read_text())["links"]["eth25"]
    assert (lk["latency"], lk["bandwidth"]) == (10e-6, 3.1e9)
    sc.main([SAMPLE, "--json", str(out), "--preset", "ib100", "--latency", "2",
             "--bandwidth", "5"])
    lk = json.loads(out.read_text())["links"]["ib100"]
    assert (lk["latency"], lk["bandwidth"]) == pytest.approx((2e-6, 5e9))


# -- calibration on the timed steps (modes_bench's timed_series) ----------------------------

def series(workers, untimed=None, server=None):
    """A ``timed_series`` from each worker's {phase: [s per step]}: steps = the workers'
    mean phases summed + untimed (what the reporter's clock would see)."""
    n = len(next(iter(workers[0].values())))
    mean = {p: [statistics.fmean(w.get(p, [0.0] * n)[t] for w in workers) for t in range(n)]
            for p in PHASES}
    untimed = untimed or [0.0] * n
    steps = [sum(mean[p][t] for p in PHASES) + untimed[t] for t in range(n)]
    return {"step": steps, "untimed": untimed, "server_apply": server or [0.0] * n,
            "phases": mean, "phases_by_worker": [{p: w.get(p, [0.0] * n) for p in PHASES}
                                                 for w in workers]}


def series_run(per_mode: dict, U=1000.0, P=100_000, batch=8, p2p=True):
    """A modes_bench run whose modes carry ``timed_series`` (per_mode: mode -> series)."""
    run = fake_run(tuple(per_mode), U=U, P=P, batch=batch, p2p=p2p)
    for m, ts in per_mode.items():
        r = run["results"][m]
        r["timed_series"] = ts
        r["step_seconds_median"] = statistics.median(ts["step"])
        r["workers"] = len(ts["phases_by_worker"])
        r["unique_ids_per_worker_step"] = [U] * r["workers"]
    return run


def test_middle_half_drops_the_quartiles():
    assert sc.middle_half([5, 1, 3, 2, 4, 100, 0, 6]) == [0, 2, 3, 4]  # times 2, 3, 4, 5
    assert sc.middle_half([3.0, 1.0, 2.0]) == [0, 1, 2]  # too few to drop any
    assert sc.middle_half(list(range(10))) == [2, 3, 4, 5, 6, 7]


def test_series_means_add_up_and_split_the_imbalance():
    """Two workers, 8 steps, one outlier step (both workers' fwd_bwd x10): the outlier is
    not in the middle half; the sync phases keep the least worker's time, the rest is
    imbalance; phases + imbalance + other = the middle-half mean step, exactly."""
    n = 8
    w0 = dict(data=[1e-3] * n, fwd_bwd=[10e-3] * (n - 1) + [100e-3], allreduce=[3e-3] * n,
              wait=[0.2e-3] * n)
    w1 = dict(data=[1e-3] * n, fwd_bwd=[12e-3] * (n - 1) + [120e-3], allreduce=[1e-3] * n,
              wait=[0.4e-3] * n)
    ts = series([w0, w1], untimed=[0.1e-3] * n)
    m = sc.series_means(ts, sc.SYNC["hybrid"])
    assert m["phases"]["fwd_bwd"] == pytest.approx(11e-3)
    assert m["phases"]["allreduce"] == pytest.approx(1e-3)
    assert m["phases"]["wait"] == pytest.approx(0.2e-3)
    assert m["imbalance"] == pytest.approx((2e-3 - 1e-3) + (0.3e-3 - 0.2e-3))
    assert m["other"] == pytest.approx(0.1e-3)
    assert sum(m["phases"].values()) + m["imbalance"] + m["other"] == pytest.approx(m["step"])
    assert m["step"] == pytest.approx(1e-3 + 11e-3 + 2e-3 + 0.3e-3 + 0.1e-3)
    no_split = sc.series_means(ts)  # no sync phases: the workers' mean, no imbalance
    assert no_split["imbalance"] == 0.0 and no_split["phases"]["allreduce"] == pytest.approx(2e-3)


def test_calibrated_step_is_the_middle_half_step_and_validates_against_the_median():
    n = 8
    w = dict(data=[1e-3] * n, fwd_bwd=[10e-3, 10e-3, 11e-3, 11e-3, 12e-3, 12e-3, 30e-3, 1e-3],
             wait=[1e-3] * n)
    run = series_run({"hybrid": series([w, w], server=[0.5e-3] * n)})
    c = sc.calibrate(run, "hybrid")
    assert c.stat == "middle-half mean"
    assert c.local["fwd_bwd"] == pytest.approx(11e-3)  # steps with 10, 11, 11, 12 ms
    assert c.server_sparse == pytest.approx(0.5e-3)
    assert c.modeled == pytest.approx(13e-3)
    for lk in sc.PRESETS.values():
        assert sc.predict(c, 1, 2, lk)["step"] == pytest.approx(13e-3, rel=1e-12)
    (v,) = sc.validate([("a", run)])
    assert v["error"] == pytest.approx(13e-3 / run["results"]["hybrid"]["step_seconds_median"] - 1)


# -- GPU-class compute ----------------------------------------------------------------------

def hybrid_ps_run(imbalance=True):
    n = 4
    h0 = dict(data=[1e-3] * n, pull=[2e-3] * n, fwd_bwd=[20e-3] * n, push=[1e-3] * n,
              allreduce=[3e-3] * n, dense_apply=[2e-3] * n, wait=[1e-3] * n)
    h1 = dict(h0, allreduce=[5e-3] * n if imbalance else [3e-3] * n)
    p0 = dict(data=[1e-3] * n, pull=[5e-3] * n, fwd_bwd=[20e-3] * n, push=[4e-3] * n,
              wait=[8e-3] * n)
    return series_run({"hybrid": series([h0, h1], server=[1e-3] * n),
                       "ps": series([p0, p0], server=[5e-3] * n)}, P=1_000_000)


def test_compute_speedup_replaces_compute_and_keeps_the_wire():
    run = hybrid_ps_run()
    for m in ("hybrid", "ps"):
        c = sc.calibrate(run, m)
        g = sc.with_speedup(c, 50)
        assert g.local["fwd_bwd"] == pytest.approx(c.local["fwd_bwd"] / 50)
        assert g.local["dense_apply"] == pytest.approx(c.local["dense_apply"] / 50)
        assert g.imbalance == pytest.approx(c.imbalance / 50)
        for key in ("data", "pull", "push", "allreduce"):
            assert g.local[key] == c.local[key]
        assert (g.wait, g.other, g.server_sparse, g.server_dense) == \
            (c.wait, c.other, c.server_sparse, c.server_dense)
        for lk in sc.PRESETS.values():
            a, b = sc.predict(c, 16, 8, lk), sc.predict(g, 16, 8, lk)
            for key in ("local", "wait", "exchange", "ps_dense", "allreduce", "allgather"):
                assert a[key] == pytest.approx(b[key], rel=1e-12, abs=1e-15)
            assert b["compute"] == pytest.approx(a["compute"] / 50)
    h = sc.calibrate(run, "hybrid")
    assert h.imbalance == pytest.approx(1e-3) and h.local["allreduce"] == pytest.approx(3e-3)
    psc = sc.with_compute(sc.calibrate(run, "ps"), 1e-3, 5e-5, "gpu")
    assert psc.local["dense_apply"] == 0.0 and psc.local["fwd_bwd"] == 1e-3  # Adam on the servers


def test_compute_from_reads_the_entry_of_the_runs_model():
    doc = {"device": "H200", "compute": {
        "light": {"mlp": "64,32", "batch_size": 256, "fwd_bwd_seconds": 1e-4,
                  "dense_apply_seconds": 1e-5},
        "paper": {"mlp": "1024,512,256", "batch_size": 256, "fwd_bwd_seconds": 6e-4,
                  "dense_apply_seconds": 3e-5}}}
    fb, da, label = sc.compute_from(doc, {"mlp": "1024,512,256", "batch_size": 256})
    assert (fb, da) == (6e-4, 3e-5) and "H200" in label
    with pytest.raises(ValueError, match="no compute entry"):
        sc.compute_from(doc, {"mlp": "1024,512,256", "batch_size": 512})


def test_gpu_check_compute_entry_round_trips_on_numpy():
    """bench/gpu_check.time_compute on NumPy: the modes benchmark's dense parameter count,
    positive times, and an entry compute_from reads."""
    import numpy as np

    import gpu_check

    e = gpu_check.time_compute(np, gpu_check.WORKLOADS["light"], repeat=2, warmup=1)
    assert e["dense_params"] == 29_647 and e["mlp"] == "64,32"
    assert e["fwd_bwd_seconds"] > 0 and e["dense_apply_seconds"] > 0
    fb, da, _ = sc.compute_from({"compute": {"light": e}}, {"mlp": "64,32", "batch_size": 256})
    assert (fb, da) == (e["fwd_bwd_seconds"], e["dense_apply_seconds"])


def test_dense_size_scales_the_dense_terms_only():
    """ps: the dense shares of pull and push (ps minus hybrid), the servers' dense Adam
    (ps server minus hybrid server) and with it the wait; hybrid: its Allreduce phase."""
    run = hybrid_ps_run(imbalance=False)
    psc = sc.calibrate(run, "ps")
    assert psc.dense_local == pytest.approx({"pull": 3e-3, "push": 3e-3})
    assert (psc.server_sparse, psc.server_dense) == pytest.approx((1e-3, 4e-3))
    q = sc.with_dense_params(psc, 250_000)
    assert q.local["pull"] == pytest.approx(2e-3 + 0.75e-3)
    assert q.local["push"] == pytest.approx(1e-3 + 0.75e-3)
    assert q.server_dense == pytest.approx(1e-3)
    assert sc.predict(q, 1, 2, sc.PRESETS["eth25"])["wait"] == pytest.approx(8e-3 - 3e-3)
    assert q.local["fwd_bwd"] == psc.local["fwd_bwd"] and q.P == 250_000
    h = sc.with_dense_params(sc.calibrate(run, "hybrid"), 250_000)
    assert h.local["allreduce"] == pytest.approx(0.75e-3)
    # the server's 1 ms apply is no longer hidden by 3 + 2 ms, only by 0.75 + 2 ms: still
    assert sc.predict(h, 1, 2, sc.PRESETS["eth25"])["wait"] == pytest.approx(1e-3)
    assert sc.with_dense_params(psc, psc.P) == psc


def test_cross_workload_of_a_run_the_model_describes_is_exact():
    """dst = src with the compute / 10 (the compute-only mode's fwd_bwd ratio) and a
    quarter of the dense parameters, built term by term as the model says: error 0."""
    n = 4

    def const(**ph):
        return {p: [v] * n for p, v in ph.items()}

    src = series_run({
        "hybrid": series([const(data=1e-3, pull=2e-3, fwd_bwd=20e-3, push=1e-3, allreduce=3e-3,
                                dense_apply=2e-3, wait=1e-3)] * 2, server=[2e-3] * n),
        "ps": series([const(data=1e-3, pull=5e-3, fwd_bwd=20e-3, push=4e-3, wait=8e-3)] * 2,
                     server=[5e-3] * n),
        "compute": series([const(data=1e-3, pull=0.5e-3, fwd_bwd=20e-3, push=0.5e-3,
                                 dense_apply=2e-3)] * 2)}, P=1_000_000)
    dst = series_run({
        # the server's 2 ms apply, hidden by 1 + 3 + 2 ms before (the next batch's data,
        # the Allreduce, the dense Adam), by 1 + 0.75 + 0.2 ms now: wait + 0.05 ms
        "hybrid": series([const(data=1e-3, pull=2e-3, fwd_bwd=2e-3, push=1e-3,
                                allreduce=0.75e-3, dense_apply=0.2e-3, wait=1.05e-3)] * 2,
                         server=[2e-3] * n),
        # ps's server: the sparse apply (hybrid's, 2 ms) + the dense Adam (3 ms) / 4; the
        # next batch's data hides 1 ms of it: wait 8 - (5 - 1) + (2.75 - 1) ms
        "ps": series([const(data=1e-3, pull=2.75e-3, fwd_bwd=2e-3, push=1.75e-3,
                            wait=5.75e-3)] * 2, server=[2.75e-3] * n),
        "compute": series([const(data=1e-3, pull=0.5e-3, fwd_bwd=2e-3, push=0.5e-3,
                                 dense_apply=0.2e-3)] * 2)}, P=250_000)
    assert sc.compute_ratio(src, dst) == pytest.approx(10.0)
    out = sc.cross_workload(src, dst)
    assert {v["mode"] for v in out} == {"hybrid", "ps", "compute"}
    for v in out:
        assert v["error"] == pytest.approx(0.0, abs=1e-12), v["mode"]
    assert next(v for v in out if v["mode"] == "ps")["error_same_dense"] > 0.5


def const_series(n=4, server=None, untimed=0.0, **workers):
    """``series`` of two workers with constant phases (ms): w0 the given, w1 = w0 with the
    ``*_w1`` overrides (its sync phase later: the imbalance)."""
    w0 = {p: [v * 1e-3] * n for p, v in workers.items() if not p.endswith("_w1")}
    w1 = dict(w0, **{p[:-3]: [v * 1e-3] * n for p, v in workers.items() if p.endswith("_w1")})
    return series([w0, w1], untimed=[untimed * 1e-3] * n,
                  server=[(server or 0.0) * 1e-3] * n)


def wire_src():
    """A paper-like run with wire-only runs (``<mode> wire``): its CPU phases faster
    without the compute beside them."""
    src = series_run({
        "hybrid": const_series(data=1, pull=2, fwd_bwd=20, push=1, allreduce=3, allreduce_w1=7,
                               dense_apply=2, wait=1, server=1),
        "compute": const_series(data=1, pull=0.5, fwd_bwd=20, push=0.5, dense_apply=2),
        "hybrid wire": const_series(data=0.8, pull=1.5, fwd_bwd=0.1, push=0.9, allreduce=2,
                                    allreduce_w1=3, dense_apply=1.9, wait=1.2, server=1.6,
                                    untimed=0.1),
        "compute wire": const_series(data=0.6, pull=0.3, fwd_bwd=0.1, push=0.4,
                                     dense_apply=1.8)}, P=1_000_000)
    src["results"]["hybrid wire"]["servers"] = 1
    return src


def test_calibrate_gpu_takes_every_term_but_the_compute_from_the_wire_run():
    """Hand-computed: fwd_bwd 20 and dense_apply 2 ms from the real run; data, pull, push,
    Allreduce (least worker), wait, untimed and the server's apply from 'hybrid wire'; the
    imbalance, 2 ms, from the real run (not the wire run's 0.5): / 10 -> 0.2."""
    src = wire_src()
    c = sc.calibrate_gpu(src, "hybrid", name="P.json")
    assert {p: v for p, v in c.local.items() if v} == pytest.approx(
        {"data": 0.8e-3, "pull": 1.5e-3, "fwd_bwd": 20e-3, "push": 0.9e-3, "allreduce": 2e-3,
         "dense_apply": 2e-3})
    assert (c.wait, c.other, c.server_sparse) == pytest.approx((1.2e-3, 0.1e-3, 1.6e-3))
    assert c.imbalance == pytest.approx(2e-3)
    assert c.dense_local == pytest.approx({"allreduce": 2e-3})
    assert "'hybrid wire' of P.json" in sc.term_sources(c)
    g = sc.with_speedup(c, 10)
    assert g.imbalance == pytest.approx(0.2e-3)
    # 1 node: compute 2.2 + local 0.8+1.5+0.9+2+0.1 + imbalance 0.2 + wait 1.2 (the server's
    # 1.6 ms stays hidden by the next batch's data 0.8 + the Allreduce's 2 + dense_apply 0.2)
    assert sc.predict(g, 1, 2, sc.PRESETS["eth25"])["step"] == pytest.approx(8.9e-3)
    c_only = sc.calibrate_gpu(src, "compute")
    assert c_only.row_apply == pytest.approx(0.4e-3 / 1000)  # the wire run's push / U
    plain = hybrid_ps_run()  # no wire-only runs: calibrate's, the terms "beside" the compute
    assert sc.calibrate_gpu(plain, "hybrid") == sc.calibrate(plain, "hybrid")
    assert sc.calibrate(plain, "hybrid").terms == sc.BESIDE


def test_cross_workload_with_wire_runs_of_a_run_the_model_describes_is_exact():
    """dst: the wire-only terms, the compute / 10 and a quarter of the dense parameters,
    built term by term: error 0, and the per-term differences are all 0. The same src
    without its wire runs overstates dst (its CPU phases measured beside the compute)."""
    src = wire_src()
    dst = series_run({  # hybrid: Allreduce 2 -> 0.5 ms (P / 4); the server's 1.6 ms is now
        # hidden by 0.8 + 0.5 + 0.2 ms only: wait 1.2 + 0.1; imbalance 0.2 = (w1 - w0) / 2
        "hybrid": const_series(data=0.8, pull=1.5, fwd_bwd=2, push=0.9, allreduce=0.5,
                               allreduce_w1=0.9, dense_apply=0.2, wait=1.3, server=1.6,
                               untimed=0.1),
        "compute": const_series(data=0.6, pull=0.3, fwd_bwd=2, push=0.4, dense_apply=0.2)},
        P=250_000)
    out = sc.cross_workload(src, dst)
    assert [v["mode"] for v in out] == ["hybrid", "compute"]
    for v in out:
        assert v["error"] == pytest.approx(0.0, abs=1e-12), v["mode"]
        assert all(d == pytest.approx(0.0, abs=1e-12) for d in v["diff"].values()), v
        assert "wire" in v["terms"]
    for m in ("hybrid wire", "compute wire"):
        del src["results"][m]
    # hybrid: 2.2 + 1+2+1+0.75 (Allreduce 3 x 1/4) + imbalance 2/10 + wait 1 (the server's 1
    # ms hidden by data 1 + 0.75 + 0.2) = 8.15 ms (measured 7.5); compute-only: 1 + 0.5 + 2 +
    # 0.5 + 0.2 = 4.2 ms (measured 3.5)
    for v, want in zip(sc.cross_workload(src, dst), (8.15 / 7.5 - 1, 4.2 / 3.5 - 1)):
        assert v["error"] == pytest.approx(want)
        assert sum(v["diff"].values()) == pytest.approx(v["predicted_s"] - v["measured_s"])


def test_cli_says_where_the_terms_come_from(tmp_path, capsys):
    src, plain = tmp_path / "P.json", tmp_path / "Q.json"
    run = wire_src()
    src.write_text(json.dumps(run))
    for m in ("hybrid wire", "compute wire"):
        del run["results"][m]
    plain.write_text(json.dumps(run))
    assert sc.main([str(src), "--compute-speedup", "10", "--nodes", "1,2"]) == 0
    text = capsys.readouterr().out
    assert f"'hybrid wire' of {src}" in text and "NOTE" not in text
    assert sc.main([str(plain), "--compute-speedup", "10", "--nodes", "1,2"]) == 0
    assert "NOTE: " + str(plain) + " has no wire-only runs" in capsys.readouterr().out


def test_cli_notes_an_oversubscribed_or_one_worker_calibration(tmp_path, capsys):
    """A run with fewer cores than ranks, or one worker projected to more per node, gets
    a NOTE; one with a core per rank and the same workers per node does not."""
    run = wire_src()
    path = tmp_path / "R.json"
    for cpr, note in ((0.67, True), (1.0, False), (None, False)):
        if cpr is not None:
            run.update(ranks=3, cores_per_rank=cpr)
        path.write_text(json.dumps(run))
        assert sc.main([str(path), "--nodes", "1,2"]) == 0
        assert ("ran 3 ranks with 0.67 cores each" in capsys.readouterr().out) == note
        run.pop("cores_per_rank", None)
    assert sc.main([str(path), "--nodes", "1,2"]) == 0
    assert "has one worker" not in capsys.readouterr().out
    one = series_run({"hybrid": series([{"fwd_bwd": [1e-3] * 4, "allreduce": [1e-4] * 4}])})
    path.write_text(json.dumps(one))
    assert sc.main([str(path), "--nodes", "1,2", "--workers-per-node", "1,4"]) == 0
    assert f"NOTE: {path} has one worker" in capsys.readouterr().out


def servers_runs():
    """(2 workers + 1 server, oversubscribed: slow apply, 1.3 ms of wait beyond it;
    1 worker + 1 server: 0.25 ms sparse per worker's rows, 0.8 ms dense, 0.05 ms beyond)."""
    n = 4
    two = series_run({"hybrid": series([{"fwd_bwd": [10e-3] * n, "wait": [0.6e-3] * n}] * 2,
                                       server=[0.5e-3] * n),
                      "ps": series([{"fwd_bwd": [10e-3] * n, "wait": [3.0e-3] * n}] * 2,
                                   server=[1.7e-3] * n)})
    one = series_run({"hybrid": series([{"fwd_bwd": [10e-3] * n, "wait": [0.3e-3] * n}],
                                       server=[0.25e-3] * n),
                      "ps": series([{"fwd_bwd": [10e-3] * n, "wait": [1.1e-3] * n}],
                                   server=[1.05e-3] * n)})
    return two, one


def test_servers_from_another_run():
    """Hand-computed: ps's sparse apply 0.25 ms for one worker's rows -> 0.5 for two, its
    dense Adam 0.8 ms (same shard), exposed 1.3 ms (ps hides none), and the wait beyond
    it 1.1 - 1.05 = 0.05 ms: wait 1.35 ms (was 3.0: 1.3 beyond 1.7); hybrid likewise:
    0.5 + 0.05. At N nodes ps's wait follows its servers as before (sparse x k/W0, dense
    x S0/S)."""
    two, one = servers_runs()
    lk = sc.PRESETS["eth25"]
    for mode, wait in (("ps", 1.35e-3), ("hybrid", 0.55e-3)):
        c = sc.with_servers(sc.calibrate(two, mode), sc.calibrate(one, mode))
        assert c.wait == pytest.approx(wait)
        assert sc.predict(c, 1, 2, lk)["wait"] == pytest.approx(wait)
    psc = sc.with_servers(sc.calibrate(two, "ps"), sc.calibrate(one, "ps"))
    assert (psc.server_sparse, psc.server_dense) == pytest.approx((0.5e-3, 0.8e-3))
    assert sc.predict(psc, 4, 4, lk)["wait"] == pytest.approx(  # sparse x 2, dense / 4
        0.05e-3 + 0.5e-3 * 2 + 0.8e-3 / 4)
    one["results"]["ps"]["dense_params"] = 7
    with pytest.raises(ValueError, match="same mode and model"):
        sc.with_servers(sc.calibrate(two, "ps"), sc.calibrate(one, "ps"))


def test_cli_servers_from(tmp_path, capsys):
    two, one = servers_runs()
    a, b = tmp_path / "two.json", tmp_path / "one.json"
    a.write_text(json.dumps(two))
    b.write_text(json.dumps(one))
    out = tmp_path / "proj.json"
    assert sc.main([str(a), "--nodes", "1,2", "--servers-from", str(b), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"servers' terms of ps from {b}: apply 1.30 ms, wait beyond it 0.05 ms" in text
    doc = json.loads(out.read_text())
    assert doc["servers_from"] == str(b)
    assert doc["calib"]["ps"]["wait"] == pytest.approx(1.35e-3)
    del one["results"]["ps"]
    b.write_text(json.dumps(one))
    with pytest.raises(SystemExit, match="no ps run"):
        sc.main([str(a), "--nodes", "1,2", "--servers-from", str(b)])


def test_ps_server_dense_shard_vs_received():
    """The ps servers' dense Adam runs over a P/S shard (shard: x S0/S) or per received
    copy (received: x g = k/W0); the sparse apply grows with the rows received (g)."""
    run = hybrid_ps_run(imbalance=False)
    c = sc.calibrate(run, "ps")
    lk = sc.PRESETS["ib100"]
    for N, k in ((4, 2), (16, 8), (1, 8)):
        g = k / 2
        shard = sc.predict(c, N, k, lk)["wait"]
        recv = sc.predict(c, N, k, lk, ps_server_dense="received")["wait"]
        assert shard == pytest.approx(max(0.0, 8e-3 + 1e-3 * (g - 1) + 4e-3 * (1 / N - 1)))
        assert recv == pytest.approx(8e-3 + 1e-3 * (g - 1) + 4e-3 * (g - 1))


def test_cli_gpu_class_options(sample, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert sc.main([SAMPLE, "--json", str(out), "--nodes", "1,16"]) == 0
    base = json.loads(out.read_text())
    assert sc.main([SAMPLE, "--json", str(out), "--nodes", "1,16", "--compute-speedup", "50",
                    "--workers-per-node", "1,4,8"]) == 0
    text = capsys.readouterr().out
    assert "ASSUMPTION" in text and "measured / 50" in text
    got = json.loads(out.read_text())
    assert set(got["projection"]["eth25"]) == {"1", "4", "8"}
    assert set(got["hybrid_over_ps_16"]["ib100"]) == {"1", "4", "8"}
    fast = got["projection"]["eth25"]["8"]["hybrid"]["components"][1]
    slow = base["projection"]["eth25"]["2"]["hybrid"]["components"][1]
    assert fast["compute"] == pytest.approx(slow["compute"] / 50)
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"device": "GPU-X", "compute": {"paper": {
        "mlp": sample["args"]["mlp"], "batch_size": 256, "fwd_bwd_seconds": 1e-3,
        "dense_apply_seconds": 1e-4}}}))
    assert sc.main([SAMPLE, "--json", str(out), "--nodes", "1,16", "--compute-from",
                    str(gpu)]) == 0
    got = json.loads(out.read_text())
    assert "GPU-X" in got["compute"]
    assert got["calib"]["hybrid"]["local"]["fwd_bwd"] == 1e-3
    assert got["calib"]["ps"]["local"]["dense_apply"] == 0.0
    with pytest.raises(SystemExit):  # one or the other
        sc.main([SAMPLE, "--compute-from", str(gpu), "--compute-speedup", "5"])


def test_cli_cross_and_png(sample, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert sc.main([SAMPLE, "--json", str(out), "--nodes", "1,2", "--cross", SAMPLE,
                    "--png", str(tmp_path / "s.png")]) == 0
    text = capsys.readouterr().out
    assert "cross-workload" in text
    (cw,) = json.loads(out.read_text())["cross_workload"].values()
    assert all(v["ratio"] == pytest.approx(1.0) for v in cw)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no PNG" in text
    else:
        assert (tmp_path / "s.png").stat().st_size > 0


# -- what modes_bench records (bench/timing.py: no MPI) -------------------------------------

def test_step_timers_keep_each_step_and_each_server_apply():
    import timing

    t = timing.StepTimers()
    assert timing.StepTimers.last is t
    t["fwd_bwd"] += 2.0
    t["wait"] += 0.5
    t.mark()
    t["fwd_bwd"] += 3.0
    t["fwd_bwd"] += 1.0  # a phase entered twice in one step
    t.mark()
    assert t.steps[0]["fwd_bwd"] == 2.0 and t.steps[0]["wait"] == 0.5
    assert t.steps[1]["fwd_bwd"] == 4.0 and t.steps[1]["wait"] == 0.0
    assert set(t.steps[0]) == set(PHASES)
    for x in (0.25, 0.5, 0.125):
        t["server_apply"] += x
    assert t.applies == [0.25, 0.5, 0.125]  # the first one's creation (0.0) is not a step


def test_timed_stats_of_two_workers():
    import timing

    zero = {p: 0.0 for p in PHASES}
    w0 = [dict(zero, fwd_bwd=1.0, wait=0.5), dict(zero, fwd_bwd=3.0, wait=0.5),
          dict(zero, fwd_bwd=2.0, wait=0.5)]
    w1 = [dict(zero, fwd_bwd=1.0, wait=1.5), dict(zero, fwd_bwd=1.0, wait=0.5),
          dict(zero, fwd_bwd=2.0, wait=0.5)]
    steps = [1.6, 3.6, 2.6]
    out = timing.timed_stats([w0, w1], w0, steps, [[0.1, 0.2, 0.3], [0.2, 0.1, 0.1]])
    assert out["phase_seconds_timed_median"]["fwd_bwd"] == 2.0  # means 1, 2, 2
    assert out["phase_seconds_timed_mean"]["wait"] == pytest.approx(2 / 3)  # 1, .5, .5
    assert out["untimed_seconds_timed_mean"] == pytest.approx(0.1)  # the reporter: w0
    assert out["server_apply_seconds_timed_median"] == 0.2  # slowest server: .2, .2, .3
    assert out["fwd_bwd_timed_median_per_worker"] == [2.0, 1.0]
    ts = out["timed_series"]
    assert ts["phases"]["fwd_bwd"] == [1.0, 2.0, 2.0] and ts["step"] == steps
    assert ts["phases_by_worker"][1]["wait"] == [1.5, 0.5, 0.5]
    m = sc.series_means(ts, ("wait",))  # 3 steps: all in the "middle half"
    assert m["imbalance"] == pytest.approx(0.5 / 3)  # step 1: mean 1.0, least 0.5


def test_hybrid_wait_grows_when_less_hides_the_servers_apply():
    """Hybrid sends the step message, then makes the next batch, completes the dense
    Allreduce and runs its dense Adam while the servers apply: 1 ms of server apply hidden
    by 0.1 + 0.5 + 2 ms. Compute / 10: dense Adam 0.2 ms, 0.2 ms of the apply exposed. At
    16 nodes the ring's wire time hides it again."""
    n = 4
    w = {p: [v] * n for p, v in dict(data=0.1e-3, fwd_bwd=20e-3, allreduce=0.5e-3,
                                        dense_apply=2e-3, wait=0.2e-3).items()}
    run = series_run({"hybrid": series([w, w], server=[1e-3] * n)}, P=100_000)
    c = sc.calibrate(run, "hybrid")
    assert c.exposed == 0.0
    g = sc.with_speedup(c, 10)
    lk = sc.PRESETS["eth25"]
    assert sc.predict(c, 1, 2, lk)["wait"] == pytest.approx(0.2e-3)
    assert sc.predict(g, 1, 2, lk)["wait"] == pytest.approx(0.2e-3 + 0.2e-3)
    ring = sc.ring_allreduce(400_000, 32, lk)
    assert 0.1e-3 + 0.5e-3 + ring + 0.2e-3 > 1e-3
    assert sc.predict(g, 16, 2, lk)["wait"] == pytest.approx(0.2e-3)


def test_on_node_dense_share_of_hybrid_and_allreduce():
    """hybrid: the least worker's Allreduce phase is all dense bytes; allreduce mode: its
    push (Allgather + optimizer on the W0 workers' rows, W0 x the compute-only push)
    progresses the pending dense Iallreduce: the rest of the push is dense."""
    n = 4
    h0 = {p: [v] * n for p, v in dict(fwd_bwd=20e-3, allreduce=3e-3).items()}
    h1 = dict(h0, allreduce=[5e-3] * n)
    a = {p: [v] * n for p, v in dict(fwd_bwd=20e-3, push=4e-3).items()}
    c = {p: [v] * n for p, v in dict(fwd_bwd=20e-3, push=0.5e-3).items()}
    run = series_run({"hybrid": series([h0, h1]), "allreduce": series([a, a]),
                      "compute": series([c, c])})
    assert sc.calibrate(run, "hybrid").dense_local == {"allreduce": pytest.approx(3e-3)}
    ar = sc.calibrate(run, "allreduce")
    assert ar.dense_local == {"push": pytest.approx(4e-3 - 2 * 0.5e-3)}
    small = sc.with_dense_params(ar, ar.P // 100)
    assert small.local["push"] == pytest.approx(1e-3 + 3e-3 / 100)
    del run["results"]["compute"]  # without it: hybrid's Allreduce phase, at most the push
    assert sc.calibrate(run, "allreduce").dense_local == {"push": pytest.approx(3e-3)}


def test_one_worker_moves_no_dense_bytes_on_the_node():
    """With one worker (W0 = 1) the Allreduce moves nothing: hybrid's Allreduce phase and the
    allreduce mode's push are fixed costs, kept when the dense size changes; two workers of
    the same phases put them in dense_local, which shrinks with P."""
    n = 4
    h = {p: [v] * n for p, v in dict(fwd_bwd=20e-3, allreduce=3e-3).items()}
    a = {p: [v] * n for p, v in dict(fwd_bwd=20e-3, push=4e-3).items()}
    c = {p: [v] * n for p, v in dict(fwd_bwd=20e-3, push=0.5e-3).items()}
    for workers, shrinks in ((1, False), (2, True)):
        run = series_run({"hybrid": series([h] * workers), "allreduce": series([a] * workers),
                          "compute": series([c] * workers)})
        for mode, phase in (("hybrid", "allreduce"), ("allreduce", "push")):
            cal = sc.calibrate(run, mode)
            assert cal.workers == workers
            assert bool(cal.dense_local) == shrinks
            small = sc.with_dense_params(cal, cal.P // 100)
            assert (small.local[phase] < cal.local[phase]) == shrinks
            assert small.local[phase] <= cal.local[phase]


def test_ps_dense_pull_and_push_leave_the_node_with_the_wire():
    """ps's dense pull and push measured on one node (3 + 3 ms): at N nodes the 1/N from
    the node's own server stays, the rest is ps_dense's wire time (k copies of Pp*4 through
    each server's NIC, each way)."""
    c = sc.calibrate(hybrid_ps_run(imbalance=False), "ps")
    lk = sc.PRESETS["eth25"]
    one = sc.predict(c, 1, 2, lk)
    assert one["ps_dense"] == 0.0
    for N in (2, 16, 128):
        out = sc.predict(c, N, 2, lk)
        assert out["local"] == pytest.approx(one["local"] - 6e-3 * (N - 1) / N)
        assert out["ps_dense"] == pytest.approx(
            2 * 2 * sc.padded(1_000_000) * 4 * (N - 1) / N / lk.bandwidth)
        full = sc.predict(c, N, 2, lk, ps_local_dense="full")
        assert full["local"] == pytest.approx(one["local"])
        assert full["ps_dense"] == out["ps_dense"]


def test_validation_against_the_median_of_the_other_runs():
    """Calibrated on run a (step 13 ms), validated on b, c, d (12, 13, 20 ms): per run
    +8.3%, 0%, -35%; against their median (13 ms) 0%."""
    n = 4

    def run(ms):
        w = {"fwd_bwd": [ms * 1e-3] * n}
        return series_run({"compute": series([w, w])})

    val = sc.validate([("a", run(13)), ("b", run(12)), ("c", run(13)), ("d", run(20))])
    s = sc.validation_summary(val)["compute"]
    assert s["runs"] == 3 and s["error"] == pytest.approx(0.0, abs=1e-12)
    assert (s["min_error"], s["max_error"]) == pytest.approx((13 / 20 - 1, 13 / 12 - 1))
    assert sc.validation_summary(val[:1]) == {}


def test_the_allreduce_on_node_share_follows_the_rings_on_node_edges():
    """Measured: 2 workers on one node, all ring edges on the node (P*4 per worker). At N
    nodes x k: 2(W-1)/W of P*4 per worker, on the node for (k-1)/k of the workers."""
    assert sc.ring_on_node(1, 2, 2) == 1.0
    assert sc.ring_on_node(1, 8, 2) == pytest.approx(2 * 7 / 8)
    assert sc.ring_on_node(16, 1, 2) == 0.0  # one worker per node: every edge leaves it
    assert sc.ring_on_node(16, 8, 2) == pytest.approx(2 * 127 / 128 * 7 / 8)
    c = sc.calibrate(hybrid_ps_run(imbalance=False), "hybrid")  # Allreduce phase 3 ms
    lk = sc.Link(0.0, 1e30)
    one = sc.predict(c, 1, 2, lk)["local"]
    for N, k in ((16, 1), (16, 4), (1, 8)):
        assert sc.predict(c, N, k, lk)["local"] == pytest.approx(
            one + 3e-3 * (sc.ring_on_node(N, k, 2) - 1))


def test_intra_node_speed_replaces_the_measured_on_node_dense_cost():
    """--intra-node: hybrid's on-node ring bytes (2(W-1)/W * (k-1)/k * P*4 per worker) and
    ps's own-server share of its dense pull and push (2 * Pp*4 / N) at that speed."""
    run = hybrid_ps_run(imbalance=False)  # P = 1e6; hybrid Allreduce phase 3 ms, ps 3 + 3
    h, q = sc.calibrate(run, "hybrid"), sc.calibrate(run, "ps")
    lk, bw = sc.Link(0.0, 1e30), 50e9
    for N, k in ((1, 2), (16, 1), (16, 8)):
        W = N * k
        on = 1.0 if N == 1 else (k - 1) / k
        got = sc.predict(h, N, k, lk, intra_node=bw)["local"]
        base = sc.predict(h, N, k, lk)["local"] - 3e-3 * sc.ring_on_node(N, k, 2)
        assert got == pytest.approx(base + 2 * (W - 1) / W * on * 4e6 / bw)
        got = sc.predict(q, N, k, lk, intra_node=bw)["local"]
        base = sc.predict(q, N, k, lk)["local"] - 6e-3 / N
        assert got == pytest.approx(base + 2 * sc.padded(1_000_000) * 4 / N / bw)


@pytest.mark.parametrize("mode", ["hybrid", "ps"])
def test_cache_hit_rate_and_pull_ahead_act_on_the_get_only(mode):
    """--consistency ssp:K in the model: a hit rate h removes h of the rows' Get bytes from
    the servers' NICs (the push still carries every row); pulling ahead hides the Get's wire
    time (bytes and one latency per remote server) behind the compute, never more than it."""
    lk = sc.Link(10e-6, 1e9)
    U, E, nodes, k = 1000.0, sc.ROW_WIDTH, 16, 4
    c = sc.calibrate(fake_run((mode,), U=U), mode)
    base = sc.predict(c, nodes, k, lk)
    get = sc.server_nic_bytes(U * E * 4, nodes, k) / lk.bandwidth
    cached = sc.predict(c, nodes, k, lk, hit_rate=0.25)
    assert base["exchange"] - cached["exchange"] == pytest.approx(0.25 * get, rel=1e-12)
    ahead = sc.predict(c, nodes, k, lk, hit_rate=0.25, pull_ahead=True)
    wire = 0.75 * get + (nodes - 1) * lk.latency
    assert wire < cached["compute"]  # so all of it hides
    assert cached["exchange"] - ahead["exchange"] == pytest.approx(wire, rel=1e-12)
    slow = sc.Link(10e-6, 1e6)  # a Get longer than the compute: only the compute hides
    a, b = (sc.predict(c, nodes, k, slow, pull_ahead=p) for p in (False, True))
    assert a["exchange"] - b["exchange"] == pytest.approx(a["compute"], rel=1e-12)
    assert {x: y for x, y in ahead.items() if x not in ("exchange", "step", "samples_per_s")} \
        == {x: y for x, y in base.items() if x not in ("exchange", "step", "samples_per_s")}


def test_cli_projects_hybrid_ssp_against_ps(sample, tmp_path, capsys):
    assert sc.main([SAMPLE, "--hit-rate", "0.3", "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "Hybrid-ssp (hit rate 30%, pull ahead)/PS (bsp) at 16 nodes" in out
    proj = json.loads((tmp_path / "s.json").read_text())["projection"]
    for p, byk in proj.items():
        for k, res in byk.items():
            assert all(s >= h for s, h in zip(res["hybrid-ssp"]["samples_per_s"],
                                               res["hybrid"]["samples_per_s"])), (p, k)


def test_auto_picks_the_fastest_mode_that_fits():
    """The pick per node count is the mode with the most samples/s; allreduce only where a
    node's k whole tables fit the memory share (the same rule as --mode auto)."""
    res = {"hybrid": {"samples_per_s": [1.0, 5.0, 3.0]}, "ps": {"samples_per_s": [2.0, 1.0, 4.0]},
           "allreduce": {"samples_per_s": [9.0, 9.0, 0.5]}, "compute": {"samples_per_s": [99] * 3}}
    proj = {"eth25": {"2": res}}
    assert sc.auto_picks(proj, 1e9, 10e9) == {"eth25": {"2": ["allreduce", "allreduce", "ps"]}}
    # two workers' whole tables (2 x 4.5 GB) over 80% of 10 GB: allreduce is refused
    assert sc.auto_picks(proj, 4.5e9, 10e9) == {"eth25": {"2": ["ps", "hybrid", "ps"]}}


def test_scaling_never_writes_over_an_input_and_names_a_bad_run_file(tmp_path):
    """``--json`` naming a ``--cross`` (or ``--servers-from``, ``--compute-from``) file wrote
    over it; a missing, non-JSON or foreign run file was a traceback. Oracle: the input's
    bytes, and one ``error:`` line with exit status 2 before any work."""
    import shutil
    import subprocess

    run = tmp_path / "m.json"
    shutil.copy(os.path.join(BENCH, "sample_modes.json"), run)
    other = tmp_path / "in2.json"
    shutil.copy(run, other)
    before = other.read_bytes()
    (tmp_path / "e.json").write_text("{}")
    (tmp_path / "r.json").write_text('{"results": {}}')  # (an IndexError traceback)
    short = json.loads(run.read_text())
    del short["results"]["hybrid"]["workers"]  # (a KeyError traceback)
    (tmp_path / "k.json").write_text(json.dumps(short))

    def scaling(*args):
        return subprocess.run([sys.executable, os.path.join(BENCH, "scaling.py"), *args],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)

    for opt in ("--cross", "--servers-from", "--compute-from"):
        p = scaling(str(run), opt, str(other), "--json", str(other))
        assert p.returncode == 2 and f"same file as {opt}" in p.stderr, p.stderr
        assert other.read_bytes() == before
    for bad, why in (("no.json", "not a readable JSON file"), ("e.json", "not a modes_bench"),
                     ("r.json", "'results' holds none of the modes"),
                     ("k.json", "results.hybrid lacks workers"),
                     (os.path.join(BENCH, "scaling.py"), "not a readable JSON file")):
        p = scaling(bad)
        assert p.returncode == 2 and why in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = scaling(str(run), "--nodes", "0,3")
    assert p.returncode == 2 and "at least 1" in p.stderr, p.stderr


def test_cli_refuses_a_bad_optional_input_in_one_line(tmp_path):
    """--cross, --servers-from and --compute-from: a missing, non-JSON or foreign file is one
    line naming the option and the file, before anything is printed (no traceback)."""
    import subprocess
    (tmp_path / "bad.json").write_text('{"bad')
    (tmp_path / "foreign.json").write_text('{"a": 1}')
    for opt in ("--cross", "--servers-from", "--compute-from"):
        for bad in ("no.json", "bad.json", "foreign.json"):
            p = subprocess.run([sys.executable, os.path.join(BENCH, "scaling.py"), SAMPLE,
                                opt, bad], capture_output=True, text=True, timeout=120,
                               cwd=tmp_path)
            assert p.returncode != 0 and "Traceback" not in p.stderr, (opt, bad, p.stderr)
            assert f"{opt} {bad}" in p.stderr and not p.stdout.strip(), (opt, bad, p.stdout)
    for h in ("1.5", "-0.5", "nan"):  # (taken, and the same rows printed as for any H)
        p = subprocess.run([sys.executable, os.path.join(BENCH, "scaling.py"), SAMPLE,
                            "--hit-rate", h], capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and f"--hit-rate {h}: a share of the rows" in p.stderr
