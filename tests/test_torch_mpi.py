"""pshybrid.torch under the MPI test runs (2, 3 and 5 ranks; float64), in process: server
ranks return from ``pt.init(..., exit_servers=False)``.

- W workers x batch b == 1 worker x batch W*b (the single process in ``allreduce`` mode on
  COMM_SELF): per-step losses and final dense and table parameters to 1e-9, for the sgd,
  adagrad and adam sparse optimizers, with every dense layer's Allreduce its own bucket, and
  on a file with multi-hot fields (``pt.batches``' bags into ``pt.EmbeddingBag``);
- checkpoint at step 2 -> resume -> step 5 == the uninterrupted run, bit for bit (dense
  Adam, AdamW, Adagrad, and RMSprop with momentum: its state under /torch_state);
- every ``pt.batches`` call is a whole pass: worker w gets its slice of each global batch;
- StepLR on ``pt.DistributedOptimizer`` == plain PyTorch with the global batch, to 1e-9.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import shutil
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mpi4py import MPI
from mpi_util import assert_all
from test_train_mpi import write_multi_hot

from pshybrid.synthetic import write_synthetic
from pshybrid.torch.session import session

_spec = importlib.util.spec_from_file_location(
    "torch_wdl", pathlib.Path(__file__).parent / "jobs" / "torch_wdl.py")
wdl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wdl)


@pytest.fixture
def workdir(comm):
    """A fresh directory every rank sees, with a small dataset."""
    path = None
    if comm.rank == 0:
        path = tempfile.mkdtemp(prefix="pshybrid-torch-")
        write_synthetic(os.path.join(path, "d.h5"), 400, seed=5, n_dense=3,
                        cardinalities=(7, 30, 200, 5), zipf=1.3)
        write_multi_hot(os.path.join(path, "mh.h5"), 200, seed=4)
    path = comm.bcast(path, root=0)  # Wire: the directory's name from rank 0
    yield pathlib.Path(path)
    comm.Barrier()  # Wire: everyone is done with it
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def args(workdir, *extra, data="d.h5") -> argparse.Namespace:
    return wdl.parser().parse_args(["--data", str(workdir / data), *extra])


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sparse_opt,data,placement", [
    ("sgd", "d.h5", "dedicated"), ("adagrad", "d.h5", "dedicated"),
    ("adam", "d.h5", "dedicated"), ("adagrad", "mh.h5", "dedicated"),
    ("sgd", "d.h5", "colocated"), ("adam", "d.h5", "colocated"),
    ("adagrad", "mh.h5", "colocated")])
def test_workers_equal_one_process_with_the_global_batch(comm, workdir, sparse_opt, data,
                                                         placement):
    """(mh.h5: 2 of its 4 fields multi-hot, ``pt.batches``' bags into ``pt.EmbeddingBag``;
    colocated: every rank a worker holding a shard, no server rank.)"""
    S = 0 if placement == "colocated" else 1 if comm.size <= 3 else 2
    W, b = comm.size - S, 4
    a = args(workdir, "--sparse-opt", sparse_opt, "--servers", str(S), "--batch", str(b),
             "--pooling", "mean", "--placement", placement, data=data)
    got = wdl.run(a, comm, exit_servers=False)
    losses = [r for r in comm.allgather(None if got is None else got["losses"]) if r is not None]
    ok, msg = True, ""
    if got is not None:
        ref = wdl.run(args(workdir, "--sparse-opt", sparse_opt, "--mode", "allreduce",
                           "--servers", "0", "--batch", str(W * b), "--pooling", "mean",
                           data=data), MPI.COMM_SELF, exit_servers=False)
        errs = {"loss": rel_err(np.mean(losses, axis=0), ref["losses"]),
                **{k: rel_err(got[k], ref[k]) for k in ("flat", "table")}}
        moved = {k: rel_err(ref[k + "0"], ref[k]) for k in ("flat", "table")}
        if max(errs.values()) > 1e-9:
            ok, msg = False, f"W={W} S={S}: relative error {errs} > 1e-9"
        elif min(moved.values()) < 1e-3:
            ok, msg = False, f"training barely moved the parameters: {moved}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("dense_opt", ["adam", "adamw", "adagrad", "rmsprop"])
def test_checkpoint_then_resume_equals_the_uninterrupted_run(comm, workdir, dense_opt):
    """(the native slots' dense optimizers but plain SGD, and one whose state is kept
    beside them: every worker's is the same, worker 0 writes it)"""
    ck = workdir / f"ck-{dense_opt}"
    common = ("--batch", "4", "--steps", "5", "--sparse-opt", "adam", "--dense-opt", dense_opt)
    full = wdl.run(args(workdir, *common, "--checkpoint", str(ck), "--checkpoint-at", "2"),
                   comm, exit_servers=False)
    res = wdl.run(args(workdir, *common, "--resume", str(ck)), comm, exit_servers=False)
    ok, msg = True, ""
    if full is not None:
        if (ck / "latest").read_text().strip() != "step-2":
            ok, msg = False, "latest does not name step-2"
        elif not np.array_equal(res["losses"], full["losses"][2:]):
            ok, msg = False, f"losses {res['losses']} vs {full['losses'][2:]}"
        else:
            bad = [k for k in ("flat", "table") if not np.array_equal(res[k], full[k])]
            ok, msg = not bad, f"{bad} differ after the resume"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("first", ["dedicated", "colocated"])
def test_a_checkpoint_resumes_in_the_other_placement(comm, workdir, first):
    """W workers either way: dedicated on every rank (S servers), colocated on W ranks.
    Checkpoint at step 2 in one placement, resume in the other to step 5 == the
    uninterrupted run (per-worker losses, dense parameters, table) to 1e-9."""
    S = 1 if comm.size <= 3 else 2
    W = comm.size - S
    sub = comm.Split(0 if comm.rank < W else MPI.UNDEFINED)  # Wire: the colocated ranks
    ck = workdir / f"ck-{first}"
    common = ("--batch", "4", "--steps", "5", "--sparse-opt", "adam", "--servers", str(S))

    def run(placement, *extra):
        on = comm if placement == "dedicated" else sub
        if on == MPI.COMM_NULL:
            return None
        return wdl.run(args(workdir, *common, "--placement", placement, *extra), on,
                       exit_servers=False)

    second = "colocated" if first == "dedicated" else "dedicated"
    full = run(first, "--checkpoint", str(ck), "--checkpoint-at", "2")
    comm.Barrier()  # Wire: the checkpoint is complete before any rank resumes from it
    res = run(second, "--resume", str(ck))
    if sub != MPI.COMM_NULL:
        sub.Free()
    fulls = {r["worker"]: r for r in comm.allgather(full) if r is not None}
    ok, msg = True, ""
    if res is not None:
        ref = fulls[res["worker"]]
        errs = {"loss": rel_err(res["losses"], ref["losses"][2:]),
                **{k: rel_err(res[k], ref[k]) for k in ("flat", "table")}}
        ok, msg = max(errs.values()) <= 1e-9, f"{first} -> {second}: {errs}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_a_model_that_differs_between_workers_is_one_error_on_every_worker(comm):
    """Worker 1's first layer is one unit wider: ``DistributedOptimizer`` names the first
    parameter that differs on every worker (the Bcast of the parameters used to fail with
    an MPI size mismatch on some ranks); the job then shuts down cleanly."""
    import pshybrid.torch as pt
    from pshybrid.errors import ConfigError

    if pt.init(servers=0, mode="allreduce", comm=comm, exit_servers=False,
               tables=[pt.Table("ids", rows=10, dim=2)]):
        w = pt.worker_index()
        f32 = dict(dtype=torch.float32)
        model = torch.nn.Sequential(torch.nn.Linear(2, 3 + (w == 1), **f32),
                                    torch.nn.Linear(3, 1, **f32))
        msg = ""
        try:
            pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        except ConfigError as e:
            msg = str(e)
        want = ("DistributedOptimizer: the model differs between workers: parameter '0.weight' "
                "is (3, 2) torch.float32 on worker 0, worker 1 has '0.weight' (4, 2) "
                "torch.float32; build the same model on every worker")
        pt.shutdown()
        assert_all(comm, msg == want, msg)


@pytest.mark.mpi(min_size=2)
def test_every_call_of_batches_is_a_whole_pass_on_every_worker(comm, workdir):
    """``allreduce`` mode, every rank a worker (W = size), batch 4: three passes with a
    training step per batch, then a validation pass; each gives every step, worker w's batch
    t is rows [t*G + 4w, t*G + 4w + 4) of the file (G = 4W), as h5py reads them."""
    import h5py

    import pshybrid.torch as pt

    torch.set_default_dtype(torch.float64)
    path, b = workdir / "d.h5", 4
    pt.init(servers=0, mode="allreduce", seed=3, comm=comm,
            tables=[pt.Table("t", rows=10, dim=2, optimizer="sgd", dtype=torch.float64)])
    W, w = pt.num_workers(), pt.worker_index()
    G = W * b
    with h5py.File(path) as f:
        want = [f["sparse"][t * G + w * b:t * G + (w + 1) * b] for t in range(400 // G)]
    model = torch.nn.Linear(3, 1)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    passes = []
    for train in (True, True, True, False):
        got = []
        for batch in pt.batches(path, b):
            got.append(batch.sparse.numpy())
            if train:
                loss = model(batch.dense).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        passes.append(got)
    pt.shutdown()
    bad = [i for i, got in enumerate(passes) if len(got) != len(want)
           or not all(np.array_equal(g, x) for g, x in zip(got, want))]
    assert_all(comm, not bad, f"passes {bad} differ from the file's rows "
               f"({[len(p) for p in passes]} steps, {len(want)} expected)")


@pytest.mark.mpi(min_size=2)
def test_an_evaluation_pass_without_drop_last_reads_every_row_once(comm, workdir):
    """``drop_last=False``, 103 rows (not a multiple of any global batch here): the
    workers' batches, in order (batch t: worker 0's rows, worker 1's, ...), are the file's
    rows 0..102, once each; past the file's end a worker's last batch is empty, and the
    model scores it."""
    import h5py

    import pshybrid.torch as pt

    path = workdir / "odd.h5"
    if comm.rank == 0:
        write_synthetic(str(path), 103, seed=6, n_dense=3, cardinalities=(7, 30))
    comm.Barrier()  # Wire: the file is written
    pt.init(servers=0, mode="allreduce", seed=3, comm=comm,
            tables=[pt.Table("t", rows=10, dim=2, dtype=torch.float64)])
    model = torch.nn.Linear(3, 1).double()
    got = []
    with torch.no_grad():
        for batch in pt.batches(path, 4, drop_last=False):
            model(batch.dense.double())
            got.append(batch.sparse.numpy())
    pt.shutdown()
    # Wire: every rank's batches to all
    every = comm.allgather(got)
    order = np.concatenate([b for t in range(len(got)) for b in (w[t] for w in every)])
    with h5py.File(path) as f:
        want = f["sparse"][...]
    steps = {len(w) for w in every}
    ok = len(steps) == 1 and np.array_equal(order, want)
    assert_all(comm, ok, f"{steps} steps; {len(order)} rows read, the file's 103 "
               f"{'in order' if ok else 'not in order'}")


@pytest.mark.mpi(min_size=2)
def test_a_plain_pytorch_model_starts_a_hybrid_run_through_load_rows(comm, workdir):
    """The fine-tune path: a plain PyTorch model (``nn.Embedding`` + Linear) taken over by
    one process in an ``allreduce`` session (``pt.load_rows``, the Linear's state_dict),
    ``pt.checkpoint``; 1 server + W workers resume it in ``hybrid`` mode and train 5 steps
    == the plain model trained on the global batch in one process, to 1e-9 (``load_rows``
    there: refused, naming this path)."""
    import torch_steplr as m

    import pshybrid.torch as pt
    from pshybrid.errors import ConfigError

    torch.set_default_dtype(torch.float64)
    torch.manual_seed(5)
    ref, ck = m.Model(torch.nn.Embedding(m.ROWS, m.D)), workdir / "imported"
    tables = [pt.Table("t", rows=m.ROWS, dim=m.D, optimizer="adagrad", lr=m.LR_EMB,
                       dtype=torch.float64)]
    if comm.rank == 0:
        pt.init(servers=0, mode="allreduce", seed=4, comm=MPI.COMM_SELF, tables=tables)
        model = m.Model(pt.Embedding("t"))
        model.lin.load_state_dict(ref.lin.state_dict())
        pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=m.LR_DENSE), model)
        pt.load_rows("t", ref.emb.weight)
        pt.checkpoint(ck)
        pt.shutdown()
    comm.Barrier()  # Wire: the checkpoint is written
    ok, msg = True, ""
    if pt.init(servers=1, mode="hybrid", seed=4, comm=comm, exit_servers=False,
               tables=tables, resume=str(ck)):
        model = m.Model(pt.Embedding("t"))  # (its own weights: the checkpoint's replace them)
        opt = pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=m.LR_DENSE),
                                      model)
        with pytest.raises(ConfigError, match="in mode 'hybrid' the rows live on the servers"):
            pt.load_rows("t", ref.emb.weight)
        W, w = pt.num_workers(), pt.worker_index()
        gb = m.global_batches(W * m.B)
        m.train(model, [opt], [], [tuple(x[w * m.B:(w + 1) * m.B] for x in b) for b in gb])
        got = [session().mode.full_table(), *(p.detach().numpy() for p in model.lin.parameters())]
        pt.shutdown()
        start = ref.emb.weight.detach().numpy().copy()
        m.train(ref, [torch.optim.Adam(ref.lin.parameters(), lr=m.LR_DENSE),
                      torch.optim.Adagrad(ref.emb.parameters(), lr=m.LR_EMB, eps=1e-8)], [], gb)
        want = [ref.emb.weight.detach().numpy(), *(p.detach().numpy()
                                                   for p in ref.lin.parameters())]
        errs = [rel_err(a, b) for a, b in zip(got, want)]
        if max(errs) > 1e-9 or rel_err(start, want[0]) < 1e-3:
            ok, msg = False, f"relative errors {errs}; the table moved {rel_err(start, want[0])}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_a_resume_of_a_pointer_loads_rank_0s_step_on_every_rank(comm, workdir, monkeypatch):
    """``pt.init(resume="ck")``: each rank read ck/latest itself, so a ``latest`` rewritten
    between their reads (a job still writing ck) resumed ranks from different steps. Rank
    0 reads it and tells the others. Oracle: the others, whose own read would name step-0
    (patched), all resume at rank 0's step 1."""
    import pshybrid.torch as pt
    import pshybrid.torch.session as sess

    ck = workdir / "ck"
    tables = [pt.Table("t", rows=6, dim=2, optimizer="sgd", dtype=torch.float64)]
    if comm.rank == 0:
        pt.init(servers=0, mode="allreduce", seed=1, comm=MPI.COMM_SELF, tables=tables)
        model, emb = torch.nn.Linear(2, 1).double(), pt.Embedding("t")
        opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        pt.checkpoint(ck)
        model(emb(torch.tensor([1]))).sum().backward()
        opt.step()
        pt.checkpoint(ck)  # (latest: step-1)
        pt.shutdown()
    comm.Barrier()  # Wire: both checkpoints are written
    if comm.rank != 0:
        monkeypatch.setattr(sess, "resolve", lambda path: str(ck / "step-0"))
    pt.init(servers=0, mode="allreduce", seed=1, comm=comm, exit_servers=False,
            tables=tables, resume=str(ck))
    steps = comm.allgather(pt.steps_done())  # Wire: each rank's resumed step
    pt.shutdown()
    assert_all(comm, steps == [1] * comm.size, f"resumed at steps {steps}")


