"""``Embedding``, ``EmbeddingBag`` and their collections (several tables in one lookup):
lookups in the job's tables, gradients to the servers.

A forward call turns a table's ids into fused-table rows, prepares them as the native step
does (``Mode.prepare``: dedup once, grouped by owner) and pulls them (``Mode.lookup``: one
Get per owner server, or a gather from shared memory). The rows come back as a tensor on the
ids' device. Its autograd backward keeps the rows' gradients; ``DistributedOptimizer.step``
hands them, with the step's other lookups, to the step's sparse update.
"""

from __future__ import annotations

import sys
import weakref
import zlib

import numpy as np
import torch

from pshybrid.errors import ConfigError, InputError
from pshybrid.optim import SLOTS
from pshybrid.torch.census import census
from pshybrid.torch.session import session
from pshybrid.transport import abort_on_error, agree, same_arguments


def _table(name: str, where: str):
    """The ``pt.Table`` named ``name``, else ``InputError`` naming ``where`` and the tables."""
    s = session()
    if name not in s.tables:
        raise InputError(f"{where}: no table {name!r}; pt.init made {sorted(s.tables)}")
    return s.tables[name]


def _tensor(x, what: str):
    """``x`` if it is a torch tensor, else ``InputError`` naming ``what`` (a NumPy array
    has no torch dtype: it failed deep inside the lookup)."""
    if not isinstance(x, torch.Tensor):
        kind = f"{type(x).__module__}.{type(x).__name__}"
        raise InputError(f"{what} must be a torch tensor of integers, got {kind}"
                         + (" (torch.from_numpy(ids) makes one)" if isinstance(x, np.ndarray)
                            else ""))
    return x


def _global_ids(name: str, ids: torch.Tensor) -> np.ndarray:
    """ids of table ``name`` (any shape, integers) -> (n,) int64 fused-table rows, checked."""
    s = session()
    _table(name, "pshybrid.torch")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise InputError(f"table {name!r}: ids must be integers, got {ids.dtype}")
    flat = ids.detach().reshape(-1).to("cpu", torch.int64).numpy()
    rows = s.tables[name].rows
    bad = (flat < 0) | (flat >= rows)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"table {name!r}: id {int(flat[i])} at position {i} is outside "
                         f"[0, {rows})")
    return flat + s.offsets[name]


class _Lookup(torch.autograd.Function):
    """outputs[k] = table ``names[k]``'s rows of ``ids[k]``, all pulled together (one
    ``prepare``, one ``lookup``); backward records the gradients of the outputs that got one
    for the step's update (an output no loss reached sends its rows nothing, as a lookup
    of its own that was never used)."""

    @staticmethod
    def forward(ctx, anchor, names, ids, record):
        s = session()
        parts = [_global_ids(n, x) for n, x in zip(names, ids)]
        gids = parts[0] if len(parts) == 1 else np.concatenate(parts)
        batch = s.mode.prepare(gids)
        rows = s.mode.lookup(batch)  # (n, E) host rows (a fresh buffer or view per call)
        outs, at = [], 0
        for name, x, part in zip(names, ids, parts):
            dim = s.tables[name].dim
            r = np.ascontiguousarray(rows[at:at + part.size, :dim])
            outs.append(torch.from_numpy(r).to(x.device).reshape(x.shape + (dim,)))
            at += part.size
        if record:  # (autograd runs forward without grad mode: the caller's mode decides)
            ctx.set_materialize_grads(False)  # (an unused output's gradient stays None)
            ctx.parts, ctx.grads, ctx.gids = parts, [None] * len(parts), gids
            ctx.entry = [gids, batch, None, True]
            _drop_unreached(s)
            s.entries.append(ctx.entry)
            weakref.finalize(ctx, s.unreached.append, ctx.entry)  # (its graph freed)
        else:
            batch.release()
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        for k, g in enumerate(grads):
            if g is not None:
                g = g.detach().reshape(-1, g.shape[-1]).to("cpu").numpy()
                ctx.grads[k] = g if ctx.grads[k] is None else ctx.grads[k] + g
        got, entry = [k for k, g in enumerate(ctx.grads) if g is not None], ctx.entry
        if len(got) == 1 == len(ctx.parts):
            entry[2] = ctx.grads[0]
        elif got:  # the ids of the outputs with a gradient, their gradients side by side
            entry[3] = len(got) == len(ctx.parts)  # (else not the batch's ids: planned anew)
            entry[0] = ctx.gids if entry[3] else np.concatenate([ctx.parts[k] for k in got])
            width = max(ctx.grads[k].shape[1] for k in got)
            entry[2] = np.zeros((entry[0].size, width), ctx.grads[got[0]].dtype)
            at = 0
            for k in got:
                n, d = ctx.grads[k].shape
                entry[2][at:at + n, :d] = ctx.grads[k]
                at += n
        return (None,) * 4


