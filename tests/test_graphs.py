"""A GPU worker's step as one CUDA graph (``pshybrid.graphs``), checked on the NumPy-backed
stand-in for CuPy (``tests/fake_cupy.py``: a capture records each operation on its buffers,
runs nothing that counts, and leaves what the graph writes as garbage; a launch replays).
Oracles: graphs == eager (the same body, kernel by kernel) == the NumPy run, float64, in
every model, mode and placement; the capacity rule by hand; the stand-in's capture itself
(a replay reads the buffers' values at launch time; a host wait in a capture raises); a
capture that fails runs eagerly with the reason in the summary; the dense gradient buckets
are cut alike with graphs on and off; and a graph step makes fewer launches."""

import io
from dataclasses import replace

import numpy as np
import pytest

from pshybrid import graphs
from pshybrid.config import TrainConfig
from pshybrid.synthetic import SyntheticCTR

DATA = SyntheticCTR(seed=5, n_dense=3, cardinalities=(7, 30, 200, 5), zipf=1.3)
BASE = TrainConfig(model="wdl", embedding_dim=4, mlp=(32, 16), steps=6, batch_size=8,
                   dtype="float64", lr=0.2, dense_lr=0.05, seed=3, log_every=1000,
                   sparse_optimizer="adagrad", dense_optimizer="adam", bucket_mb=0.001,
                   mode="allreduce", servers=0, cuda_aware="off")


def _fake(monkeypatch):
    import fake_cupy

    return fake_cupy.install(monkeypatch)


def _train(cfg, comm, on_step=None):
    from pshybrid.train import train

    return train(cfg, comm, dataset=DATA, collect=True, out=io.StringIO(), on_step=on_step)


def _gpu(monkeypatch, cfg, comm, graphs_):
    """Train ``cfg`` on the stand-in with ``--cuda-graphs graphs_`` -> (result, launches of
    each step after the first)."""
    fake, seen = _fake(monkeypatch), []
    got = _train(replace(cfg, device="cuda", cuda_graphs=graphs_), comm,
                 on_step=lambda done: seen.append(fake.state.launches))
    return got, np.diff(seen).tolist()


def _rel(a, b) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def test_capacity_is_a_power_of_two_from_the_minimum_capped_by_the_batch():
    M = graphs.MIN_CAPACITY
    assert [graphs.capacity(u, 10**6) for u in (0, 1, M - 1, M, M + 1, 3 * M)] == \
        [M, M, M, M, 2 * M, 4 * M]
    assert graphs.capacity(5000, 4096) == 4096 and graphs.capacity(3, 2) == 2
    # a row padded to whole 16-byte vectors: dim 16 + the wide weight, in float32 and float64
    assert [graphs.padded_width(e, np.float32) for e in (16, 17, 20)] == [16, 20, 20]
    assert [graphs.padded_width(e, np.float64) for e in (4, 5)] == [4, 6]


def test_the_stand_in_replays_a_capture_on_its_buffers_and_refuses_host_waits(monkeypatch):
    fake = _fake(monkeypatch)
    x, z = fake.asarray(np.arange(4.0)), fake.zeros(4)
    s = fake.cuda.Stream(non_blocking=True)
    s.begin_capture()
    y = x * 2.0
    z[...] = y + 1.0
    with pytest.raises(RuntimeError, match="capture"):
        s.synchronize()  # a host wait inside a capture
    g = s.end_capture()
    assert np.isnan(np.asarray(z.view(np.ndarray))).all()  # CUDA ran nothing: garbage
    x[...] = np.asarray(10.0)
    before = fake.state.launches
    g.launch()
    np.testing.assert_array_equal(z.view(np.ndarray), [21.0] * 4)  # x's value at the launch
    assert fake.state.launches == before + 1
    with pytest.raises(AssertionError):
        fake.cuda.get_current_stream().begin_capture()  # not on the legacy stream


@pytest.mark.parametrize("model", ["wdl", "deepfm", "dcn", "dcnv2", "dlrm"])
def test_graphs_equal_eager_equal_numpy_with_fewer_launches(monkeypatch, model):
    from mpi4py import MPI

    cfg = replace(BASE, model=model, steps=7)
    ref = _train(cfg, MPI.COMM_SELF)
    on, on_launches = _gpu(monkeypatch, cfg, MPI.COMM_SELF, "on")
    off, off_launches = _gpu(monkeypatch, cfg, MPI.COMM_SELF, "off")
    assert on.summary["cuda_graphs"] == "on" and off.summary["cuda_graphs"].startswith("off")
    for got in (on, off):
        assert _rel(got.dense, ref.dense) < 1e-9 and _rel(got.table, ref.table) < 1e-9
    assert _rel(on.dense, off.dense) < 1e-12
    steady = slice(2, -1)  # after the eager step and the capture, before the last read back
    assert max(on_launches[steady]) <= 12 < min(off_launches[steady]), (on_launches,
                                                                         off_launches)


