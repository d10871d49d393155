"""The cost model behind ``--mode auto``: price every (mode, placement, replicated rows)
alternative from measured rates and pick the cheapest. Pure functions, no MPI.

A step of one alternative, in seconds (``price``; ``docs/placement.md`` says what each
term is, what measures it and when each alternative wins):

  step = batch + compute + pull + push + allreduce + allgather + hot_apply + server + sync

``batch`` (reading and deduplicating a worker's batch) and ``compute`` (forward, backward
and, except in ``ps``, the dense optimizer) are measured on this job's model and batch;
the communication terms are a message latency times the messages plus the bytes over the
measured bandwidth of the operation that moves them (``Link``); ``server`` is the owners'
sparse (and ``ps``'s dense) optimizer, hidden on dedicated servers behind what the workers
do meanwhile (the Allreduce, the dense optimizer, the next batch), inside every rank's step
when colocated; ``sync`` the step's sync points (the workers' collectives, the owners'
step), a measured Barrier each. The alternatives are ranked by seconds per sample
(step / (W * b)): placements change the number of workers W.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .registry import (COLOCATED, DEDICATED, MODES, NO_PLACEMENT, is_colocated, is_dedicated,
                       padded)  # padded: the planner's users' (auto, bench) too

MEMORY_SHARE = 0.8  # an alternative may use at most this share of the available memory
HOT_ROWS = (0, 1024, 16384, 131072)  # --replicate-rows candidates (capped by the table)


@dataclass(frozen=True)
class Link:
    """One kind of transfer: seconds per message, bytes per second."""

    latency: float
    bandwidth: float
    label: str = ""

    def time(self, nbytes: float, messages: float = 1) -> float:
        return messages * self.latency + (nbytes / self.bandwidth if nbytes else 0.0)


PRESETS = {"eth25": Link(10e-6, 3.1e9, "25 Gb/s Ethernet"),
           "ib100": Link(1.5e-6, 12.5e9, "100 Gb/s InfiniBand")}


def ring_allreduce(nbytes: float, W: int, link: Link) -> float:
    """Ring Allreduce of ``nbytes`` over W ranks: 2(W-1) steps of nbytes/W each."""
    return 2 * (W - 1) / W * nbytes / link.bandwidth + 2 * (W - 1) * link.latency if W > 1 else 0.0


def ring_allgather(nbytes_each: float, W: int, link: Link) -> float:
    """Ring Allgather, ``nbytes_each`` per rank: W-1 steps, each forwards one rank's block."""
    return (W - 1) * (nbytes_each / link.bandwidth + link.latency)


def server_nic_bytes(per_worker: float, nodes: int, k: int) -> float:
    """Off-node bytes one server's NIC carries in one phase when each of W = nodes*k
    workers exchanges ``per_worker`` bytes spread over the S = nodes servers."""
    W, S = nodes * k, nodes
    return W / S * per_worker * (nodes - 1) / nodes


def server_messages(mode: str, ids: bool) -> int:
    """Messages a worker sends each server per step (each costs one latency): one per
    flow to the servers (``ModeSpec.flows``): the rows' Get; with a server-side optimizer
    the step message (row ids, then gradient sums), else one Accumulate (direct SGD); ps
    adds the dense table's Get and Accumulate."""
    return MODES[mode].server_messages(ids)


# -- what the probe measures, and the job's shape -------------------------------------------

@dataclass(frozen=True)
class Rates:
    """Measured on the job's ranks (the slowest rank's figure, the same on every rank)."""

    fwd_bwd: float      # s: forward + backward of one worker batch
    dense_apply: float  # s: the dense optimizer over all P parameters
    row_apply: float    # s per row: the sparse optimizer (server side, or a worker's own)
    batch: float        # s: read one worker batch, fused ids, dedup and group by owner
    allreduce: Link     # fitted to the ring: latency per ring step, bandwidth per rank
    get: Link           # one-sided Get from another rank: per target, bytes/s
    acc: Link           # one-sided Accumulate(SUM) to another rank
    barrier: float = 0.0  # s: a Barrier of every rank (a sync point's cost on a busy node)
    get_dense: Link | None = None  # ps's dense table: Get and Accumulate at its own size
    acc_dense: Link | None = None  #   (None: as the rows')
    cores: int = 0      # cores of a node (0: unknown); the probe ran every rank at once
    acc_owner: float = 0.0  # bytes/s one owner takes in when every other rank Accumulates
    #   into it at once (0: unknown, not priced)