def _drop_unreached(s) -> None:
    """Lookups whose autograd graph was freed before a backward reached them (an
    evaluation with gradients on) are dropped from the step, their Batches released: they
    would have sent their rows nothing. (Told by a finalizer, which may run inside any
    allocation: it only appends; the session's lists change here.)"""
    gone = set()
    while s.unreached:
        entry = s.unreached.popleft()
        if entry[2] is None:
            gone.add(id(entry))  # (the deque held it: no live entry shares its id)
    if gone:
        s.drop(lambda entry: id(entry) in gone)


# gives each lookup's output a place in the autograd graph (tables have no torch parameters)
_ANCHOR = torch.zeros((), requires_grad=True)


def lookup_many(names, ids) -> tuple:
    """(table names[k][ids[k]] for each k): ids[k].shape + (dim_k,) on ids[k]'s device,
    pulled in one lookup."""
    _unloaded(session())
    return _Lookup.apply(_ANCHOR, tuple(names), tuple(ids), torch.is_grad_enabled())


def _unloaded(s) -> None:
    """A lookup in a session resumed from a checkpoint before its DistributedOptimizer was
    made: the model's dense weights load when it is made, so they are still the initial
    ones (an inference script that makes none scored with random weights, silently).
    Said once, by worker 0."""
    if s.resume_dir is not None and s.optimizer is None and not s.told_unloaded:
        s.told_unloaded = True
        if s.topo.worker_index == 0:
            sys.stderr.write(f"pshybrid: warning: a lookup before the DistributedOptimizer "
                             f"of a session resumed from {s.resume_dir}: the model's dense "
                             "weights are loaded when it is made (pt.DistributedOptimizer("
                             "torch_opt, model)), so they are still the initial ones\n")


def lookup(name: str, ids: torch.Tensor) -> torch.Tensor:
    """table[ids]: ids.shape + (dim,) on ids' device."""
    return lookup_many((name,), (ids,))[0]


def load_rows(name: str, weights) -> None:
    """Workers, collectively, in ``allreduce`` mode: table ``name``'s rows := ``weights``
    ((rows, dim): a plain PyTorch ``nn.Embedding``'s ``.weight``, the same on every
    worker), its rows' optimizer state zero. A ``hybrid`` run starts from them through a
    checkpoint: ``pt.checkpoint`` here, then ``pt.init(mode="hybrid", resume=...)``."""
    s = session()
    where = f"pt.load_rows({name!r})"
    with abort_on_error(s.topo.world):
        census(s, "pt.load_rows", s.step)
        spec = _table(name, where)
        if s.topo.n_servers:
            held = "in the ranks' shards" if s.topo.colocated else "on the servers"
            raise ConfigError(f"{where}: in mode {s.mode_name!r} the rows live {held}: load "
                              "them in a session of mode='allreduce' "
                              "(servers=0, one process will do), pt.checkpoint it, and start "
                              "this run with pt.init(..., resume=that directory)",
                              collective=True)
        if isinstance(weights, torch.Tensor):  # (bfloat16 has no NumPy form: float64 does)
            t = weights.detach().to("cpu")
            w = (t.double() if t.is_floating_point() else t).numpy()
        else:
            w = np.asarray(weights)
        problem = (f"weights of shape {w.shape}, the table's is {(spec.rows, spec.dim)}"
                   if w.shape != (spec.rows, spec.dim) else None if w.dtype.kind == "f" and
                   np.isfinite(w).all() else "weights must be finite floating-point numbers")
        # Wire: allgather of the verdict and a checksum: every worker loads the same rows
        agree(s.topo.workers, InputError(f"{where}: {problem}") if problem else None)
        same_arguments(s.topo.workers, where, "worker", weights_crc32=zlib.crc32(
            np.ascontiguousarray(w, s.layout.table.dtype).tobytes()))
        E, dtype = s.layout.table.dim, s.layout.table.dtype
        rows = np.zeros((spec.rows, E), dtype)
        rows[:, :spec.dim] = w
        ids = np.arange(spec.rows, dtype=np.int64) + s.offsets[name]
        s.mode.set_sparse_rows(ids, {"w": rows, **{k: np.zeros_like(rows) for k in
                                                   SLOTS[s.sparse_opt.kind]}})