def test_rows_pulled_into_the_pinned_buffer_equal_rows_copied_there(monkeypatch):
    """The pull writes the rows straight into the pinned buffer (``rows_out``); rows from
    anywhere else are copied there by ``run``: the same training, bit for bit, padded
    rows (WDL: dim 4 + the wide weight, 5 float64, padded to 6) included."""
    from mpi4py import MPI

    cfg = replace(BASE, embedding_dim=4, steps=5)
    in_place, _ = _gpu(monkeypatch, cfg, MPI.COMM_SELF, "on")
    monkeypatch.setattr(graphs.DeviceStep, "rows_out",
                        lambda self, U: np.full((U, self.E), np.nan, self.dtype))
    copied, _ = _gpu(monkeypatch, cfg, MPI.COMM_SELF, "on")
    assert np.array_equal(in_place.dense, copied.dense)
    assert np.array_equal(in_place.table, copied.table) and np.isfinite(copied.table).all()


def test_a_capture_that_fails_runs_eagerly_and_says_why(monkeypatch):
    """A body that waits on the host (here: the model's forward) cannot be captured: the
    step runs eagerly from then on, with the same results, and the summary names why."""
    from mpi4py import MPI

    from pshybrid import models

    forward = models.WDL.forward

    def waiting_forward(self, dense, emb):
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        return forward(self, dense, emb)

    ref = _train(BASE, MPI.COMM_SELF)
    monkeypatch.setattr(models.WDL, "forward", waiting_forward)
    got, _ = _gpu(monkeypatch, BASE, MPI.COMM_SELF, "auto")
    assert got.summary["cuda_graphs"].startswith("off: capture failed: RuntimeError")
    assert _rel(got.dense, ref.dense) < 1e-9 and _rel(got.table, ref.table) < 1e-9


def test_the_dense_buckets_are_cut_alike_with_graphs_on_and_off(monkeypatch):
    """The buckets' cuts happen in backward's callbacks, on the host: recorded at the capture
    and replayed with each launch, so a graph step starts the same buckets."""
    from mpi4py import MPI

    from pshybrid.modes.buckets import GradBuckets

    finish, cuts = GradBuckets.finish, []

    def spy(self):
        spans = finish(self)
        cuts[-1].append(tuple((s.start, s.stop) for s in spans))
        return spans

    monkeypatch.setattr(GradBuckets, "finish", spy)
    for g in ("off", "on"):
        cuts.append([])
        _gpu(monkeypatch, BASE, MPI.COMM_SELF, g)
    assert len(cuts[0]) == BASE.steps and len(set(cuts[0])) == 1 and len(cuts[0][0]) >= 2
    assert cuts[1] == cuts[0]


def test_multi_hot_fields_run_eagerly_and_refuse_graphs_on(monkeypatch, tmp_path):
    """Multi-hot pooling differs batch by batch: auto runs those steps kernel by kernel
    (== NumPy), on refuses the run with one clear error."""
    from mpi4py import MPI

    from pshybrid.errors import ConfigError
    from pshybrid.train import train
    from test_train_mpi import write_multi_hot

    path = str(tmp_path / "mh.h5")
    write_multi_hot(path, 100, seed=4)
    cfg = replace(BASE, data=path, batch_size=12)
    ref = train(cfg, MPI.COMM_SELF, collect=True, out=io.StringIO())
    _fake(monkeypatch)
    got = train(replace(cfg, device="cuda"), MPI.COMM_SELF, collect=True, out=io.StringIO())
    assert got.summary["cuda_graphs"] == "off: multi-hot fields"
    assert _rel(got.dense, ref.dense) < 1e-9 and _rel(got.table, ref.table) < 1e-9
    with pytest.raises(ConfigError, match="multi-hot") as e:
        train(replace(cfg, device="cuda", cuda_graphs="on"), MPI.COMM_SELF, out=io.StringIO())
    assert e.value.collective  # every rank raises it: not one rank's failure (MPI_Abort)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,placement,sparse_opt", [
    ("hybrid", "dedicated", "adagrad"), ("hybrid", "dedicated", "sgd"),
    ("hybrid", "colocated", "adam"), ("ps", "dedicated", "adam"),
    ("allreduce", "dedicated", "adagrad")])
