"""A GPU worker's step waits on the host once (``modes.step``), checked on CPU stand-ins (no
device needed): a fake cupy whose copies run only when the host waits (a stream or event
synchronisation) and whose events read a fake device clock. Oracles: the folded phase
seconds == the fake clock's elapsed times; a staged buffer holds the device values only
after the sync and is reused; ``Mode.update``'s one sync comes after every queued
device->host copy and before every MPI call; the dense Allreduce in buckets on a fake GPU
and a fake two-worker communicator gives the CPU optimizer's weights with the summed
gradient, and no MPI call happens inside backward; and the whole GPU training path on a
NumPy-backed stand-in for CuPy (``tests/fake_cupy.py``) == the NumPy run, with one host
wait per step, in every mode."""

import io
from dataclasses import replace
from types import SimpleNamespace as NS

import numpy as np
import pytest

from pshybrid import backend
from pshybrid.config import TrainConfig
from pshybrid.synthetic import SyntheticCTR
from pshybrid.timers import EventTimers, Timers

DATA = SyntheticCTR(seed=5, n_dense=3, cardinalities=(7, 30, 200, 5), zipf=1.3)


def _fake(monkeypatch):
    """A fresh fake device (``tests/fake_cupy.py``) whose events read ``state.now``."""
    import fake_cupy

    return fake_cupy.install(monkeypatch, now=0.0)


def _sync(fake):
    fake.cuda.get_current_stream().synchronize()


# -- phase timers from CUDA events ----------------------------------------------------------
def test_event_timers_fold_the_device_times_when_the_host_has_waited(monkeypatch):
    fake, timers = _fake(monkeypatch), Timers()
    ev = EventTimers(timers, fake.cuda)
    spans = [("fwd_bwd", 0.004), ("dense_apply", 0.001), ("fwd_bwd", 0.006)]
    for phase, seconds in spans:
        with ev.time(phase):
            fake.state.queue.append(lambda: None)  # the block's kernels, on the stream
            fake.state.now += seconds               # ... take this long on the device
        fake.state.now += 0.5                       # the host's own work between phases: not timed
    assert dict(timers) == {} and fake.state.log == []  # recorded, not waited for
    before = backend.host_waits()
    _sync(fake)                                   # the host waited anyway (a read back)
    ev.fold()
    assert timers["fwd_bwd"] == pytest.approx(0.010) and timers["dense_apply"] == \
        pytest.approx(0.001)
    assert backend.host_waits() == before          # the events were reached: no extra wait
    with ev.time("fwd_bwd"):                        # not reached when folded: one wait
        fake.state.queue.append(lambda: None)
        fake.state.now += 0.002
    ev.fold()
    assert backend.host_waits() == before + 1 and fake.state.log[-1] == "event sync"
    assert timers["fwd_bwd"] == pytest.approx(0.012)
    assert len(ev.free) == 6  # the last pair reused two folded events: 6 made, not 8


def test_event_timers_fold_what_is_reached_past_their_bound(monkeypatch):
    """A long log interval: past ``bound`` spans the reached ones are folded with no wait;
    a span not yet reached stays pending until the next fold."""
    fake, timers = _fake(monkeypatch), Timers()
    ev, n = EventTimers(timers, fake.cuda, bound=4), backend.host_waits()
    for _ in range(4):
        with ev.time("fwd_bwd"):
            fake.state.now += 0.001
    _sync(fake)                                   # a step's sync: all four reached
    with ev.time("fwd_bwd"):                      # the fifth: not reached (a queued copy)
        fake.state.queue.append(lambda: None)
        fake.state.now += 0.002
    assert len(ev.pending) == 1 and timers["fwd_bwd"] == pytest.approx(0.004)
    assert backend.host_waits() == n and len(ev.free) == 8
    ev.fold()
    assert timers["fwd_bwd"] == pytest.approx(0.006) and backend.host_waits() == n + 1


