"""Communication modes: a sparse-update strategy composed with a dense-update strategy
(``pshybrid.registry`` names the pairs), driven by one fixed step sequence (``Mode.update``).

| mode | sparse (``sparse``) | dense (``dense``) |
|---|---|---|
| ``hybrid`` | ``ServerSparse``: sharded on the servers, RMA | ``AllreduceDense`` |
| ``ps`` | ``ServerSparse`` | ``ServerDense``: a table on the servers |
| ``allreduce`` | ``ReplicatedSparse``: a copy per worker, Allgather | ``AllreduceDense`` |

Workers: ``batch = mode.prepare(ids)`` (on the data thread where it can), ``mode.begin(step)``,
``emb = mode.lookup(batch)``, forward/backward, ``mode.update(batch, demb, step)``,
``batch.release()``. Servers: ``mode.serve(start_step, on_checkpoint)`` (``servers``).
"""

from __future__ import annotations

from ..registry import MODES, ModeSpec
from .step import Mode, ModeSetup
from .strategy import DenseStrategy, SparseStrategy

__all__ = ["MODES", "DenseStrategy", "Mode", "ModeSetup", "ModeSpec", "SparseStrategy",
           "build_mode"]


def build_mode(name: str, topo, layout, params, sparse_opt, dense_opt, seed: int,
               **options) -> Mode:
    """The mode ``name`` of the registry (collective over ``topo.world``); ``options``: those
    of ``ModeSetup`` (``dense=``: a front end's own dense strategy class)."""
    return Mode(ModeSetup(MODES[name], topo, layout, params, sparse_opt, dense_opt, seed,
                          **options))
