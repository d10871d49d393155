"""The master oracle: W workers x batch b under BSP give the same dense and
embedding parameters as one process with batch W*b, to 1e-9 relative in float64, in
every mode, for every optimizer pair on WDL and for every model in hybrid mode.

Servers: 1 at 2-3 ranks, 2 at 5 ranks (so (W, S) = (1, 1), (2, 1), (3, 2)); allreduce
mode uses every rank as a worker. The reference runs on each worker over COMM_SELF.
"""

import io
import math
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

from mpi_util import SHARED_MEMORY, assert_all
from pshybrid.config import TrainConfig
from pshybrid.synthetic import SyntheticCTR
from pshybrid.train import train

DATA = SyntheticCTR(seed=5, n_dense=3, cardinalities=(7, 30, 200, 5), zipf=1.3)
BASE = TrainConfig(model="wdl", embedding_dim=4, mlp=(8, 6), steps=3, batch_size=4,
                   dtype="float64", lr=0.2, dense_lr=0.05, seed=3, log_every=1000,
                   cross_layers=2, shared_memory=SHARED_MEMORY)
# (model, mode, sparse optimizer, dense optimizer, --bucket-mb, --prefetch): the default
# 1 MiB is one bucket for these small models; 1e-6 starts the Allreduce of every layer during
# backward. --prefetch defaults to 0 on these oversubscribed runs; 2 makes each step's store
# plan on the data thread (MPI_THREAD_MULTIPLE) as on nodes with spare cores.
CASES = ([("wdl", mode, so, do, 1.0, None) for mode in ("hybrid", "ps", "allreduce")
          for so in ("sgd", "adagrad", "adam") for do in ("sgd", "adam")]
         + [(m, "hybrid", "adagrad", "adam", 1.0, None) for m in ("deepfm", "dcn", "dlrm")]
         + [("wdl", "hybrid", "adagrad", "adam", 1e-6, None),
            ("dcn", "allreduce", "sgd", "adam", 1e-6, None),
            ("dcnv2", "hybrid", "adagrad", "adam", 1e-6, None),
            ("dlrm", "hybrid", "adam", "sgd", 1e-6, 2),
            ("wdl", "hybrid", "sgd", "adam", 1.0, 2), ("wdl", "ps", "adagrad", "adam", 1.0, 2)])


def run(cfg, comm):
    return train(cfg, comm, dataset=DATA, collect=True, out=io.StringIO())


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("model,mode,sparse_opt,dense_opt,bucket_mb,prefetch", CASES)
def test_bsp_equals_single_process_with_global_batch(comm, model, mode, sparse_opt, dense_opt,
                                                     bucket_mb, prefetch):
    S = 0 if mode == "allreduce" else (1 if comm.size <= 3 else 2)
    W = comm.size - S
    cfg = replace(BASE, model=model, mode=mode, servers=S, sparse_optimizer=sparse_opt,
                  dense_optimizer=dense_opt, bucket_mb=bucket_mb, prefetch=prefetch)
    assert_all(comm, *bsp_verdict(comm, cfg, W, S)[:2])


def bsp_verdict(comm, cfg, W, S):
    """(ok, message, result): ``cfg`` on ``comm`` == one process with the global batch."""
    got = run(cfg, comm)
    ok, msg = True, ""
    if got.role == "worker":
        one = replace(cfg, mode="allreduce", servers=0, placement="dedicated")
        ref = run(replace(one, batch_size=W * cfg.batch_size), MPI.COMM_SELF)
        init = run(replace(one, steps=0), MPI.COMM_SELF)
        wrong = run(one, MPI.COMM_SELF)  # batch b only
        errs = {"dense": rel_err(got.dense, ref.dense), "table": rel_err(got.table, ref.table)}
        moved = {"dense": rel_err(init.dense, ref.dense), "table": rel_err(init.table, ref.table)}
        if max(errs.values()) > 1e-9:
            ok, msg = False, f"W={W} S={S}: relative error {errs} > 1e-9"
        elif min(moved.values()) < 1e-4:
            ok, msg = False, f"training barely moved the parameters: {moved}"
        elif W > 1 and rel_err(wrong.table, ref.table) < 1e-4:
            ok, msg = False, "oracle cannot tell batch b from batch W*b"
    return ok, msg, got


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,sparse_opt,dense_opt,schedule", [
    ("hybrid", "sgd", "sgd", "cosine"),  # --l2 turns the direct SGD push into a server step
    ("hybrid", "adagrad", "adam", "warmup-linear"),
    ("colocated", "adam", "adam", "cosine"),  # every rank applies its shard's step itself
    ("ps", "adagrad", "sgd", "cosine"),  # the dense table's SGD becomes a server step
    ("allreduce", "adam", "sgd", "warmup-linear")])
