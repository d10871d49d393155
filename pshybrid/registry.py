"""The communication modes by name: what each one composes. Pure data, no MPI.

A mode is a pair of strategies (``pshybrid.modes``): where the embedding rows live and how
their gradients move (``sparse``), and the same for the dense weights (``dense``). This
table is the one list of modes: the command line's choices, config validation, ``info``,
``pshybrid.modes`` and the docs' mode table (checked by a test) all read it.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class ModeSpec:
    name: str
    sparse: str  # a key of SPARSE_STRATEGIES
    dense: str   # a key of DENSE_STRATEGIES
    help: str

    @property
    def needs_servers(self) -> bool:
        return "servers" in (self.sparse, self.dense)

    @property
    def chosen(self) -> bool:
        """``auto``: resolved to another mode (and placement) before anything is built."""
        return self.sparse == "chosen"


MODES: dict[str, ModeSpec] = {m.name: m for m in (
    ModeSpec("hybrid", "servers", "allreduce",
             "embeddings on the servers (RMA), dense weights replicated (Allreduce)"),
    ModeSpec("ps", "servers", "servers",
             "embeddings and dense weights on the servers: a parameter server"),
    ModeSpec("allreduce", "replicated", "allreduce",
             "every table on every worker: sparse gradients Allgathered, dense Allreduced"),
    ModeSpec("auto", "chosen", "chosen",
             "mode, placement and --replicate-rows picked at start-up by a cost model "
             "calibrated on this job (a probe of a few seconds at start-up)"),
)}
