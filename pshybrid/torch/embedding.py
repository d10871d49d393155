"""``Embedding`` and ``EmbeddingBag``: lookups in the job's tables, gradients to the servers.

A forward call turns a table's ids into fused-table rows, prepares them as the native step
does (``Mode.prepare``: dedup once, grouped by owner) and pulls them (``Mode.lookup``: one
Get per owner server, or a gather from shared memory). The rows come back as a tensor on the
ids' device. Its autograd backward keeps the rows' gradients; ``DistributedOptimizer.step``
hands them, with the step's other lookups, to the step's sparse update.
"""

from __future__ import annotations

import numpy as np
import torch

from pshybrid.errors import InputError
from pshybrid.torch.session import session


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
    """rows = table[ids]; backward records the rows' gradient for the step's update."""

    @staticmethod
    def forward(ctx, anchor, name, ids, record):
        s = session()
        gids = _global_ids(name, ids)
        batch = s.mode.prepare(gids)
        rows = s.mode.lookup(batch)  # (n, E) host rows (a fresh buffer or view per call)
        dim = s.tables[name].dim
        out = torch.from_numpy(np.ascontiguousarray(rows[:, :dim])).to(ids.device)
        if record:  # (autograd runs forward without grad mode: the caller's mode decides)
            ctx.entry = [gids, batch, None]
            s.entries.append(ctx.entry)
        else:
            batch.release()
        return out.reshape(ids.shape + (dim,))

    @staticmethod
    def backward(ctx, grad):
        entry = ctx.entry
        g = grad.detach().reshape(-1, grad.shape[-1]).to("cpu").numpy()
        entry[2] = g if entry[2] is None else entry[2] + g
        return None, None, None, None


# gives each lookup's output a place in the autograd graph (tables have no torch parameters)
_ANCHOR = torch.zeros((), requires_grad=True)


def lookup(name: str, ids: torch.Tensor) -> torch.Tensor:
    """table[ids]: ids.shape + (dim,) on ids' device."""
    return _Lookup.apply(_ANCHOR, name, ids, torch.is_grad_enabled())


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


class EmbeddingBag(torch.nn.Module):
    """Bags of rows of table ``name`` reduced by ``mode`` ("sum" | "mean"):
    ``forward(values, offsets)``: values (n,) ids, offsets (B,) the start of each bag in
    ``values`` (ascending, ``offsets[0] == 0``) -> (B, dim); an empty bag gives zeros."""

    def __init__(self, name: str, mode: str = "sum"):
        super().__init__()
        if mode not in ("sum", "mean"):
            raise InputError(f"EmbeddingBag({name!r}): mode must be 'sum' or 'mean', got "
                             f"{mode!r}")
        self.name, self.mode = name, mode
        self.dim = _table(name, f"pt.EmbeddingBag({name!r})").dim

    def forward(self, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        for x, what in ((values, "values"), (offsets, "offsets")):
            _tensor(x, f"pt.EmbeddingBag({self.name!r}): {what}")
        if values.dim() != 1 or offsets.dim() != 1:
            raise InputError(f"EmbeddingBag({self.name!r}): values and offsets must be 1-D, "
                             f"got {tuple(values.shape)} and {tuple(offsets.shape)}")
        n, B = values.shape[0], offsets.shape[0]
        offs = offsets.to(values.device, torch.int64)
        ends = torch.cat([offs[1:], torch.tensor([n], device=offs.device)])
        counts = ends - offs
        if B and (int(offs[0]) != 0 or bool((counts < 0).any()) or int(offs[-1]) > n):
            raise InputError(f"EmbeddingBag({self.name!r}): offsets must start at 0 and "
                             f"ascend within [0, {n}]")
        rows = lookup(self.name, values)
        bag = torch.repeat_interleave(torch.arange(B, device=values.device), counts)
        out = torch.zeros((B, self.dim), dtype=rows.dtype, device=rows.device)
        out = out.index_add(0, bag, rows)
        if self.mode == "mean":
            out = out / counts.clamp(min=1).to(rows.dtype)[:, None]
        return out

    def extra_repr(self) -> str:
        return f"{self.name!r}, dim={self.dim}, mode={self.mode!r}"
