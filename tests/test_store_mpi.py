"""Embedding store over RMA: sharded == unsharded, exact under concurrent pushes.

Runs at every world size tests/run.py uses (2, 3, 5 ranks) with 1 and 2 servers
(every server count that leaves a worker).
"""

import threading
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

from mpi_util import assert_all
from pshybrid.errors import ConfigError, InputError
from pshybrid.initializers import uniform_rows
from pshybrid.store import EmbeddingStore, TableSpec
from pshybrid.topology import Topology

SEED = 11
SPECS = [TableSpec("small", rows=7, dim=3, dtype="float64", init_scale=0.5),
         TableSpec("big", rows=1001, dim=8, dtype="float64", slots=("g",)),
         TableSpec("f32", rows=64, dim=4, dtype="float32")]


def server_counts(size):
    return [s for s in (1, 2) if s < size]


PATHS = {"rma": False, "shm": True, "mixed": None}  # pull path -> shared_memory


def topology(comm, S, path):
    """(topology, the one the store gets): for "mixed", the same ranks as if they alternated
    over two nodes (rank r on node r % 2), so a worker has some servers on its node and not
    others: the store reads those through shared memory (``shared_memory=None`` on a job of
    several nodes) and Gets the rest."""
    topo = Topology.create(comm, S)
    if path != "mixed":
        return topo, topo
    return topo, replace(topo, node_of_rank=[r % 2 for r in range(topo.size)],
                         node_names=["a", "b"])


def views_as_expected(store, topo) -> bool:
    """Shared memory exactly for the servers on the worker's node, where the MPI answers
    ``Shared_query`` on an allocated window (MPI 4.1: MPICH 5 does); another MPI may refuse
    it (Open MPI 4, MPI 3.1; Intel MPI 2021, MPI 4.1 all the same): then none, every pull
    over RMA."""
    want = [topo.node_of_rank[r] == topo.node_of_rank[topo.rank] for r in topo.server_ranks]
    got = [v is not None for v in (store._views or [None] * topo.n_servers)]
    mpich = MPI.Get_library_version().startswith("MPICH") and MPI.Get_version() >= (4, 1)
    if not mpich and not any(got):
        return True
    return got == (want if any(want) else [False] * topo.n_servers)


def reference(spec, seed=SEED):
    """Unsharded table built on this rank alone."""
    ref = np.zeros((spec.rows, spec.dim), dtype=spec.dtype)
    if spec.init == "uniform":
        uniform_rows(ref, np.arange(spec.rows, dtype=np.int64), seed, spec.name, spec.init_scale)
    return ref


def random_ids(rng, spec, shape):
    # Zipf-distributed with guaranteed duplicates
    return np.minimum(rng.zipf(1.2, size=shape) - 1, spec.rows - 1).astype(np.int64)


