"""transport.Pacer (the servers' polling): against a wall clock, no MPI traffic. An event
that comes early is seen within about ``idle`` whatever gap was learned, gaps that were
not steps are forgotten, and a back-to-back checker (own core) sees events at once."""

import time

import pytest

from pshybrid.transport import Pacer


def after(seconds):
    """A test() that turns true ``seconds`` from now, and counts its calls."""
    t = time.perf_counter() + seconds
    calls = []

    def test():
        calls.append(1)
        return time.perf_counter() >= t

    test.calls = calls
    return test


def timed(pacer, test, learn=True):
    t0 = time.perf_counter()
    pacer.wait(test, learn)
    return time.perf_counter() - t0


@pytest.mark.parametrize("own_core", [False, True])
def test_an_early_event_is_seen_within_idle_after_a_long_gap(own_core):
    p = Pacer(own_core=own_core)
    timed(p, after(0.2))  # a slow first step (numba loading its kernels)
    dt = timed(p, after(0.005))  # then steps are quick: the nap must not hold it up
    assert dt < 0.005 + 5 * p.idle, dt
    assert p.gaps[-1] < 0.05


def test_learns_the_gap_and_naps_through_part_of_it():
    p = Pacer()
    for _ in range(3):
        timed(p, after(0.02))
    test = after(0.02)
    dt = timed(p, test)
    assert 0.02 <= dt < 0.02 + 5 * p.idle
    # it napped: far fewer checks than one per `fine` over the whole gap
    assert len(test.calls) < 0.02 / p.fine / 2, len(test.calls)


def test_forget_drops_a_gap_that_was_not_a_step():
    p = Pacer()
    timed(p, after(0.01))
    timed(p, after(0.3))  # the pause before a checkpoint
    p.forget()
    assert len(p.gaps) == 1 and p.gaps[0] < 0.05


def test_follow_up_waits_neither_nap_nor_learn():
    p = Pacer()
    timed(p, after(0.05))
    n = len(p.gaps)
    dt = timed(p, after(0.002), learn=False)
    assert dt < 0.002 + 5 * p.idle and len(p.gaps) == n
