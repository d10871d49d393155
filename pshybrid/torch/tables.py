"""``pt.Table`` and ``pt.init``'s checks of its arguments: the mode, the servers and their
placement, the tables, and the memory the fused table's shards need on each node."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import torch

from pshybrid.checks import (SEED_RANGE, decay, finite_positive, non_negative, seed_check,
                             zero_in)
from pshybrid.errors import ConfigError
from pshybrid.limits import available_memory, gib
from pshybrid.optim import SLOTS, SPARSE_LR
from pshybrid.registry import MODES, PLACEMENTS, is_colocated
from pshybrid.schema import names_problem
from pshybrid.torch.restore import DTYPES
from pshybrid.transport import agree


@dataclass(frozen=True)
class Table:
    """One embedding table: ``rows`` x ``dim`` of ``dtype``, updated where its rows live (the
    servers; colocated, every rank's shard) by ``optimizer`` ("sgd" | "adagrad" | "adam")
    with learning rate ``lr`` (None: the optimizer's default, ``optim.SPARSE_LR``: 0.05 for
    adagrad, 0.001 for adam, 0.5 for sgd), adam's ``betas`` and adagrad's and adam's
    ``eps`` (as torch's, and ``--beta1``, ``--beta2``, ``--eps``)."""

    name: str
    rows: int
    dim: int
    optimizer: str = "adagrad"
    lr: float | None = None
    dtype: torch.dtype = torch.float32
    init_scale: float = 0.05
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self):
        if self.lr is None:  # (an unknown optimizer keeps None: pt.init names it)
            object.__setattr__(self, "lr", SPARSE_LR.get(self.optimizer))


def check_init(tables, mode: str, servers, placement: str, seed, timeout, size: int) -> int | None:
    """``pt.init``'s arguments -> the servers to start (None: one per node; every rank with
    ``placement="colocated"``), else ``ConfigError`` (raised alike on every rank)."""
    servers = _servers(mode, servers, placement, size)
    _check_tables(tables)
    if not isinstance(seed, int) or seed_check(seed):  # the tables' key takes 32 bits
        raise ConfigError(f"pt.init: seed {seed!r}: {SEED_RANGE}", collective=True)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(
            timeout, (int, float)) or not timeout > 0):
        raise ConfigError(f"pt.init: timeout={timeout!r}: seconds > 0, or None (no limit)",
                          collective=True)
    return servers


def _servers(mode: str, servers, placement: str, size: int) -> int | None:
    if mode not in MODES or not MODES[mode].front_end:
        raise ConfigError(f"pt.init: mode {mode!r}: pshybrid.torch trains with 'hybrid' "
                          "(tables on the servers) or 'allreduce' (a copy per worker)",
                          collective=True)
    needs = MODES[mode].needs_servers
    if not isinstance(placement, str) or placement not in PLACEMENTS:
        raise ConfigError(f"pt.init: placement {placement!r}: one of {sorted(PLACEMENTS)}",
                          collective=True)
    colocated = is_colocated(placement)
    if colocated and (not needs or servers is not None):
        raise ConfigError(f"pt.init: placement='colocated' puts a shard of the tables on every "
                          f"rank, each a worker: only in mode 'hybrid', without servers= "
                          f"(mode={mode!r}, servers={servers!r})", collective=True)
    if needs and not colocated and (
            size < 2 if servers is None else type(servers) is not int or not 1 <= servers < size):
        raise ConfigError(f"pt.init: servers={servers!r} in mode {mode!r} on {size} rank(s): "
                          f"{mode!r} needs 1 <= servers <= ranks - 1 (launch more ranks: "
                          "mpiexec -n N), placement='colocated' (every rank a worker with a "
                          "shard), or mode='allreduce' (no server; one process is enough)",
                          collective=True)
    if not needs and servers is not None and (type(servers) is not int or servers != 0):
        raise ConfigError(f"pt.init: mode {mode!r} uses no server: servers={servers!r}",
                          collective=True)
    return servers if needs else 0