@dataclass(frozen=True)
class Shape:
    """The job: ranks and nodes, the model's sizes and the data's id statistics."""

    ranks: int
    nodes: int
    servers: int        # S of a dedicated placement
    batch: int          # b, per worker
    E: int              # row width of the fused table
    P: int              # dense parameters
    itemsize: int
    server_opt: bool    # a server-side sparse optimizer (ids + sums sent two-sided)
    cuda: bool = False
    U: float = 0.0      # mean distinct ids of a worker batch
    union: dict = field(default_factory=dict)   # W -> mean distinct ids of a global batch
    hot_share: dict = field(default_factory=dict)  # N -> share of a worker's distinct ids
    #   among the N hottest rows
    hot_touched: dict = field(default_factory=dict)  # (W, N) -> hot rows a global batch hits


@dataclass(frozen=True)
class Alternative:
    mode: str
    placement: str      # dedicated | colocated ("-" for allreduce)
    replicate_rows: int
    workers: int
    servers: int

    @property
    def key(self) -> str:
        hot = f", --replicate-rows {self.replicate_rows}" if self.replicate_rows else ""
        return f"{self.mode} {self.placement}{hot}"


def alternatives(shape: Shape, hot_candidates=HOT_ROWS) -> list[Alternative]:
    """Every alternative the job's ranks allow, in a fixed order (ties go to the first)."""
    N, S = shape.ranks, shape.servers
    hots = sorted({n for n in hot_candidates if n in shape.hot_share} | {0})
    out = []
    for spec in (m for m in MODES.values() if m.needs_servers and not m.chosen):
        for placement, W, s in ((DEDICATED, N - S, S), (COLOCATED, N, N)):
            if W < 1 or s < 1:
                continue
            for n in (hots if spec.hot_rows and not shape.cuda else (0,)):
                out.append(Alternative(spec.name, placement, n, W, s))
    out.extend(Alternative(m.name, NO_PLACEMENT, 0, N, 0) for m in MODES.values()
               if not m.needs_servers and not m.chosen)
    return out


def price(alt: Alternative, r: Rates, s: Shape) -> dict:
    """Seconds per step by term, ``step`` and ``samples_per_s``: the mode's flows
    (``ModeSpec.flows``) priced at the measured rates, and the updates and sync points."""
    W, S, N = alt.workers, alt.servers, alt.replicate_rows
    spec = MODES[alt.mode]
    flows = spec.flows(s.E, s.P, s.itemsize, s.server_opt)
    cold = s.U * (1 - s.hot_share.get(N, 0.0)) if N else s.U
    union = s.union.get(W, s.U * W)
    cpu = dilation(alt, r, s)
    t = dict(batch=r.batch * cpu,
             compute=(r.fwd_bwd + (0.0 if spec.dense_on_servers else r.dense_apply)) * cpu,
             pull=0.0, push=0.0, allreduce=0.0, allgather=0.0, hot_apply=0.0, server=0.0)
    sparse = hidden = 0.0
    if spec.sparse_on_servers:
        t["pull"], t["push"], acc_in = _server_flows(flows, cold, S, r)
        sparse = (union * (1 - s.hot_share.get(N, 0.0)) / S * r.row_apply
                  if s.server_opt else 0.0)
        if r.acc_owner and acc_in:  # every worker Accumulates into every owner at once: an
            #   owner takes in W/S workers' shares, at its measured crowded rate
            t["push"] = max(t["push"], W * acc_in / S / r.acc_owner)
        if spec.dense_on_servers:  # ps: the owners' dense optimizer, each over its P / S
            sparse += r.dense_apply / S
    # collectives over the workers: each is a sync point where a busy node's ranks wait for
    # the slowest (a measured Barrier each): the mode's (``worker_syncs``), the hot rows'
    waits = spec.worker_syncs + (1 if N else 0)
    t["sync"] = r.barrier * waits if W > 1 else 0.0
    for f in flows:
        if f.allreduced:
            t["allreduce"] = ring_allreduce(f.nbytes, W, r.allreduce)
            hidden = t["allreduce"] + r.dense_apply
        elif f.gathered:
            t["allgather"] = (sum(ring_allgather(x, W, r.allreduce) for x in f.blocks(s.U))
                              if W > 1 else 0.0)
            t["hot_apply"] = union * r.row_apply  # every worker updates every gathered row
    if N:
        t["allreduce"] += ring_allreduce(N * (s.E + 1) * s.itemsize, W, r.allreduce)
        t["hot_apply"] = s.hot_touched.get((W, N), N) * r.row_apply
    if spec.sparse_on_servers:
        colocated = is_colocated(alt.placement)
        if s.server_opt or spec.dense_on_servers:  # the workers make their next batch
            hidden += t["batch"]                   # while the owners apply (modes.step)
        t["server"] = sparse if colocated else max(0.0, sparse - hidden)
        # a step of the owners (a server-side sparse optimizer, ps's dense one) is a sync
        # point: the end-of-step barrier; colocated, also receiving every rank's message.
        # hybrid with plain SGD Accumulates straight into the weights: no owners' step
        if s.server_opt or spec.dense_on_servers:
            t["sync"] += r.barrier * (2 if colocated else 1)
    step = sum(t.values())
    return dict(t, step=step, samples_per_s=W * s.batch / step if step > 0 else math.inf)