@pytest.mark.mpi(min_size=2)
def test_the_workers_own_communicator_holds_the_workers_alone(comm):
    """``hybrid``, 1 server: between steps, ``pt.worker_comm()`` gathers every worker's
    index (0 .. W-1, in order) and its scores for a global metric, where a collective over
    COMM_WORLD waited for the server for good."""
    import pshybrid.torch as pt

    ok, msg = True, ""
    if pt.init(servers=1, mode="hybrid", seed=3, comm=comm, exit_servers=False,
               tables=[pt.Table("t", rows=10, dim=2, dtype=torch.float64)]):
        model, emb = torch.nn.Linear(2, 1).double(), pt.Embedding("t")
        opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        W, w = pt.num_workers(), pt.worker_index()
        wc = pt.worker_comm()
        for step in range(2):
            opt.zero_grad()
            model(emb(torch.tensor([w, 9 - w]))).sum().backward()
            opt.step()
            # Wire: each worker's (index, scores) to every worker, over the workers alone
            every = wc.allgather((w, [float(step + w)]))
            if wc.size != W or [i for i, _ in every] != list(range(W)) or \
                    sum(x for _, xs in every for x in xs) != W * step + W * (W - 1) / 2:
                ok, msg = False, f"step {step}: size {wc.size}, gathered {every}"
        pt.shutdown()
    assert_all(comm, ok, msg)


