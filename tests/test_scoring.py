"""``eval`` and ``predict`` of a checkpoint, the resumed run's evaluation, the --metrics
stamps, and ``plot``.

Oracles: ``eval`` == the training-time evaluation of the same checkpoint (at this world
size, and alone on each rank); ``predict``'s logits == WDL's forward pass written out here
in NumPy (docs/models.md) from the checkpoint's one-file export; a resumed run with no step
left evaluates to the same numbers; ``lr`` == --lr x the documented schedule.
"""

import io
import json
import math
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI
from mpi_util import SHARED_MEMORY, assert_all

from pshybrid import limits
from pshybrid.config import TrainConfig
from pshybrid.data import DatasetWriter
from pshybrid.optim import Schedule
from pshybrid.schema import Schema
from pshybrid.scoring import score
from pshybrid.train import train

CFG = TrainConfig(model="wdl", embedding_dim=4, mlp=(8, 6), steps=6, batch_size=16,
                  dtype="float64", lr=0.2, dense_lr=0.05, seed=3, log_every=2, eval_every=3,
                  lr_schedule="cosine", warmup_steps=2, l2=1e-3, shared_memory=SHARED_MEMORY)


def wdl_logits(export_path, dense, sparse):
    """docs/models.md, WDL: wide.dense(dense) + sum_f w_f + over(x0), from the export."""
    with h5py.File(export_path, "r") as f:
        names = json.loads(f.attrs["field_names"])[dense.shape[1]:]  # dense names first
        e = np.concatenate([f[f"embeddings/{n}"][...][sparse[:, i]][:, None, :]
                            for i, n in enumerate(names)], axis=1)
        lin = sum(f[f"linear/{n}"][...][sparse[:, i]] for i, n in enumerate(names))
        d = {k: f[f"dense/{k}"][...] for k in f["dense"]}
    z = dense @ d["wide.dense.weight"] + d["wide.dense.bias"]
    x = np.concatenate([dense, e.reshape(len(dense), -1)], axis=1)
    layers = sorted({k.split(".")[1] for k in d if k.startswith("over.")}, key=int)
    for i, l in enumerate(layers):
        x = x @ d[f"over.{l}.weight"] + d[f"over.{l}.bias"]
        if i < len(layers) - 1:
            x = np.maximum(x, 0)
    return (z + x)[:, 0] + lin


@pytest.fixture
def trained(comm, mpi_tmp_path):
    """Train on a file with --eval-data, checkpointing; (cfg, result, paths)."""
    from pshybrid.synthetic import write_synthetic

    t, v = str(mpi_tmp_path / "t.h5"), str(mpi_tmp_path / "v.h5")
    if comm.rank == 0:
        write_synthetic(t, 1200, valid_fraction=0.25, valid_out=v, seed=4, n_dense=3,
                        cardinalities=(7, 30, 200, 5))
    comm.Barrier()
    cfg = replace(CFG, servers=1, data=t, eval_data=v,
                  checkpoint_dir=str(mpi_tmp_path / "ck"), metrics=str(mpi_tmp_path / "m.jsonl"))
    res = train(cfg, comm, out=io.StringIO())
    return cfg, res, mpi_tmp_path


