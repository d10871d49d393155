"""The servers' side of a step, and the messages workers send them.

Servers hold shards in the store's RMA window, which workers read and write one-sidedly;
what needs the servers' own hands is an optimizer step (Adagrad/Adam rows, or the dense
table in ``ps`` mode) and a checkpoint. Each step every worker sends every server one
message (two-sided, int64): TAG_STEP with the local rows it touched (possibly none), TAG_CKPT
with a step number, or TAG_STOP. A server handles rounds of one message from every worker:

- STEP: apply the step's optimizers to the union of the rows, then join an Ibarrier over
  the world, which the workers wait on: once it completes, every pull of the next step sees
  every update of this one;
- CKPT: join ``checkpoint.save`` (collective with the workers);
- STOP: return.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..kernels import unique_inverse
from ..transport import idle_barrier, poll_recv

TAG_STEP, TAG_STOP, TAG_CKPT = 101, 102, 103


class ServerLink:
    """Workers' end: the messages above, and the wait for the servers' step."""

    def __init__(self, topo):
        self.topo = topo
        self.bytes = 0  # row-id messages sent

    def send(self, tag: int, payloads) -> None:
        """Wire: payloads[s] (int64) to server s with ``tag``; waits for the sends only."""
        bufs = [np.ascontiguousarray(p, dtype=np.int64) for p in payloads]  # alive until Waitall
        self.bytes += sum(b.nbytes for b in bufs) if tag == TAG_STEP else 0
        MPI.Request.Waitall([self.topo.world.Isend([b, MPI.INT64_T], r, tag)
                             for b, r in zip(bufs, self.topo.server_ranks)])

    def step(self, touched) -> None:
        """Tell each server s the local rows ``touched(s)`` this worker changed."""
        self.send(TAG_STEP, [touched(s) for s in range(self.topo.n_servers)])

    def wait(self) -> None:
        """Wire: zero-byte Ibarrier over world; servers join after applying the step."""
        self.topo.world.Ibarrier().Wait()

    def checkpoint(self, step: int) -> None:
        self.send(TAG_CKPT, [[step]] * self.topo.n_servers)

    def stop(self) -> None:
        self.send(TAG_STOP, [[]] * self.topo.n_servers)


def serve(topo, mode, start_step: int, on_checkpoint) -> None:
    """Servers: handle rounds of one message from every worker until STOP (see above).
    ``mode.server_apply(rows, step)`` applies a step; ``on_checkpoint(step)`` saves."""
    timers, win = mode.timers, mode.store.win
    step = start_step
    while True:
        msgs = []
        with timers.time("wait"):
            for r in topo.worker_ranks:
                msgs.append(poll_recv(topo.world, r))  # Wire: one message from worker r
        tags = {tag for _, tag in msgs}
        assert len(tags) == 1, f"workers out of step: tags {tags}"
        tag = tags.pop()
        if tag == TAG_STOP:
            return
        if tag == TAG_CKPT:
            on_checkpoint(int(msgs[0][0][0]))
            continue
        step += 1
        with timers.time("server_apply"):
            win.Sync()  # see the workers' completed Accumulates
            rows = unique_inverse(np.concatenate([m for m, _ in msgs]))[0]
            mode.server_apply(rows, step)
            win.Sync()  # publish before the workers' next Get
        with timers.time("wait"):
            idle_barrier(topo.world)  # Wire: the Ibarrier the workers wait on (ServerLink.wait)
