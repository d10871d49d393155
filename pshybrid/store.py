"""Embedding store: tables sharded row-wise over server ranks, moved by one-sided RMA.

Every rank calls ``MPI.Win.Allocate`` once on ``topo.world``: each server exposes one
window holding all its shards (workers expose 0 bytes), and every rank opens a single
``Lock_all`` epoch for the store's lifetime. Per table and server the window holds one
``(local_rows, dim)`` region per *slot*: ``"w"`` (the weights) and any extra slots a
table asks for (gradient sums, optimizer state), zero-initialised.

A ``Plan`` (``plan(table, ids)``) deduplicates the ids, groups them by owner
(``partition.group_by_owner``) and commits one ``hindexed_block`` row datatype per owner
(64-bit byte offsets inside a slot's region; the slot's region start goes as the target
displacement, so one datatype serves every slot). ``pull`` issues **one** indexed ``Get``
per owner, then expands rows with the inverse index; ``push`` sums the rows of duplicate
ids locally (input order), then issues **one** ``Accumulate(SUM)`` per owner. Both take ids
(and make a plan for the call) or a plan made ahead: the training loop makes the next
step's on its data thread and uses it for the step's pull and push. MPI makes concurrent
accumulates to one element atomic, so workers never lose each other's updates. Both
complete with ``Flush(owner)`` before returning, so once every worker has returned from
``push`` and the workers have synchronised (an Allreduce or ``barrier``), every later
``pull`` sees the update.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from . import partition
from .errors import ConfigError, InputError, PshybridError
from .initializers import uniform_range
from .kernels import gather, min_max, scatter_add
from .schema import TableSpec
from .topology import Topology, shared_window
from .transport import (agree, allocate_window, idle_barrier, mpi_type, out_of_memory,
                        reserve_shared_memory, rows_type)

_ALIGN = 64  # bytes; each region starts on a cache line


@dataclass
class _Table:
    spec: TableSpec
    itemsize: int
    base: MPI.Datatype
    offsets: dict[str, int]  # slot -> byte offset of its region on this server (one rule on all)


@dataclass
class Traffic:
    """Bytes and operations moved by this rank (instrumentation for --metrics and bench)."""

    get_bytes: int = 0
    get_ops: int = 0
    shm_bytes: int = 0  # read through the same-node shared-memory path
    acc_bytes: int = 0
    acc_ops: int = 0


def ids_in_range(table: str, rows: int, ids) -> tuple[np.ndarray, tuple[int, int] | None]:
    """(``ids`` (any shape, integers) as int64, their (min, max) or None when there are
    none) if all are rows of ``table`` (``[0, rows)``: checked on the extent, one pass of
    ``kernels.min_max``, which ``partition.group_by_owner`` takes too), else
    ``InputError`` naming the first bad one (its flat position) and how many there are."""
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise InputError(f"table {table!r}: ids must be integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    extent = min_max(ids) if ids.size else None
    if extent is not None and (extent[0] < 0 or extent[1] >= rows):
        bad = (ids < 0) | (ids >= rows)
        pos = int(np.flatnonzero(bad.ravel())[0])
        raise InputError(
            f"table {table!r}: id {int(ids.ravel()[pos])} at flat position {pos} "
            f"is out of range [0, {rows}) ({int(bad.sum())} bad id(s)); "
            "nothing was read or written")
    return ids, extent


def owner_types(base: MPI.Datatype, dim: int, itemsize: int, unique, bounds,
                n_servers: int) -> list:
    """[(server index, slice of ``unique``, committed datatype)], one per owner with rows:
    the byte offsets of its rows of ``unique`` (grouped by ``bounds``, as
    ``partition.group_by_owner`` makes them) inside a slot's region, the same in every
    slot (``transport.rows_type``). The caller frees the datatypes."""
    out = []
    for s in range(n_servers):
        a, b = int(bounds[s]), int(bounds[s + 1])
        if a < b:
            local = unique[a:b] if n_servers == 1 else partition.local_row(unique[a:b], n_servers)
            disps = local * (dim * itemsize)
            out.append((s, slice(a, b), rows_type(base, dim, disps)))
    return out


class Plan:
    """One step's ids of one table, grouped for the wire (``EmbeddingStore.plan``): the
    checked ids, their distinct values grouped by owner, the inverse index, and (made when
    an RMA operation first needs them) one committed row datatype per owner. ``pull`` and
    ``push`` of any slot reuse it; ``free`` it after."""

    __slots__ = ("store", "table", "ids", "unique", "inverse", "bounds", "_targets", "_freed")

    def __init__(self, store, table, ids, unique, inverse, bounds):
        self.store, self.table, self.ids, self.unique = store, table, ids, unique
        self.inverse, self.bounds = inverse, bounds
        self._targets, self._freed = None, False

    @property
    def targets(self) -> list:
        """[(server index, world rank, slice of unique, datatype)], one per owner with rows."""
        assert not self._freed, "a freed plan was used for an RMA operation"
        if self._targets is None:
            self._targets = self.store._targets(self)
        return self._targets

    def sum_rows(self, grads) -> np.ndarray:
        """grads: ids.shape + (dim,) -> (U, dim) sums per distinct id, in the table's dtype
        (rows of one id added in input order: the bits of ``np.add.at``)."""
        t = self.store.tables[self.table].spec
        if grads.shape != self.ids.shape + (t.dim,):
            raise InputError(f"table {t.name!r}: grads shape {grads.shape} does not match "
                             f"ids shape {self.ids.shape} + (dim={t.dim},)")
        return scatter_add(self.inverse.ravel(), grads.reshape(-1, t.dim).astype(
            t.dtype, copy=False), self.unique.size)

    def free(self) -> None:
        for *_, dt in self._targets or ():
            dt.Free()
        self._targets, self._freed = [], True


class EmbeddingStore:
    """Sharded embedding tables. Collective construction over ``topo.world``.

    ``tables``: TableSpecs (unique names). ``seed``: initialisation seed.
    ``shared_memory``: the same-node fast path (None: on when every rank shares one
    node; False: RMA only, as between nodes): the window is allocated with
    ``Win.Allocate_shared`` and workers read the servers' shards directly (``pull`` is a
    gather from a zero-copy view); pushes stay MPI Accumulates (atomic). None on a job of
    several nodes: each worker gathers the rows of the servers on its own node from their
    ``Win.Allocate`` memory where the MPI shares it (MPI-4.1's ``Shared_query``;
    ``_node_views``), and Gets the other servers' rows.
    Workers call ``pull``/``push``; servers hold the shards (``shard``) and update them
    locally (``modes`` runs their loop); every rank calls ``close`` (collective).
    """

    def __init__(self, topo: Topology, tables: list[TableSpec], seed: int = 0,
                 shared_memory: bool | None = None):
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ConfigError(f"duplicate table names in {names}", collective=True)
        for t in tables:
            try:
                t.validate()
            except PshybridError as e:
                e.collective = True  # same specs on every rank: same verdict, clean exit
                raise
        if topo.n_servers < 1:
            raise ConfigError("the embedding store needs at least one server rank", collective=True)
        self.topo = topo
        self.seed = seed
        self.traffic = Traffic()
        self.tables: dict[str, _Table] = {}
        nbytes = 0
        S, me = topo.n_servers, topo.server_index
        for spec in tables:
            itemsize = np.dtype(spec.dtype).itemsize
            offsets = {}
            for slot in ("w",) + spec.slots:
                offsets[slot] = nbytes
                if topo.is_server:
                    region = partition.shard_rows(spec.rows, S, me) * spec.dim * itemsize
                    nbytes += -(-region // _ALIGN) * _ALIGN
            self.tables[spec.name] = _Table(spec, itemsize, mpi_type(spec.dtype), offsets)
        # Offsets differ per server (shard sizes differ by one row): every rank learns all.
        # Wire: one allgather of each rank's {table: {slot: offset}}; all ranks wait.
        layouts = topo.world.allgather({n: t.offsets for n, t in self.tables.items()})
        self._remote = [layouts[r] for r in topo.server_ranks]
        auto = shared_memory is None
        shared_memory = shared_window(shared_memory, topo.n_nodes)
        # Wire: collective window creation over world; servers expose their shards.
        self.win = allocate_window(nbytes, topo.world, shared_memory)
        if shared_memory:
            self._views = [np.frombuffer(self.win.Shared_query(r)[0], np.uint8)
                           for r in topo.server_ranks]
        else:
            self._views = self._node_views() if auto and topo.is_worker else None
        # a server of no rows (more servers than a table's rows) holds an empty window
        self._mem = (np.frombuffer(self.win.tomemory(), dtype=np.uint8) if nbytes else
                     np.empty(0, np.uint8))
        self._init_shards()
        self.win.Lock_all()
        self._open = True

    def reset_traffic(self) -> None:
        """Zero the byte and operation counters."""
        self.traffic = Traffic()

    # -- server side -----------------------------------------------------------------------
    def shard(self, table: str, slot: str = "w") -> np.ndarray:
        """This server's rows of ``table`` (``slot`` region): (local_rows, dim) view."""
        t = self.tables[table]
        assert self.topo.is_server, "only servers hold shards"
        n = partition.shard_rows(t.spec.rows, self.topo.n_servers, self.topo.server_index)
        count = n * t.spec.dim
        a = t.offsets[slot]
        return self._mem[a:a + count * t.itemsize].view(t.spec.dtype).reshape(n, t.spec.dim)

    def shard_ids(self, table: str) -> np.ndarray:
        """Global row ids of this server's rows of ``table``, in local order."""
        t = self.tables[table]
        return partition.shard_ids(t.spec.rows, self.topo.n_servers, self.topo.server_index)

    def _init_shards(self) -> None:
        """Servers reserve and initialise their shards; collective (one failing fails all)."""
        err = None
        try:
            if self.topo.is_server and self._mem.size:  # its pages now: a shortage is a
                reserve_shared_memory(self._mem)  # MemoryError, not a SIGBUS at the writes
            for name in (self.tables if self.topo.is_server else ()):
                self._init_shard(name)
        except Exception as e:  # noqa: BLE001 - any failure: every rank learns it, none waits
            err = e if isinstance(e, PshybridError) else PshybridError(
                out_of_memory(e) if isinstance(e, MemoryError) else
                f"initialising the shard: {type(e).__name__}: {e}")
        # Wire: verdict allgather (a barrier) so no worker reads a shard before its server
        # initialised it, and a server that failed fails every rank.
        agree(self.topo.world, err)

    def _init_shard(self, name: str) -> None:
        t = self.tables[name]
        w = self.shard(name)
        if t.spec.init == "uniform":
            # (rows server, server + S, ...: partition.shard_ids, a chunk at a time)
            uniform_range(w, self.topo.server_index, self.topo.n_servers, self.seed, name,
                          t.spec.init_scale)
        else:
            w[...] = 0
        for slot in t.spec.slots:
            self.shard(name, slot)[...] = 0

    # -- worker side -----------------------------------------------------------------------
    def _check_ids(self, t: _Table, ids) -> np.ndarray:
        return ids_in_range(t.spec.name, t.spec.rows, ids)[0]

    @property
    def shared(self) -> bool:
        """Whether pulls read every server's shared memory (no RMA Get, no datatype)."""
        return self._views is not None and all(v is not None for v in self._views)

    def _node_views(self) -> list | None:
        """A zero-copy view of each server's window on this rank's node, where this MPI
        shares it (``Shared_query`` on an allocated window, MPI-4.1; an MPI that refuses it
        or shares less than the server's regions: None), None for the others; None when
        there is none (RMA only)."""
        me, views = self.topo.node_of_rank[self.topo.rank], []
        old = self.win.Get_errhandler()
        self.win.Set_errhandler(MPI.ERRORS_RETURN)  # a refusal raises instead of aborting
        try:
            for s, r in enumerate(self.topo.server_ranks):
                view = need = None
                if self.topo.node_of_rank[r] == me:
                    need = max((self._remote[s][n][k] + self._region_bytes(t, s)
                                for n, t in self.tables.items() for k in t.offsets), default=0)
                if need:
                    try:
                        view = np.frombuffer(self.win.Shared_query(r)[0], np.uint8)
                    except MPI.Exception:
                        pass
                views.append(view if view is not None and view.size >= need else None)
        finally:
            self.win.Set_errhandler(old)
            old.Free()
        return views if any(v is not None for v in views) else None

    def plan(self, table: str, ids, types: bool = True) -> Plan:
        """Workers, any thread (MPI_THREAD_MULTIPLE when ``types``): check ``ids`` (any shape
        int64), deduplicate and group them by owner, and (``types``) commit one row datatype
        per owner now; else the first RMA ``pull``/``push`` makes them. ``pull`` and ``push``
        of any slot take the plan instead of ids. ``free()`` it after use."""
        t = self.tables[table]
        ids, extent = ids_in_range(t.spec.name, t.spec.rows, ids)
        unique, inverse, bounds = partition.group_by_owner(ids, t.spec.rows,
                                                           self.topo.n_servers, extent)
        plan = Plan(self, table, ids, unique, inverse, bounds)
        if types:
            plan.targets  # noqa: B018 - commits the datatypes now (e.g. on the data thread)
        return plan

    def _targets(self, plan: Plan) -> list:
        """One committed row datatype per owner of ``plan``'s rows (``owner_types``)."""
        t = self.tables[plan.table]
        return [(s, self.topo.server_ranks[s], sl, dt) for s, sl, dt in owner_types(
            t.base, t.spec.dim, t.itemsize, plan.unique, plan.bounds, self.topo.n_servers)]

    def _planned(self, table: str, ids) -> tuple[Plan, bool]:
        """(plan, whether this call made it and must free it)."""
        if isinstance(ids, Plan):
            assert ids.table == table, (ids.table, table)
            return ids, False
        return self.plan(table, ids), True

    def pull(self, table: str, ids, slot: str = "w", unique: bool = False,
             out=None) -> np.ndarray:
        """Rows of ``table`` for ``ids`` (or a ``Plan``): (B,) or (B, F) int64 -> ids.shape
        + (dim,). Duplicates are fetched once. One indexed Get per owner server.
        ``unique`` (with a plan): the (U, dim) rows of ``plan.unique`` instead, not expanded,
        written into ``out`` if given (a (U, dim) array, any strides) and returned."""
        t = self.tables[table]
        assert out is None or unique, "out takes the plan's distinct rows"
        if self.shared:  # a plan's ids were checked when it was made
            if isinstance(ids, Plan) and (unique or self.topo.n_servers > 1):
                return self._pull_shared_plan(t, ids, slot, unique, out)
            return self._pull_shared(t, self._check_ids(t, ids.ids if isinstance(ids, Plan)
                                                         else ids), slot)
        plan, own = self._planned(table, ids)
        direct = out is not None and out.flags.c_contiguous
        buf = self._get(t, plan, slot, out if direct else None)
        self._flush(plan, own)
        if out is not None and not direct:
            out[...] = buf
            return out
        return buf if unique else gather(buf, plan.inverse)

    def _get(self, t: _Table, plan: Plan, slot: str, buf=None) -> np.ndarray:
        """Issue one indexed Get per owner of ``plan.unique``'s rows into ``buf`` (a
        C-contiguous (U, dim) array; default a new one), not completed: valid after
        ``Flush`` of those owners (``_flush``). An owner on this node whose memory is
        shared (``_node_views``): its rows gathered from it instead, now."""
        if buf is None:
            buf = np.empty((plan.unique.size, t.spec.dim), dtype=t.spec.dtype)
        if self._views is not None:
            self.win.Sync()  # memory barrier: see every Accumulate completed before our barrier
        for s, rank, sl, dt in plan.targets:
            if self._views is not None and self._views[s] is not None:
                self._gather_owner(t, plan, s, slot, buf)
                continue
            # Wire: one indexed Get of (rows, dim) from server `rank`; buf lives until Flush.
            self.win.Get([buf[sl], t.base], rank, [self._remote[s][t.spec.name][slot], 1, dt])
            self.traffic.get_bytes += buf[sl].nbytes
            self.traffic.get_ops += 1
        return buf

    def pull_start(self, table: str, plan: Plan):
        """Start pulling the (U, dim) rows of ``plan.unique`` (weights): the Gets are issued
        and left in flight (the values are read at some point before ``pull_wait``; on the
        same-node path they are copied now). -> a handle for ``pull_wait``."""
        t = self.tables[table]
        if self.shared:
            return None, self._pull_shared_plan(t, plan, "w", True)
        return plan, self._get(t, plan, "w")

    def pull_wait(self, handle) -> np.ndarray:
        """Complete ``pull_start``'s Gets (Flush of their owners) -> (U, dim) rows."""
        plan, buf = handle
        if plan is not None:
            self._flush(plan, False)
        return buf

    def _region_bytes(self, t: _Table, s: int) -> int:
        """Bytes of one slot's region of ``t`` on server s."""
        return partition.shard_rows(t.spec.rows, self.topo.n_servers, s) * t.spec.dim * t.itemsize

    def _region(self, t: _Table, s: int, slot: str) -> np.ndarray:
        """Server s's (rows, dim) region of ``slot``, a zero-copy view of shared memory."""
        a = self._remote[s][t.spec.name][slot]
        return self._views[s][a:a + self._region_bytes(t, s)].view(t.spec.dtype).reshape(
            -1, t.spec.dim)

    def _gather_owner(self, t: _Table, plan: Plan, s: int, slot: str, buf) -> None:
        """Server s's distinct rows of ``plan`` gathered from its shared region into their
        rows of ``buf`` (after the caller's ``win.Sync``)."""
        a, b = int(plan.bounds[s]), int(plan.bounds[s + 1])
        gather(self._region(t, s, slot), partition.local_row(plan.unique[a:b],
                                                             self.topo.n_servers), out=buf[a:b])
        self.traffic.shm_bytes += buf[a:b].nbytes

    def _pull_shared(self, t: _Table, ids, slot: str) -> np.ndarray:
        """Same-node fast path: gather straight from the servers' shared memory."""
        S = self.topo.n_servers
        self.win.Sync()  # memory barrier: see every Accumulate completed before our barrier
        if S == 1:
            out = gather(self._region(t, 0, slot), ids)
        else:
            local, own = np.divmod(ids, S)
            out = np.empty(ids.shape + (t.spec.dim,), t.spec.dtype)
            for s in range(S):
                m = own == s
                out[m] = gather(self._region(t, s, slot), local[m])
        self.traffic.shm_bytes += out.nbytes
        return out

    def _pull_shared_plan(self, t: _Table, plan: Plan, slot: str, unique: bool,
                          out=None) -> np.ndarray:
        """Same-node fast path with a plan: each server's distinct rows gathered from its
        region by the plan's owner groups (no per-id owner masks) straight into ``out``
        (default a new (U, dim) buffer), then expanded."""
        self.win.Sync()  # memory barrier: see every Accumulate completed before our barrier
        buf = np.empty((plan.unique.size, t.spec.dim), t.spec.dtype) if out is None else out
        for s in range(self.topo.n_servers):
            if plan.bounds[s] < plan.bounds[s + 1]:
                self._gather_owner(t, plan, s, slot, buf)
        return buf if unique else gather(buf, plan.inverse)

    def push(self, table: str, ids, grads, scale: float = 1.0, slot: str = "w",
             unique: bool = False):
        """Add ``scale * grads`` to the rows ``ids`` (or a ``Plan``) of ``table`` (``slot``).

        ids: (B,) or (B, F) int64; grads: ids.shape + (dim,). Rows of duplicate ids are
        summed locally first (in input order); then one Accumulate(SUM) per owner server,
        flushed. ``unique`` (with a plan): grads are already the (U, dim) sums of the rows of
        ``plan.unique``. Returns ``(unique, bounds)``: the distinct ids pushed, grouped by
        owner server (owner s's are ``unique[bounds[s]:bounds[s+1]]``).
        """
        t = self.tables[table]
        grads = np.asarray(grads)
        if unique:
            assert isinstance(ids, Plan), "unique=True pushes the rows of a plan"
            if grads.shape != (ids.unique.size, t.spec.dim):
                raise InputError(f"table {table!r}: grads shape {grads.shape} is not "
                                 f"({ids.unique.size}, {t.spec.dim})")
            sums = np.array(grads, dtype=t.spec.dtype)  # a copy: scaled in place below
            plan, own = ids, False
        else:
            shape = ids.ids.shape if isinstance(ids, Plan) else np.shape(ids)
            if grads.shape != tuple(shape) + (t.spec.dim,):  # before a plan is made
                raise InputError(f"table {table!r}: grads shape {grads.shape} does not match "
                                 f"ids shape {tuple(shape)} + (dim={t.spec.dim},)")
            plan, own = self._planned(table, ids)
            sums = plan.sum_rows(grads)
        if scale != 1.0:
            sums *= np.asarray(scale, dtype=t.spec.dtype)
        for s, rank, sl, dt in plan.targets:
            # Wire: one indexed Accumulate(SUM) of (rows, dim) into server `rank`; we wait
            # (Flush), nobody else.
            self.win.Accumulate([sums[sl], t.base], rank, [self._remote[s][table][slot], 1, dt],
                                op=MPI.SUM)
        self.traffic.acc_bytes += sums.nbytes
        self.traffic.acc_ops += len(plan.targets)
        self._flush(plan, own)
        return plan.unique, plan.bounds

    def put(self, table: str, ids, rows, slot: str = "w") -> None:
        """Overwrite the rows ``ids`` (distinct, (n,) int64) of ``table`` (``slot``) with
        ``rows`` (n, dim): one Accumulate(REPLACE) per owner server, flushed (atomic with
        respect to other accumulates)."""
        t = self.tables[table]
        plan = self.plan(table, ids)
        assert plan.unique.size == np.size(ids), "put takes distinct ids"
        vals = np.ascontiguousarray(np.asarray(rows, t.spec.dtype)[np.argsort(plan.inverse)])
        for s, rank, sl, dt in plan.targets:
            # Wire: one indexed Accumulate(REPLACE) of (rows, dim) into server `rank`.
            self.win.Accumulate([vals[sl], t.base], rank, [self._remote[s][table][slot], 1, dt],
                                op=MPI.REPLACE)
        self.traffic.acc_bytes += vals.nbytes
        self._flush(plan, True)

    def push_sgd(self, table: str, ids, grads, lr: float):
        """Direct SGD: ``w[ids] -= lr * sum of grads`` by accumulating ``-lr * g`` (Hetu style)."""
        return self.push(table, ids, grads, scale=-lr)

    def _flush(self, plan: Plan, free: bool) -> None:
        for _, rank, _, _ in plan._targets or ():
            self.win.Flush(rank)  # waits until the ops to `rank` are complete at both ends
        if free:
            plan.free()

    def barrier(self) -> None:
        """Workers only: after it, every push issued before it by any worker is visible.
        Wire: zero-byte barrier over the workers communicator; all workers wait."""
        self.topo.workers.Barrier()

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Collective over world: end the epoch and free the window.
        Wire: Ibarrier over world; servers wait politely, workers until all pushes are done."""
        if not self._open:
            return
        idle_barrier(self.topo.world)
        self.win.Unlock_all()
        self._mem = self._views = None
        self.win.Free()
        self._open = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