def test_bsp_with_l2_and_schedule(comm, mode, sparse_opt, dense_opt, schedule):
    """--l2 and --lr-schedule keep the master oracle, and they change the result."""
    S = 0 if mode == "allreduce" else (1 if comm.size <= 3 else 2)
    where = {"servers": S}
    if mode == "colocated":
        mode, S, where = "hybrid", 0, {"placement": "colocated", "servers": None}
    cfg = replace(BASE, mode=mode, sparse_optimizer=sparse_opt, dense_optimizer=dense_opt,
                  l2=0.5, lr_schedule=schedule, warmup_steps=1, **where)
    ok, msg, with_l2 = bsp_verdict(comm, cfg, comm.size - S, S)
    plain = run(replace(cfg, l2=0.0, lr_schedule="constant", warmup_steps=0), comm)
    if ok and with_l2.role == "worker" and rel_err(plain.table, with_l2.table) < 1e-4:
        ok, msg = False, "--l2 and the schedule changed nothing"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,sparse_opt", [("hybrid", "adam"), ("ps", "adagrad"),
                                             ("colocated", "adam")])
def test_bsp_with_adams_decays_and_eps(comm, mode, sparse_opt):
    """--beta1, --beta2 and --eps reach every optimizer (the servers' rows, and in ps their
    dense table; colocated, every rank's shard): the master oracle holds, and they change
    the result."""
    S = 0 if mode == "allreduce" else (1 if comm.size <= 3 else 2)
    where = {"servers": S}
    if mode == "colocated":
        mode, S, where = "hybrid", 0, {"placement": "colocated", "servers": None}
    cfg = replace(BASE, mode=mode, sparse_optimizer=sparse_opt, dense_optimizer="adam",
                  beta1=0.5, beta2=0.9, eps=1e-2, **where)
    ok, msg, got = bsp_verdict(comm, cfg, comm.size - S, S)
    plain = run(replace(cfg, beta1=0.9, beta2=0.999, eps=1e-8), comm)
    if ok and got.role == "worker" and min(rel_err(plain.table, got.table),
                                           rel_err(plain.dense, got.dense)) < 1e-4:
        ok, msg = False, "--beta1, --beta2 and --eps changed nothing"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("sparse_opt", ["sgd", "adam"])