def _server_flows(flows, cold: float, S: int, r: Rates) -> tuple[float, float, float]:
    """(pull, push, bytes Accumulated) of a worker's flows to the S servers at ``cold``
    distinct ids pulled: the rows' pushes go in one time (one message each per server),
    the dense table's at its own measured rates (None: the rows')."""
    rows = [f for f in flows if f.to_servers and f.per_id]
    push = [f for f in rows if not f.pulls]
    pull_t = r.get.time(cold * sum(f.nbytes for f in rows if f.pulls), S)
    push_t = r.acc.time(cold * sum(f.nbytes for f in push), S * len(push))
    acc_in = cold * sum(f.nbytes for f in push if f.accumulates)
    for f in (f for f in flows if f.to_servers and not f.per_id):  # ps's dense table
        if f.pulls:
            pull_t += (r.get_dense or r.get).time(f.nbytes, S)
        else:
            push_t += (r.acc_dense or r.acc).time(f.nbytes, S)
            acc_in += f.nbytes
    return pull_t, push_t, acc_in


def dilation(alt: Alternative, r: Rates, s: Shape) -> float:
    """The workers' CPU time under ``alt`` relative to the probe's: the probe kept every
    rank of a node busy; a dedicated placement keeps only its workers busy (servers wait
    in MPI with back-off sleeps), so with more ranks than cores on a node its workers get
    max(1, busy / cores) of the probe's max(1, ranks / cores) time slices."""
    if not r.cores:
        return 1.0
    per_node = -(-s.ranks // s.nodes)
    busy = -(-alt.workers // s.nodes) if is_dedicated(alt.placement) else per_node
    return max(1.0, busy / r.cores) / max(1.0, per_node / r.cores)


def choose(alts: list[Alternative], r: Rates, s: Shape, refused: dict | None = None):
    """(the cheapest alternative, its row, every row): each row holds the alternative's
    fields, its priced terms and ``refused`` (the reason, or None); the cheapest is the
    one with the least seconds per sample among those not refused, the first on a tie."""
    rows, best = [], None
    for a in alts:
        why = (refused or {}).get(a.key)
        row = dict(mode=a.mode, placement=a.placement, replicate_rows=a.replicate_rows,
                   workers=a.workers, servers=a.servers, key=a.key, refused=why, **price(a, r, s))
        rows.append(row)
        if why is None and (best is None or row["samples_per_s"] > best[1]["samples_per_s"]):
            best = (a, row)
    if best is None:
        raise ValueError("no alternative fits: " + "; ".join(f"{x['key']}: {x['refused']}"
                                                             for x in rows))
    return best[0], best[1], rows