def _zero_step_run(comm, zeroed: bool):
    """``hybrid``, 1 server, a bucket per layer: 3 steps of plain SGD, step 2's batch
    backward then ``opt.zero_grad()`` before its ``opt.step()`` (``zeroed``), or no step 2
    at all. Workers: (dense parameters, the table's rows); the server: None."""
    import pshybrid.torch as pt

    if not pt.init(servers=1, mode="hybrid", seed=3, comm=comm, exit_servers=False,
                   tables=[pt.Table("t", rows=12, dim=2, optimizer="sgd",
                                    dtype=torch.float64)]):
        return None
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)).double()
    emb = pt.Embedding("t")
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                  bucket_mb=1e-9)  # (each layer's Allreduce starts in backward)
    for b in range(3):
        opt.zero_grad()
        if b == 1 and not zeroed:
            continue
        ids = torch.tensor([b, 3 + b + pt.worker_index()])
        (model(emb(ids)) * (b + 1 + pt.worker_index())).sum().backward()
        if b == 1:
            opt.zero_grad()
        opt.step()
    with torch.no_grad():
        got = (torch.cat([p.flatten() for p in model.parameters()]).numpy().copy(),
               emb(torch.arange(12)).numpy().copy())
    pt.shutdown()
    return got


@pytest.mark.mpi(min_size=2)
def test_zero_grad_between_a_backward_and_its_step_makes_a_zero_step(comm):
    """``loss.backward(); opt.zero_grad(); opt.step()`` (plain PyTorch: a step of zero
    gradients): the dense buckets were on the wire when ``zero_grad`` wrote them, so the
    step applied the workers' whole dense gradient and none of the tables' (MPI forbids
    writing a buffer in a nonblocking Allreduce). Oracle: with plain SGD, the run's
    parameters and rows == the run without that step, to 1e-12 (the workers' Accumulates
    into one row land in either order)."""
    got, want = _zero_step_run(comm, True), _zero_step_run(comm, False)
    ok, msg = True, ""
    if got is not None:
        errs = [rel_err(a, b) for a, b in zip(got, want)]
        ok, msg = max(errs) < 1e-12, f"relative errors (dense, rows) {errs}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_steplr_on_distributed_optimizer_matches_native_pytorch(comm):
    """``hybrid``, 1 server, W = size - 1 workers of batch 6: StepLR on
    ``pt.DistributedOptimizer`` (the servers' Adagrad gets each new embedding rate) == plain
    PyTorch with the global batch of 6W in one process, to 1e-9 (``tests/torch_steplr.py``)."""
    import torch_steplr

    ok, msg, res = torch_steplr.run(comm, "hybrid", 1)
    # Wire: every rank's local losses to all (the workers' mean is the global batch's loss)
    got = [r[0] for r in comm.allgather(res) if r is not None]
    if ok and res is not None:
        err = torch_steplr.rel(np.mean(got, axis=0), res[1])
        ok, msg = err < 1e-9, f"losses: relative error {err} > 1e-9"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,servers", [("hybrid", 1), ("allreduce", 0)])
