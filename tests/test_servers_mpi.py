"""modes.servers.ServerLink.wait: the step's sends stay in flight through ``idle`` (the next
batch is made while they move) until they have been found still pending after it
``MAX_BEHIND`` steps in a row; then they complete before ``idle``, except every
``RETRY``-th step, which overlaps them again. A server that posts its receives late keeps
a large message pending whatever the MPI, and a tiny one moves at once: the deterministic
cases. And ``apply_step``: a colocated rank's wait for the other ranks' step messages is its
``wait`` phase.

Runs at every world size tests/run.py uses: one server, the other ranks workers.
"""

import time

import numpy as np
import pytest

from mpi_util import assert_all
from pshybrid.modes import servers
from pshybrid.errors import PshybridError
from pshybrid.modes.servers import MAX_BEHIND, TAG_ACK, TAG_GRAD, TAG_STEP, ServerLink
from pshybrid.timers import Timers
from pshybrid.topology import Topology

BIG, WIDTH = 1 << 17, 16  # rows of a large step message: 8 MiB of sums (rendezvous in any MPI)


def serve(topo, late: float, rows: int) -> None:
    """The server's side of one step: after ``late`` seconds, every worker's message, in
    worker order, then a zero-byte acknowledgement to each."""
    time.sleep(late)
    for r in topo.worker_ranks:
        ids = np.empty(rows, np.int64)
        topo.world.Recv(ids, r, TAG_STEP)
        topo.world.Recv(np.empty((rows, WIDTH), np.float32), r, TAG_GRAD)
    for r in topo.worker_ranks:
        topo.world.Send(np.empty(0, np.uint8), r, TAG_ACK)


def run(comm, steps, watch):
    """Steps of (server late by, rows, worker's idle seconds). On a worker, after each
    ``wait``: ``watch(overlapped, link)`` (overlapped: ``idle`` ran with the step's sends
    in flight) is appended. -> (topo, the values; empty on the server)."""
    topo = Topology.create(comm, 1)
    link, seen = ServerLink(topo), []
    for late, rows, nap in steps:
        if topo.is_worker:
            link.send(TAG_STEP, [np.arange(rows, dtype=np.int64)],
                      [np.ones((rows, WIDTH), np.float32)])
            link.wait(Timers(), lambda: seen.append(link.pending > 0) or time.sleep(nap))
            seen[-1] = watch(seen[-1], link)
        else:
            serve(topo, late, rows)
    return topo, seen


@pytest.mark.mpi(min_size=2)
def test_sends_complete_before_idle_after_steps_that_did_not_move(comm):
    # three steps the server is late for, then one more
    steps = [(0.3, BIG, 0.0)] * (MAX_BEHIND + 1)
    topo, seen = run(comm, steps, lambda overlapped, link: (overlapped, link.behind))
    want = [(True, k) for k in range(1, MAX_BEHIND + 1)] + [(False, MAX_BEHIND)]
    assert_all(comm, not topo.is_worker or seen == want, f"{seen} != {want}")


@pytest.mark.mpi(min_size=2)
def test_a_step_whose_sends_moved_during_idle_resets_the_count(comm):
    # late (count 1), then a one-row message while the server waits (moved: 0), late again
    steps = [(0.3, BIG, 0.0), (0.0, 1, 0.2), (0.3, BIG, 0.0)]
    topo, seen = run(comm, steps, lambda overlapped, link: link.behind)
    assert_all(comm, not topo.is_worker or seen == [1, 0, 1], str(seen))


