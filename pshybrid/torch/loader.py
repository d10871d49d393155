"""``batches`` and ``schema``: a dataset file (``python -m pshybrid prep``) as torch tensors.

``batches(path, batch_size)`` yields this worker's rows of each global batch, exactly the
rows the native trainer reads (``batches.BatchPlan``: global batch t is rows
``[t*G, (t+1)*G)`` of the epoch's order, G = workers x batch_size, worker w reads its
w-th slice), so W workers x batch b read what 1 worker x batch W*b reads. Each call is a
pass of its own, from ``start`` (default 0), whatever earlier calls or the training step
did: an epoch loop gets every epoch, a validation loop every batch; ``start=pt.steps_done()``
continues a resumed run. It reads ahead on a data thread where the rank has a spare core.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch

from pshybrid.batches import BatchPlan, prefetch, read_ids, worker_batches
from pshybrid.data import H5Dataset
from pshybrid.errors import InputError
from pshybrid.files import is_unlabeled, refuse_unlabeled
from pshybrid.schema import Schema
from pshybrid.threads import rank_cores
from pshybrid.torch.census import census
from pshybrid.torch.session import session
from pshybrid.transport import abort_on_error, agree, same_arguments


@dataclass
class Batch:
    """This worker's rows of one global batch: label (b,), dense (b, n_dense) in torch's
    default float dtype, sparse (b, F) int64 per-field ids of the F single-hot fields, and
    ``bags``: each multi-hot field's ``(values, offsets)`` int64 by name, what
    ``pt.EmbeddingBag`` takes (row i's ids are ``values[offsets[i]:offsets[i+1]]``, the
    last row's ``values[offsets[-1]:]``)."""

    label: torch.Tensor
    dense: torch.Tensor
    sparse: torch.Tensor
    bags: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def schema(path) -> Schema:
    """The file's fields: ``dense_names``, ``sparse_names``, ``cardinalities``, ``n_dense``."""
    ds = H5Dataset(path)
    ds.close()
    return ds.schema


def _open(path, batch_size: int, drop_last: bool, s):
    """The dataset of ``path`` (opened here, or given), holding one global batch (with
    ``drop_last``) or one row, with one verdict over the workers. A training pass
    (``drop_last``) refuses a file marked unlabeled (``prep --unlabeled``)."""
    err, ds = None, None
    W = s.topo.n_workers
    G = W * batch_size if drop_last else 1
    try:
        ds = H5Dataset(path) if isinstance(path, (str, os.PathLike)) else path
        if isinstance(ds, H5Dataset) and is_unlabeled(ds) and drop_last:
            refuse_unlabeled(ds, "a pass with drop_last=False reads such a file")
        if getattr(ds, "n_rows", G) < G:
            if not drop_last:
                raise InputError(f"{path}: holds no rows: nothing to read")
            raise InputError(f"{path}: {ds.n_rows} row{'s' * (ds.n_rows != 1)}, fewer than one "
                             f"global batch ({W} worker{'s' * (W != 1)} x batch_size "
                             f"{batch_size})")
    except InputError as e:
        err = e
    agree(s.topo.workers, err)  # Wire: verdict allgather over the workers
    return ds


def _split(parts, sch: Schema):
    """``(label, dense, sparse (b, F1), bags)`` of a ``worker_batches`` batch: with
    multi-hot fields its ids are flat (the single-hot ids row by row, then each multi-hot
    field's, ``lengths`` (b, K) of them a row; new arrays every step), made into
    ``(values, offsets)`` by name."""
    if len(parts) == 3:
        return (*parts, {})
    label, dense, ids, lengths = parts
    n, f1 = len(label), sch.n_single
    bags, at = {}, n * f1
    for k, name in enumerate(sch.sparse_names[f1:]):
        offsets = np.zeros(n, np.int64)
        np.cumsum(lengths[:-1, k], out=offsets[1:])
        m = int(lengths[:, k].sum())
        bags[name] = (torch.from_numpy(ids[at:at + m]), torch.from_numpy(offsets))
        at += m
    return label, dense, ids[:n * f1].reshape(n, f1), bags


def _tail(plan: BatchPlan, offset: int, count: int, start: int):
    """The file rows ``(lo, hi)`` of this worker's slice (``offset``, ``count`` rows) of the
    last partial global batch (maybe empty), or None: none, or ``start`` past it."""
    full = plan.steps_per_epoch * plan.G
    if full == plan.n or start > plan.steps_per_epoch:
        return None
    hi = min(full + offset + count, plan.n)
    return min(full + offset, hi), hi


def _batch(parts, sch: Schema) -> Batch:
    """A ``Batch`` of a ``worker_batches`` / ``read_ids`` batch: copies (the reader reuses
    its buffers a few steps later), label and dense in torch's default float dtype."""
    label, dense, sparse, bags = _split(parts, sch)
    dtype = torch.get_default_dtype()
    return Batch(torch.from_numpy(np.array(label)).to(dtype),
                 torch.from_numpy(np.array(dense)).to(dtype),
                 torch.from_numpy(np.array(sparse, np.int64)), bags)


def _check(batch_size: int, epoch: int, start: int) -> None:
    for name, value, least in (("batch_size", batch_size, 1), ("epoch", epoch, 0),
                               ("start", start, 0)):
        if value < least:
            raise InputError(f"batches: {name} must be >= {least}, got {value}",
                             collective=True)


def batches(path, batch_size: int, epochs: int = 1, steps: int | None = None,
            shuffle: bool = False, seed: int | None = None, epoch: int = 0, start: int = 0,
            drop_last: bool = True):
    """Collective over the workers. Yields ``Batch`` for global batches ``start .. n-1`` of
    this call's pass, ``n`` = ``steps`` (default: ``epochs`` passes over the file, the last
    partial global batch of each dropped); batch ``i`` of the pass is global batch
    ``epoch * steps_per_epoch + i`` of the data's order, so it begins with epoch ``epoch``'s
    order. Every call is its own pass: nothing depends on earlier calls or on the training
    step. ``shuffle``: the native block shuffle, by ``seed`` (default: ``pt.init``'s) and the
    epoch. ``drop_last`` False (one unshuffled epoch: an evaluation): the last partial
    global batch too, each worker's slice of it (an empty batch on a worker past the
    file's end). ``path`` may also be a dataset object (``synthetic.SyntheticCTR``, an
    endless stream: give ``steps``)."""
    s = session()
    W, w = s.topo.n_workers, s.topo.worker_index
    with abort_on_error(s.topo.world):
        census(s, "pt.batches()", s.step)
        # (each worker reads its slice of the same global batches: a batch_size or a pass
        # that differs between workers read overlapping rows, and their step counts differed)
        same_arguments(s.topo.workers, "batches", "worker", batch_size=batch_size,
                       epochs=epochs, steps=steps, shuffle=bool(shuffle), seed=seed,
                       epoch=epoch, start=start, drop_last=bool(drop_last))
        _check(batch_size, epoch, start)  # (the same on every worker: collective)
        if not drop_last and (shuffle or steps is not None or epochs != 1 or epoch):
            raise InputError("batches: drop_last=False reads one pass in the file's order (an "
                             "evaluation): give it without shuffle, steps, epochs or epoch",
                             collective=True)
        ds = _open(path, batch_size, drop_last, s)
    plan = BatchPlan(getattr(ds, "n_rows", None), W * batch_size, shuffle,
                     s.seed if seed is None else seed)
    if plan.steps_per_epoch is None and (steps is None or epoch):
        raise InputError("batches: an endless stream needs steps= (and has no epoch=)",
                         collective=True)
    total = steps if steps is not None else epochs * plan.steps_per_epoch
    n = max(total - start, 0)
    first = epoch * (plan.steps_per_epoch or 0) + start
    depth = 2 if rank_cores() >= 2 else 0
    rows = worker_batches(ds, plan, first, n, w * batch_size, batch_size, None, depth)
    tail = None if drop_last else _tail(plan, w * batch_size, batch_size, start)
    try:
        for parts in prefetch(lambda i: next(rows), n, depth):
            yield _batch(parts, ds.schema)
        if tail is not None:  # (every worker has one: maybe empty)
            yield _batch(read_ids(ds, [tail], np.zeros(ds.schema.n_sparse, np.int64)),
                         ds.schema)
    finally:
        if ds is not path:
            ds.close()