def plan_on_thread(store, name, ids):
    """store.plan made on another thread, as the training loop's data thread does."""
    out = []
    th = threading.Thread(target=lambda: out.append(store.plan(name, ids)))
    th.start()
    th.join()
    return out[0]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("planned", [False, True], ids=["ids", "plan"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("S", [1, 2])
def test_pull_equals_unsharded(comm, S, path, planned):
    if S >= comm.size:
        pytest.skip(f"{S} servers need > {S} ranks")
    real, topo = topology(comm, S, path)
    store = EmbeddingStore(topo, SPECS, seed=SEED, shared_memory=PATHS[path])
    ok, msg = store._views is not None or path != "shm", "shared-memory path not taken"
    if path == "mixed" and topo.is_worker and not views_as_expected(store, topo):
        ok, msg = False, f"views {store._views is not None} on node {topo.node_of_rank}"
    rma = [s for s in range(S) if store._views is None or store._views[s] is None]
    if not topo.is_server:
        rng = np.random.default_rng(100 + topo.worker_index)
        for spec in SPECS:
            ref = reference(spec)
            for shape in [(1,), (257,), (32, 5)]:
                ids = random_ids(rng, spec, shape)
                plan = plan_on_thread(store, spec.name, ids) if planned else None
                ops = store.traffic.get_ops
                got = store.pull(spec.name, plan or ids)
                owners = np.isin(rma, ids % S).sum()  # a Get per RMA owner holding some
                if not store.shared and store.traffic.get_ops - ops != owners:
                    ok, msg = False, f"{store.traffic.get_ops - ops} Gets for {owners} owners"
                if got.shape != shape + (spec.dim,) or not np.array_equal(got, ref[ids]):
                    ok, msg = False, f"{spec.name} {shape}: pull != table[ids]"
                for slot in spec.slots:  # one plan serves every slot (zeros here)
                    if not np.array_equal(store.pull(spec.name, plan or ids, slot=slot),
                                          np.zeros_like(ref[ids])):
                        ok, msg = False, f"{spec.name} {shape}: slot {slot} != 0"
                if plan:  # the distinct rows, also into a given array (a GPU worker's
                    # pinned buffer: rows padded by 3 elements, so a strided view)
                    want = ref[plan.unique]
                    pad = np.full((plan.unique.size, spec.dim + 3), 9, spec.dtype)
                    for out in (None, np.empty_like(want), pad[:, :spec.dim]):
                        got = store.pull(spec.name, plan, unique=True, out=out)
                        if not (np.array_equal(got, want) and (out is None or got is out)):
                            ok, msg = False, f"{spec.name} {shape}: unique pull into {out}"
                    if (pad[:, spec.dim:] != 9).any():
                        ok, msg = False, f"{spec.name} {shape}: wrote past the out columns"
                    plan.free()
            if not np.array_equal(store.pull(spec.name, np.zeros((0,), np.int64)),
                                  ref[:0]):
                ok, msg = False, "empty pull"
            plan = store.plan(spec.name, random_ids(rng, spec, (64,)))  # the pipeline's pull
            if not np.array_equal(store.pull_wait(store.pull_start(spec.name, plan)),
                                  ref[plan.unique]):
                ok, msg = False, f"{spec.name}: pull_start/pull_wait != table[unique]"
            plan.free()
    store.close()
    real.free()
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("planned", [False, True], ids=["ids", "plan"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("S", [1, 2])
def test_concurrent_pushes_are_exact(comm, S, path, planned):
    """Every worker pushes integer-valued grads for several rounds at once; every
    server's shard must equal init + the sum of all pushes (exact in float64)."""
    if S >= comm.size:
        pytest.skip(f"{S} servers need > {S} ranks")
    # Sums are exact in any order only from a zero start (small integers times 0.5)
    specs = [replace(s, init="zeros") for s in SPECS]
    real, topo = topology(comm, S, path)
    store = EmbeddingStore(topo, specs, seed=SEED, shared_memory=PATHS[path])
    rounds, lr = 4, 0.5

    def pushes(worker):
        rng = np.random.default_rng(1000 + worker)
        for rnd in range(rounds):
            for spec in specs:
                ids = random_ids(rng, spec, (40, 3))
                grads = rng.integers(-4, 5, size=ids.shape + (spec.dim,)).astype(spec.dtype)
                yield rnd, spec, ids, grads

    if not topo.is_server:
        for rnd, spec, ids, grads in pushes(topo.worker_index):
            target = plan_on_thread(store, spec.name, ids) if planned else ids
            if rnd % 2:
                store.push_sgd(spec.name, target, grads, lr)
            else:
                store.push(spec.name, target, grads, slot="g" if spec.slots else "w")
            if planned:
                target.free()
    # Wire: every worker's accumulates are flushed before it enters this barrier.
    comm.Barrier()
    ok, msg = True, ""
    if topo.is_server:
        want = {s.name: reference(s) for s in specs}
        want_g = {s.name: np.zeros((s.rows, s.dim), s.dtype) for s in specs}
        for w in range(topo.n_workers):
            for rnd, spec, ids, grads in pushes(w):
                tgt = want[spec.name] if rnd % 2 or not spec.slots else want_g[spec.name]
                np.add.at(tgt, ids.ravel(), (-lr if rnd % 2 else 1.0) * grads.reshape(-1, spec.dim))
        for spec in specs:
            mine = store.shard_ids(spec.name)
            if not np.array_equal(store.shard(spec.name), want[spec.name][mine]):
                ok, msg = False, f"server {topo.server_index}: weights of {spec.name} differ"
            if spec.slots and not np.array_equal(store.shard(spec.name, "g"),
                                                 want_g[spec.name][mine]):
                ok, msg = False, f"server {topo.server_index}: slot g of {spec.name} differs"
    store.close()
    real.free()
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_same_seed_same_table_for_any_server_count(comm):
    spec = TableSpec("t", rows=53, dim=5, dtype="float32")
    tables = {}
    for S in range(1, min(comm.size, 4)):
        topo = Topology.create(comm, S)
        store = EmbeddingStore(topo, [spec], seed=SEED)
        if topo.rank == topo.worker_ranks[0]:
            tables[S] = store.pull("t", np.arange(spec.rows))
        store.close()
        topo.free()
    ok = all(np.array_equal(tables[1], t) for t in tables.values())
    ok = ok and (not tables or np.array_equal(tables[1], reference(spec)))
    assert_all(comm, ok, f"tables differ across server counts {sorted(tables)}")


@pytest.mark.mpi(min_size=2)
def test_owners_of_no_rows_start_and_the_rows_stay_exact(comm):
    """Fewer rows than shard owners (colocated: every rank owns a shard; 1 row): the ranks
    of empty shards start (an empty window; they crashed, or hung the Python API), and a
    pull after every worker's push == the unsharded table + the pushes."""
    spec = TableSpec("one", rows=1, dim=3, dtype="float64", init="zeros")  # sums: exact
    topo = Topology.create(comm, colocated=True)
    store = EmbeddingStore(topo, [spec], seed=SEED)
    ids = np.zeros((2, 1), np.int64)
    store.push("one", ids, np.full((2, 1, 3), topo.worker_index + 1.0))
    comm.Barrier()   # Wire: every worker's accumulate is flushed before the barrier
    got = store.pull("one", np.zeros(1, np.int64))
    want = reference(spec) + 2 * sum(range(1, topo.n_workers + 1))
    store.close()
    topo.free()
    assert_all(comm, np.array_equal(got, want), f"{got} != {want}")


@pytest.mark.mpi(min_size=2)
def test_a_server_failing_to_initialise_fails_every_rank(comm, monkeypatch):
    """A server whose shard cannot be initialised (here: its initialiser raises) fails the
    store's construction on every rank; the workers used to wait in the barrier."""
    from pshybrid import store as store_module
    from pshybrid.errors import PshybridError

    topo = Topology.create(comm, 1)
    if topo.is_server:
        monkeypatch.setattr(store_module, "uniform_range", lambda *a: 1 / 0)
    try:
        EmbeddingStore(topo, [TableSpec("t", rows=6, dim=2)], seed=SEED)
        got = "built"
    except PshybridError as e:
        got = str(e)
    topo.free()
    assert_all(comm, "ZeroDivisionError" in got, got)


@pytest.mark.mpi(min_size=2)
def test_bad_ids_raise_and_write_nothing(comm):
    spec = TableSpec("users", rows=10, dim=2, dtype="float64")
    topo = Topology.create(comm, 1)
    store = EmbeddingStore(topo, [spec], seed=SEED)
    ok, msg = True, ""
    if not topo.is_server:
        for bad in ([3, -1], [[0, 10]], [2**40]):
            for op in ("pull", "push"):
                try:
                    if op == "pull":
                        store.pull("users", np.array(bad))
                    else:
                        ids = np.array(bad)
                        store.push("users", ids, np.ones(ids.shape + (2,)))
                    ok, msg = False, f"{op}({bad}) did not raise"
                except InputError as e:
                    text = str(e)
                    offending = [v for v in np.ravel(bad) if not 0 <= v < 10][0]
                    if "'users'" not in text or str(offending) not in text:
                        ok, msg = False, f"message does not name table and id: {text}"
        try:
            store.pull("users", np.array([1.5]))
            ok, msg = False, "float ids accepted"
        except InputError:
            pass
        try:
            store.push("users", np.array([1, 2]), np.ones((2, 3)))
            ok, msg = False, "wrong grads shape accepted"
        except InputError:
            pass
    comm.Barrier()
    if not topo.is_server and not np.array_equal(store.pull("users", np.arange(10)),
                                                 reference(spec)):
        ok, msg = False, "a rejected push wrote to the table"
    store.close()
    topo.free()
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_bad_specs_are_collective_config_errors(comm):
    topo = Topology.create(comm, 1)
    for specs in ([TableSpec("a", 0, 2)], [TableSpec("a", 3, 2), TableSpec("a", 3, 2)],
                  [TableSpec("a", 3, 2, dtype="int8")]):
        with pytest.raises(ConfigError) as e:
            EmbeddingStore(topo, specs)
        assert e.value.collective
    topo.free()


@pytest.mark.mpi(min_size=2)
def test_topology_roles(comm):
    S = comm.size - 1
    topo = Topology.create(comm, S)
    ok = (topo.n_servers == S and topo.n_workers == 1
          and topo.server_ranks == list(range(1, comm.size))  # one node: highest ranks
          and topo.worker_ranks == [0] and topo.role == ("worker" if comm.rank == 0 else "server")
          and (topo.servers.size == S if topo.is_server else topo.workers.size == 1)
          and topo.world != comm)
    topo.free()
    assert_all(comm, ok, "roles or communicators wrong")


@pytest.mark.mpi(min_size=2)
def test_agree_raises_everywhere(comm):
    from pshybrid.errors import PshybridError
    from pshybrid.transport import agree

    agree(comm, None)  # no error: returns on every rank
    err = InputError("bad row 7 in file x") if comm.rank == comm.size - 1 else None
    with pytest.raises(PshybridError) as e:
        agree(comm, err)
    assert "bad row 7" in str(e.value) and e.value.collective
    assert isinstance(e.value, InputError)  # the failing rank's class on every rank


@pytest.mark.mpi(min_size=2)
def test_agree_raises_the_same_class_everywhere(comm):
    """A ConfigError found on every rank is a ConfigError on every rank: a script's
    ``except ConfigError`` around ``train`` catches it on all ranks (none exits alone)."""
    from pshybrid.transport import agree

    with pytest.raises(ConfigError) as e:
        agree(comm, ConfigError("lr: must be >= 0"))
    assert "lr: must be >= 0" in str(e.value) and e.value.collective


def test_row_datatype_takes_64bit_byte_displacements():
    """The RMA target datatype of rows past 2**31 elements (here past 2**34 bytes):
    its true extent ends exactly at the last row's end, so offsets were not truncated."""
    from mpi4py import MPI

    from pshybrid.transport import rows_type

    dim = 16
    rows = np.array([3, 2**31 + 5, 2**32 + 7], dtype=np.int64)
    disps = rows * dim * 4
    dt = rows_type(MPI.FLOAT, dim, disps)
    lb, extent = dt.Get_true_extent()
    assert lb == disps[0] and lb + extent == disps[-1] + dim * 4
    assert dt.Get_size() == len(rows) * dim * 4
    dt.Free()


def test_check_ids_names_the_first_bad_id():
    """The plan's id check (one min/max pass when all are good) against the plain mask."""
    from pshybrid.errors import InputError
    from pshybrid.store import ids_in_range

    ids = np.array([[0, 9], [3, 4]], np.int32)
    got, extent = ids_in_range("t", 10, ids)
    assert got.dtype == np.int64 and (got == ids).all() and extent == (0, 9)
    for bad, pos, n in (([0, 10, -1, 3], 1, 2), ([-5], 0, 1), ([2, 3, 2**40], 2, 1)):
        with pytest.raises(InputError, match=rf"table 't': id {bad[pos]} at flat position "
                                             rf"{pos} is out of range \[0, 10\) \({n} bad"):
            ids_in_range("t", 10, np.array(bad))
    with pytest.raises(InputError, match="must be integers"):
        ids_in_range("t", 10, np.array([1.0]))
    got, extent = ids_in_range("t", 0, np.zeros((0, 3), np.int64))
    assert got.shape == (0, 3) and extent is None


@pytest.mark.parametrize("c_call", [True, False])
def test_row_datatype_is_mpi4pys_hindexed_block(monkeypatch, c_call):
    """rows_type builds, by one C call on the array (transport._c_hindexed_block) or through
    mpi4py's list path where that call is not found, the type mpi4py's
    Create_hindexed_block builds from a list: same combiner, base, block length and byte
    displacements (64-bit), so the same bytes."""
    from mpi4py import MPI

    from pshybrid import transport

    if c_call:
        assert transport._c_hindexed_block() is not None  # found with MPICH and Open MPI
    else:
        monkeypatch.setattr(transport, "_C_CALL", [None])
    rng = np.random.default_rng(3)
    for dim, base in ((16, MPI.FLOAT), (3, MPI.DOUBLE)):
        for n in (1, 7, 5000):
            rows = np.sort(rng.choice(2**33, n, replace=False)).astype(np.int64)
            disps = rows * dim * base.Get_size()
            got = transport.rows_type(base, dim, disps)
            want = base.Create_hindexed_block(dim, disps.tolist()).Commit()
            g, w = got.decode(), want.decode()
            assert g[1:] == w[1:] == ("HINDEXED_BLOCK", {"blocklength": dim,
                                                         "displacements": disps.tolist()})
            assert g[0].handle == w[0].handle == base.handle
            assert got.Get_true_extent() == want.Get_true_extent()
            assert got.Get_size() == want.Get_size() == n * dim * base.Get_size()
            got.Free()
            want.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.skipif(not __import__("os").environ.get("PSHYBRID_BIG_TESTS"),
                    reason="needs ~9 GB of memory: set PSHYBRID_BIG_TESTS=1")
def test_table_past_2_31_elements(comm):
    """One float32 table of 2**27 + 3 rows x 16 = 2.1e9 elements (8.6 GB) on one server."""
    rows, dim = 2**27 + 3, 16
    topo = Topology.create(comm, 1)
    store = EmbeddingStore(topo, [TableSpec("huge", rows, dim, init="zeros")], seed=0)
    ok, msg = True, ""
    ids = np.array([0, 5, rows - 1, rows - 2, 2**27 - 1, rows - 1], dtype=np.int64)
    grads = np.arange(ids.size * dim, dtype=np.float32).reshape(ids.size, dim)
    want = np.stack([grads[ids == r].sum(0) for r in ids])  # duplicates summed
    if topo.rank == topo.worker_ranks[0]:
        store.push("huge", ids, grads)
        ok, msg = np.array_equal(store.pull("huge", ids), want), "pulled rows wrong"
    comm.Barrier()  # Wire: the worker's push is flushed before it enters
    if topo.is_server:
        ok = np.array_equal(store.shard("huge")[ids], want)
        msg = "server's shard wrong past 2**31 elements"
    store.close()
    topo.free()
    assert_all(comm, ok, msg)