@pytest.mark.mpi(min_size=2)
def test_every_retry_th_step_overlaps_again_and_a_move_resumes_overlapping(comm, monkeypatch):
    retry = MAX_BEHIND + 3
    monkeypatch.setattr(servers, "RETRY", retry)
    # steps 1..MAX_BEHIND: late server (count up); then tiny messages, server waiting: in
    # order until step `retry`, which overlaps, sees them moved, and overlapping goes on
    steps = [(0.3, BIG, 0.0)] * MAX_BEHIND + [(0.0, 1, 0.05)] * (retry + 2 - MAX_BEHIND)
    topo, seen = run(comm, steps, lambda overlapped, link: overlapped)
    want = [True] * MAX_BEHIND + [False] * (retry - 1 - MAX_BEHIND) + [True] * 3
    assert_all(comm, not topo.is_worker or seen == want, f"{seen} != {want}")



@pytest.mark.mpi(min_size=2)
def test_a_colocated_rank_times_its_wait_for_the_other_ranks_messages(comm):
    """A colocated rank receives every rank's step message to its shard before applying
    it (``apply_step``): that wait is its ``wait`` phase, not untimed. Rank 1 sends its
    messages ``DELAY`` late; every other rank's ``wait`` holds the delay, and each applies
    one part per rank."""
    from types import SimpleNamespace

    from mpi4py import MPI

    DELAY = 0.1
    topo = Topology.create(comm, colocated=True)
    timers, applied = Timers(), []
    mode = SimpleNamespace(sparse=SimpleNamespace(grad_row=(WIDTH, np.float32)), timers=timers,
                           store=SimpleNamespace(win=SimpleNamespace(Sync=lambda: None)),
                           server_apply=lambda parts, step: applied.append(len(parts)))
    if topo.rank == 1:
        time.sleep(DELAY)
    ids, sums = np.arange(3, dtype=np.int64), np.ones((3, WIDTH), np.float32)
    reqs = [req for r in topo.server_ranks  # one step message to every rank's shard
            for req in (topo.world.Isend([ids, MPI.INT64_T], r, TAG_STEP),
                        topo.world.Isend([sums, MPI.FLOAT], r, TAG_GRAD))]
    servers.apply_step(topo, mode, 1)
    MPI.Request.Waitall(reqs)
    waited = timers["wait"]
    ok = applied == [topo.size] and (topo.rank == 1 or waited >= 0.8 * DELAY)
    assert_all(comm, ok, f"waited {waited:.3f} s for a {DELAY} s delay; applied {applied}")
    topo.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("before", ["nothing", "a step of every rank", "a step of rank 0"])
def test_colocated_ranks_end_on_every_ranks_stop(comm, before):
    """``ServerLink.stop`` on colocated ranks: each sends every rank a STOP and receives
    every rank's before its sends complete (one is to itself). A round of step messages
    that no rank applied (the same exception on each) comes first: dropped, and the STOPs
    are still received (none is left pending); one rank's step beside the others' ends is
    the workers out of step, on every rank."""
    from mpi4py import MPI

    topo = Topology.create(comm, colocated=True)
    link = ServerLink(topo)
    if before == "a step of every rank" or before == "a step of rank 0" and topo.rank == 0:
        link.step(lambda s: (np.arange(2, dtype=np.int64), np.ones((2, WIDTH), np.float32)))
    try:
        link.stop((WIDTH, np.float32))
        ok = before != "a step of rank 0"
        msg = f"{before}: no refusal"
    except PshybridError as e:
        ok = before == "a step of rank 0" and "worker 0 asked for a step while worker 1 " \
            "asked for the end (shutdown)" in str(e)
        msg = str(e)
        MPI.Request.Waitall(link._sending[0])  # (the sends: the test goes on)
    topo.world.Barrier()  # Wire: every rank has received what it will
    left = topo.world.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
    if left and before == "a step of rank 0":  # (the others' STOPs that rank 0 never read)
        while topo.world.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status := MPI.Status()):
            topo.world.Recv(np.empty(status.Get_count(MPI.BYTE), np.uint8), status.source,
                            status.tag)
    elif left:
        ok, msg = False, f"{before}: a message left unreceived after the stop"
    assert_all(comm, ok, msg)
    topo.free()
