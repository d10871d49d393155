"""The catalogue of strategies: each mode, placement and consistency by name, with its
facts. Pure data and pure functions, no MPI.

A mode is a pair of strategies (``pshybrid.modes``): where the embedding rows live and how
their gradients move (``sparse``), and the same for the dense weights (``dense``). A
placement says where the table shards live; a consistency how fresh an embedding read is.
This module is the one list of each: the command line's choices, config validation (the
allowed combinations, ``refusal``), ``info``, ``pshybrid.modes``, the cost model
(``planner``), the memory check (``limits``), ``--mode auto`` and the docs' mode table
(checked by a test) all read it. Code elsewhere asks its predicates (``ModeSpec``'s
properties, ``is_colocated``, ``parse_consistency``) instead of comparing names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DENSE_ROW = 256  # width of a row of the dense table when the dense weights live on servers

SPARSE_STRATEGIES = {
    "servers": "sharded row-wise on the server ranks; one-sided RMA Get / Accumulate",
    "replicated": "a full copy on every worker; gradient rows exchanged with Allgather",
    "chosen": "one of the above, chosen at start-up by a cost model (pshybrid.planner)",
}
DENSE_STRATEGIES = {
    "allreduce": "replicated on every worker; gradients summed with Allreduce",
    "servers": f"a table of {DENSE_ROW}-wide rows sharded on the servers, pulled and pushed "
               "every step",
    "chosen": "as the chosen mode's",
}


def padded(P: int) -> int:
    """Dense parameters rounded up to whole rows of the servers' dense table."""
    return -(-P // DENSE_ROW) * DENSE_ROW


@dataclass(frozen=True)
class Flow:
    """What one worker moves in one step by one kind of transfer. ``kind``: the library's
    counter kind (pull: RMA Get or the same-node read; rma_acc: Accumulate; p2p: two-sided
    to the owners; allreduce; allgather); ``part``: "rows", ``nbytes`` per distinct id of
    the worker's batch, or "dense", ``nbytes`` per step. A flow to the servers is one
    message to each server (one latency)."""

    kind: str
    part: str
    nbytes: int

    @property
    def to_servers(self) -> bool:
        return self.kind in ("pull", "rma_acc", "p2p")

    @property
    def per_id(self) -> bool:
        return self.part == "rows"

    @property
    def pulls(self) -> bool:
        return self.kind == "pull"

    @property
    def accumulates(self) -> bool:
        return self.kind == "rma_acc"

    @property
    def allreduced(self) -> bool:
        return self.kind == "allreduce"

    @property
    def gathered(self) -> bool:
        return self.kind == "allgather"

    def blocks(self, U: float) -> tuple[float, ...]:
        """An Allgather flow's collectives (``ReplicatedSparse.exchange``), as the bytes one
        worker adds to each at U distinct ids: the count of its rows, their 8-byte ids, the
        rows."""
        assert self.gathered, self.kind
        return (8.0, 8.0 * U, (self.nbytes - 8) * U)

    def step_bytes(self, U: float, gathered: float) -> float:
        """Bytes per worker per step as the library counts them at U distinct ids a worker
        batch and ``gathered`` ids over all workers' batches (an Allgather's counter holds
        every worker's block, its own included)."""
        if not self.per_id:
            return self.nbytes
        return (gathered if self.gathered else U) * self.nbytes


@dataclass(frozen=True)
class ModeSpec:
    """One mode: its strategies and what they allow. ``hot_rows``: ``--replicate-rows``
    (the hot rows join the dense Allreduce); ``front_end``: ``pshybrid.torch`` trains with it."""

    name: str
    sparse: str  # a key of SPARSE_STRATEGIES
    dense: str   # a key of DENSE_STRATEGIES
    help: str
    hot_rows: bool = False
    front_end: bool = False

    @property
    def needs_servers(self) -> bool:
        return "servers" in (self.sparse, self.dense)

    @property
    def chosen(self) -> bool:
        """``auto``: resolved to another mode (and placement) before anything is built."""
        return self.sparse == "chosen"

    @property
    def sparse_on_servers(self) -> bool:
        """The embedding rows live on the servers (RMA pulls, pushes to owners)."""
        return self.sparse == "servers"

    @property
    def dense_on_servers(self) -> bool:
        """The dense weights live on the servers too (pulled and pushed each step)."""
        return self.dense == "servers"

    @property
    def dense_allreduce(self) -> bool:
        """The dense weights are replicated and their gradients Allreduced."""
        return self.dense == "allreduce"

    @property
    def replicated(self) -> bool:
        """Every worker holds the whole table (gradient rows Allgathered)."""
        return self.sparse == "replicated"

    @property
    def stale_reads(self) -> bool:
        """``--consistency ssp:K|asp`` and ``--cache-rows`` apply (reads from the servers)."""
        return self.sparse_on_servers

    def flows(self, E: int, P: int, itemsize: int, ids: bool) -> tuple[Flow, ...]:
        """What a worker moves in one step (``Flow``s, in this order: the rows' pull and
        push, the rows' Allgather, the dense table's pull and push, the dense Allreduce)
        for rows of E floats, P dense parameters and a server-side sparse optimizer
        (``ids``: row ids and gradient sums go two-sided, one message each) or not (one
        Accumulate of the rows, direct SGD). The planner, bench/scaling and its byte
        check price these; an Allgather sends each row with its 8-byte id."""
        row, out = E * itemsize, []
        if self.sparse_on_servers:
            out.append(Flow("pull", "rows", row))
            out += ([Flow("p2p", "rows", 8), Flow("p2p", "rows", row)] if ids
                    else [Flow("rma_acc", "rows", row)])
        if self.replicated:
            out.append(Flow("allgather", "rows", 8 + row))
        if self.dense_on_servers:
            dense = padded(P) * itemsize
            out += [Flow("pull", "dense", dense), Flow("rma_acc", "dense", dense)]
        if self.dense_allreduce:
            out.append(Flow("allreduce", "dense", P * itemsize))
        return tuple(out)

    def server_messages(self, ids: bool) -> int:
        """Messages a worker sends each server per step (each costs one latency)."""
        return sum(f.to_servers for f in self.flows(0, 0, 1, ids))

    def table_parts(self, servers: int) -> tuple[tuple[str, str], ...]:
        """The tables' memory parts of a job of this mode on ``servers`` servers, as (role,
        part) in ``limits``' names: with the rows on the servers, the servers hold the rows'
        shards and take in each step's rows and gradients; else every worker holds the
        whole table and every worker's exchanged rows. With the dense weights on the
        servers, their shards of the dense table too, which every worker pulls whole."""
        out = ((("server", "shard of the embedding table"),
                ("server", "rows and gradients of a step")) if servers and self.sparse_on_servers
               else (("worker", "embedding table"), ("worker", "exchanged gradient rows")))
        if servers and self.dense_on_servers:
            out += (("server", "shard of the dense table"), ("worker", "pulled dense table"))
        return out

    @property
    def worker_syncs(self) -> int:
        """Collectives over the workers in a step, each a sync point: the dense Allreduce,
        the allreduce mode's three Allgathers (counts, ids, rows)."""
        return (1 if self.dense_allreduce else 0) + (3 if self.replicated else 0)


MODES: dict[str, ModeSpec] = {m.name: m for m in (
    ModeSpec("hybrid", "servers", "allreduce",
             "embeddings on the servers (RMA), dense weights replicated (Allreduce)",
             hot_rows=True, front_end=True),
    ModeSpec("ps", "servers", "servers",
             "embeddings and dense weights on the servers: a parameter server"),
    ModeSpec("allreduce", "replicated", "allreduce",
             "every table on every worker: sparse gradients Allgathered, dense Allreduced",
             front_end=True),
    ModeSpec("auto", "chosen", "chosen",
             "mode, placement and --replicate-rows picked at start-up by a cost model "
             "calibrated on this job (a probe of a few seconds at start-up)"),
)}

# -- placements --------------------------------------------------------------------------

DEDICATED, COLOCATED = "dedicated", "colocated"
PLACEMENTS = {DEDICATED: "table shards on server ranks that only serve",
              COLOCATED: "a shard on every rank, each of which also trains"}
NO_PLACEMENT = "-"  # a planner alternative without shards (allreduce)


def is_colocated(placement: str) -> bool:
    """Every rank trains and owns a shard (``Topology.colocated``)."""
    return placement == COLOCATED


def is_dedicated(placement: str) -> bool:
    """Server ranks that only serve hold the shards (a planner alternative without shards,
    ``NO_PLACEMENT``, is neither)."""
    return placement == DEDICATED


def placement_name(colocated: bool) -> str:
    return COLOCATED if colocated else DEDICATED


# -- consistency: bsp | ssp:K | asp, parsed here only -----------------------------------

CONSISTENCY_HELP = "must be bsp, ssp:K (K >= 0 steps) or asp"


@dataclass(frozen=True)
class Consistency:
    """A parsed ``--consistency``: ``bound`` is the staleness promised (bsp: 0, ssp:K: K,
    asp: None, no bound)."""

    text: str
    bound: int | None

    @property
    def synchronous(self) -> bool:
        """``bsp``: every read sees every update of the earlier steps (no pipeline)."""
        return is_synchronous(self.text)


def is_synchronous(text: str) -> bool:
    """``--consistency bsp``: the reads need no pipeline (``ssp:0`` keeps one: its numbers
    are bsp's, its reads go through the pipeline)."""
    return text == "bsp"


def parse_consistency(text: str) -> Consistency:
    """``bsp`` | ``ssp:K`` | ``asp`` -> ``Consistency``; anything else: ValueError."""
    if text in ("bsp", "asp"):
        return Consistency(text, 0 if text == "bsp" else None)
    m = re.fullmatch(r"ssp:([0-9]+)", text)
    if m is None:
        raise ValueError(CONSISTENCY_HELP)
    return Consistency(text, int(m.group(1)))


def cache_serves(consistency: str) -> bool:
    """Whether ``--cache-rows`` can ever serve a row under ``consistency``: not under
    ``bsp`` and ``ssp:0`` (a cached row's version is always older than the step it would be
    read for, ``modes.stale``); under ``ssp:1`` only the step after the start or a
    checkpoint (a row pulled a step ahead at version ``c`` serves steps ``c + 2 .. c + K``);
    from ``ssp:2`` on, and under ``asp``, every step."""
    bound = parse_consistency(consistency).bound
    return bound is None or bound >= 1


def consistency_error(text: str) -> str | None:
    """The config's check of ``--consistency``: None, or why not."""
    try:
        parse_consistency(text)
    except ValueError as e:
        return str(e)
    return None


# -- the allowed combinations -------------------------------------------------------------

def refusal(mode: str, placement: str, servers, replicate_rows: int, consistency: str,
            cache_rows: int, device: str) -> str | None:
    """Why this combination of options is not allowed (the message names the options and
    what to do), or None."""
    spec = MODES[mode]
    if spec.chosen and (replicate_rows or placement != DEDICATED):
        return (f"--mode {mode} chooses --placement and --replicate-rows: drop them (or pick "
                "a mode)")
    if replicate_rows and not (spec.hot_rows and device == "cpu"):
        return (f"--replicate-rows {replicate_rows}: hot rows join the workers' dense "
                "Allreduce: only with --mode hybrid on --device cpu")
    if not is_synchronous(consistency) or cache_rows:
        bad = [why for cond, why in (
            (not spec.stale_reads, f"--mode {mode}"),
            (is_colocated(placement), f"--placement {placement}"),
            (replicate_rows > 0, f"--replicate-rows {replicate_rows}"),
            (device != "cpu", f"--device {device}")) if cond]
        if bad:
            given = " ".join(g for c, g in (
                (not is_synchronous(consistency), f"--consistency {consistency}"),
                (cache_rows, f"--cache-rows {cache_rows}")) if c)  # (what was asked for)
            return (f"{given}: only with --mode "
                    f"hybrid or ps, --placement dedicated, no --replicate-rows, --device cpu; "
                    f"not with {', '.join(bad)}")
    if is_colocated(placement) and not spec.needs_servers:
        return (f"--placement colocated: --mode {mode} has no table shards to place (every "
                "worker holds every table)")
    if is_colocated(placement) and servers is not None:
        return f"--placement colocated puts a shard on every rank: drop --servers {servers}"
    if servers and not spec.needs_servers and not spec.chosen:
        return (f"--mode {mode} keeps every table on every worker and uses no server: drop "
                f"--servers {servers} (or use --servers 0)")
    return None
