"""The servers' side of a step, and the messages workers send them.

Servers hold shards in the store's RMA window, which workers read and write one-sidedly;
what needs the servers' own hands is an optimizer step (Adagrad/Adam rows, or the dense
table in ``ps`` mode) and a checkpoint. Each step that has a server-side optimizer (any
but plain SGD in both strategies) every worker sends every server one message (two-sided,
int64): TAG_STEP with the local rows whose gradients it sends (possibly none), followed by
TAG_GRAD with their gradient sums (rows x E floats); and when it is time, TAG_CKPT with a
step number, TAG_LR with the sparse optimizer's new learning rate (a float64's bits; sent
by ``pshybrid.torch`` when a scheduler changed it), or TAG_STOP. A server handles rounds of
one message from every worker:

- STEP: apply the step's optimizers (the sparse one to the union of the workers' rows, their
  sums added in worker order), then send every worker a zero-byte TAG_ACK, which it waits
  for: once it has every server's, every pull of its next step sees every update of this
  one (one message server -> worker: the acknowledgement is the end-of-step barrier; the
  worker makes its next batch meanwhile, with its step message still in flight where the
  MPI moves it alone: ``ServerLink.wait``);
- CKPT: join ``checkpoint.save`` (collective with the workers);
- LR: the sparse optimizer's learning rate from the next STEP on;
- STOP: return.

With ``--placement colocated`` every rank is a worker and a server: it receives every
worker's STEP inside its own step (``apply_step``) and, at the end, every worker's STOP
(``stopped``), so a worker that ends while the others step is named at once there too.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..errors import PshybridError
from ..threads import rank_cores
from ..transport import Pacer, mpi_type, poll_recv

TAG_STEP, TAG_STOP, TAG_CKPT, TAG_GRAD, TAG_LR = 101, 102, 103, 104, 105
_CALLS = {TAG_STEP: "a step", TAG_STOP: "the end (shutdown)", TAG_CKPT: "a checkpoint",
          TAG_LR: "a learning rate"}  # what a worker's message to the servers asks for
TAG_SIGNAL = 106  # the other way, server -> worker: a signal reached it (``preempt``)
TAG_ACK = 107     # server -> worker: the step is applied (zero bytes)
_NOTHING = np.empty(0, np.uint8)  # an acknowledgement's (empty) buffer
# ServerLink.wait: after MAX_BEHIND steps in a row whose sends did not move during ``idle``,
# the sends complete before it, but every RETRY-th step overlaps them again to re-check (a
# server still starting up, or late once, is not a transport that needs this rank)
MAX_BEHIND, RETRY = 3, 64
MOVE_POLLS = 4  # progress polls within which a send whose data has moved completes


class ServerLink:
    """Workers' end: the messages above, and the wait for the servers' step."""

    def __init__(self, topo):
        self.topo = topo
        self.bytes = 0  # step messages sent (rows and gradient sums)
        self._sending: tuple[list, list] = ([], [])  # (requests, their buffers) in flight
        self.behind = 0  # steps in a row whose sends were still in flight after ``idle``
        self.waits = 0   # ``wait`` calls with an ``idle``

    def send(self, tag: int, payloads, grads=None) -> None:
        """Wire: payloads[s] (int64) to server s with ``tag`` (and, given ``grads``, grads[s]
        with TAG_GRAD right after it). Returns at once: ``wait`` completes the sends (large
        messages complete once the server has received them)."""
        world = self.topo.world
        reqs, keep = self._sending  # buffers stay alive until the requests complete
        for s, r in enumerate(self.topo.server_ranks):
            ids = np.ascontiguousarray(payloads[s], dtype=np.int64)
            keep.append(ids)
            reqs.append(world.Isend([ids, MPI.INT64_T], r, tag))
            if grads is not None:
                g = np.ascontiguousarray(grads[s])
                keep.append(g)
                reqs.append(world.Isend([g, mpi_type(g.dtype)], r, TAG_GRAD))
            if tag == TAG_STEP:
                self.bytes += ids.nbytes + (g.nbytes if grads is not None else 0)

    @property
    def pending(self) -> int:
        """Requests of sends started since the last completion (``wait`` completes them
        and clears the list; some may have finished already)."""
        return len(self._sending[0])

    def _moved(self) -> bool:
        """Whether the sends complete within ``MOVE_POLLS`` progress polls: their data has
        moved (what is left is the receiver's notice; a copy this rank must drive takes
        tens to hundreds of polls even for 100 KB)."""
        reqs = self._sending[0]
        return any(MPI.Request.Testall(reqs) for _ in range(MOVE_POLLS))

    def _complete(self) -> None:
        reqs, keep = self._sending
        MPI.Request.Waitall(reqs)
        reqs.clear()
        keep.clear()

    def step(self, grads_for) -> None:
        """Send each server s ``grads_for(s)`` = (its local rows, their gradient sums)."""
        parts = [grads_for(s) for s in range(self.topo.n_servers)]
        self.send(TAG_STEP, [p[0] for p in parts], [p[1] for p in parts])

    def wait(self, timers, idle=None) -> None:
        """Wire: the servers' zero-byte acknowledgements (TAG_ACK, one from each, sent after
        its apply) or, colocated, a zero-byte Ibarrier over world that every rank joins
        after applying its shard; and the step's sends complete. ``idle()`` runs while
        they are outstanding (the next step's batch is made then); ``timers`` gets the rest
        as "wait".

        The step's sends stay in flight through ``idle`` where this MPI moves them without
        this rank calling into it (a single-copy read by the receiver: MPICH's CMA path on
        one node, an RDMA get between nodes): their copy then overlaps the next batch.
        Where it does not (a copy through shared buffers both ranks must drive), they
        are still pending after ``idle``; after ``MAX_BEHIND`` such steps in a row they
        are completed before ``idle``, so the server is not kept waiting for this rank's
        copy while the batch is made, except every ``RETRY``-th step, which checks again."""
        world = self.topo.world
        if idle is not None:
            self.waits += 1
        overlap = idle is not None and (self.behind < MAX_BEHIND or self.waits % RETRY == 0)
        with timers.time("wait"):
            if not overlap:
                self._complete()
            if self.topo.colocated:
                reqs = [world.Ibarrier()]
            else:
                reqs = [world.Irecv([_NOTHING, MPI.BYTE], r, TAG_ACK)
                        for r in self.topo.server_ranks]
        if idle is not None:
            idle()
        with timers.time("wait"):
            if overlap:  # Wire: the sends' completion (a few progress polls, then the wait)
                self.behind = 0 if self._moved() else self.behind + 1
                self._complete()
            MPI.Request.Waitall(reqs)

    def checkpoint(self, step: int) -> None:
        self.send(TAG_CKPT, [[step]] * self.topo.n_servers)
        self._complete()

    def set_lr(self, lr: float) -> None:
        """Every server's sparse optimizer steps with ``lr`` from the next step on (the
        send completes with the step's ``wait``)."""
        self.send(TAG_LR, [np.array([lr], np.float64).view(np.int64)] * self.topo.n_servers)

    def stop(self, grad_row) -> None:
        """TAG_STOP to every server; colocated, every worker's is received (``stopped``;
        ``grad_row``: the step messages' rows) before the sends complete: one is to this
        rank itself, which MPI may complete only once it is received."""
        self.send(TAG_STOP, [[]] * self.topo.n_servers)
        if self.topo.colocated:
            stopped(self.topo, grad_row)
        self._complete()


def _receive(topo, width: int, dtype, pacer: Pacer | None, on_wait=None):
    """One message from every worker: [(int64 payload, tag, gradient sums or None)].
    ``pacer`` None: wait in MPI's own (spinning) probe, as a colocated rank (a worker) does;
    else ``on_wait()`` is called at each check."""
    out = []
    for i, r in enumerate(topo.worker_ranks):
        # Wire: one message from worker r (the pacer naps through most of a step's length)
        ids, tag = poll_recv(topo.world, r, pacer=pacer, learn=i == 0, spin=pacer is None,
                             on_wait=on_wait)
        grads = None
        if tag == TAG_STEP:  # Wire: its gradient sums follow, rows x width floats
            grads = np.empty((ids.size, width), dtype)
            topo.world.Recv([grads, mpi_type(dtype)], r, TAG_GRAD)
        out.append((ids, tag, grads))
    return out


def _one_call(msgs) -> int:
    """The tag of every worker's message, else ``PshybridError`` naming what each asked
    for (``pshybrid.torch``: a script whose workers call differently)."""
    tags = {tag for _, tag, _ in msgs}
    if len(tags) > 1:
        asked = " while ".join(f"worker {w} asked for {_CALLS.get(t, t)}"
                               for w, (_, t, _) in enumerate(msgs) if t != msgs[0][1])
        raise PshybridError(f"the workers are out of step: worker 0 asked for "
                            f"{_CALLS.get(msgs[0][1], msgs[0][1])} while {asked}: every "
                            "worker makes the same steps, checkpoints and shutdown")
    return tags.pop()


def apply_step(topo, mode, step: int) -> None:
    """Receive every worker's step message (rows, sums) for this rank's shard and apply the
    step's optimizers to it; the caller then joins the Ibarrier (``ServerLink.wait``).
    A colocated rank calls it inside its own step (``Mode.update``)."""
    width, dtype = mode.sparse.grad_row
    with mode.timers.time("wait"):  # for the other ranks' messages, as a server's wait
        msgs = _receive(topo, width, dtype, None)  # a worker: MPI's spinning probe
    _one_call(msgs)  # (a worker's end among the steps: out of step)
    _apply(mode, msgs, step)


def stopped(topo, grad_row) -> None:
    """Colocated ranks, at the end: every worker's TAG_STOP (``ServerLink.stop``). A round of
    step messages before them is a step every worker left unapplied (the same exception on
    each, a Ctrl-C): dropped; steps beside ends are the workers out of step."""
    # Wire: one message from every worker (zero-byte STOP; a STEP's rows and sums), a round
    # at a time until the STOPs
    while _one_call(_receive(topo, *grad_row, None)) != TAG_STOP:
        pass


def _apply(mode, msgs, step: int) -> None:
    win = mode.store.win
    with mode.timers.time("server_apply"):
        win.Sync()  # see the workers' completed Accumulates
        mode.server_apply([(ids, g) for ids, _, g in msgs], step)
        win.Sync()  # publish before the workers' next Get


def serve(topo, mode, start_step: int, on_checkpoint, on_wait=None) -> None:
    """Servers: handle rounds of one message from every worker until STOP (see above).
    ``mode.server_apply(parts, step)`` applies a step (parts: every worker's (rows, sums));
    ``on_checkpoint(step)`` saves; ``on_wait()`` is called while waiting for the workers
    (the stop on a signal: ``preempt.Preemption.poll``)."""
    timers = mode.timers
    width, dtype = mode.sparse.grad_row
    pacer = Pacer(own_core=rank_cores() >= 1)  # (threads: this rank's share of the node)
    step = start_step
    while True:
        with timers.time("wait"):
            msgs = _receive(topo, width, dtype, pacer, on_wait)
        tag = _one_call(msgs)
        if tag != TAG_STEP:
            pacer.forget()  # the pause before a checkpoint or the end is not a step's gap
        if tag == TAG_STOP:
            return
        if tag == TAG_CKPT:
            on_checkpoint(int(msgs[0][0][0]))
            continue
        if tag == TAG_LR:
            mode.sparse.set_rule(lr=float(msgs[0][0].view(np.float64)[0]))
            continue
        step += 1
        _apply(mode, msgs, step)
        # Wire: a zero-byte TAG_ACK to every worker (ServerLink.wait); eager: completes here
        MPI.Request.Waitall([topo.world.Isend([_NOTHING, MPI.BYTE], r, TAG_ACK)
                             for r in topo.worker_ranks])