def test_modes_agree_with_each_other(comm, sparse_opt):
    S = 1 if comm.size <= 3 else 2
    G = math.lcm(comm.size - S, comm.size)  # one global batch for W = size - S and W = size
    results = {}
    for mode in ("hybrid", "ps", "allreduce"):
        s = 0 if mode == "allreduce" else S
        cfg = replace(BASE, mode=mode, servers=s, sparse_optimizer=sparse_opt,
                      batch_size=G // (comm.size - s))
        results[mode] = (cfg.batch_size * (comm.size - s), run(cfg, comm))
    ok, msg = True, ""
    if comm.rank == 0:  # world rank 0 is a worker in every mode
        gb = {m: r[0] for m, r in results.items()}
        if len(set(gb.values())) == 1:
            for m in ("ps", "allreduce"):
                for part in ("dense", "table"):
                    e = rel_err(getattr(results[m][1], part), getattr(results["hybrid"][1], part))
                    if e > 1e-9:
                        ok, msg = False, f"{m} vs hybrid {part}: relative error {e}"
        else:
            ok, msg = False, f"global batches differ: {gb}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["hybrid", "allreduce"])
def test_file_data_shuffled_epochs_and_distributed_eval(comm, mpi_tmp_path, mode):
    """Training from a block-shuffled file over 2+ epochs equals one process with the
    global batch, and the distributed evaluation (AUC, logloss over all workers) equals
    the single process's evaluation of the same parameters."""
    from pshybrid.synthetic import write_synthetic

    train_f, valid_f = str(mpi_tmp_path / "t.h5"), str(mpi_tmp_path / "v.h5")
    if comm.rank == 0:
        write_synthetic(train_f, 2600, valid_fraction=0.25, valid_out=valid_f, seed=9,
                        n_dense=3, cardinalities=(7, 30, 200, 5))
    comm.Barrier()
    S = 0 if mode == "allreduce" else 1
    W = comm.size - S
    cfg = replace(BASE, mode=mode, servers=S, data=train_f, eval_data=valid_f, epochs=2,
                  eval_every=5, batch_size=60 // W if 60 % W == 0 else 12, shuffle=True)
    got = train(cfg, comm, collect=True, out=io.StringIO())
    ok, msg = True, ""
    if got.role == "worker":
        ref = train(replace(cfg, mode="allreduce", servers=0, batch_size=W * cfg.batch_size),
                    MPI.COMM_SELF, collect=True, out=io.StringIO())
        if rel_err(got.table, ref.table) > 1e-9 or rel_err(got.dense, ref.dense) > 1e-9:
            ok, msg = False, "file-trained parameters differ from the single process"
        if comm.rank == 0:
            steps_per_epoch = 1950 // (W * cfg.batch_size)
            if [e["step"] for e in got.evals] != [e["step"] for e in ref.evals] or \
                    got.evals[-1]["step"] != 2 * steps_per_epoch:
                ok, msg = False, f"eval steps {[e['step'] for e in got.evals]}"
            for g, r in zip(got.evals, ref.evals):
                if g["rows"] != 650 or abs(g["auc"] - r["auc"]) > 1e-9 or \
                        abs(g["logloss"] - r["logloss"]) > 1e-9:
                    ok, msg = False, f"distributed eval {g} != single-process {r}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,sparse_opt,dense_opt,prefetch", [
    ("hybrid", "adagrad", "adam", None), ("hybrid", "sgd", "adam", None),
    ("hybrid", "adam", "sgd", 2), ("ps", "adagrad", "adam", None), ("ps", "sgd", "sgd", None)])
def test_colocated_equals_dedicated_and_single_process(comm, mode, sparse_opt, dense_opt,
                                                       prefetch):
    """--placement colocated (every rank a worker owning a shard) gives the per-step losses
    and final parameters of one process with the global batch, and of the dedicated
    placement with the same global batch, to float64 rounding."""
    S = 1 if comm.size <= 3 else 2
    G = math.lcm(comm.size - S, comm.size)
    cfg = replace(BASE, mode=mode, sparse_optimizer=sparse_opt, dense_optimizer=dense_opt,
                  prefetch=prefetch, log_every=1)
    col = run(replace(cfg, placement="colocated", servers=None, batch_size=G // comm.size), comm)
    ded = run(replace(cfg, servers=S, batch_size=G // (comm.size - S)), comm)
    ok, msg = True, ""
    if comm.rank == 0:  # world rank 0 is a worker in both placements
        ref = run(replace(cfg, mode="allreduce", servers=0, batch_size=G), MPI.COMM_SELF)
        for name, other in (("single process", ref), ("dedicated", ded)):
            errs = {"dense": rel_err(col.dense, other.dense),
                    "table": rel_err(col.table, other.table),
                    "loss": rel_err(np.array([r["loss"] for r in col.log]),
                                    np.array([r["loss"] for r in other.log]))}
            if max(errs.values()) > 1e-9 or len(col.log) != cfg.steps:
                ok, msg = False, f"colocated vs {name}: {errs}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode,sparse_opt,consistency", [
    ("hybrid", "adagrad", "bsp"), ("hybrid", "sgd", "bsp"), ("ps", "adam", "bsp"),
    ("hybrid", "adagrad", "ssp:1")])
def test_a_job_on_several_nodes_reads_its_nodes_servers_through_shared_memory(
        comm, monkeypatch, mode, sparse_opt, consistency):
    """A job on several nodes (here its ranks made to alternate over two) reads the servers
    on a worker's node straight from their shared memory and Gets the others' rows: the
    same training as Gets from every server (``--shared-memory off``), to float64 rounding
    (several workers' concurrent SGD Accumulates sum in any order)."""
    from pshybrid import topology

    cfg = replace(BASE, mode=mode, servers=2, sparse_optimizer=sparse_opt, log_every=1,
                  consistency=consistency, shared_memory="off")
    rma = run(cfg, comm)
    create = topology.Topology.create.__func__

    def two_nodes(cls, *args, **kw):
        t = create(cls, *args, **kw)
        return replace(t, node_of_rank=[r % 2 for r in range(t.size)], node_names=["a", "b"])

    monkeypatch.setattr(topology.Topology, "create", classmethod(two_nodes))
    mixed = run(replace(cfg, shared_memory="auto"), comm)
    ok, msg = True, ""
    if comm.rank == 0:  # world rank 0 is a worker: it collects the parameters
        errs = {"dense": rel_err(mixed.dense, rma.dense), "table": rel_err(mixed.table, rma.table),
                "loss": rel_err(np.array([r["loss"] for r in mixed.log]),
                                np.array([r["loss"] for r in rma.log]))}
        ok, msg = max(errs.values()) <= 1e-12 and len(mixed.log) == cfg.steps, str(errs)
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("placement,sparse_opt,l2", [
    ("dedicated", "sgd", 0.0), ("dedicated", "adagrad", 0.0), ("dedicated", "adam", 0.0),
    ("colocated", "adam", 0.0), ("dedicated", "sgd", 0.5), ("colocated", "adagrad", 0.5)])
def test_replicated_hot_rows_equal_none(comm, placement, sparse_opt, l2):
    """--replicate-rows N (the N hottest rows on every worker, summed by an Allreduce) gives
    the per-step losses and final parameters of N = 0, to float64 rounding (also with
    --l2, which decays only the rows some worker touched, and a schedule)."""
    cfg = replace(BASE, mode="hybrid", sparse_optimizer=sparse_opt, log_every=1, steps=4,
                  placement=placement, servers=None if placement == "colocated" else 1,
                  l2=l2, lr_schedule="cosine" if l2 else "constant")
    hot = run(replace(cfg, replicate_rows=20), comm)
    cold = run(cfg, comm)
    ok, msg = True, ""
    if comm.rank == 0:
        errs = {"dense": rel_err(hot.dense, cold.dense), "table": rel_err(hot.table, cold.table),
                "loss": rel_err(np.array([r["loss"] for r in hot.log]),
                                np.array([r["loss"] for r in cold.log]))}
        moved = hot.summary["traffic_per_step"].get("hot_allreduce_bytes", 0)
        if max(errs.values()) > 1e-9 or not moved:
            ok, msg = False, f"replicated vs not: {errs}, hot Allreduce bytes/step {moved}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,placement,sparse_opt,dense_opt,l2,dtype", [
    ("hybrid", "dedicated", "adagrad", "adam", 0.0, "float64"),
    ("hybrid", "dedicated", "sgd", "adam", 0.5, "float64"),  # --l2: sgd is a server step
    ("hybrid", "colocated", "adam", "sgd", 0.0, "float64"),  # applied inside the step
    ("ps", "dedicated", "adam", "adam", 0.0, "float64"),     # + the dense table's apply_slot
    ("hybrid", "dedicated", "adam", "adam", 0.5, "float32")])
def test_server_threads_train_exactly_like_one(comm, monkeypatch, mode, placement, sparse_opt,
                                               dense_opt, l2, dtype):
    """--server-threads 3 with chunks of 1 row (the threshold forced down, so these small
    steps are cut) gives the bits of one thread: losses and final parameters equal, and
    every rank that applies a shard did cut a step (1 worker: its one part, the segment
    sum skipped; more: the summed union). One thread's run is the master oracle's.
    ps with 3+ workers: their Accumulates into the dense gradient slot add up in any order,
    so two runs differ in the last bits with any thread count: there to float64 rounding."""
    from pshybrid import pool

    cut = []
    spans = pool.spans
    monkeypatch.setattr(pool, "MIN_ROWS_PER_THREAD", 1)
    monkeypatch.setattr(pool, "MIN_VALUES_PER_THREAD", 1)
    monkeypatch.setattr(pool, "spans", lambda *a: cut.append(len(spans(*a))) or spans(*a))
    where = ({"placement": "colocated", "servers": None} if placement == "colocated" else
             {"servers": 1 if comm.size <= 3 else 2})
    cfg = replace(BASE, mode=mode, sparse_optimizer=sparse_opt, dense_optimizer=dense_opt,
                  l2=l2, dtype=dtype, log_every=1, steps=4, **where)
    one = run(replace(cfg, server_threads=1), comm)
    cut.clear()
    three = run(replace(cfg, server_threads=3), comm)
    ok, msg = True, ""
    applies = three.role == "server" or placement == "colocated"
    if applies and max(cut, default=0) < 2:
        ok, msg = False, f"no step was cut into chunks: {cut[:10]}"
    if three.role == "worker" and comm.rank == 0:
        workers = comm.size if placement == "colocated" else comm.size - where["servers"]
        tol = 1e-9 if mode == "ps" and workers > 2 else 0.0
        errs = {"dense": rel_err(three.dense, one.dense),
                "table": rel_err(three.table, one.table),
                "loss": rel_err(np.array([r["loss"] for r in three.log]),
                                np.array([r["loss"] for r in one.log]))}
        if max(errs.values()) > tol or len(one.log) != cfg.steps:
            ok, msg = False, f"3 threads vs 1: relative errors {errs} > {tol}"
    assert_all(comm, ok, msg)


def write_multi_hot(path, rows, seed):
    """A dataset file with 2 single-hot fields and 2 multi-hot fields of 1-4 ids a row."""
    from pshybrid.data import DatasetWriter

    rng = np.random.default_rng(seed)
    cards = (7, 30, 50, 20)
    with DatasetWriter(path, ["d0", "d1", "d2"], ["s0", "s1"], ["m0", "m1"]) as w:
        lengths = [rng.integers(1, 5, rows) for _ in range(2)]
        w.append(rng.integers(0, 2, rows).astype(np.float32),
                 rng.random((rows, 3), np.float32),
                 np.stack([rng.integers(0, c, rows) for c in cards[:2]], 1),
                 [(rng.integers(0, c, int(n.sum())), n) for c, n in zip(cards[2:], lengths)])
        w.close(cards)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("model,mode,pooling,placement", [
    ("wdl", "hybrid", "sum", "colocated"), ("dlrm", "hybrid", "mean", "dedicated"),
    ("deepfm", "ps", "mean", "dedicated")])
def test_multi_hot_fields_bsp_equals_single_process(comm, mpi_tmp_path, model, mode, pooling,
                                                    placement):
    """Multi-hot fields (pooled by the model, flat ids to the store) under BSP: W workers
    x b == one process with W*b (colocated: W = every rank); the distributed eval == the
    single process's."""
    path = str(mpi_tmp_path / "mh.h5")
    if comm.rank == 0:
        write_multi_hot(path, 300, seed=4)
    comm.Barrier()
    S = None if placement == "colocated" else 1
    W = comm.size - (S or 0)
    cfg = replace(BASE, model=model, mode=mode, servers=S, data=path, eval_data=path,
                  steps=6, batch_size=12, pooling=pooling, sparse_optimizer="adagrad",
                  placement=placement)
    got = train(cfg, comm, collect=True, out=io.StringIO())
    ok, msg = True, ""
    if got.role == "worker":
        single = replace(cfg, mode="allreduce", servers=0, placement="dedicated")
        ref = train(replace(single, batch_size=W * cfg.batch_size), MPI.COMM_SELF,
                    collect=True, out=io.StringIO())
        init = train(replace(single, steps=0, eval_data=None), MPI.COMM_SELF, collect=True,
                     out=io.StringIO())
        errs = {"dense": rel_err(got.dense, ref.dense), "table": rel_err(got.table, ref.table)}
        if max(errs.values()) > 1e-9:
            ok, msg = False, f"W={W} S={S}: relative error {errs} > 1e-9"
        elif rel_err(init.table[7 + 30:], ref.table[7 + 30:]) < 1e-4:
            ok, msg = False, "training barely moved the multi-hot rows"
        elif comm.rank == 0 and abs(got.evals[-1]["auc"] - ref.evals[-1]["auc"]) > 1e-9:
            ok, msg = False, f"eval {got.evals[-1]} != {ref.evals[-1]}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["hybrid", "ps"])
@pytest.mark.parametrize("sparse_opt", ["sgd", "adagrad", "adam"])
def test_ssp0_with_and_without_cache_equals_single_process(comm, mode, sparse_opt):
    """--consistency ssp:0 (the pull-ahead pipeline at depth 0), alone and with a hot-row
    cache that can hold most of the table, is BSP: the parameters of one process with the
    global batch, and a cache that never served a row."""
    S = 1 if comm.size <= 3 else 2
    W = comm.size - S
    cfg = replace(BASE, mode=mode, servers=S, sparse_optimizer=sparse_opt, steps=4,
                  consistency="ssp:0")
    got = {rows: run(replace(cfg, cache_rows=rows), comm) for rows in (0, 150)}
    ok, msg = True, ""
    if comm.rank == 0:  # a worker
        ref = run(replace(cfg, mode="allreduce", servers=0, consistency="bsp",
                          batch_size=W * cfg.batch_size), MPI.COMM_SELF)
        for rows, r in got.items():
            errs = {"dense": rel_err(r.dense, ref.dense), "table": rel_err(r.table, ref.table)}
            reads = r.summary["reads"]
            served, pulled = reads["cache_rows_per_step"], reads["pulled_rows_per_step"]
            if max(errs.values()) > 1e-9 or served != 0 or not pulled:
                ok, msg = False, f"ssp:0 --cache-rows {rows}: {errs}, cache rows/step {served}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,consistency", [("hybrid", "bsp"), ("ps", "bsp"),
                                              ("hybrid", "ssp:2")])
def test_traffic_per_step_counts_the_training_steps_only(comm, mpi_tmp_path, mode,
                                                         consistency):
    """The summary's traffic_per_step is the training's: the same run with evaluations
    (their pulls) has the same figures to the byte, and --replicate-rows' one-off pull of
    the hot rows at start-up is not spread over the steps (its steps pull no more than
    without hot rows)."""
    from pshybrid.synthetic import write_synthetic

    ev = str(mpi_tmp_path / "ev.h5")
    if comm.rank == 0:
        write_synthetic(ev, 300, seed=9, n_dense=3, cardinalities=(7, 30, 200, 5), zipf=1.3)
    comm.Barrier()
    cfg = replace(BASE, mode=mode, servers=1, steps=6, shared_memory="off",
                  consistency=consistency, cache_rows=50 if consistency != "bsp" else 0)
    plain, evald = run(cfg, comm), run(replace(cfg, eval_data=ev, eval_every=2), comm)
    runs = [plain, evald]
    if mode == "hybrid" and consistency == "bsp":
        runs.append(run(replace(cfg, replicate_rows=200), comm))
    ok, msg = True, ""
    if comm.rank == 0:
        t = [r.summary["traffic_per_step"] for r in runs]
        ok = t[0] == t[1] and len(evald.evals) == 3
        if len(t) > 2:
            ok = ok and t[2]["rma_get_bytes"] <= t[0]["rma_get_bytes"]
        msg = str(t)
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_colocated_ranks_count_as_workers_in_the_memory_check(comm):
    """A colocated rank is a worker too: activations far past any node's memory are refused
    before step 1, on every rank, naming --batch-size (they were counted as 0 workers)."""
    from pshybrid.errors import PshybridError

    cfg = replace(BASE, placement="colocated", servers=None, batch_size=10**8,
                  mlp=(4096, 4096), steps=1)
    try:
        run(cfg, comm)
        verdict = "trained"
    except PshybridError as e:
        verdict = str(e)
    assert_all(comm, "not enough memory" in verdict and "per worker" in verdict
               and "--batch-size" in verdict, verdict)


@pytest.mark.mpi(min_size=2)
def test_a_model_registered_after_import_trains_and_one_missing_on_a_rank_fails_all(comm):
    """``MODELS`` is read when a config is checked, not when ``pshybrid.config`` was imported
    (a model registered later trains == the model it copies); registered on rank 0 alone,
    every rank refuses the config (the others used to wait in the next collective)."""
    from pshybrid.errors import PshybridError
    from pshybrid.models import MODELS

    cfg = replace(BASE, mode="allreduce", servers=0, steps=2)
    verdicts = []
    for everywhere in (True, False):
        if everywhere or comm.rank == 0:
            MODELS["wdl_copy"] = MODELS["wdl"]
        try:
            got = run(replace(cfg, model="wdl_copy"), comm)
            verdicts.append(np.array_equal(got.dense, run(cfg, comm).dense))
        except PshybridError as e:
            verdicts.append(str(e))
        finally:
            MODELS.pop("wdl_copy", None)
    assert_all(comm, verdicts[0] is True and "wdl_copy" in str(verdicts[1])
               and "must be one of" in str(verdicts[1]), f"{verdicts}")


@pytest.mark.mpi(min_size=2)
def test_phase_seconds_add_up_to_the_run_seconds_when_worker_0_starts_late(comm, monkeypatch):
    """The summary's phase split is the workers' mean time per phase over the run's
    ``seconds``: a start-up worker 0 alone makes longer (its reporter: --metrics,
    --tensorboard) is start-up, not the other workers' wait in their first Allreduce (the
    phases summed to ~(W-1)/W of that delay past ``seconds``, as "allreduce" time)."""
    import time

    from pshybrid.report import Reporter

    delay, header = 1.0, Reporter.header
    monkeypatch.setattr(Reporter, "header", lambda self, *a: (time.sleep(delay),
                                                             header(self, *a)))
    got = run(replace(BASE, mode="allreduce", servers=0, steps=3), comm)
    ok, msg = True, ""
    if got.summary:
        s = got.summary
        ok = sum(s["phase_seconds"].values()) <= s["seconds"] + 0.1 * delay
        msg = f"phases {s['phase_seconds']} vs seconds {s['seconds']}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_the_summary_names_a_worker_the_others_wait_for(comm, monkeypatch):
    """The last worker's rows take 30 ms more a step to make (a slow node, a slow disk): the
    summary's ``slowest_worker`` is that worker and rank, and the done line names it (its
    least gap, ``report.SLOW_MIN_S``, set below this run's 0.18 s)."""
    import time

    import pshybrid.report

    monkeypatch.setattr(pshybrid.report, "SLOW_MIN_S", 0.1)

    class Slow(SyntheticCTR):
        def fill(self, *args, **kw):
            if comm.rank == comm.size - 1:
                time.sleep(0.03)
            return super().fill(*args, **kw)

    out = io.StringIO()
    cfg = replace(BASE, mode="allreduce", servers=0, steps=6, prefetch=0)
    # a first run in the process spends 0.2-0.4 s of its first step's own work on one-off
    # costs, on every worker: as much as the delay (and at 2 workers the median is the mean)
    train(replace(cfg, steps=1), comm, dataset=DATA, out=io.StringIO())
    got = train(cfg, comm, dataset=Slow(**{k: getattr(DATA, k) for k in (
        "seed", "n_dense", "cardinalities", "zipf")}), collect=True, out=out)
    ok, msg = True, ""
    if got.summary:
        slow, w = got.summary["slowest_worker"], comm.size - 1
        ok = (slow["worker"], slow["rank"]) == (w, w) and slow["own_seconds"] >= 0.18
        ok &= f"slowest worker {w} (rank {w}): its own work" in out.getvalue()
        msg = f"{slow}: {out.getvalue()}"
    assert_all(comm, ok, msg)