@pytest.mark.mpi(min_size=2)
def test_eval_equals_training_eval_and_predict_equals_forward(comm, trained):
    from pshybrid.export import export
    from pshybrid.scoring import score

    cfg, res, tmp = trained
    ck, v = cfg.checkpoint_dir, cfg.eval_data
    here = score(ck, v, comm)                       # every rank a worker with a shard
    alone = score(ck + "/step-6", v, MPI.COMM_SELF)  # each rank by itself
    out = str(tmp / "p.h5")
    score(ck, v, comm, out=out)
    again = score(ck, v, comm, out=out, overwrite=True)
    resumed = train(replace(cfg, resume=ck, checkpoint_dir=None, metrics=None), comm,
                    out=io.StringIO())
    collected = train(replace(cfg, resume=ck, checkpoint_dir=None, metrics=None), comm,
                      out=io.StringIO(), collect=True)  # the Python API's path
    ok, msg = True, ""
    if comm.rank == 0:  # worker 0 of every run
        want = res.evals[-1]
        got = [here.evals[-1], alone.evals[-1], resumed.evals[-1], collected.evals[-1]]
        for g in got:
            for k in ("step", "rows"):
                ok &= g[k] == want[k]
            for k in ("auc", "logloss"):
                ok &= math.isclose(g[k], want[k], rel_tol=1e-12)
        export(ck, str(tmp / "x.h5"))
        with h5py.File(v, "r") as f:
            label, dense, sparse = f["label"][...], f["dense"][...], f["sparse"][...]
        with h5py.File(out, "r") as f:
            logit, s = f["logit"][...], f["score"][...]
        ref = wdl_logits(str(tmp / "x.h5"), dense.astype(np.float64), sparse)
        p = float(label.astype(np.float64).mean())  # the base rate, from the file's labels
        for g in [want] + got:
            ok &= math.isclose(g["base_rate_logloss"],
                               -(p * math.log(p) + (1 - p) * math.log(1 - p)), rel_tol=1e-12)
        ok &= logit.shape == label.shape and again.summary == {"rows": len(label), "step": 6}
        ok &= bool(np.allclose(logit, ref, rtol=1e-10, atol=1e-12))
        ok &= bool(np.allclose(s, 1 / (1 + np.exp(-ref)), rtol=1e-12))
        # /score to float64's precision (the tanh form lost digits below 0, all below -37)
        ok &= bool(np.allclose(s, [1 / (1 + math.exp(-z)) for z in logit], rtol=4e-16, atol=0))
        ok &= not np.allclose(ref, ref.mean())  # the rows score differently
        msg = f"eval {got} vs training {want}; logits {logit[:3]} vs forward {ref[:3]}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_predict_holds_no_array_of_every_rows_logits(comm, mpi_tmp_path, monkeypatch):
    """predict gathered every row's logit and label to worker 0 and made every row's score
    beside them (24 B a row on one rank: a scoring file of billions of rows did not fit).
    Oracles: tracemalloc's peak on worker 0 over predict of 1M rows (NumPy's allocations
    included) is under 16 B a row (its own rows' logits and labels, then its logits and
    one other worker's: 16 B a row over the workers; 64 B before, with sigmoid's
    temporaries); the file == one process's, bit for bit. A write failing on worker 0 (its
    first rows) is one error on every worker and no file, the others' logits (4 MB each,
    past MPI's eager sends) still taken: no worker is left in its send."""
    import tracemalloc

    from pshybrid.scoring import score
    from pshybrid.synthetic import write_synthetic

    n = 1_000_000
    t, v = str(mpi_tmp_path / "tp.h5"), str(mpi_tmp_path / "vp.h5")
    if comm.rank == 0:
        write_synthetic(t, 600, seed=4, n_dense=3, cardinalities=(7, 30, 200, 5))
        write_synthetic(v, n, seed=5, n_dense=3, cardinalities=(7, 30, 200, 5))
    comm.Barrier()
    ck = str(mpi_tmp_path / "ckp")
    train(replace(CFG, servers=1, data=t, eval_every=0, checkpoint_dir=ck), comm,
          out=io.StringIO())
    outs = [str(mpi_tmp_path / f"pp{k}.h5") for k in ("all", "one")]
    if comm.rank == 0:
        tracemalloc.start()
    score(ck, v, comm, out=outs[0])
    ok, msg = True, ""
    if comm.rank == 0:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        score(ck, v, MPI.COMM_SELF, out=outs[1])  # one process
        with h5py.File(outs[0], "r") as a, h5py.File(outs[1], "r") as b:
            same = all(np.array_equal(a[k][...], b[k][...]) for k in ("logit", "score"))
            ok = same and a["logit"].shape == (n,) and peak < 16 * n
            msg = f"worker 0's peak {peak / n:.1f} B a row; the file == one process's: {same}"
    assert_all(comm, ok, msg)

    # eval of the same file: worker 0 holds what the memory check counts for its rows (it
    # held 73 B a row: 57 of them the AUC's argsort, sorted copy, ranks and masks), and
    # the AUC is the rank-sum formula's, to the bit, over predict's logits
    est = limits.estimate(replace(CFG, servers=1), Schema(3, (7, 30, 200, 5)), comm.size - 1,
                          1, eval_rows=n)
    counted = sum(p.nbytes for r in ("worker", "first") for p in est[r]
                  if p.what.startswith("evaluation"))  # (worker 0's)
    if comm.rank == 0:
        tracemalloc.start()
    got = score(ck, v, comm).evals
    if comm.rank == 0:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        with h5py.File(outs[0], "r") as a, h5py.File(v, "r") as f:
            z, y = a["logit"][...], f["label"][...] > 0.5
        s = np.sort(z)  # average ranks of tied groups, then the positives' rank sum
        lo, hi = s.searchsorted(z[y], "left"), s.searchsorted(z[y], "right")
        P, N = int(y.sum()), int((~y).sum())
        want = (float((lo + hi + 1).sum()) / 2 - P * (P + 1) / 2) / (P * N)
        ok = got[0]["auc"] == want and peak < counted + 4 * 2**20
        msg = f"eval: worker 0's peak {peak / n:.1f} B a row, counted {counted / n:.1f}; " \
              f"auc {got[0]['auc']!r} vs the rank sum's {want!r}"
    assert_all(comm, ok, msg)

    def full(z):
        raise OSError(28, "No space left on device")

    from pshybrid import scoring
    from pshybrid.errors import PshybridError
    monkeypatch.setattr(scoring, "sigmoid", full)
    failed = str(mpi_tmp_path / "full.h5")
    with pytest.raises(PshybridError) as e:
        score(ck, v, comm, out=failed)
    comm.Barrier()
    assert_all(comm, f"{failed}: cannot write: [Errno 28] No space left" in str(e.value)
               and not any(f.startswith(("full.h5", ".full.h5"))
                           for f in os.listdir(mpi_tmp_path)), str(e.value))