def test_graph_workers_equal_one_process_waiting_once_a_step(comm, monkeypatch, mode,
                                                             placement, sparse_opt):
    """GPU workers (the stand-in) with graphs, CPU servers, under BSP == one NumPy process
    with the global batch, float64, in every mode and placement, one host wait a step
    (kernel by kernel: ``tests/test_gpu_sync.py``)."""
    from mpi4py import MPI

    from mpi_util import assert_all
    from pshybrid.backend import host_waits

    servers = 1 if mode != "allreduce" and placement == "dedicated" else None
    W = comm.size - (servers or 0)
    cfg = replace(BASE, mode=mode, placement=placement, servers=servers or 0,
                  sparse_optimizer=sparse_opt, shared_memory="off")
    if placement == "colocated":
        cfg = replace(cfg, servers=None)
    ref = _train(replace(cfg, mode="allreduce", servers=0, placement="dedicated",
                         batch_size=W * cfg.batch_size), MPI.COMM_SELF)
    _fake(monkeypatch)
    waits = []
    got = _train(replace(cfg, device="cuda", cuda_graphs="on"), comm,
                 on_step=lambda done: waits.append(host_waits()))
    ok, msg = True, ""
    if got.role == "worker":
        err = max(_rel(got.dense, ref.dense), _rel(got.table, ref.table))
        steady = np.diff(waits)[1:-1].tolist()  # after the first step, before the read back
        if err > 1e-9 or steady != [1] * (cfg.steps - 3):
            ok, msg = False, f"{mode} {placement}: relative error {err}, waits {steady}"
    assert_all(comm, ok, msg)


@pytest.mark.timeout(360)  # (its subprocess's own 300 s, not the suite's 120 s)
def test_step_launches_bench_counts_every_mode_within_12_with_graphs(tmp_path):
    """``bench/step_launches.py`` (it runs itself under mpiexec -n 2, with a timeout): every
    mode and placement, one host wait a step, graphs on within 12 launches and fewer than
    off; its last line names the largest."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "launches.json"
    p = subprocess.run([sys.executable, os.path.join(root, "bench", "step_launches.py"),
                        "--steps", "5", "--mlp", "64,32", "--json", str(out)],
                       capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())
    assert {(r["mode"], r["placement"]) for r in rows} == {
        ("allreduce", "dedicated"), ("hybrid", "dedicated"), ("ps", "dedicated"),
        ("hybrid", "colocated")}
    for r in rows:
        assert r["on"]["launches"] <= 12 < r["off"]["launches"], r
        assert r["on"]["host_waits"] == r["off"]["host_waits"] == 1, r
    most = max(r["on"]["launches"] for r in rows)
    assert p.stdout.strip().splitlines()[-1] == f"graphs on: max {most} launches per step"


def test_every_copy_carries_zeros_in_the_rows_pad(monkeypatch):
    """Every step's copy carries the rows and zeros in their pad (E 5 -> 6 float64), through
    capacities that grow the pinned buffer and smaller ones after, the rows pulled in place
    or copied by ``run``."""
    from mpi4py import MPI

    monkeypatch.setattr(graphs, "MIN_CAPACITY", 2)  # several capacities in a small run
    seen, run = [], graphs.DeviceStep.run

    def checked(self, label, dense, rows, inverse, timers=None):
        out = run(self, label, dense, rows, inverse, timers)
        U, slot = rows.shape[0], self._slot(rows.shape[0])
        dev = slot.rows.view(np.ndarray)[:U]  # (the stand-in's device array: NumPy)
        seen.append((U, slot.C, self.pinned.size, self.E, self.Ep))
        assert np.array_equal(dev[:, :self.E], rows) and not dev[:, self.E:].any(), U
        return out

    monkeypatch.setattr(graphs.DeviceStep, "run", checked)
    cfg = replace(BASE, embedding_dim=4, steps=12, batch_size=6)  # rows of 5 float64 -> 6
    _gpu(monkeypatch, cfg, MPI.COMM_SELF, "on")
    assert all((E, Ep) == (5, 6) for *_, E, Ep in seen), seen
    caps = [c for _, c, *_ in seen]
    assert len(set(caps)) >= 2 and any(b < a for a, b in zip(caps, caps[1:])), seen
    assert len({n for _, _, n, *_ in seen}) >= 2, seen  # the pinned buffer grew at least once
    monkeypatch.setattr(graphs.DeviceStep, "rows_out",
                        lambda self, U: np.full((U, self.E), np.nan, self.dtype))
    seen.clear()
    _gpu(monkeypatch, cfg, MPI.COMM_SELF, "on")  # the rows copied by run
    assert len(seen) == 12
