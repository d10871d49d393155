"""PyTorch front end: any ``torch.nn.Module`` trained on pshybrid's sharded tables and
bucketed dense Allreduce (``docs/torch.md``). The only part of pshybrid that imports torch
(the ``[torch]`` extra)::

    import torch, pshybrid.torch as pt
    pt.init(servers=1, tables=[pt.Table("ids", rows=10**6, dim=16)], mode="hybrid", seed=0)
    emb = pt.Embedding("ids")            # LongTensor of any shape -> shape + (16,)
    opt = pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3), model)
    for batch in pt.batches("train.h5", batch_size=256):
        loss = loss_fn(model(batch), batch.label)
        opt.zero_grad(); loss.backward(); opt.step()
        if pt.stop_requested():          # SIGTERM / SIGUSR1 on any rank: the same step
            pt.checkpoint("ck"); break   # on every worker
    pt.shutdown()                        # after a stop: every rank exits 75

Server ranks serve inside ``init`` and exit with status 0 once the workers shut down (the
workers' status after a stop); ``pt.init(placement="colocated", ...)`` starts none: every
rank is a worker holding a shard of the tables.
"""

from __future__ import annotations

from pshybrid.torch.embedding import (
    Embedding,
    EmbeddingBag,
    EmbeddingBagCollection,
    EmbeddingCollection,
    load_rows,
)
from pshybrid.torch.loader import Batch, batches, schema
from pshybrid.torch.optimizer import DistributedOptimizer
from pshybrid.torch.session import (
    checkpoint_to,
    init,
    num_workers,
    resumed_state,
    shutdown,
    steps_done,
    stop_requested,
    worker_comm,
    worker_index,
)
from pshybrid.torch.tables import Table


def checkpoint(directory, state: dict | None = None) -> str:
    """Workers, collectively: write checkpoint ``step-N`` (N: the steps done) under
    ``directory`` in the native format (``python -m pshybrid export`` reads it); returns
    its path. ``pt.init(..., resume=directory)`` continues from it. ``state``: worker 0's
    dict of JSON values kept with it (an lr scheduler's ``state_dict()``, the epoch), which
    ``pt.resumed_state()`` returns after the resume."""
    return checkpoint_to(directory, state)


__all__ = ["Batch", "DistributedOptimizer", "Embedding", "EmbeddingBag", "EmbeddingBagCollection",
           "EmbeddingCollection", "Table", "batches", "checkpoint", "init", "load_rows",
           "num_workers", "resumed_state", "schema", "shutdown", "steps_done", "stop_requested",
           "worker_comm", "worker_index"]