def _check_tables(tables) -> None:
    if not tables or not all(isinstance(t, Table) for t in tables):
        raise ConfigError("pt.init: tables must be a non-empty list of pt.Table", collective=True)
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ConfigError(f"pt.init: duplicate table names in {names}", collective=True)
    problem = names_problem([], names)
    if problem:
        raise ConfigError(f"pt.init: table {problem}", collective=True)
    t0 = tables[0]
    for t in tables:
        if t.rows < 1 or t.dim < 1:
            raise ConfigError(f"pt.Table {t.name!r}: rows and dim must be >= 1, got rows="
                              f"{t.rows} dim={t.dim}", collective=True)
        if t.dtype not in DTYPES:
            raise ConfigError(f"pt.Table {t.name!r}: dtype must be torch.float32 or "
                              f"torch.float64, got {t.dtype}", collective=True)
        if t.optimizer not in SLOTS:
            raise ConfigError(f"pt.Table {t.name!r}: optimizer {t.optimizer!r} is not one of "
                              f"{sorted(SLOTS)}", collective=True)
        for arg in ("lr", "init_scale"):  # (as --lr: a negative rate, NaN, trained silently)
            if why := _rate_problem(getattr(t, arg)):
                raise ConfigError(f"pt.Table {t.name!r}: {arg} {why}, got "
                                  f"{getattr(t, arg)!r}", collective=True)
        if why := _moments_problem(t.betas, t.eps, DTYPES[t.dtype]):
            raise ConfigError(f"pt.Table {t.name!r}: {why}", collective=True)
        key = (t.optimizer, t.lr, t.dtype, t.init_scale, tuple(t.betas), t.eps)
        if key != (t0.optimizer, t0.lr, t0.dtype, t0.init_scale, tuple(t0.betas), t0.eps):
            raise ConfigError(f"pt.Table {t.name!r}: optimizer, lr, dtype, init_scale, betas "
                              f"and eps must equal table {t0.name!r}'s (one fused table, one "
                              "optimizer)", collective=True)


def _moments_problem(betas, eps, dtype: str) -> str | None:
    """(As ``--beta1``, ``--beta2``, ``--eps``: checks.decay, checks.finite_positive, and
    an eps that is not 0 in the table's dtype, where the kernels use it.)"""
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2
            and all(_real(b) and not decay(b) for b in betas)):
        return f"betas must be two numbers >= 0 and < 1, got {betas!r}"
    if not _real(eps) or finite_positive(eps):
        return f"eps must be a number > 0 and finite, got {eps!r}"
    if why := zero_in(dtype, eps):
        return f"eps {eps!r} {why}"
    return None


def resume_problem(meta: dict, tables) -> str | None:
    """A torch checkpoint's tables (name, rows, dim, in order) against ``tables``: what
    differs, else None (a native checkpoint: None; its fused rows are checked alone). The
    fused rows alone matched tables listed in another order or resized to the same sum:
    each table then resumed another's rows, silently."""
    saved = meta.get("config", {}).get("tables")
    if meta.get("front_end") != "torch" or not isinstance(saved, list):
        return None
    got = [(d.get("name"), d.get("rows"), d.get("dim")) for d in saved if isinstance(d, dict)]
    want = [(t.name, t.rows, t.dim) for t in tables]
    if got == want:
        return None

    def show(ts):
        return "[" + ", ".join(f"{n!r} {r}x{d}" for n, r, d in ts) + "]"

    return (f"the checkpoint's tables are {show(got)}, pt.init's {show(want)} (name, rows x "
            "dim): resume with the same tables in the same order")


def _real(v) -> bool:
    """A real number (NumPy's too), not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _rate_problem(v) -> str | None:
    """What is wrong with a table's ``lr`` or ``init_scale`` (a real number >= 0)."""
    if not _real(v):
        return "must be a number"
    return non_negative(v)


def check_memory(topo, tables: list[Table]) -> None:
    """Collective: the fused table's share on this node (each server's, or colocated
    rank's, ``ceil(rows / S)`` rows; with no servers, the whole table on every worker) with
    the optimizer's slots fits its available memory (``limits.available_memory``), else one
    ``ConfigError`` on every rank naming the largest table and the bytes (instead of a
    shared-memory error)."""
    err = None
    rows, width = sum(t.rows for t in tables), max(t.dim for t in tables)
    t0, big = tables[0], max(tables, key=lambda t: t.rows)
    row_bytes = width * t0.dtype.itemsize * (1 + len(SLOTS[t0.optimizer]))
    node = topo.node_of_rank[topo.rank]
    holders = topo.server_ranks if topo.n_servers else topo.worker_ranks
    holder = "rank" if topo.colocated else "server" if topo.n_servers else "worker"
    here = sum(1 for r in holders if topo.node_of_rank[r] == node)
    need = here * -(-rows // max(topo.n_servers, 1)) * row_bytes
    mem = available_memory()
    if mem is not None and need > mem:
        err = ConfigError(
            f"pt.init: not enough memory: the tables' {rows:,} rows x {width} columns x "
            f"{1 + len(SLOTS[t0.optimizer])} slots ({t0.optimizer}) need {gib(need)} on this "
            f"node ({here} {holder}{'s' * (here != 1)}), "
            f"{gib(mem)} is "
            f"available; the largest is pt.Table {big.name!r} of {big.rows:,} rows: give it "
            f"fewer rows (hash the ids) or more {'nodes' if topo.colocated else 'servers'}")
    agree(topo.world, err)  # Wire: allgather of each rank's verdict; everyone raises the same