def test_predict_refuses_a_file_that_cannot_fit_before_scoring(tmp_path, monkeypatch):
    """predict found a full disk or a file size limit only when it wrote, after scoring
    every row (hours on a large file), and then as h5py's RuntimeError: a traceback and
    MPI_Abort. Oracles: under a file size limit below the file's 16 B a row, the refusal
    names OUT and the limit, and no row was scored (the scoring function never called);
    with that check skipped, the write's own failure is one error naming OUT; no file."""
    import resource

    from pshybrid import scoring
    from pshybrid.errors import InputError, PshybridError
    from pshybrid.synthetic import write_synthetic

    t, v, out = (str(tmp_path / f) for f in ("t.h5", "v.h5", "p.h5"))
    write_synthetic(t, 600, seed=4, n_dense=3, cardinalities=(7, 30, 200, 5))
    write_synthetic(v, 200_000, seed=5, n_dense=3, cardinalities=(7, 30, 200, 5))
    ck = str(tmp_path / "ck")
    train(replace(CFG, placement="colocated", data=t, eval_every=0, checkpoint_dir=ck),
          MPI.COMM_SELF, out=io.StringIO())
    scored, real = [], scoring.worker_logits
    monkeypatch.setattr(scoring, "worker_logits", lambda *a: scored.append(1) or real(*a))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, hard))  # 1 MiB; the file needs 3.2 MB
    try:
        with pytest.raises(InputError, match=re.escape(f"{out}: cannot be written: a file of "
                                                       "about 4.1 MiB exceeds the file size "
                                                       "limit (ulimit -f) of 1.0 MiB")):
            score(ck, v, MPI.COMM_SELF, out=out)
        assert not scored
        monkeypatch.setattr(scoring.safeio, "room_problem", lambda *a: None)
        with pytest.raises(PshybridError, match=re.escape(f"{out}: cannot write: ")):
            score(ck, v, MPI.COMM_SELF, out=out)
        assert scored
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert not [f for f in os.listdir(tmp_path) if f.startswith(("p.h5", ".p.h5"))]


