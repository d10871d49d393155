"""The GPU path's host-side logic on CPU stand-ins (no device needed): bench/timing.py's kernel
timing method (bench/gpu_check.py: many launches between two CUDA events, beside a copy of the
same bytes) on a fake clock whose time only the timed calls and the marks advance (analytic
oracle) and on the host clock around NumPy kernels; ``backend.to_device``'s pinned staging
ring on a fake cupy; and ``steplog.StepLog``'s GPU branch (loss read back once per log interval
and before a checkpoint) with a stand-in array module."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "bench"))
from timing import HostClock, per_launch  # noqa: E402


class FakeClock:
    """A device timeline: ``now`` advances by what ``work`` costs and by ``mark_cost`` per
    mark (an event's own overhead, after the reading it records)."""

    def __init__(self, mark_cost=0.0):
        self.now, self.mark_cost, self.marks = 0.0, mark_cost, 0

    def mark(self):
        t = self.now
        self.now += self.mark_cost
        self.marks += 1
        return t

    def elapsed(self, start, stop):
        return stop - start


def test_per_launch_is_the_cost_of_one_call_with_marks_amortised():
    clock, calls = FakeClock(mark_cost=50.0), []

    def work():
        calls.append(1)
        clock.now += 100.0 if len(calls) <= 2 else 1.0  # warm-ups are slow (compile, caches)

    got = per_launch(work, clock, launches=50, repeat=3, warmup=2)
    assert len(calls) == 2 + 50 * 3 and clock.marks == 2 * 3
    assert got == pytest.approx(1.0 + 50.0 / 50)  # the call, plus one mark's cost / launches
    # one launch per mark pair (the old method) times the mark's overhead as the kernel's
    clock2 = FakeClock(mark_cost=50.0)
    assert per_launch(lambda: setattr(clock2, "now", clock2.now + 1.0), clock2, 1, 1, 0) == 51.0


def test_per_launch_takes_the_median_round():
    clock, costs = FakeClock(), iter([0.0, 0.0] + [5.0] * 4 + [1.0] * 4 + [2.0] * 4)

    def work():
        clock.now += next(costs)

    assert per_launch(work, clock, launches=4, repeat=3) == 2.0


def test_host_clock_syncs_before_each_mark_and_times_numpy_beside_a_copy():
    syncs = []
    clock = HostClock(sync=lambda: syncs.append(1))
    rng = np.random.default_rng(0)
    table = rng.standard_normal((1 << 14, 16)).astype(np.float32)
    idx = rng.integers(0, table.shape[0], 1 << 14)
    out, src = np.empty((idx.size, 16), np.float32), np.ones((idx.size, 16), np.float32)
    gather = per_launch(lambda: np.take(table, idx, axis=0, out=out), clock, 5, 3)
    copy = per_launch(lambda: np.copyto(out, src), clock, 5, 3)
    assert len(syncs) == 2 * 3 * 2 and gather > 0 and copy > 0
    np.testing.assert_array_equal(out, src)  # the copy really ran last
    np.take(table, idx, axis=0, out=out)
    np.testing.assert_array_equal(out, table[idx])


class FakeCuda:
    """The part of cupy that ``backend.to_device`` uses, on NumPy: pinned memory is a
    bytearray, an event records the copies queued before it, ``set`` queues a copy (run at
    the next synchronize of an event recorded after it)."""

    def __init__(self):
        self.queue, self.log, self.done = [], [], 0
        fake = self

        class Event:
            def record(self):
                self.upto = len(fake.queue)

            @property
            def done(self):
                return fake.done >= self.upto

            def synchronize(self):
                fake.run(self.upto)
                fake.log.append(("sync", self.upto))

        class Dev(np.ndarray):
            def set(self, host, stream=None):
                assert stream == "stream", "the copy must be asynchronous, on the stream"
                fake.queue.append(lambda dst=self, src=host: np.copyto(dst, src))

        self.cuda = type("cuda", (), {
            "Event": Event, "get_current_stream": staticmethod(lambda: "stream"),
            "alloc_pinned_memory": staticmethod(lambda n: (fake.log.append(("alloc", n)),
                                                           bytearray(n))[1])})
        self.empty = lambda shape, dtype: np.empty(shape, dtype).view(Dev)

    def run(self, upto):
        """Complete the queued copies up to ``upto`` (each runs once, in order)."""
        while self.done < upto:
            self.queue[self.done]()
            self.done += 1

    def drain(self):
        self.run(len(self.queue))


def test_to_device_stages_through_reused_pinned_slots():
    """Each copy: host -> a pinned slot (cast there), then an asynchronous copy on the
    stream; a slot is overwritten only after its last copy's event completed; slots grow."""
    from pshybrid import backend

    fake, ring = FakeCuda(), backend._PinnedRing(slots=2)
    rng = np.random.default_rng(0)
    hosts = [rng.standard_normal((5, 3)), rng.standard_normal(4), rng.standard_normal((7, 3)),
             rng.standard_normal(3)]
    devs = [ring.to_device(fake, h, np.float32) for h in hosts]
    assert [e for e in fake.log if e[0] == "alloc"] == [("alloc", 60), ("alloc", 16),
                                                       ("alloc", 84)]  # slot 0 grew, not 1
    # each slot's previous copy was waited for (and so had run) before the slot's reuse
    assert [e for e in fake.log if e[0] == "sync"] == [("sync", 1), ("sync", 2)]
    fake.drain()
    for d, h in zip(devs, hosts):
        assert d.dtype == np.float32 and d.shape == h.shape
        np.testing.assert_array_equal(np.asarray(d), h.astype(np.float32))
    same = np.arange(6.0)
    assert backend.to_device(np, same) is same  # NumPy: no copy
    assert backend.to_device(np, same, np.float32).dtype == np.float32


def _fake_job(log_every, steps, checkpoint_every=0):
    """What ``steplog.StepLog`` reads of a job, on a GPU worker: ``mode.xp`` is not NumPy (a
    stand-in whose arrays are NumPy's), one worker (the Allreduce is the identity)."""
    from collections import defaultdict
    from types import SimpleNamespace as NS

    from mpi4py import MPI

    fake_xp = NS(stack=np.stack)
    return NS(mode=NS(xp=fake_xp, timers=defaultdict(float), stale=None,
                      kernel_timers=NS(fold=lambda: None)), reporter=None,
              steps=steps, start=0,
              cfg=NS(batch_size=4, log_every=log_every, checkpoint_every=checkpoint_every,
                     checkpoint_dir="ck" if checkpoint_every else None),
              topo=NS(worker_index=0, workers=MPI.COMM_SELF),
              totals=np.zeros(3), result=NS(log=[]))


def test_gpu_log_reads_the_loss_back_once_per_interval(monkeypatch):
    """GPU branch of ``steplog.StepLog``: the loss and label sums stay "on the device"
    (reads counted) until the log step; the logged loss is the interval's mean, as on CPU."""
    from pshybrid import steplog

    reads = []
    monkeypatch.setattr(steplog, "to_host", lambda a: (reads.append(1), np.asarray(a))[1])
    job = _fake_job(log_every=3, steps=6)
    log = steplog.StepLog(job)
    losses, labels = [0.5, 0.25, 1.0, 2.0, 0.5, 0.5], [np.array([1.0, 0, 1, 0])] * 6
    for done, (l, y) in enumerate(zip(losses, labels), 1):
        log.add(done, np.float32(l), y)
        assert len(reads) == done // 3  # one read per interval, none in between
    assert job.totals.tolist() == [sum(losses), 24.0, 12.0]


@pytest.mark.parametrize("every,want", [(0, 4), (3, 3)])
def test_gpu_log_stops_a_diverged_run_by_the_next_log_or_checkpoint(monkeypatch, every, want):
    """A NaN loss at step 2 on a GPU is found at the next read: the log step (4), or a
    checkpoint step before it (3), so no checkpoint holds the diverged parameters."""
    from pshybrid import steplog

    monkeypatch.setattr(steplog, "to_host", np.asarray)
    log = steplog.StepLog(_fake_job(log_every=4, steps=8, checkpoint_every=every))
    y = np.array([1.0, 0, 0, 0])
    log.add(1, np.float32(0.5), y)
    log.add(2, np.float32("nan"), y)
    with pytest.raises(steplog.TrainingDiverged, match=f"loss is nan in the steps up to {want} "):
        for done in range(3, 9):
            log.add(done, np.float32(0.5), y)
            assert done < want


def test_a_loss_far_above_its_start_is_divergence_on_cpu_and_gpu(monkeypatch):
    """Oracle: the rule stated in docs/checkpoints.md, exactly: a mean loss per sample above
    1e6 * log(2) stops the run (CPU: each step; GPU: at the read-back, over the samples
    since the last one); at the bound it does not. ``--lr 1e30`` reached 2e30 and exited 0."""
    import math

    from pshybrid import steplog

    job = _fake_job(log_every=2, steps=4)
    bound = 1e6 * math.log(2)
    steplog.check_loss(job, 4 * bound, 4, "at step 1", 0)  # a mean of exactly the bound
    with pytest.raises(steplog.TrainingDiverged, match=r"loss is 6.93e\+05 per sample \(above "
                       r"1e6 x log 2 = 6.93e\+05: diverging\) at step 1 on worker 0"):
        steplog.check_loss(job, 4 * bound * (1 + 1e-9), 4, "at step 1", 0)
    monkeypatch.setattr(steplog, "to_host", np.asarray)
    log = steplog.StepLog(job)
    y = np.array([1.0, 0, 0, 0])
    log.add(1, 2.5e6, y)  # 2.5e6 + 0.5 over 8 samples: 3.1e5 per sample, below the bound
    log.add(2, 0.5, y)
    log.add(3, 1e30, y)
    with pytest.raises(steplog.TrainingDiverged, match="loss is 1.25e.29 per sample .* in "
                       "the steps up to 4 "):
        log.add(4, 0.0, y)


def test_a_diverged_run_names_its_last_checkpoint_or_says_there_is_none(tmp_path):
    """(It named DIR/latest before any checkpoint was written, where there was none; and
    called "good" a checkpoint whose parameters the diverging loss came from.)"""
    from pshybrid import steplog

    job = _fake_job(log_every=2, steps=4, checkpoint_every=2)
    job.cfg.checkpoint_dir = str(tmp_path / "ck")
    (tmp_path / "ck").mkdir()
    for latest, want in ((None, f"no checkpoint was written in {tmp_path / 'ck'} yet"),
                         ("step-1", f"{tmp_path / 'ck'}/latest names the last good checkpoint "
                                    "(step-1)"),
                         ("step-2", f"{tmp_path / 'ck'}/latest names step-2, whose parameters "
                                    "(finite) the steps of that loss started from")):
        if latest:  # (the loss of step 3, from the parameters after step 2: step-2's)
            (tmp_path / "ck" / "latest").write_text(latest + "\n")
        with pytest.raises(steplog.TrainingDiverged) as e:
            steplog.check_loss(job, float("nan"), 4, "at step 3", 2)
        assert "training stopped; " + want in str(e.value), e.value


@pytest.mark.parametrize("latest,safe", [("step-6", True), ("step-8", False)])
def test_a_gpu_run_resumed_names_a_checkpoint_by_the_step_of_the_last_read(tmp_path, monkeypatch,
                                                                         latest, safe):
    """On a GPU the diverging loss is read back at a checkpoint or log step: its steps
    started from the parameters of the read before (8 here, the run resumed at 4 and read at
    6 and 8), so ``latest`` step-6 is the last good one and step-8 may diverge again."""
    from pshybrid import steplog

    monkeypatch.setattr(steplog, "to_host", np.asarray)
    job = _fake_job(log_every=100, steps=12, checkpoint_every=2)
    job.start, job.cfg.checkpoint_dir = 4, str(tmp_path)
    (tmp_path / "latest").write_text(latest + "\n")
    log, y = steplog.StepLog(job), np.array([1.0, 0, 0, 0])
    for done in range(5, 9):
        log.add(done, np.float32(0.5), y)
    log.add(9, np.float32("nan"), y)
    with pytest.raises(steplog.TrainingDiverged, match="in the steps up to 10 ") as e:
        log.add(10, np.float32(0.5), y)
    assert (f"names the last good checkpoint ({latest})" in str(e.value)) == safe, e.value
    assert (f"names {latest}, whose parameters (finite)" in str(e.value)) != safe, e.value
