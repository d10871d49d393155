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
    got = run(cfg, comm)
    ok, msg = True, ""
    if got.role == "worker":
        ref = run(replace(cfg, mode="allreduce", servers=0, batch_size=W * cfg.batch_size),
                  MPI.COMM_SELF)
        init = run(replace(cfg, mode="allreduce", servers=0, steps=0), MPI.COMM_SELF)
        wrong = run(replace(cfg, mode="allreduce", servers=0), MPI.COMM_SELF)  # batch b only
        errs = {"dense": rel_err(got.dense, ref.dense), "table": rel_err(got.table, ref.table)}
        moved = {"dense": rel_err(init.dense, ref.dense), "table": rel_err(init.table, ref.table)}
        if max(errs.values()) > 1e-9:
            ok, msg = False, f"W={W} S={S}: relative error {errs} > 1e-9"
        elif min(moved.values()) < 1e-4:
            ok, msg = False, f"training barely moved the parameters: {moved}"
        elif W > 1 and rel_err(wrong.table, ref.table) < 1e-4:
            ok, msg = False, "oracle cannot tell batch b from batch W*b"
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


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("placement,sparse_opt", [("dedicated", "sgd"), ("dedicated", "adagrad"),
                                                  ("dedicated", "adam"), ("colocated", "adam")])
def test_replicated_hot_rows_equal_none(comm, placement, sparse_opt):
    """--replicate-rows N (the N hottest rows on every worker, summed by an Allreduce) gives
    the per-step losses and final parameters of N = 0, to float64 rounding."""
    cfg = replace(BASE, mode="hybrid", sparse_optimizer=sparse_opt, log_every=1, steps=4,
                  placement=placement, servers=None if placement == "colocated" else 1)
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
