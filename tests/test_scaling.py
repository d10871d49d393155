"""bench/scaling.py: the scaling model's formulas against analytic cases (serial, no MPI)."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, "bench")
sys.path.insert(0, BENCH)
import scaling as sc  # noqa: E402

SAMPLE = os.path.join(BENCH, "sample_modes.json")
PHASES = ("data", "pull", "fwd_bwd", "push", "allreduce", "dense_apply", "wait", "eval")


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
    the allreduce mode's push grows by row_apply * U * 2, hybrid's wait by the server's
    extra rows. Calibrated on A, predicting B: error 0."""
    ph = dict(data=0.001, pull=0.002, fwd_bwd=0.010, push=0.004, allreduce=0.001,
              dense_apply=0.002, wait=0.003, eval=0.0)
    a = fake_run(("hybrid", "allreduce", "compute"), W0=2, U=1000.0, phases=ph,
                 server={"hybrid": 0.002})
    row_apply = ph["push"] / 1000.0  # compute mode's push per row
    b = fake_run(("hybrid", "allreduce"), W0=4, U=1000.0, phases=ph, server={"hybrid": 0.004})
    b["results"]["allreduce"]["step_seconds_median"] += row_apply * 1000.0 * 2
    b["results"]["hybrid"]["step_seconds_median"] += 0.002  # server rows 2U -> 4U
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
                for kw in ({}, {"overlap": True}, {"ps_server_dense": "shard"}):
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
    for m in ("hybrid", "allreduce"):
        got = sum(res[m]["bytes_per_step"].values())
        assert sc.model_bytes(sc.calibrate(sample, m)) == pytest.approx(got, rel=5e-3)
    u, P = res["ps"]["unique_ids_per_worker_step"][0], res["ps"]["dense_params"]
    assert u * sc.ROW_WIDTH * 4 + sc.padded(P) * 4 == res["ps"]["bytes_analytic"]["rma_get_bytes"]


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
        for m, r in p.items():
            assert r["samples_per_s"][0] == pytest.approx(
                sample["results"][m]["samples_per_s"], rel=1e-9)
            assert r["nodes"] == [1, 2, 16]
    assert math.isfinite(got["hybrid_over_ps_16"]["eth25"])
    lk = json.loads(out.read_text())["links"]["eth25"]
    assert (lk["latency"], lk["bandwidth"]) == (10e-6, 3.1e9)
    sc.main([SAMPLE, "--json", str(out), "--preset", "ib100", "--latency", "2",
             "--bandwidth", "5"])
    lk = json.loads(out.read_text())["links"]["ib100"]
    assert (lk["latency"], lk["bandwidth"]) == pytest.approx((2e-6, 5e9))