def test_one_worker_evaluates_within_what_the_memory_check_counts(tmp_path):
    """Alone, a worker gathered its own logits and labels into a copy of them (32 B a row
    before the AUC's 10, the check counting 26). Oracle: tracemalloc's peak over eval of
    1M rows on one rank is within the estimate's part (+ 1 MiB; 32.2 B a row before)."""
    import tracemalloc

    from pshybrid.synthetic import write_synthetic

    n, t, v = 1_000_000, str(tmp_path / "t.h5"), str(tmp_path / "v.h5")
    write_synthetic(t, 600, seed=4, n_dense=3, cardinalities=(7, 30, 200, 5))
    write_synthetic(v, n, seed=5, n_dense=3, cardinalities=(7, 30, 200, 5))
    ck = str(tmp_path / "ck")
    train(replace(CFG, placement="colocated", data=t, eval_every=0, checkpoint_dir=ck),
          MPI.COMM_SELF, out=io.StringIO())
    est = limits.estimate(CFG, Schema(3, (7, 30, 200, 5)), 1, 1, eval_rows=n)
    counted = sum(p.nbytes for r in ("worker", "first") for p in est[r]
                  if p.what.startswith("evaluation"))  # (worker 0's)
    tracemalloc.start()
    try:
        got = score(ck, v, MPI.COMM_SELF).evals
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got[0]["rows"] == n and peak < counted + 2**20, (peak / n, counted / n)


@pytest.mark.mpi(min_size=2)
def test_a_rows_logit_does_not_depend_on_the_worker_count(comm, mpi_tmp_path, monkeypatch):
    """Rows are scored in batches from row 0, each worker taking whole batches: a row is
    scored in the same batch on any number of workers, so its float32 logit is one
    process's to the bit (it differed in the last bits: a matrix product rounds by its
    rows, and worker ranges [n*w/W, n*(w+1)/W) cut the batches elsewhere)."""
    from pshybrid import steplog
    from pshybrid.scoring import score
    from pshybrid.synthetic import write_synthetic

    monkeypatch.setattr(steplog, "EVAL_BATCH", 48)
    t, v = str(mpi_tmp_path / "t32.h5"), str(mpi_tmp_path / "v32.h5")
    if comm.rank == 0:
        write_synthetic(t, 900, valid_fraction=1 / 3, valid_out=v, seed=4, n_dense=3,
                        cardinalities=(7, 30, 200, 5))
    comm.Barrier()
    ck = str(mpi_tmp_path / "ck32")
    train(replace(CFG, dtype="float32", mlp=(64, 32), servers=1, data=t, eval_every=0,
                  checkpoint_dir=ck), comm, out=io.StringIO())
    outs = [str(mpi_tmp_path / f"p{k}.h5") for k in ("all", comm.rank)]
    score(ck, v, comm, out=outs[0])
    score(ck, v, MPI.COMM_SELF, out=outs[1])  # one process
    comm.Barrier()
    got = []
    for p in outs:
        with h5py.File(p, "r") as f:
            got.append(f["logit"][...])
    assert_all(comm, got[0].size == 300 and np.array_equal(got[0], got[1]),
               f"max difference {np.abs(got[0] - got[1]).max()}")