# -- pinned staging of device->host copies ---------------------------------------------------
def test_host_staging_is_readable_after_the_sync_and_reused(monkeypatch):
    fake, staging = _fake(monkeypatch), backend.HostStaging()
    dev = fake.asarray(np.arange(6.0).reshape(2, 3))
    host = staging.stage(fake, "g", dev)
    assert host.shape == (2, 3) and fake.state.log == ["alloc 48", "d2h queued"]
    _sync(fake)                                     # the step's sync
    np.testing.assert_array_equal(host, np.arange(6.0).reshape(2, 3))
    seen = host.copy()                              # MPI read it within that step
    dev[...] = -1                                   # the next step's kernels
    host2 = staging.stage(fake, "g", dev)
    assert np.shares_memory(host, host2) and fake.state.log.count("alloc 48") == 1  # reused
    np.testing.assert_array_equal(host2, seen)      # not overwritten before the next sync
    _sync(fake)
    np.testing.assert_array_equal(host2, -np.ones((2, 3)))
    padded = staging.stage(fake, "p", fake.asarray(np.ones(5, np.float32)), total=8)
    _sync(fake)
    assert padded.tolist() == [1.0] * 5 + [0.0] * 3  # a padded table: zero tail
    staging.stage(fake, "g", fake.asarray(np.ones(7)))  # larger: the buffer grows
    assert "alloc 56" in fake.state.log


def test_host_waits_counts_every_wait_through_the_backend(monkeypatch):
    fake = _fake(monkeypatch)
    dev, n = fake.asarray(np.ones(3)), backend.host_waits()
    backend.synchronize(np.ones(2))                 # NumPy: nothing to wait for
    assert backend.to_host(np.ones(2)).sum() == 2 and backend.host_waits() == n
    backend.synchronize(dev)
    backend.to_host(dev)
    event = fake.cuda.Event()
    event.record()
    backend.wait_event(event)                       # reached already: no wait
    assert backend.host_waits() == n + 2 and fake.state.log == ["stream sync", "blocking get"]


# -- Mode.update: one sync, after every D2H, before every MPI call ---------------------------
class _Recorder:
    """A strategy stub: each method logs "<kind>.<method>" (``stage``: a D2H queued;
    ``start``/``finish``: MPI calls)."""

    def __init__(self, kind, log, live=False, server_step=False, sync_point=False):
        self.kind, self.log, self.live, self.server_step = kind, log, live, server_step
        self.sync_point = sync_point

    def __getattr__(self, name):
        def call(*args):
            self.log.append(f"{self.kind}.{name}")
            return self.sync_point if name == "sync" else None
        return call


def _mode(monkeypatch, log, xp, sparse_live, server_step, allreduce):
    from pshybrid.modes import step as mode_step

    monkeypatch.setattr(mode_step, "synchronize", lambda *a: log.append("SYNC"))
    mode = mode_step.Mode.__new__(mode_step.Mode)
    mode.xp, mode.timers = xp, Timers()
    mode.sparse = _Recorder("sparse", log, live=sparse_live, server_step=server_step)
    mode.dense = _Recorder("dense", log, sync_point=allreduce)
    mode.live, mode.server_step = sparse_live, server_step
    barrier = NS(Barrier=lambda: log.append("mpi.Barrier"))
    mode.topo = NS(workers=barrier, colocated=False)
    mode.link = NS(step=lambda grads_for: log.append("mpi.step message"),
                   wait=lambda timers, idle: log.append("mpi.acknowledgement wait"))
    return mode


CASES = {"hybrid adagrad": (False, True, True), "hybrid sgd": (True, False, True),
         "allreduce": (False, False, True), "ps adam": (False, True, False),
         "ps sgd": (True, False, False)}


@pytest.mark.parametrize("case", CASES)
def test_update_on_a_gpu_syncs_once_after_every_d2h_and_before_any_mpi(monkeypatch, case):
    log = []
    mode = _mode(monkeypatch, log, _fake(monkeypatch), *CASES[case])
    mode.update(NS(), "demb", 3)
    stages = [i for i, e in enumerate(log) if e.endswith(".stage")]
    mpi = [i for i, e in enumerate(log) if e.endswith((".start", ".finish", ".sync"))
           or e.startswith("mpi.")]
    assert log.count("SYNC") == 1 and len(stages) == 2 and mpi
    assert max(stages) < log.index("SYNC") < min(mpi), log
    # the CPU path: the same moves in the same order, no staging, no sync
    cpu = []
    _mode(monkeypatch, cpu, np, *CASES[case]).update(NS(), "demb", 3)
    assert cpu == [e for e in log if e != "SYNC" and not e.endswith(".stage")]