class Embedding(torch.nn.Module):
    """Rows of table ``name``: LongTensor of any shape -> shape + (dim,)."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.dim = _table(name, f"pt.Embedding({name!r})").dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return lookup(self.name, _tensor(ids, f"pt.Embedding({self.name!r}): ids"))

    def extra_repr(self) -> str:
        return f"{self.name!r}, dim={self.dim}"


def _bags(where: str, values, offsets, last: bool = False):
    """``(values (n,), counts (B,))`` of bags given as torch's ``EmbeddingBag`` takes them
    (``where`` names the call): 1-D ``values`` and ``offsets`` (each bag's start, from 0,
    ascending; ``last``: ``include_last_offset``, B + 1 of them, the last n), or 2-D
    ``values`` (B, L) without offsets (B bags of L ids)."""
    _tensor(values, f"{where}: values")
    if offsets is None:
        if values.dim() != 2:
            raise InputError(f"{where}: values of shape {tuple(values.shape)} need offsets "
                             "(without them, values are 2-D: a bag per row)")
        B, L = values.shape
        return values.reshape(-1), torch.full((B,), L, dtype=torch.int64,
                                              device=values.device)
    _tensor(offsets, f"{where}: offsets")
    if values.dim() != 1 or offsets.dim() != 1:
        raise InputError(f"{where}: values and offsets must be 1-D (2-D values take no "
                         f"offsets), got {tuple(values.shape)} and {tuple(offsets.shape)}")
    n = values.shape[0]
    offs = offsets.to(values.device, torch.int64)
    if last and (offs.numel() == 0 or int(offs[-1]) != n):
        raise InputError(f"{where}: with include_last_offset, offsets end with the number "
                         f"of values ({n}), got {offs[-1:].tolist()}")
    ends = torch.cat([offs[1:], torch.tensor([n], device=offs.device)])
    if offs.numel() and (int(offs[0]) != 0 or bool((ends < offs).any())):
        raise InputError(f"{where}: offsets must start at 0 and ascend within [0, {n}]")
    if last:
        offs, ends = offs[:-1], offs[1:]
    if offs.numel() == 0:  # no bag: no row (torch's gives (0, dim) too)
        values = values[:0]
    return values, ends - offs


def _pooled(rows: torch.Tensor, counts: torch.Tensor, mode: str, weights=None):
    """(B, dim): each bag's rows (``counts`` of them, in order; times ``weights``, one a
    row, where given) summed, or averaged (an empty bag: zeros)."""
    B = counts.shape[0]
    if weights is not None:
        rows = rows * weights.reshape(-1, 1)[:len(rows)].to(rows.dtype)  # (no bag: none)
    bag = torch.repeat_interleave(torch.arange(B, device=rows.device), counts)
    out = torch.zeros((B, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    out = out.index_add(0, bag, rows)
    if mode == "mean":
        out = out / counts.clamp(min=1).to(rows.dtype)[:, None]
    return out


def _mode(where: str, mode: str) -> str:
    if mode not in ("sum", "mean"):
        raise InputError(f"{where}: mode must be 'sum' or 'mean', got {mode!r}")
    return mode


class EmbeddingBag(torch.nn.Module):
    """Bags of rows of table ``name`` reduced by ``mode`` ("sum" | "mean"), as
    ``torch.nn.EmbeddingBag`` takes them: ``forward(values, offsets=None,
    per_sample_weights=None)``: values (n,) ids, offsets (B,) the start of each bag in
    ``values`` (ascending, ``offsets[0] == 0``; ``include_last_offset``: B + 1, the last n),
    or values (B, L) without offsets -> (B, dim); an empty bag gives zeros;
    ``per_sample_weights`` (values' shape, mode "sum"): each row weighted."""

    def __init__(self, name: str, mode: str = "sum", include_last_offset: bool = False):
        super().__init__()
        self.name, self.mode = name, _mode(f"EmbeddingBag({name!r})", mode)
        self.include_last_offset = bool(include_last_offset)
        self.dim = _table(name, f"pt.EmbeddingBag({name!r})").dim

    def forward(self, values: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        where = f"pt.EmbeddingBag({self.name!r})"
        if per_sample_weights is not None and (
                self.mode != "sum" or not isinstance(per_sample_weights, torch.Tensor)
                or not per_sample_weights.is_floating_point()
                or per_sample_weights.shape != getattr(values, "shape", None)):
            raise InputError(f"{where}: per_sample_weights must be a floating tensor of the "
                             "values' shape, with mode 'sum'")
        flat, counts = _bags(where, values, offsets, self.include_last_offset)
        return _pooled(lookup(self.name, flat), counts, self.mode, per_sample_weights)

    def extra_repr(self) -> str:
        return f"{self.name!r}, dim={self.dim}, mode={self.mode!r}"


def _names(where: str, names) -> tuple:
    names = (names,) if isinstance(names, str) else tuple(names)
    if not names:
        raise InputError(f"{where}: give at least one table")
    for n in names:
        _table(n, where)
    return names


class EmbeddingCollection(torch.nn.Module):
    """Rows of several tables in one lookup (one pull from the servers, where one
    ``pt.Embedding`` per table makes one each): ``forward(ids)``, ``ids`` one tensor of ids
    per table of ``names`` (a list or tuple), or one tensor whose last axis has a column
    per table -> a tuple, table k's rows ``ids_k.shape + (dim_k,)``."""

    def __init__(self, names):
        super().__init__()
        self.names = _names("pt.EmbeddingCollection", names)

    def forward(self, ids) -> tuple:
        where = "pt.EmbeddingCollection"
        if isinstance(ids, torch.Tensor):
            if ids.dim() == 0 or ids.shape[-1] != len(self.names):
                raise InputError(f"{where}: ids of shape {tuple(ids.shape)}: its last axis "
                                 f"must have a column per table ({len(self.names)})")
            ids = ids.unbind(-1)
        elif not isinstance(ids, (list, tuple)) or len(ids) != len(self.names):
            raise InputError(f"{where}: give one tensor of ids per table ({len(self.names)}: "
                             f"{list(self.names)}), got {type(ids).__name__}"
                             + (f" of {len(ids)}" if isinstance(ids, (list, tuple)) else ""))
        return lookup_many(self.names, [_tensor(x, f"{where}: ids of table {n!r}")
                                        for n, x in zip(self.names, ids)])

    def extra_repr(self) -> str:
        return ", ".join(map(repr, self.names))


class EmbeddingBagCollection(torch.nn.Module):
    """Bags of rows of several tables in one lookup, each reduced by ``mode`` ("sum" |
    "mean"): ``forward(bags)``, ``bags`` one ``(values, offsets)`` per table of ``names``
    (a list or tuple, or a dict by name: ``pt.batches``' ``batch.bags``; as
    ``EmbeddingBag`` takes them, ``include_last_offset`` too) -> a tuple, table k's
    ``(B_k, dim_k)``."""

    def __init__(self, names, mode: str = "sum", include_last_offset: bool = False):
        super().__init__()
        self.names = _names("pt.EmbeddingBagCollection", names)
        self.mode = _mode("pt.EmbeddingBagCollection", mode)
        self.include_last_offset = bool(include_last_offset)

    def forward(self, bags) -> tuple:
        where = "pt.EmbeddingBagCollection"
        if isinstance(bags, dict):
            if missing := [n for n in self.names if n not in bags]:
                raise InputError(f"{where}: no bags for table {missing[0]!r} (given "
                                 f"{sorted(bags)})")
            bags = [bags[n] for n in self.names]
        elif not isinstance(bags, (list, tuple)) or len(bags) != len(self.names):
            raise InputError(f"{where}: give one (values, offsets) per table "
                             f"({len(self.names)}: {list(self.names)})")
        for n, pair in zip(self.names, bags):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise InputError(f"{where}: table {n!r}: give its bags as (values, offsets)")
        flat = [_bags(f"{where}: table {n!r}", *pair, self.include_last_offset)
                for n, pair in zip(self.names, bags)]
        rows = lookup_many(self.names, [values for values, _ in flat])
        return tuple(_pooled(r, c, self.mode) for r, (_, c) in zip(rows, flat))

    def extra_repr(self) -> str:
        return ", ".join(map(repr, self.names)) + f", mode={self.mode!r}"