@pytest.mark.mpi(min_size=2)
def test_eval_and_predict_take_a_list_or_a_directory_as_eval_data_does(comm, trained):
    """DATA as two files (a comma list, or their directory) scores the rows of their
    concatenation: the same AUC, logloss and per-row logits, in row order, as one file
    holding those rows."""
    from pshybrid.scoring import score

    cfg, _, tmp = trained
    ck, v = cfg.checkpoint_dir, cfg.eval_data
    d = tmp / "parts"
    if comm.rank == 0:
        d.mkdir()
        with h5py.File(v, "r") as f:
            rows = [f[k][...] for k in ("label", "dense", "sparse")]
            cards = f.attrs["cardinalities"]
        for name, (a, b) in (("a.h5", (0, 130)), ("b.h5", (130, len(rows[0])))):
            w = DatasetWriter(str(d / name), [f"I{i + 1}" for i in range(3)],
                              [f"C{i + 1}" for i in range(4)])
            w.append(*(x[a:b] for x in rows))
            w.close(cards)
    comm.Barrier()
    whole = score(ck, v, comm)
    score(ck, v, comm, out=str(tmp / "w.h5"))
    ok, msg = True, ""
    for i, spec in enumerate((f"{d}/a.h5,{d}/b.h5", str(d))):
        got = score(ck, spec, comm)
        score(ck, spec, comm, out=str(tmp / f"p{i}.h5"))
        if comm.rank == 0:
            ok &= all(math.isclose(got.evals[-1][k], whole.evals[-1][k], rel_tol=1e-12)
                      for k in ("auc", "logloss")) and got.evals[-1]["rows"] == 300
            with h5py.File(tmp / f"p{i}.h5") as f, h5py.File(tmp / "w.h5") as g:
                ok &= bool(np.array_equal(f["logit"][...], g["logit"][...]))
                ok &= f.attrs["data"] == f"{d}/a.h5,{d}/b.h5"  # each path absolute
            msg = f"{spec}: {got.evals} vs {whole.evals}"
    from pshybrid.errors import PshybridError
    try:  # a prediction written into DATA's directory would be read as its rows next time
        score(ck, str(d), comm, out=str(d / "p.h5"))
        ok, msg = False, "a prediction into DATA's directory was written"
    except PshybridError as e:  # (rank 0's verdict, on every rank)
        ok &= f"{d}/p.h5: lies in DATA's directory {d}" in str(e)
        ok &= sorted(os.listdir(d)) == ["a.h5", "b.h5"]
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_predict_scores_an_unlabeled_file_as_its_labeled_twin_and_eval_refuses_it(comm,
                                                                                  trained):
    """A file marked unlabeled (``prep --unlabeled``; here eval data's copy, marked): the
    same logits from ``predict``; ``eval`` refuses it naming the file, on every rank, as it
    does an attribute that is not 0 or 1."""
    import shutil

    from pshybrid.errors import InputError
    from pshybrid.scoring import score

    cfg, _, tmp = trained
    ck, v = cfg.checkpoint_dir, cfg.eval_data
    if comm.rank == 0:
        for name, value in (("u.h5", 1), ("odd.h5", "yes")):
            shutil.copy(v, tmp / name)
            with h5py.File(tmp / name, "r+") as f:
                f.attrs["unlabeled"] = value
    comm.Barrier()
    score(ck, v, comm, out=str(tmp / "pl.h5"))
    score(ck, str(tmp / "u.h5"), comm, out=str(tmp / "pu.h5"))
    ok, msg = True, ""
    if comm.rank == 0:
        with h5py.File(tmp / "pl.h5") as f, h5py.File(tmp / "pu.h5") as g:
            ok &= bool(np.array_equal(f["logit"][...], g["logit"][...]))
    for name, says in (("u.h5", "its rows have no labels"), ("odd.h5", "unlabeled is 'yes'")):
        try:
            score(ck, str(tmp / name), comm)
            ok, msg = False, f"eval scored {name}"
        except InputError as e:
            ok &= f"{tmp / name}: " in str(e) and says in str(e)  # (others: "rank 0: ...")
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_metrics_lines_carry_time_epoch_and_lr(comm, trained):
    cfg = trained[0]
    ok, msg = True, ""
    if comm.rank == 0:
        recs = [json.loads(ln) for ln in Path(cfg.metrics).read_text().splitlines()][1:]
        W = comm.size - 1
        per_epoch = 900 // (W * cfg.batch_size)
        sched = Schedule("cosine", 2, 6)
        times = [r["time"] for r in recs]
        for r in recs:
            s = r["steps"] if r.get("summary") else r["step"]
            ok &= r["lr"] == cfg.lr * sched.factor(s) and r["epoch"] == s / per_epoch
        ok &= times == sorted(times) and abs(times[-1] - time.time()) < 600
        ok &= [r["step"] for r in recs if "loss" in r] == [2, 4, 6]
        ok &= [r["step"] for r in recs if r.get("eval")] == [3, 6]
        msg = f"{recs}"
    assert_all(comm, ok, msg)