# -- the dense Allreduce in buckets on a fake GPU ---------------------------------------------
class _TwoWorkers:
    """A communicator of two workers whose other worker contributes the same gradient: a
    SUM doubles the buffer (when completed). Checks that MPI never reads a host buffer
    before the copies queued into it ran (i.e. before the step's sync)."""

    def __init__(self, fake, log):
        self.fake, self.log = fake, log

    def Iallreduce(self, _inplace, spec):
        buf = spec[0]
        assert isinstance(buf, np.ndarray) and not isinstance(buf, self.fake.ndarray)
        assert self.fake.state.done == len(self.fake.state.queue), "MPI read a copy still queued"
        self.log.append(("Iallreduce", buf.size))
        return NS(Wait=lambda: buf.__imul__(2))

    def Allreduce(self, _inplace, spec):
        buf = spec[0]
        assert isinstance(buf, self.fake.ndarray)  # CUDA-aware: the device span itself
        assert self.fake.state.done == len(self.fake.state.queue), "MPI read device memory unsynced"
        self.log.append(("Allreduce", buf.size))
        buf *= 2


@pytest.mark.parametrize("cuda_aware", [False, True])
def test_allreduce_dense_on_a_gpu_starts_its_buckets_after_the_sync(monkeypatch, cuda_aware):
    from pshybrid.layers import ParamSpace
    from pshybrid.modes.dense import AllreduceDense
    from pshybrid.optim import Optimizer

    fake, log = _fake(monkeypatch), []
    params = ParamSpace()
    for name, shape in (("a", (40,)), ("b", (8, 8)), ("c", (30,)), ("d", (5,))):
        params.add(name, shape, "uniform", 0.1)
    params.build(np, np.dtype("float64"), 0)
    w0 = params.flat.copy()
    params.flat, params.flat_grad = fake.asarray(params.flat), fake.asarray(params.flat_grad)
    timers = Timers()
    ctx = NS(params=params, xp=fake, timers=timers, cuda_aware=cuda_aware,
             topo=NS(is_worker=True, workers=_TwoWorkers(fake, log)),
             kernel_timers=EventTimers(timers, fake.cuda), staging=backend.HostStaging())
    dense = AllreduceDense(ctx, Optimizer("adam", 0.01), bucket_bytes=200)
    g = np.random.default_rng(0).standard_normal(params.size)
    for names in (["d"], ["c"], ["b"], ["a"]):  # backward: the last layer first
        for n in names:
            span = slice(params.offset(n), params.offset(n) + int(np.prod(params.shape(n))))
            params.flat_grad[span] = fake.asarray(g[span])  # a kernel writes it
        params.grads_ready(*names)                    # at kernel launch time on a GPU
    assert log == []                              # no MPI inside backward
    dense.stage(1)                                # Mode.update's move 0 ...
    _sync(fake)                                   # ... and its one sync
    dense.start(1)
    assert dense.sync(1) is True
    _sync(fake)                                   # the end of the run (a read back)
    assert len(log) >= 3 and sum(n for _, n in log) == params.size  # several buckets, all
    ref_w, ref_g = w0.copy(), 2 * g
    Optimizer("adam", 0.01).update(ref_w, ref_g, {"m": np.zeros_like(g), "v": np.zeros_like(g)},
                                   1)
    np.testing.assert_array_equal(np.asarray(params.flat_grad), ref_g)  # the sum came back
    np.testing.assert_allclose(np.asarray(params.flat), ref_w, rtol=1e-13)
    assert fake.state.log.count("stream sync") == 2 and "blocking get" not in fake.state.log