@pytest.mark.parametrize("sync,accum,unused,staged", [
    (False, 1, False, False), (True, 1, False, False), (True, 3, False, False),
    (False, 2, True, False), (False, 3, True, True)])
def test_loop_habits_match_native_pytorch(comm, mode, servers, sync, accum, unused, staged):
    """``model.zero_grad()``, a dense layer only some workers' batches reach in some steps
    (a bucket per parameter: the buckets were cut where each worker's backward finished,
    so they differed and the job hung; the layer's earlier gradient was applied again
    where ``.grad`` was None), ``clip_grad_norm_`` after ``opt.synchronize()`` (before
    it, ``.grad`` is a worker's own), gradient accumulation over 3 micro-batches with
    ``opt.no_sync()`` (it was refused), and a layer no worker reaches in some steps with
    ``find_unused_parameters`` (Adam moved it): == plain PyTorch with the global batch, to
    1e-9 (``tests/torch_habits.py``). ``staged``: the GPU path's gradient staging (each
    gradient copied to the host once a step, those reached only inside ``no_sync`` at the
    step), run on CPU tensors."""
    import torch_habits

    ok, msg = torch_habits.run(comm, mode, servers, sync, accum, unused, staged)
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,servers", [("hybrid", 1), ("allreduce", 0)])
@pytest.mark.parametrize("clip", [False, True])
def test_a_grad_scaler_matches_native_pytorch(comm, mode, servers, clip):
    """``torch.amp.GradScaler`` with ``opt.synchronize(scaler)``: a step whose gradients
    are NaN on one worker is skipped by every worker, the scale follows the twin's, and
    the tables are trained on unscaled gradients: == plain PyTorch with a GradScaler and
    the global batch, to 1e-9 (``tests/torch_amp.py``)."""
    import torch_amp

    ok, msg = torch_amp.run(comm, mode, servers, clip)
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=3)
def test_a_table_overflow_on_one_worker_skips_the_step_on_every_worker(comm):
    """``hybrid``, 1 server: worker 1's table gradient alone is not finite (the dense ones
    are, on every worker): every worker's scaler must skip the step and halve its scale
    (one worker stepping alone waited for the others: ended by the timeout)."""
    torch = pytest.importorskip("torch")
    import pshybrid.torch as pt
    from torch_amp import cpu_scaler

    scaler = cpu_scaler(init_scale=4.0)
    if not pt.init(servers=1, mode="hybrid", seed=4, comm=comm, exit_servers=False, timeout=60,
                   tables=[pt.Table("t", rows=8, dim=2, optimizer="sgd", dtype=torch.float64)]):
        assert_all(comm, True, "")
        return
    lin, emb = torch.nn.Linear(3, 1).double(), pt.Embedding("t")
    opt = pt.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), lin)
    weight = lin.weight.detach().clone()
    big = 1e308 if pt.worker_index() == 1 else 1.0
    x, ids = torch.ones(2, 3, dtype=torch.float64), torch.tensor([1, 2])
    opt.zero_grad()
    scaler.scale(lin(x).sum() + (emb(ids) * big).sum()).backward()
    opt.synchronize(scaler)
    scaler.step(opt)
    scaler.update()
    got = (pt.steps_done(), scaler.get_scale(), torch.equal(lin.weight, weight))
    pt.shutdown()
    assert_all(comm, got == (0, 2.0, True), f"steps, scale, weights unchanged: {got}")