def test_plot_draws_the_curves(tmp_path):
    pytest.importorskip("matplotlib")
    from pshybrid.plot import plot

    m = tmp_path / "m.jsonl"
    m.write_text("".join(json.dumps(r) + "\n" for r in [
        {"config": {"model": "wdl"}, "pshybrid": "0.1.0", "command": "train", "start_step": 0},
        {"step": 1, "loss": 0.7, "samples_per_s": 100.0},
        {"step": 2, "loss": 0.6, "samples_per_s": 120.0},
        {"eval": True, "step": 2, "auc": 0.7, "logloss": 0.5, "rows": 10},
        {"summary": True}]))
    assert plot(str(m), str(tmp_path / "o.png")) == (2, 1)
    assert (tmp_path / "o.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(os.listdir(tmp_path)) == {"m.jsonl", "o.png"}  # no temporary left


def test_plot_reads_what_killed_resumed_and_eval_only_runs_leave(tmp_path):
    """A killed job's cut line (the last line, or one a resumed run's config record follows)
    is skipped; a null AUC (a one-class file) keeps its logloss; an ``eval --metrics`` file
    (no step records) draws its evaluations, one-class ones alone too; a resume from an
    earlier step (``start_step`` 1 after steps 1-3 were logged: a kill -9 after the
    checkpoint at 1) replaces the records after it of the runs that saved into the resumed
    directory (``ck/step-1`` or ``ck``), not another run's in the same file. A bad line
    anywhere else is still an error naming it."""
    pytest.importorskip("matplotlib")
    from pshybrid.errors import InputError
    from pshybrid.plot import read_metrics

    config = json.dumps({"config": {}, "command": "train", "start_step": 0})
    step = [json.dumps({"step": s, "loss": 0.5, "samples_per_s": 9.0}) for s in (1, 2, 3)]
    ev = json.dumps({"eval": True, "step": 3, "auc": 0.7, "logloss": 0.5, "rows": 4})
    null = json.dumps({"eval": True, "step": 2, "auc": None, "logloss": 0.6, "rows": 4})
    def run(start, ck, resume=None, command="train"):
        return json.dumps({"config": {"checkpoint_dir": ck, "resume": resume},
                           "command": command, "start_step": start})

    ran, other = run(0, "ck"), run(0, "other")
    again, again_dir = run(1, "ck2", "./ck/step-1"), run(1, "ck", "ck")
    redo = json.dumps({"step": 2, "loss": 0.25, "samples_per_s": 9.0})
    evcfg = run(1, None, "ck/step-1", "eval")
    cases = {"resumed": [config, step[0], '{"step": 2, "lo', config, step[1], step[2], ev],
             "killed": [config, step[0], step[1], null, '{"step": 3, "loss": 0.'],
             "eval_only": [json.dumps({"config": {}, "command": "eval"}), ev, null],
             "one_class": [json.dumps({"config": {}, "command": "eval"}), null],
             "earlier": [ran, *step, ev, again, redo, evcfg],
             "by_dir": [ran, *step, again_dir, redo],
             "two_runs": [ran, *step, other, *step, again, redo],
             "no_config": [*step, again, redo]}
    want = {"resumed": ([1, 2, 3], [3]), "killed": ([1, 2], [2]), "eval_only": ([], [3, 2]),
            "one_class": ([], [2]), "earlier": ([1, 2], []), "by_dir": ([1, 2], []),
            "two_runs": ([1, 1, 2, 3, 2], []), "no_config": ([1, 2, 3, 2], [])}
    for name, lines in cases.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        steps, evals = read_metrics(str(tmp_path / name))
        assert ([r["step"] for r in steps], [r["step"] for r in evals]) == want[name], name
    assert read_metrics(str(tmp_path / "earlier"))[0][1]["loss"] == 0.25  # the resumed run's
    for bad in ([config, '{"step": 2, "lo', step[1]], ['{"step": 2, "lo', config, step[1]]):
        (tmp_path / "bad").write_text("\n".join(bad) + "\n")
        with pytest.raises(InputError, match=r"bad:\d: not a JSON object"):
            read_metrics(str(tmp_path / "bad"))


def test_plot_without_an_extension_writes_a_png_and_says_so(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from pshybrid.cli import main

    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"step": 1, "loss": 0.7, "samples_per_s": 1.0}) + "\n")
    assert main(["plot", str(m), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"{tmp_path}/out (no extension: PNG)")
    assert (tmp_path / "out").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_overlays_several_runs_one_line_each(tmp_path):
    """``plot A B OUT``: every panel holds each run's own records as one line, labelled by
    file name (by path where two share a name); a bad file among them draws nothing."""
    pytest.importorskip("matplotlib")
    from pshybrid.errors import InputError
    from pshybrid.plot import figure, labels, plot, read_metrics

    runs = {"a/m.jsonl": [(1, 0.7, 100.0), (3, 0.5, 110.0)],
            "b/m.jsonl": [(2, 0.9, 90.0), (4, 0.8, 95.0), (6, 0.6, 99.0)]}
    paths = []
    for rel, recs in runs.items():
        (tmp_path / rel).parent.mkdir()
        (tmp_path / rel).write_text("".join(
            json.dumps({"step": s, "loss": lo, "samples_per_s": r}) + "\n" for s, lo, r in recs)
            + json.dumps({"eval": True, "step": recs[-1][0], "auc": 0.6, "logloss": 0.5,
                          "rows": 4}) + "\n")
        paths.append(str(tmp_path / rel))
    assert labels(paths) == paths and labels(["x/a.jsonl", "y/b.jsonl"]) == ["a.jsonl", "b.jsonl"]
    fig = figure(paths, [read_metrics(p) for p in paths])
    loss, speed, ev = fig.axes[:3]
    for i, recs in enumerate(runs.values()):
        assert loss.lines[i].get_xydata().tolist() == [[s, lo] for s, lo, _ in recs]
        assert speed.lines[i].get_xydata().tolist() == [[s, r] for s, _, r in recs]
        assert ev.lines[i].get_xydata().tolist() == [[recs[-1][0], 0.6]]
        assert loss.lines[i].get_label() == paths[i]
    assert plot(paths, str(tmp_path / "o.png")) == (5, 2)
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(InputError, match="bad.jsonl:1"):
        plot([paths[0], str(tmp_path / "bad.jsonl")], str(tmp_path / "p.png"))
    assert not (tmp_path / "p.png").exists()


def test_plot_without_matplotlib_is_one_clear_error(tmp_path, monkeypatch):
    import sys

    from pshybrid.errors import ConfigError
    from pshybrid.plot import NEEDS, plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    m = tmp_path / "m.jsonl"
    m.write_text('{"step": 1, "loss": 0.7, "samples_per_s": 100.0}\n')
    with pytest.raises(ConfigError) as e:
        plot(str(m), str(tmp_path / "o.png"))
    assert str(e.value) == NEEDS and not (tmp_path / "o.png").exists()


def test_plot_replaces_only_an_image_and_only_with_overwrite(tmp_path):
    """Checked before matplotlib is needed: an existing OUT is refused without --overwrite,
    and with it unless it is an image; the run file itself is never OUT."""
    from pshybrid.errors import InputError
    from pshybrid.plot import plot

    m = tmp_path / "m.jsonl"
    m.write_text('{"step": 1, "loss": 0.7, "samples_per_s": 100.0}\n')
    (tmp_path / "old.png").write_bytes(b"\x89PNG\r\n\x1a\n...")
    (tmp_path / "data.h5").write_bytes(b"\x89HDF\r\n\x1a\n...")
    for out, overwrite, why in (("old.png", False, "pass --overwrite"),
                                ("data.h5", True, "is not an image"),
                                ("m.jsonl", True, "same file as RUN")):
        with pytest.raises(InputError, match=why):
            plot(str(m), str(tmp_path / out), overwrite)
    assert (tmp_path / "data.h5").read_bytes().startswith(b"\x89HDF")


@pytest.mark.parametrize("fmt", ["png", "pdf", "svg", "eps", "jpg", "gif", "tif", "webp",
                                 "svgz", "raw", "rgba"])
def test_plot_writes_only_formats_it_can_replace_again(tmp_path, fmt):
    """Every format plot writes it knows again by its first bytes, so --overwrite replaces
    plot's own output (a GIF was written, then refused as 'not an image'); matplotlib's
    formats it could not know again are refused before anything is written."""
    pytest.importorskip("matplotlib")
    from pshybrid.errors import InputError
    from pshybrid.plot import FORMATS, plot

    m, out = tmp_path / "m.jsonl", str(tmp_path / f"o.{fmt}")
    m.write_text('{"step": 1, "loss": 0.7, "samples_per_s": 100.0}\n')
    if fmt not in FORMATS:
        with pytest.raises(InputError, match=f"unknown image format '{fmt}'"):
            plot(str(m), out)
        assert not os.path.exists(out)
        return
    plot(str(m), out)
    first = os.stat(out).st_mtime_ns
    time.sleep(0.01)
    plot(str(m), out, overwrite=True)
    assert os.stat(out).st_mtime_ns != first