# -- the whole GPU training path on a NumPy-backed stand-in for CuPy --------------------------
def _train_fake_gpu(monkeypatch, cfg, comm):
    """Train ``cfg`` with ``--device cuda`` on ``tests/fake_cupy.py`` -> (result, the host waits
    of each steady-state step: the 3rd to the 5th, no log or checkpoint among them)."""
    import fake_cupy

    from pshybrid.train import train

    fake_cupy.install(monkeypatch)
    seen = []
    got = train(replace(cfg, device="cuda"), comm, dataset=DATA, collect=True,
                out=io.StringIO(), on_step=lambda done: seen.append(backend.host_waits()))
    return got, np.diff(seen[1:-1]).tolist()


def _one_process(cfg, batch_size):
    """The NumPy run of ``cfg`` in one process with ``batch_size`` (the global batch)."""
    from mpi4py import MPI

    from pshybrid.train import train

    one = replace(cfg, mode="allreduce", servers=0, placement="dedicated",
                  batch_size=batch_size)
    return train(one, MPI.COMM_SELF, dataset=DATA, collect=True, out=io.StringIO())


BASE = TrainConfig(model="wdl", embedding_dim=4, mlp=(32, 16), steps=6, batch_size=8,
                   dtype="float64", lr=0.2, dense_lr=0.05, seed=3, log_every=1000,
                   sparse_optimizer="adagrad", dense_optimizer="adam", bucket_mb=0.001)


@pytest.mark.parametrize("bucket_mb,cuda_aware", [(0.0, "off"), (0.001, "off"),
                                                  (0.001, "on")])
def test_fake_gpu_training_waits_once_per_step_and_equals_numpy(monkeypatch, bucket_mb,
                                                                cuda_aware):
    """allreduce mode on one worker: every steady-state step waits on the host once, and the
    run's parameters are the NumPy run's (the stand-in's copies run only at a host wait: a
    read before the step's sync would train on stale gradients)."""
    from mpi4py import MPI

    cfg = replace(BASE, mode="allreduce", servers=0, bucket_mb=bucket_mb, cuda_aware=cuda_aware)
    ref = _one_process(cfg, cfg.batch_size)
    got, waits = _train_fake_gpu(monkeypatch, cfg, MPI.COMM_SELF)
    assert waits == [1, 1, 1], waits
    np.testing.assert_allclose(got.dense, ref.dense, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.table, ref.table, rtol=1e-12, atol=1e-15)
    assert got.summary["phase_seconds"]["fwd_bwd"] > 0  # the events' times were folded
    assert got.summary["host_syncs_per_step"] >= 1


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,placement,sparse_opt", [
    ("hybrid", "dedicated", "adagrad"), ("hybrid", "dedicated", "sgd"),
    ("hybrid", "colocated", "adagrad"), ("ps", "dedicated", "adam")])
def test_fake_gpu_workers_wait_once_per_step_and_equal_one_process(comm, monkeypatch, mode,
                                                                   placement, sparse_opt):
    """GPU workers (the stand-in) + CPU servers under BSP == one NumPy process with the
    global batch, and one host wait per steady-state step on every worker: the step kernel
    by kernel (``--cuda-graphs off``; ``tests/test_graphs.py`` runs the graphs)."""
    from mpi_util import assert_all

    colocated = placement == "colocated"
    W = comm.size if colocated else comm.size - 1
    cfg = replace(BASE, mode=mode, placement=placement, servers=None if colocated else 1,
                  sparse_optimizer=sparse_opt, shared_memory="off", cuda_aware="off",
                  cuda_graphs="off")
    got, waits = _train_fake_gpu(monkeypatch, cfg, comm)
    ok, msg = True, ""
    if got.role == "worker":
        ref = _one_process(cfg, W * cfg.batch_size)
        err = max(float(np.max(np.abs(got.dense - ref.dense))),
                  float(np.max(np.abs(got.table - ref.table))))
        if waits != [1, 1, 1] or err > 1e-12:
            ok, msg = False, f"{mode} {placement}: waits {waits}, max error {err}"
    assert_all(comm, ok, msg)
