"""pshybrid.torch's Python API in one process (``allreduce`` mode on COMM_SELF), against
oracles outside it: ``pt.batches`` against the file read with h5py (every call a pass of
its own; a multi-hot file's bags); StepLR on ``pt.DistributedOptimizer`` against plain
PyTorch; a torch checkpoint's meta.json against the tables made, its export against the
trained rows. At several world sizes: ``tests/test_torch_mpi.py``."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import shutil

import h5py
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mpi4py import MPI

import pshybrid.torch as pt
from pshybrid.optim import SPARSE_LR
from pshybrid.synthetic import write_synthetic
from torch_amp import cpu_scaler

ROWS, B = 50, 8  # 6 global batches of 8 rows an epoch (2 rows dropped)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "d.h5"
    write_synthetic(str(path), ROWS, seed=5, n_dense=3, cardinalities=(7, 30, 200, 5))
    return path


@pytest.fixture
def job():
    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF,
            tables=[pt.Table("t", rows=10, dim=2, optimizer="sgd", dtype=torch.float64)])
    yield
    pt.shutdown()


def file_rows(path, lo, hi):
    with h5py.File(path) as f:
        return f["label"][lo:hi], f["dense"][lo:hi], f["sparse"][lo:hi]


def same_rows(batch, rows) -> bool:
    return all(np.array_equal(got.numpy(), want.astype(np.float64 if got.is_floating_point()
                                                       else np.int64))
               for got, want in zip((batch.label, batch.dense, batch.sparse), rows))


def test_every_call_of_batches_is_a_whole_pass(job, data):
    """An epoch loop, then a validation loop: each call yields the file's 6 global batches
    in order (rows [8t, 8t+8)); ``start`` skips into a pass; ``epoch=1`` is the second
    epoch of a 2-epoch call (shuffled: its own order)."""
    torch.set_default_dtype(torch.float64)
    model = torch.nn.Linear(3, 1)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for epoch in range(3):
        got = []
        for batch in pt.batches(data, B):  # trains: the job's step advances
            got.append(batch)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(batch.dense)[:, 0], batch.label)
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert len(got) == ROWS // B, f"epoch {epoch}: {len(got)} steps"
        assert all(same_rows(b, file_rows(data, B * t, B * (t + 1))) for t, b in enumerate(got))
    assert [b.sparse.tolist() for b in pt.batches(data, B, start=4)] == \
        [b.sparse.tolist() for b in got[4:]]
    two = list(pt.batches(data, B, epochs=2, shuffle=True, seed=3))
    second = list(pt.batches(data, B, epoch=1, shuffle=True, seed=3))
    assert [b.sparse.tolist() for b in second] == [b.sparse.tolist() for b in two[6:]]
    with pytest.raises(Exception, match="start must be >= 0"):
        next(pt.batches(data, B, start=-1))
    with pytest.raises(Exception, match="drop_last=False reads one pass in the file's order"):
        next(pt.batches(data, B, shuffle=True, drop_last=False))
    tail = list(pt.batches(data, B, drop_last=False, start=6))  # (the 2 rows dropped above)
    assert len(tail) == 1 and same_rows(tail[0], file_rows(data, 48, 50))


def test_batches_of_a_file_too_short_name_what_it_lacks(job, data, tmp_path):
    """A file of no rows: an evaluation pass (``drop_last=False``, which needs one row) says
    it holds none, and a training pass names the batch_size given (both named 1 // W)."""
    empty = tmp_path / "empty.h5"
    with h5py.File(data) as f, h5py.File(empty, "w") as g:
        for k in ("label", "dense", "sparse"):
            g[k] = f[k][:0]
        g.attrs.update(f.attrs)
    with pytest.raises(Exception, match=r"empty.h5: holds no rows: nothing to read"):
        next(pt.batches(empty, B, drop_last=False))
    with pytest.raises(Exception, match=rf"d.h5: {ROWS} rows, fewer than one global batch "
                                        rf"\(1 worker x batch_size {ROWS + 1}\)"):
        next(pt.batches(data, ROWS + 1))


def test_a_training_pass_refuses_an_unlabeled_file_and_an_evaluation_pass_reads_it(job, data,
                                                                                 tmp_path):
    """A file marked unlabeled (``prep --unlabeled``: /label zeros) is no training data, as
    for ``train``: ``pt.batches`` refuses it naming the file; ``drop_last=False`` (to
    predict) reads its rows, the file's."""
    marked = tmp_path / "u.h5"
    shutil.copy(data, marked)
    with h5py.File(marked, "r+") as f:
        f.attrs["unlabeled"] = 1
    with pytest.raises(Exception, match=r"u.h5: its rows have no labels"):
        next(pt.batches(marked, B))
    got = list(pt.batches(marked, B, drop_last=False))
    assert sum(len(b.label) for b in got) == ROWS
    assert all(same_rows(b, file_rows(marked, B * t, min(B * t + B, ROWS)))
               for t, b in enumerate(got))


def test_batches_of_a_multi_hot_file_are_its_rows(job, tmp_path):
    """A file with 2 multi-hot fields: ``.sparse`` holds the single-hot fields' ids and
    ``.bags`` each multi-hot field's ``(values, offsets)`` of the batch's rows, as h5py
    reads them, unshuffled and shuffled (the rows of ``BatchPlan``'s ranges: 3 blocks of
    1024 rows permuted, a batch across two of them)."""
    from test_train_mpi import write_multi_hot

    from pshybrid.batches import BatchPlan

    path, n, G = tmp_path / "mh.h5", 2500, 200
    write_multi_hot(str(path), n, seed=4)
    with h5py.File(path) as f:
        label, sparse = f["label"][...], f["sparse"][...]
        bags = {k: (f[f"multi_hot/{k}/values"][...], f[f"multi_hot/{k}/offsets"][...])
                for k in ("m0", "m1")}
    split = 0
    for shuffle in (False, True):
        plan = BatchPlan(n, G, shuffle, 9)
        got = list(pt.batches(path, G, shuffle=shuffle, seed=9))
        assert len(got) == n // G
        for t, batch in enumerate(got):
            ranges = plan.ranges(t, 0, G)
            split += len(ranges) > 1
            rows = np.concatenate([np.arange(a, b) for a, b in ranges])
            assert np.array_equal(batch.label.numpy(), label[rows])
            assert np.array_equal(batch.sparse.numpy(), sparse[rows])
            assert list(batch.bags) == ["m0", "m1"]
            for k, (values, offsets) in bags.items():
                want = [values[offsets[r]:offsets[r + 1]] for r in rows]
                got_v, got_o = (x.numpy() for x in batch.bags[k])
                assert np.array_equal(got_v, np.concatenate(want)), (shuffle, t, k)
                assert np.array_equal(got_o, np.cumsum([0] + [len(w) for w in want[:-1]]))
    assert split, "no shuffled batch spans two blocks"


def test_steplr_on_distributed_optimizer_matches_native_pytorch():
    """``pt.DistributedOptimizer`` is a ``torch.optim.Optimizer``; StepLR on it halves the
    dense and the embedding learning rates every 2 steps, and 5 steps match plain PyTorch
    (``nn.Embedding``, Adam + Adagrad, a StepLR each) to 1e-9 (``tests/torch_steplr.py``)."""
    import torch_steplr

    ok, msg, (losses, want) = torch_steplr.run(MPI.COMM_SELF, "allreduce", 0)
    assert ok, msg
    assert torch_steplr.rel(losses, want) < 1e-9, (losses, want)


def test_state_dict_round_trip_keeps_both_rates(job):
    """state_dict -> new rates -> load_state_dict: the saved dense and embedding rates are
    back, and the dense groups are still the torch optimizer's own (a scheduler sets both)."""
    model = torch.nn.Linear(3, 1).double()
    inner = torch.optim.Adam(model.parameters(), lr=0.01)
    opt = pt.DistributedOptimizer(inner, model)
    assert isinstance(opt, torch.optim.Optimizer)
    assert [g.get("name") for g in opt.param_groups] == [None, "embeddings"]
    saved = opt.state_dict()
    for g in opt.param_groups:
        g["lr"] = 9.0
    opt.load_state_dict(saved)
    assert [g["lr"] for g in opt.param_groups] == [0.01, SPARSE_LR["sgd"]]  # pt.Table's default lr
    assert opt.param_groups[0] is inner.param_groups[0] and opt.state is inner.state


@pytest.mark.parametrize("optimizer, lr, want", [("adam", None, 0.001), ("adagrad", None, 0.05),
                                                ("sgd", None, 0.5), ("adam", 0.2, 0.2)])
def test_a_tables_rate_defaults_by_its_optimizer(optimizer, lr, want):
    """``pt.Table(lr=None)``: the optimizer's default rate, as ``--lr none`` (0.001 for adam:
    Adagrad's 0.05 is far too large for it); the embeddings' param group steps at it."""
    table = pt.Table("t", rows=10, dim=2, optimizer=optimizer, lr=lr, dtype=torch.float64)
    assert table.lr == want
    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF, tables=[table])
    try:
        model = torch.nn.Linear(3, 1).double()
        opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        assert opt.param_groups[-1]["lr"] == want
    finally:
        pt.shutdown()


@pytest.mark.parametrize("kw", [dict(lr=-0.1), dict(lr=float("nan")), dict(lr=float("inf")),
                                dict(lr="0.1"), dict(lr=True), dict(init_scale=-0.05),
                                dict(init_scale=float("nan"))])
def test_a_tables_rate_or_scale_that_is_not_a_number_at_least_0_is_refused(kw):
    """As ``--lr -0.1`` is: a negative rate trained by gradient ascent, NaN and inf turned
    the rows NaN and inf, a string or True trained at some rate; all without a word (torch's
    own optimizers refuse a negative lr)."""
    from pshybrid.errors import ConfigError

    (key, value), = kw.items()
    with pytest.raises(ConfigError, match=rf"pt.Table 't': {key} must be "):
        pt.init(servers=0, mode="allreduce", comm=MPI.COMM_SELF,
                tables=[pt.Table("t", rows=10, dim=2, **kw)])
    pt.init(servers=0, mode="allreduce", comm=MPI.COMM_SELF,  # 0 and NumPy's numbers: fine
            tables=[pt.Table("t", rows=10, dim=2, lr=np.float32(0.0), init_scale=0)])
    pt.shutdown()


def test_a_torch_checkpoint_describes_its_run_and_exports_each_table(data, tmp_path):
    """meta.json: front_end "torch", the two tables as pt.Table made them, the mode, seed
    and both optimizers, no native model fields. ``pshybrid export`` writes each table at
    its own width (== the trained rows) and the dense parameters; ``eval`` and ``predict``
    refuse it in one line that says the model is the user's code."""
    import json
    import subprocess

    from mpi_util import pshybrid

    from pshybrid.torch.session import session

    torch.set_default_dtype(torch.float64)
    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF,
            tables=[pt.Table("a", rows=20, dim=3, lr=0.5, dtype=torch.float64),
                    pt.Table("b", rows=9, dim=5, lr=0.5, dtype=torch.float64)])
    try:
        model = torch.nn.Linear(3 + 5, 1)
        ea, eb = pt.Embedding("a"), pt.Embedding("b")
        opt = pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), model)
        x = torch.cat([ea(torch.tensor([1, 4, 19])), eb(torch.tensor([0, 8, 8]))], 1)
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
        step_dir = pt.checkpoint(tmp_path / "ck")
        table, weight = session().mode.full_table(), model.weight.detach().numpy().copy()
    finally:
        pt.shutdown()
    meta = json.loads((tmp_path / "ck" / "step-1" / "meta.json").read_text())
    assert meta["front_end"] == "torch" and (meta["mode"], meta["seed"]) == ("allreduce", 7)
    cfg = meta["config"]
    assert [(t["name"], t["rows"], t["dim"], t["optimizer"], t["lr"]) for t in cfg["tables"]] \
        == [("a", 20, 3, "adagrad", 0.5), ("b", 9, 5, "adagrad", 0.5)]
    assert (cfg["width"], cfg["dtype"], cfg["dense_optimizer"], cfg["dense_lr"]) == \
        (5, "float64", "adam", 0.01)
    assert not {"model", "mlp", "batch_size", "embedding_dim"} & set(cfg)

    def cli(*args):
        return subprocess.run(pshybrid(*args), capture_output=True, text=True, timeout=120,
                              cwd=tmp_path, stdin=subprocess.DEVNULL)

    p = cli("export", step_dir, "out.h5")
    assert p.returncode == 0, p.stderr
    with h5py.File(tmp_path / "out.h5") as f:
        np.testing.assert_array_equal(f["embeddings/a"][...], table[:20, :3])
        np.testing.assert_array_equal(f["embeddings/b"][...], table[20:, :5])
        np.testing.assert_array_equal(f["dense/weight"][...], weight)
        assert "linear" not in f and f["optimizer/embeddings/a/acc"].shape == (20, 3)
    for args in (("eval", step_dir, str(data)), ("predict", step_dir, str(data), "p.h5")):
        p = cli(*args)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, p.stderr
        assert "written by pshybrid.torch: its model is your PyTorch code" in lines[0], lines


def _checkpoints(steps: int, into, resume=None) -> list:
    """One session (resumed from ``resume``): ``steps`` steps, then ``pt.checkpoint`` into
    each of ``into`` in turn; each one's step directory, or its refusal's message."""
    from pshybrid.errors import PshybridError

    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF, resume=resume,
            tables=[pt.Table("t", rows=10, dim=2, optimizer="sgd", dtype=torch.float64)])
    got = []
    try:
        model, emb = torch.nn.Linear(2, 1).double(), pt.Embedding("t")
        opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        for _ in range(steps):
            opt.zero_grad()
            model(emb(torch.tensor([1, 3]))).sum().backward()
            opt.step()
        for root in into:
            try:
                got.append(pt.checkpoint(root))
            except PshybridError as e:
                got.append(str(e))
    finally:
        pt.shutdown()
    return got


def test_a_torch_checkpoint_directory_keeps_one_history(tmp_path):
    """As train's --checkpoint-dir: a session writes on in the directory it wrote in or
    resumed from; another session's checkpoint there (``latest`` would go back to its
    step), one inside a step directory, one from a step older than the directory's newest,
    and one at the step resumed from are refused, and the directory is unchanged; a second
    one of its own at the same step (a periodic one, then the stop's) is the first's."""
    from mpi_util import snapshot

    ck = str(tmp_path / "ck")
    assert _checkpoints(1, [ck, ck]) == [f"{ck}/step-1"] * 2
    assert _checkpoints(0, [ck], resume=ck) == [f"pt.checkpoint: {ck} already holds step-1 "
                                                "(no step since it was written)"]
    assert _checkpoints(1, [ck], resume=ck) == [f"{ck}/step-2"]
    before = snapshot(ck)
    fresh, inner, older = _checkpoints(3, [ck, f"{ck}/step-2", str(tmp_path / "x")])[:2] + \
        _checkpoints(1, [ck], resume=f"{ck}/step-1")
    assert "already holds checkpoints (latest: step-2)" in fresh and "pt.init(resume" in fresh
    assert f"lies inside the checkpoint directory {ck}" in inner
    assert "holds step-2, newer than the resume point step-1" in older
    assert snapshot(ck) == before
    assert _checkpoints(1, [ck], resume=ck) == [f"{ck}/step-3"]


class _CountingSGD(torch.optim.SGD):
    """Plain SGD that counts its steps per parameter in a Python int (state that is not a
    tensor: a third-party optimizer's)."""

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p]["count"] = self.state[p].get("count", 0) + 1
        return super().step(closure)


class _GlobalSGD(torch.optim.SGD):
    """SGD whose step count is an entry of its own, not a parameter's (``state["global"]``)."""

    def step(self, closure=None):
        self.state["global"]["t"] = self.state["global"].get("t", torch.zeros(())) + 1
        return super().step(closure)


class _SlashSGD(torch.optim.SGD):
    """SGD with a state key that is no HDF5 name."""

    def step(self, closure=None):
        for p in self.param_groups[0]["params"]:
            self.state[p]["a/b"] = torch.zeros(())
        return super().step(closure)


@pytest.mark.parametrize("make, why", [
    (_CountingSGD, "its state 'count' of parameter 'weight' is a int, not a dense tensor"),
    (_GlobalSGD, "its state holds an entry for str 'global', not a parameter of the model"),
    (_SlashSGD, "its state 'a/b' of parameter 'weight': the key is not a name (a string "
                "without '/', not '' or '.')"),
], ids=["python-int", "not-a-parameters", "key-with-a-slash"])
def test_a_dense_optimizer_whose_state_a_checkpoint_cannot_hold_is_refused(tmp_path, capfd,
                                                                          make, why):
    """State a checkpoint cannot hold (not a dense tensor, not a parameter's, a key that is
    no HDF5 name): said at the first step, and refused by pt.checkpoint in one message
    naming the entry, nothing written. LBFGS, which needs several gradients a step, and a
    torch optimizer over a parameter the model does not hold (its gradient was never
    averaged) are refused when the DistributedOptimizer is made."""
    from pshybrid.errors import ConfigError

    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF,
            tables=[pt.Table("t", rows=10, dim=2, optimizer="sgd", dtype=torch.float64)])
    try:
        model, emb = torch.nn.Linear(2, 1).double(), pt.Embedding("t")
        with pytest.raises(ConfigError, match="LBFGS evaluates the loss and gradients several "
                           "times in one step"):
            pt.DistributedOptimizer(torch.optim.LBFGS(model.parameters()), model)
        extra = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        with pytest.raises(ConfigError, match="the torch optimizer holds a parameter that is "
                           "not one of the model's"):
            pt.DistributedOptimizer(make([*model.parameters(), extra], lr=0.1), model)
        opt = pt.DistributedOptimizer(make(model.parameters(), lr=0.1), model)
        assert "warning" not in capfd.readouterr().err
        for _ in range(2):
            opt.zero_grad()
            model(emb(torch.tensor([1, 3]))).sum().backward()
            opt.step()
        want = f"torch.optim.{make.__name__} has no checkpoint form: {why}"
        assert capfd.readouterr().err == (f"pshybrid: warning: DistributedOptimizer: {want}: "
                                          "pt.checkpoint will refuse it, so a stop on SIGTERM "
                                          "/ SIGUSR1 can write no checkpoint\n")  # (once)
        with pytest.raises(ConfigError) as info:
            pt.checkpoint(tmp_path / "ck")
        assert str(info.value) == f"pt.checkpoint: {want}"
    finally:
        pt.shutdown()
    assert not (tmp_path / "ck").exists()


MAKERS = {
    "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "adam-amsgrad": lambda ps: torch.optim.Adam(ps, lr=0.1, amsgrad=True),
    "adam-fused": lambda ps: torch.optim.Adam(ps, lr=0.1, fused=True),
    "rmsprop-centered": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5,
                                                       centered=True),
    "nadam": lambda ps: torch.optim.NAdam(ps, lr=0.1),
    "adadelta": lambda ps: torch.optim.Adadelta(ps),
    "asgd": lambda ps: torch.optim.ASGD(ps, lr=0.1, t0=1),
    "rprop": lambda ps: torch.optim.Rprop(ps, lr=0.1),
    "adafactor": lambda ps: torch.optim.Adafactor(ps, lr=0.1),  # (row and column factors)
    "adam-over-layer-a": lambda ps: torch.optim.Adam(list(ps)[:2], lr=0.1),
}


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def default_dtype(request):
    """torch's default dtype (that of the scalar state some optimizers make: NAdam's
    mu_product), restored after."""
    was = torch.get_default_dtype()
    torch.set_default_dtype(request.param)
    yield
    torch.set_default_dtype(was)


@pytest.mark.parametrize("kind", MAKERS)
def test_any_torch_optimizers_state_resumes_exactly(tmp_path, kind, default_dtype):
    """Every state tensor of the torch optimizer (momentum buffers, amsgrad's maxima,
    RMSprop's averages, Adafactor's factors, NAdam's float32 mu_product of a float64 model,
    each parameter's step) is in the checkpoint and comes back in its own dtype: checkpoint
    at step 2 -> resume -> step 5 == 5 steps uninterrupted, bit for bit. Layer b is first
    reached at step 3: it has no state at the checkpoint, and gets it as in PyTorch after
    the resume (or, for an optimizer over layer a alone, never)."""
    make = MAKERS[kind]
    _, want = _two_layer_run(tmp_path / "whole", 5, make=make, when=(3,))
    step, _ = _two_layer_run(tmp_path / "part", 2, make=make, when=(3,))
    _, got = _two_layer_run(tmp_path / "part", 5, resume=step, make=make, when=(3,))
    assert all(torch.equal(p, q) for p, q in zip(got, want))


def test_a_checkpoint_without_the_optimizers_own_state_resumes_or_is_refused(tmp_path):
    """A checkpoint without each parameter's step count (native, older) gives each the
    run's: resumed by an optimizer over part of the model, == the uninterrupted run (it
    raised StopIteration: a parameter no group holds). One without amsgrad's maxima (no
    param_groups to restore amsgrad=False from) is refused naming the parameter (torch
    raised KeyError at the first step)."""
    from pshybrid.errors import InputError

    def part(ps):
        return torch.optim.Adam(list(ps)[:2], lr=0.1)

    _, want = _two_layer_run(tmp_path / "whole", 5, make=part)
    step, _ = _two_layer_run(tmp_path / "part", 2, make=part)
    with h5py.File(f"{step}/dense.h5", "a") as f:
        del f.attrs["param_steps"]
    _, got = _two_layer_run(tmp_path / "part", 5, resume=step, make=part)
    assert all(torch.equal(p, q) for p, q in zip(got, want))
    step, _ = _two_layer_run(tmp_path / "plain", 2)
    meta = json.loads(open(f"{step}/meta.json").read())
    for key in ("param_groups", "torch_optimizer"):
        del meta["config"][key]
    open(f"{step}/meta.json", "w").write(json.dumps(meta))
    with pytest.raises(InputError, match="dense.h5: parameter 'a.weight' has no amsgrad "
                       "maxima .*: resume with amsgrad=False"):
        _two_layer_run(tmp_path / "plain", 5, resume=step,
                       make=lambda ps: torch.optim.Adam(ps, lr=0.1, amsgrad=True))


def test_a_momentum_buffer_is_exported_and_a_foreign_one_refused(tmp_path):
    """Export carries the torch optimizer's other state as /optimizer/dense/<key>/<param>:
    SGD's momentum buffers == plain PyTorch's after the same 2 steps. A /torch_state entry
    naming no parameter of the model, not numeric or not finite, is refused naming it."""
    from pshybrid.errors import InputError
    from pshybrid.export import export

    def make(ps):
        return torch.optim.SGD(ps, lr=0.1, momentum=0.9)

    step, _ = _two_layer_run(tmp_path / "ck", 2, make=make, when=(0,))
    torch.manual_seed(5)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(3, 1), "b": torch.nn.Linear(3, 1)}).double()
    ref, x = make(model.parameters()), torch.ones(2, 3, dtype=torch.float64)
    for t in range(2):
        ref.zero_grad(set_to_none=True)
        ((model["a"](x) + (model["b"](x) if t == 0 else 0)) ** 2).sum().backward()
        ref.step()
    export(step, str(tmp_path / "e.h5"))
    with h5py.File(tmp_path / "e.h5") as f:
        got = {n: f[f"optimizer/dense/momentum_buffer/{n}"][...]
               for n in f["optimizer/dense/momentum_buffer"]}
    assert got.keys() == {n for n, _ in model.named_parameters()}
    for n, p in model.named_parameters():
        assert np.array_equal(got[n], ref.state[p]["momentum_buffer"].numpy()), n

    def nan(f):
        from pshybrid.checksums import crc32

        d = f["torch_state/a.bias/momentum_buffer"]
        d[...], d.attrs["crc32"] = np.nan, crc32(np.full(d.shape, np.nan, d.dtype))

    for edit, why in ((nan, r"/torch_state/a.bias/momentum_buffer has a non-finite value"),
                      (lambda f: f.move("torch_state/b.bias", "torch_state/c.bias"),
                       r"/torch_state/c.bias/momentum_buffer names 'c.bias', not a parameter"),
                      (lambda f: f.create_dataset("torch_state/a.bias/note", data="x"),
                       r"/torch_state/a.bias/note is not a numeric dataset")):
        shutil.copy(f"{step}/dense.h5", tmp_path / "dense.h5")
        with h5py.File(f"{step}/dense.h5", "a") as f:
            edit(f)
        with pytest.raises(InputError, match=why):
            _two_layer_run(tmp_path / "ck", 3, resume=step, make=make, when=(0,))
        with pytest.raises(InputError, match=why):
            export(step, str(tmp_path / "e2.h5"))
        shutil.copy(tmp_path / "dense.h5", f"{step}/dense.h5")  # (each edit on its own)


@pytest.mark.parametrize("make", [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW,
                                  torch.optim.Adagrad, torch.optim.RMSprop])
def test_a_checkpointable_dense_optimizer_steps_without_a_warning(make, capfd):
    """(Their checkpoint -> resume == the uninterrupted run: above, and
    ``tests/test_torch_mpi.py``.)"""
    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF,
            tables=[pt.Table("t", rows=10, dim=2, optimizer="sgd", dtype=torch.float64)])
    try:
        model, emb = torch.nn.Linear(2, 1).double(), pt.Embedding("t")
        opt = pt.DistributedOptimizer(make(model.parameters(), lr=0.01), model)
        opt.zero_grad()
        model(emb(torch.tensor([1, 3]))).sum().backward()
        opt.step()
        assert opt.opt.state or make is torch.optim.SGD  # (the state a warning would be of)
    finally:
        pt.shutdown()
    assert "warning" not in capfd.readouterr().err


def test_a_lookup_whose_graph_is_freed_unreached_is_dropped_and_the_step_is_unchanged(job):
    """An evaluation with gradients on (no ``torch.no_grad()``) kept each of its lookups
    until the next ``opt.step()``: the session grew with every batch. A lookup whose graph
    is freed before a backward reached it is dropped at the next lookup. Oracles: after 40
    such lookups the session holds at most 2; the step after them moves the rows by
    -lr * count * w (plain SGD, loss = Linear(emb(ids)).sum()), exactly as without them."""
    from pshybrid.torch.session import session

    emb, model = pt.Embedding("t"), torch.nn.Linear(2, 1, bias=False).double()
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model)
    with torch.no_grad():
        before = emb(torch.arange(10)).numpy().copy()
    ids = torch.tensor([3, 3, 7])
    loss = model(emb(ids)).sum()
    loss.backward()
    del loss  # (its graph freed after the backward: kept, it has gradients)
    for k in range(40):
        model(emb(torch.tensor([k % 10, 1]))).sum()  # (never backpropagated)
    assert len(session().entries) <= 2, len(session().entries)
    opt.step()
    with torch.no_grad():
        after = emb(torch.arange(10)).numpy()
    want = before.copy()
    w, lr = model.weight.detach().numpy()[0], opt.param_groups[-1]["lr"]
    for i in ids.tolist():
        want[i] -= lr * w
    assert np.allclose(after, want, rtol=0, atol=1e-12), (after, want)
    assert not np.allclose(after, before)


def test_a_tables_betas_and_eps_are_torch_adams(tmp_path):
    """``pt.Table(optimizer="adam", betas=, eps=)`` (they were fixed at 0.9, 0.999, 1e-8).
    Oracle: with every row touched at every step, the rows' lazy Adam is
    ``torch.optim.Adam`` over an ``nn.Embedding`` with the same betas and eps (its formula:
    docs/models.md), to 1e-12 over 3 steps, and the default betas and eps give another
    result. Bad values are one ConfigError naming the table."""
    from pshybrid.errors import ConfigError

    kw = dict(optimizer="adam", lr=0.1, dtype=torch.float64, betas=(0.5, 0.8), eps=0.3)
    pt.init(servers=0, mode="allreduce", seed=3, comm=MPI.COMM_SELF,
            tables=[pt.Table("t", rows=5, dim=3, **kw)])
    try:
        emb, ids = pt.Embedding("t"), torch.tensor([0, 1, 2, 3, 4, 2])
        with torch.no_grad():
            start = emb(torch.arange(5)).clone()
        lin, lin_ref = torch.nn.Linear(3, 1).double(), torch.nn.Linear(3, 1).double()
        lin_ref.load_state_dict(lin.state_dict())  # (the references' own: lin is hooked)
        opt = pt.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.0), lin)
        refs = []
        for betas, eps in ((kw["betas"], kw["eps"]), ((0.9, 0.999), 1e-8)):
            ref = torch.nn.Embedding(5, 3).double()
            ref.weight.data.copy_(start)
            refs.append((ref, torch.optim.Adam(ref.parameters(), lr=0.1, betas=betas, eps=eps)))
        for _ in range(3):
            opt.zero_grad()
            (lin(emb(ids)) ** 2).sum().backward()
            opt.step()
            for ref, ropt in refs:
                ropt.zero_grad()
                (lin_ref(ref(ids)) ** 2).sum().backward()
                ropt.step()
        with torch.no_grad():
            got = emb(torch.arange(5))
        want, other = (ref.weight.detach() for ref, _ in refs)
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-14), (got - want).abs().max()
        assert not torch.allclose(want, other, rtol=1e-6)
    finally:
        pt.shutdown()
    for bad, why in (({"betas": (0.9, 1.0)}, "betas must be two numbers >= 0 and < 1"),
                     ({"betas": 0.9}, "betas must be two numbers >= 0 and < 1"),
                     ({"eps": 0.0}, "eps must be a number > 0 and finite"),
                     ({"eps": 1e-50}, "eps 1e-50 is 0 in float32")):
        with pytest.raises(ConfigError, match=re.escape(f"pt.Table 't': {why}")):
            pt.init(servers=0, mode="allreduce", comm=MPI.COMM_SELF,
                    tables=[pt.Table("t", rows=5, dim=3, **bad)])


def test_load_rows_refuses_what_is_not_the_tables_rows(job):
    """(The rows it loads start a hybrid run: ``tests/test_torch_mpi.py``.)"""
    from pshybrid.errors import InputError

    for bad, match in ((torch.zeros(9, 2), r"weights of shape \(9, 2\), the table's is "
                        r"\(10, 2\)"),
                       (torch.full((10, 2), float("nan")), "weights must be finite floating-point"),
                       (torch.zeros(10, 2, dtype=torch.int64), "weights must be finite floating-point")):
        with pytest.raises(InputError, match=r"^pt.load_rows\('t'\): " + match):
            pt.load_rows("t", bad)
    pt.load_rows("t", np.arange(20.0).reshape(10, 2))
    assert pt.Embedding("t")(torch.tensor([9])).tolist() == [[18.0, 19.0]]
    pt.load_rows("t", torch.arange(20.0).reshape(10, 2).bfloat16())  # (no NumPy bfloat16)
    assert pt.Embedding("t")(torch.tensor([9])).tolist() == [[18.0, 19.0]]


def test_a_resume_with_another_dense_optimizer_class_is_refused(tmp_path):
    """AdamW's checkpoint holds Adam's slots: resumed by a torch.optim.Adam it loaded
    silently (with AdamW's group settings, or on an older torch plain L2 decay). Refused
    naming both classes; the same class resumes."""
    from pshybrid.errors import InputError

    tables = [pt.Table("t", rows=10, dim=2, optimizer="sgd", dtype=torch.float64)]

    def start(make, **kw):
        pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF, tables=tables, **kw)
        model = torch.nn.Linear(2, 1).double()
        return model, pt.DistributedOptimizer(make(model.parameters(), lr=0.01), model)

    model, opt = start(torch.optim.AdamW)
    opt.zero_grad()
    model(torch.ones(3, 2, dtype=torch.float64)).sum().backward()
    opt.step()
    pt.checkpoint(tmp_path / "ck")
    pt.shutdown()
    for make in (torch.optim.Adam, torch.optim.AdamW):
        try:
            if make is torch.optim.Adam:
                with pytest.raises(InputError, match=r"step-1/meta.json: the checkpoint's dense "
                                   r"optimizer is torch.optim.AdamW, this one torch.optim.Adam: "
                                   r"resume with AdamW"):
                    start(make, resume=str(tmp_path / "ck"))
            else:
                _, opt = start(make, resume=str(tmp_path / "ck"))
                assert opt.opt.state  # AdamW's moments are back
        finally:
            pt.shutdown()


def test_a_refused_pt_init_leaves_the_process_able_to_start_again(tmp_path):
    """In one process (a notebook, a test), a ``pt.init`` refused at its resume left its
    session half made: ``pt.shutdown()`` raised AttributeError and every later
    ``pt.init`` said it was already called. Oracle: after the refusal, ``pt.shutdown()``
    does nothing, and a new session trains and checkpoints."""
    from pshybrid.errors import InputError

    tables = [pt.Table("a", rows=4, dim=2, optimizer="sgd", dtype=torch.float64)]
    with pytest.raises(InputError, match="no such checkpoint directory"):
        pt.init(servers=0, mode="allreduce", comm=MPI.COMM_SELF, tables=tables,
                resume=str(tmp_path / "none"))
    pt.shutdown()
    pt.init(servers=0, mode="allreduce", comm=MPI.COMM_SELF, tables=tables)
    try:
        model = torch.nn.Linear(2, 1).double()
        opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        model(pt.Embedding("a")(torch.tensor([1, 2]))).sum().backward()
        opt.step()
        assert pt.checkpoint(tmp_path / "ck").endswith("step-1")
    finally:
        pt.shutdown()


def test_a_session_after_a_refused_pt_init_gives_back_the_hook_it_found(tmp_path, monkeypatch):
    """A refused ``pt.init`` leaves pshybrid's excepthook (uncaught, the refusal is one
    line); the next session's ``pt.shutdown()`` put that one back, not the script's.
    Oracle: the hook installed before the first ``pt.init`` is the one after the last."""
    import sys

    from pshybrid.errors import InputError

    def mine(*exc):
        sys.__excepthook__(*exc)

    monkeypatch.setattr(sys, "excepthook", mine)
    tables = [pt.Table("a", rows=4, dim=2, optimizer="sgd", dtype=torch.float64)]
    for _ in range(2):
        with pytest.raises(InputError, match="no such checkpoint directory"):
            pt.init(servers=0, mode="allreduce", comm=MPI.COMM_SELF, tables=tables,
                    resume=str(tmp_path / "none"))
    pt.init(servers=0, mode="allreduce", comm=MPI.COMM_SELF, tables=tables)
    pt.shutdown()
    assert sys.excepthook is mine, sys.excepthook


def test_a_resume_with_other_tables_of_the_same_fused_rows_is_refused(tmp_path):
    """The fused table's rows alone were checked: the same tables listed in another order
    (or resized to the same sum) resumed silently, each table reading another's rows.
    Refused naming both lists (each in a process of its own: a refused pt.init ends its
    process); the same list resumes each table's own rows."""
    import subprocess
    import sys

    rows = {"a": 3, "b": 5}

    def tables(order, sizes):
        return [pt.Table(n, rows=sizes[n], dim=2, optimizer="sgd", dtype=torch.float64)
                for n in order]

    def start(tabs, **kw):
        pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF, tables=tabs, **kw)
        model = torch.nn.Linear(2, 1).double()
        pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)

    start(tables("ab", rows))
    pt.load_rows("a", np.arange(6.0).reshape(3, 2))
    pt.load_rows("b", -np.arange(10.0).reshape(5, 2))
    pt.checkpoint(tmp_path / "ck")
    pt.shutdown()
    for order, sizes in (("ba", rows), ("ab", {"a": 4, "b": 4})):
        script = ("import torch; from mpi4py import MPI; import pshybrid.torch as pt; "
                  f"pt.init(servers=0, mode='allreduce', comm=MPI.COMM_SELF, resume="
                  f"{str(tmp_path / 'ck')!r}, tables=[pt.Table(n, rows=r, dim=2, "
                  f"optimizer='sgd', dtype=torch.float64) for n, r in "
                  f"{[(n, sizes[n]) for n in order]!r}])")
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode != 0 and re.search(
            r"step-0/meta.json: the checkpoint's tables are \['a' 3x2, 'b' 5x2\], pt.init's "
            r"\[" + ", ".join(f"'{n}' {sizes[n]}x2" for n in order) + r"\]", run.stderr), \
            run.stderr
    try:
        start(tables("ab", rows), resume=str(tmp_path / "ck"))
        ids = torch.tensor([0, 1, 2])
        assert pt.Embedding("a")(ids).tolist() == np.arange(6.0).reshape(3, 2).tolist()
        assert pt.Embedding("b")(ids).tolist() == (-np.arange(6.0).reshape(3, 2)).tolist()
    finally:
        pt.shutdown()


@pytest.mark.parametrize("servers", [1, 0, None])
def test_a_hybrid_session_without_room_for_a_server_names_the_api_arguments(servers):
    """One process in mode 'hybrid' has no rank for a server: the refusal names pt.init's
    own arguments (servers=, mode=), not train's command-line flags; nothing is started."""
    from pshybrid.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        pt.init(servers=servers, mode="hybrid", comm=MPI.COMM_SELF,
                tables=[pt.Table("t", rows=10, dim=2)])
    msg = str(e.value)
    assert msg.startswith(f"pt.init: servers={servers!r} in mode 'hybrid' on 1 rank(s)"), msg
    assert "mode='allreduce'" in msg and "--servers" not in msg
    pt.init(servers=0, mode="allreduce", comm=MPI.COMM_SELF,
            tables=[pt.Table("t", rows=10, dim=2)])
    pt.shutdown()


@pytest.mark.parametrize("kw,want", [
    (dict(placement="colocated", servers=1), "placement='colocated' puts a shard of the tables "
     "on every rank, each a worker: only in mode 'hybrid', without servers= (mode='hybrid', "
     "servers=1)"),
    (dict(placement="colocated", mode="allreduce", servers=0), "only in mode 'hybrid'"),
    (dict(placement="nearby"), "placement 'nearby': one of ['colocated', 'dedicated']")])
def test_a_placement_that_cannot_be_is_refused_and_colocated_runs_on_one_rank(kw, want):
    """``placement="colocated"`` needs table shards (mode 'hybrid') and places them itself
    (no ``servers=``); one process is enough for it: a worker that holds every row."""
    from pshybrid.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        pt.init(comm=MPI.COMM_SELF, tables=[pt.Table("t", rows=10, dim=2)], **kw)
    assert want in str(e.value), str(e.value)
    assert pt.init(placement="colocated", comm=MPI.COMM_SELF, tables=[pt.Table("t", 10, 2)])
    rows = pt.Embedding("t")(torch.arange(10))
    assert rows.shape == (10, 2) and pt.num_workers() == 1
    pt.shutdown()


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), True, "600"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_refused(timeout):
    """pt.init(timeout=...): seconds > 0 or None; anything else one ConfigError naming it
    (True would have been a one-second limit), and nothing started."""
    from pshybrid.errors import ConfigError

    with pytest.raises(ConfigError, match=r"pt.init: timeout=.*: seconds > 0, or None"):
        pt.init(servers=0, mode="allreduce", comm=MPI.COMM_SELF, timeout=timeout,
                tables=[pt.Table("t", rows=10, dim=2)])
    pt.init(servers=0, mode="allreduce", comm=MPI.COMM_SELF, timeout=None,
            tables=[pt.Table("t", rows=10, dim=2)])
    pt.shutdown()


def test_add_param_group_is_refused_and_schedulers_that_cycle_momentum_run(job):
    """``opt.add_param_group`` put a group after "embeddings" (whose lr then went to the
    servers) and its parameters were never stepped nor averaged; OneCycleLR (cycle_momentum)
    failed with KeyError 'betas' on the embeddings group. Oracle: the refusal's words;
    OneCycleLR's first step sets the dense and embedding rates to max_lr / div_factor."""
    from pshybrid.errors import ConfigError

    model = torch.nn.Linear(3, 1).double()
    opt = pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), model)
    with pytest.raises(ConfigError, match="add_param_group: its parameters would not be"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))], "lr": 0.5})
    assert [g.get("name") for g in opt.param_groups] == [None, "embeddings"]
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.4, total_steps=4)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.4 / 25] * 2, rel=1e-12)
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
        opt.step()
        sched.step()


def test_a_sparse_gradient_and_a_second_synchronize_are_named(job):
    """``nn.Embedding(sparse=True)`` beside the tables failed deep in the gradient hook
    ('Cannot access data pointer of Tensor that doesn't have storage')."""
    from pshybrid.errors import ConfigError

    emb = torch.nn.Embedding(5, 2, sparse=True).double()
    opt = pt.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), emb)
    with pytest.raises(ConfigError, match="'weight' has a sparse gradient .*sparse=False"):
        emb(torch.tensor([1, 2])).sum().backward()
    dense = torch.nn.Linear(2, 1).double()
    opt = pt.DistributedOptimizer(torch.optim.SGD(dense.parameters(), lr=0.1), dense)
    dense(torch.ones(1, 2, dtype=torch.float64)).sum().backward()
    opt.synchronize()
    with pytest.raises(ConfigError, match="synchronize: once per step"):
        opt.synchronize()
    opt.step()


def test_clipping_before_synchronize_is_refused(job):
    """A DDP habit, ``clip_grad_norm_`` between ``loss.backward()`` and ``opt.step()``
    without ``opt.synchronize()``, clipped the Allreduce's own buffer while it was on the
    wire: the run trained on neither the clipped nor the unclipped global gradient, and said
    nothing."""
    from pshybrid.errors import ConfigError

    dense = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)).double()
    opt = pt.DistributedOptimizer(torch.optim.SGD(dense.parameters(), lr=0.1), dense)
    x = torch.ones(1, 2, dtype=torch.float64)
    for _ in range(2):  # (synchronize, then clip: as documented; the second step reuses .grad)
        opt.zero_grad()
        dense(x).sum().backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(dense.parameters(), 1e-3)
        opt.step()
    opt.zero_grad()
    dense(x).sum().backward()
    torch.nn.utils.clip_grad_norm_(dense.parameters(), 1e-3)
    with pytest.raises(ConfigError, match="changed in place after loss.backward.*synchronize"):
        opt.step()


def test_a_scheduler_made_on_the_wrapped_optimizer_is_warned(job, capfd):
    """A port keeps ``sched = StepLR(inner)`` and wraps ``inner``: the scheduler halves the
    dense rate and never the tables' (the DistributedOptimizer's last group), which trained
    the tables at the start rate, silently. Oracle: the rates after one scheduler step; a
    scheduler on the DistributedOptimizer is not warned of."""
    model = torch.nn.Linear(2, 1).double()
    inner = torch.optim.SGD(model.parameters(), lr=0.4)
    sched = torch.optim.lr_scheduler.StepLR(inner, step_size=1, gamma=0.5)
    opt = pt.DistributedOptimizer(inner, model)
    assert "the torch optimizer has a learning-rate scheduler: it schedules the dense " \
        "parameters only" in capfd.readouterr().err
    tables = opt.param_groups[-1]["lr"]
    opt.zero_grad()
    model(torch.ones(1, 2, dtype=torch.float64)).sum().backward()
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.2 and opt.param_groups[-1]["lr"] == tables
    pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.4), model)  # (a phase)
    assert "scheduler" not in capfd.readouterr().err


def test_a_lookup_before_the_optimizer_of_a_resumed_session_is_warned(tmp_path, capfd):
    """An inference script resumes a checkpoint and scores without making the
    DistributedOptimizer, which is what loads the dense weights: it scored with the initial
    ones, silently. Oracle: the weights then and after it is made (the checkpoint's)."""
    from pshybrid.torch import embedding

    step_dir, _ = _bn_checkpoint(tmp_path / "ck")
    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF, resume=step_dir,
            tables=[pt.Table("t", rows=10, dim=2, optimizer="sgd", dtype=torch.float64)])
    try:
        model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).double()
        initial = model[0].weight.detach().clone()
        capfd.readouterr()
        for _ in range(2):
            embedding.lookup("t", torch.tensor([1, 2]))
        err = capfd.readouterr().err
        assert err.count("pshybrid: warning: a lookup before the DistributedOptimizer") == 1
        pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        assert not torch.equal(model[0].weight, initial)  # loaded only now
        embedding.lookup("t", torch.tensor([1]))
        assert "warning" not in capfd.readouterr().err
    finally:
        pt.shutdown()


def _bn_session(resume):
    """A Linear + BatchNorm model (3 persistent buffers, 1 not) on a one-process session."""
    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF, resume=resume,
            tables=[pt.Table("t", rows=10, dim=2, optimizer="sgd", dtype=torch.float64)])
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).double()
    model.register_buffer("scratch", torch.ones(1), persistent=False)
    return model, pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)


def _bn_checkpoint(root):
    """Two steps of ``_bn_session``, checkpointed under ``root``: (step dir, its buffers)."""
    model, opt = _bn_session(None)
    try:
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(4, 3, dtype=torch.float64)).sum().backward()
            opt.step()
        model.scratch.fill_(5.0)
        saved = {n: b.clone() for n, b in model.named_buffers()}
        return pt.checkpoint(str(root)), saved
    finally:
        pt.shutdown()


def test_a_checkpoint_keeps_the_models_buffers(tmp_path):
    """A BatchNorm's running statistics were lost across a resume (the checkpoint held
    ``named_parameters`` only): eval predictions of the resumed model were 3% off. Oracle:
    save -> load == identity, buffer by buffer (a state_dict's: non-persistent ones are
    not kept); a buffer whose shape changed is refused by name."""
    from pshybrid.errors import InputError

    step, saved = _bn_checkpoint(tmp_path / "ck")
    assert saved["1.num_batches_tracked"] == 2 and saved["1.running_mean"].abs().sum() > 0
    model, _ = _bn_session(step)
    try:
        got = dict(model.named_buffers())
        assert set(got) == set(saved)
        for n in ("1.running_mean", "1.running_var", "1.num_batches_tracked"):
            assert torch.equal(got[n], saved[n]), n
        assert got["scratch"].item() == 1.0  # (not persistent: not in the checkpoint)
    finally:
        pt.shutdown()
    from pshybrid.export import export

    export(step, str(tmp_path / "e.h5"))
    with h5py.File(tmp_path / "e.h5") as f:
        assert sorted(f["buffers"]) == ["1.num_batches_tracked", "1.running_mean",
                                         "1.running_var"]
        assert np.array_equal(f["buffers/1.running_var"][...], saved["1.running_var"].numpy())
    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF, resume=step,
            tables=[pt.Table("t", rows=10, dim=2, optimizer="sgd", dtype=torch.float64)])
    try:
        model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2),
                                    torch.nn.BatchNorm1d(2, affine=False)).double()
        with pytest.raises(InputError, match="buffer '2.running_mean' is missing"):
            pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    finally:
        pt.shutdown()


def test_a_resume_without_the_models_buffers_says_so(tmp_path, capsys):
    """A checkpoint written before buffers were kept: they stay as the model made them,
    and worker 0 says so in one line (it resumed silently, the statistics started over)."""
    step, _ = _bn_checkpoint(tmp_path / "ck")
    with h5py.File(f"{step}/dense.h5", "a") as f:
        del f["buffers"]
    capsys.readouterr()
    model, _ = _bn_session(step)
    try:
        assert model[1].running_mean.abs().sum() == 0 and model[1].num_batches_tracked == 0
        err = capsys.readouterr().err
        assert ("dense.h5 holds none of the model's 3 buffers (1.running_mean, "
                "1.running_var, 1.num_batches_tracked)" in err and "start over" in err), err
    finally:
        pt.shutdown()


def test_a_new_distributed_optimizer_between_backward_and_step_is_refused(job):
    """Its buckets' requests were dropped: the next step applied the gradient's sum, W
    times too large (zeros on a GPU after synchronize); gradients accumulated under
    ``no_sync`` were applied unaveraged. ``synchronize`` inside ``no_sync`` is refused."""
    from pshybrid.errors import ConfigError

    model = torch.nn.Linear(3, 1).double()
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    model(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
    with pytest.raises(ConfigError, match="has not been stepped"):
        pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    opt.step()
    with opt.no_sync():  # (held gradients: the new one would apply this worker's own sum)
        model(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
        with pytest.raises(ConfigError, match="synchronize: once per step, after its last "
                           r"backward \(outside no_sync\)"):
            opt.synchronize()
    with pytest.raises(ConfigError, match="accumulated under no_sync"):
        pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    model(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
    opt.step()
    pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)  # (now fine)


@pytest.mark.parametrize("who", ["opt", "model"])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_parameter_no_backward_reaches_is_stepped_as_plain_pytorch_steps_it(job, who,
                                                                             set_to_none):
    """With ``find_unused_parameters``: after ``opt.zero_grad(set_to_none)`` or
    ``model.zero_grad(set_to_none)`` a layer the step's backward does not reach is skipped
    (None) or stepped with a zero gradient (Adam's moments move it), as plain PyTorch does
    with the same ``zero_grad``; oracle: a plain PyTorch twin, to 1e-12. The second step
    reaches the ``b`` layer no more."""
    torch.manual_seed(3)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(3, 1), "b": torch.nn.Linear(3, 1)}).double()
    twin = copy.deepcopy(model)
    opt = pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1), model,
                                  find_unused_parameters=True)
    ref = torch.optim.Adam(twin.parameters(), lr=0.1)
    x = torch.ones(2, 3, dtype=torch.float64)
    for step in range(3):
        for m, o in ((model, opt), (twin, ref)):
            (o if who == "opt" else m).zero_grad(set_to_none=set_to_none)
            y = m["a"](x) + (m["b"](x) if step == 0 else 0)
            y.sum().backward()
            o.step()
    moved = (model["b"].weight - twin["b"].weight).abs().max().item()
    assert all(torch.allclose(p, q, rtol=1e-12, atol=0) for p, q in
               zip(model.parameters(), twin.parameters())), moved


def test_a_grad_scaler_is_refused_without_synchronize_and_a_table_overflow_skips(job):
    """``scaler.step(opt)`` without ``opt.synchronize(scaler)`` trained the tables on
    gradients ``scale`` times too large: refused, and so is ``synchronize`` after
    ``scaler.unscale_``. A table gradient that overflows while the dense ones do not skips
    the whole step (the dense gradients made NaN: every worker's scaler agrees): nothing
    moves, the scale halves; after ``opt.zero_grad()`` the next step is taken."""
    from pshybrid.errors import ConfigError
    from pshybrid.torch.session import session

    lin = torch.nn.Linear(3, 1).double()
    emb = pt.Embedding("t")
    opt = pt.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), lin)
    scaler = cpu_scaler(init_scale=4.0)
    x, ids = torch.ones(2, 3, dtype=torch.float64), torch.tensor([1, 2])

    def backward(big: float):
        opt.zero_grad()
        scaler.scale(lin(x).sum() + (emb(ids) * big).sum()).backward()

    backward(1.0)
    with pytest.raises(ConfigError, match=r"call opt.synchronize\(scaler\) after the backward"):
        scaler.step(opt)
    scaler.unscale_(opt)
    with pytest.raises(ConfigError, match=r"synchronize\(scaler\): call it before "
                       r"scaler.unscale_\(opt\)"):
        opt.synchronize(scaler)
    opt.step()  # (the refused step's own, to go on)
    scaler.update()
    table, weight = session().mode.full_table().copy(), lin.weight.detach().clone()
    scale = scaler.get_scale()
    backward(1e308)  # (d loss / d rows = scale * 1e308: not finite; the dense ones are)
    opt.synchronize(scaler)
    scaler.step(opt)
    scaler.update()
    assert (pt.steps_done(), scaler.get_scale()) == (1, scale / 2)
    assert np.array_equal(session().mode.full_table(), table)
    assert torch.equal(lin.weight, weight)
    lin.zero_grad()  # (not the optimizer's: the skipped step is still pending)
    with pytest.raises(ConfigError, match=r"call opt.zero_grad\(\), not model.zero_grad"):
        lin(x).sum().backward()
    backward(1.0)
    with pytest.raises(ConfigError, match=r"call opt.synchronize\(scaler\) after the "):
        scaler.step(opt)  # (the skipped step's synchronize counts no more)
    opt.synchronize(scaler)
    with pytest.raises(ConfigError, match=r"call scaler.step\(opt\) .*, not opt.step\(\)"):
        opt.step()
    scaler.step(opt)
    assert pt.steps_done() == 2 and not torch.equal(lin.weight, weight)
    rows = session().mode.full_table()[1:3, :2] - table[1:3, :2]
    assert np.allclose(rows, -SPARSE_LR["sgd"] * 1.0, rtol=1e-12), rows  # unscaled gradient


@pytest.mark.parametrize("staged", [False, True], ids=["cpu", "gpu-path"])
def test_accumulation_habits_match_plain_pytorch(job, staged):
    """Gradient accumulation in one process against a plain PyTorch twin, to 1e-12: nested
    ``no_sync`` contexts (the inner one's exit ended the outer one: its next backward was
    reduced, and the step's last refused), and ``model.zero_grad()`` between micro-batches
    (a layer reached only by the dropped micro-batch was still stepped). ``staged``: the
    GPU path (each gradient copied to the host buffer once a step, ``b``'s, reached only
    inside ``no_sync``, at the step), on CPU tensors."""
    torch.manual_seed(5)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(3, 1), "b": torch.nn.Linear(3, 1)}).double()
    twin = copy.deepcopy(model)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    opt.on_cpu = not staged
    ref = torch.optim.SGD(twin.parameters(), lr=0.1)
    x = torch.ones(2, 3, dtype=torch.float64)
    for m, o in ((model, opt), (twin, ref)):
        sync = opt.no_sync if o is opt else contextlib.nullcontext
        o.zero_grad()
        with sync():
            with sync():
                (m["a"](x) + m["b"](x)).sum().backward()
            (2 * m["a"](x)).sum().backward()
        m["a"](x).sum().backward()
        o.step()
        o.zero_grad()
        with sync():
            (m["a"](x) + m["b"](x)).sum().backward()
        m.zero_grad()  # (drops b's gradient: plain PyTorch skips b)
        m["a"](x).sum().backward()
        o.step()
    assert all(torch.allclose(p, q, rtol=1e-12, atol=0) for p, q in
               zip(model.parameters(), twin.parameters()))


def test_a_new_phase_goes_on_at_the_tables_rate_of_the_moment(job):
    """A second ``DistributedOptimizer`` reported the ``pt.Table`` rate while the servers
    trained at the one a scheduler had set last. Oracle: a row's change / its gradient
    (plain SGD on the table, gradient 1)."""
    from pshybrid.torch.session import session

    lin, emb = torch.nn.Linear(2, 1).double(), pt.Embedding("t")
    ids = torch.tensor([1, 2])

    def step(opt):
        before = session().mode.full_table()[1:3, :2].copy()
        opt.zero_grad()
        (lin(emb(ids)).sum() * 0 + emb(ids).sum()).backward()
        opt.step()
        return before - session().mode.full_table()[1:3, :2]

    first = pt.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), lin)
    first.param_groups[-1]["lr"] = 0.02  # (as a scheduler sets it)
    assert np.allclose(step(first), 0.02, rtol=1e-12)
    first.param_groups[-1]["lr"] = 0.01  # (after the step: opt.step(); sched.step())
    second = pt.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), lin)
    assert second.param_groups[-1]["lr"] == 0.01
    assert np.allclose(step(second), 0.01, rtol=1e-12)


def _two_layer_run(root, steps, resume=None, make=None, when=(0, 3)):
    """``steps`` steps (``find_unused_parameters``) of ``make``'s torch optimizer (Adam) on
    layers a (every step) and b (the steps ``when`` alone), a squared loss (gradients that
    change step to step), from ``resume``; -> (step dir of a checkpoint, parameters)."""
    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF, resume=resume,
            tables=[pt.Table("t", rows=10, dim=2, optimizer="sgd", dtype=torch.float64)])
    try:
        torch.manual_seed(5)
        model = torch.nn.ModuleDict({"a": torch.nn.Linear(3, 1),
                                     "b": torch.nn.Linear(3, 1)}).double()
        torch_opt = (make or (lambda ps: torch.optim.Adam(ps, lr=0.1)))(model.parameters())
        opt = pt.DistributedOptimizer(torch_opt, model, find_unused_parameters=True)
        x = torch.ones(2, 3, dtype=torch.float64)
        for t in range(pt.steps_done(), steps):
            opt.zero_grad()
            ((model["a"](x) + (model["b"](x) if t in when else 0)) ** 2).sum().backward()
            opt.step()
        return pt.checkpoint(str(root)), [p.detach().clone() for p in model.parameters()]
    finally:
        pt.shutdown()


def test_a_resume_keeps_each_parameters_own_adam_step(tmp_path):
    """A layer no step reached since step 0 resumed with Adam's step the run's (2, not 1)
    and its bias correction went wrong at its next step (find_unused_parameters; 1.1%
    off). Oracle: checkpoint at step 2 -> resume -> step 4 == 4 steps uninterrupted."""
    from pshybrid.errors import InputError

    _, want = _two_layer_run(tmp_path / "whole", 4)
    step, _ = _two_layer_run(tmp_path / "part", 2)
    _, got = _two_layer_run(tmp_path / "part", 4, resume=step)
    assert all(torch.allclose(p, q, rtol=1e-13, atol=0) for p, q in zip(got, want))
    from pshybrid.export import export

    export(step, str(tmp_path / "e.h5"))  # (the counts go with the export)
    with h5py.File(tmp_path / "e.h5") as f:
        assert json.loads(f.attrs["param_steps"]) == {"a.weight": 2, "a.bias": 2,
                                                      "b.weight": 1, "b.bias": 1}
    for bad, why in (('{"a.weight": -1}', "is not a JSON object of counts >= 0"),
                     ('{"c.weight": 1}', "names 'c.weight', not a parameter")):
        with h5py.File(f"{step}/dense.h5", "a") as f:
            f.attrs["param_steps"] = bad
        with pytest.raises(InputError, match=f"attribute param_steps {why}"):
            _two_layer_run(tmp_path / "part", 4, resume=step)
        with pytest.raises(InputError, match=f"attribute param_steps {why}"):
            export(step, str(tmp_path / "e2.h5"))


def test_a_grad_scaler_step_that_reaches_the_tables_alone(job):
    """With ``find_unused_parameters`` every dense ``.grad`` stays None on a step whose
    loss reaches the tables alone: the scaler found nothing to check and raised ('No inf
    checks were recorded'). The tables' rows move by the unscaled gradient (sgd, its rate)."""
    from pshybrid.torch.session import session

    lin, emb = torch.nn.Linear(3, 1).double(), pt.Embedding("t")
    opt = pt.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), lin,
                                  find_unused_parameters=True)
    scaler = cpu_scaler(init_scale=8.0)
    table, weight = session().mode.full_table().copy(), lin.weight.detach().clone()
    opt.zero_grad()
    scaler.scale(emb(torch.tensor([3])).sum()).backward()
    opt.synchronize(scaler)
    scaler.step(opt)
    scaler.update()
    moved = table[3, :2] - session().mode.full_table()[3, :2]
    assert pt.steps_done() == 1 and torch.equal(lin.weight, weight) and lin.weight.grad is None
    assert np.allclose(moved, SPARSE_LR["sgd"], rtol=1e-12), moved


def test_a_session_catches_the_batch_systems_signals_and_gives_them_back():
    """pt.init catches SIGTERM and SIGUSR1 on its rank (a stop at a step boundary: whole
    jobs in tests/test_signal_jobs.py) and leaves SIGINT to Python (KeyboardInterrupt); a
    run no signal stopped gives back the handlers it found."""
    import signal

    def mine(signum, frame):
        pass

    before, ctrl_c = signal.signal(signal.SIGUSR1, mine), signal.getsignal(signal.SIGINT)
    try:
        pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF,
                tables=[pt.Table("t", rows=10, dim=2)])
        caught = signal.getsignal(signal.SIGTERM)
        assert caught == signal.getsignal(signal.SIGUSR1) and caught not in (
            mine, signal.SIG_DFL) and signal.getsignal(signal.SIGINT) == ctrl_c
        model = torch.nn.Linear(2, 1).float()  # (the table's dtype)
        opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        model(pt.Embedding("t")(torch.tensor([1, 2]))).sum().backward()
        opt.step()
        assert not pt.stop_requested()
        pt.shutdown()
        assert signal.getsignal(signal.SIGUSR1) is mine
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_checkpoint_keeps_the_scripts_state_and_every_groups_settings(tmp_path):
    """save -> load == identity: ``pt.checkpoint(state=)`` -> ``pt.resumed_state()`` (tuples
    come back as lists; ``{}`` on a fresh run), and each param group's settings as torch's
    ``load_state_dict`` restores them (a StepLR's rates of that step, dense and embeddings,
    so the resumed scheduler continues from them: they restarted at the code's rates). A
    state that is not JSON is refused naming the place, nothing written; a second
    checkpoint at the step (a periodic one without state, then the stop's with it, after a
    ``sched.step()``) writes its state and the rates of the moment (it returned the first's
    path and dropped them: the resume stepped at twice the rate), and a third, its dict
    changed in place since, that change."""
    import os

    from pshybrid.errors import ConfigError

    ck = str(tmp_path / "ck")
    state = {"epoch": 2, "pair": (1, 2.5), "name": "x", "nested": {"a": [True, None]}}

    def start(resume=None):
        pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF, resume=resume,
                tables=[pt.Table("t", rows=10, dim=2, lr=0.2, dtype=torch.float64)])
        model = torch.nn.Linear(2, 1).double()
        opt = pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01,
                                                       betas=(0.8, 0.9)), model)
        return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    model, opt, sched = start()
    try:
        for _ in range(2):
            opt.zero_grad()
            model(pt.Embedding("t")(torch.tensor([1, 3]))).sum().backward()
            opt.step()
            sched.step()
        assert pt.resumed_state() == {}
        for bad, want in [({"w": torch.ones(1)}, "state['w'] is a Tensor, not JSON"),
                          ({"s": [{1: 2}]}, "state['s'][0]: key 1 is not a string"),
                          ([1], "state must be a dict")]:
            with pytest.raises(ConfigError, match=re.escape(want)):
                pt.checkpoint(ck, state=bad)
        assert not os.path.exists(ck)
        first = pt.checkpoint(ck)
        sched.step()
        given = dict(state, scheduler=sched.state_dict(), epoch=1)
        assert pt.checkpoint(ck, state=given) == first == os.path.join(ck, "step-2")
        given["epoch"] = 2
        pt.checkpoint(ck, state=given)
        rates = [g["lr"] for g in opt.param_groups]
    finally:
        pt.shutdown()
    assert rates == [0.01 / 8, 0.2 / 8]
    model, opt, sched = start(resume=ck)
    try:
        kept = pt.resumed_state()
        sched.load_state_dict(kept.pop("scheduler"))
        assert kept == dict(state, pair=[1, 2.5])
        assert [g["lr"] for g in opt.param_groups] == rates
        assert opt.param_groups[0]["betas"] == (0.8, 0.9)
        sched.step()
        assert [g["lr"] for g in opt.param_groups] == [r / 2 for r in rates]
    finally:
        pt.shutdown()


def test_a_scheduler_made_after_the_resume_gets_the_checkpoints_rates_back(tmp_path, capfd):
    """LambdaLR's constructor sets every rate to ``initial_lr x lambda(0)``, over the rates
    the resume's DistributedOptimizer restored: its ``load_state_dict`` does not put them
    back, so the resumed run stepped at the base rate. ``opt.restore_settings()`` after it
    does (plain PyTorch: ``opt.load_state_dict`` after making the scheduler); without it the
    first step warns, naming the setting."""
    ck = str(tmp_path / "ck")

    def session(resume=None, restore=False):
        pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF, resume=resume,
                tables=[pt.Table("t", rows=10, dim=2, dtype=torch.float64)])
        try:
            model = torch.nn.Linear(2, 1).double()
            opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5 ** t)
            if resume:
                sched.load_state_dict(pt.resumed_state()["scheduler"])
                if restore:
                    opt.restore_settings()
            for _ in range(1 if resume else 3):
                rates = [g["lr"] for g in opt.param_groups]
                opt.zero_grad()
                model(pt.Embedding("t")(torch.tensor([1]))).sum().backward()
                opt.step()
                sched.step()
            if not resume:
                pt.checkpoint(ck, state={"scheduler": sched.state_dict()})
            return rates
        finally:
            pt.shutdown()

    session()
    capfd.readouterr()
    assert session(ck, restore=True) == [0.1 / 8, 0.05 / 8]  # step 4's rates
    assert "warning" not in capfd.readouterr().err
    assert session(ck) == [0.1, 0.05]
    assert ("warning: at the first step after the resume, param group 0's lr is 0.1 where "
            "the checkpoint's was 0.0125" in capfd.readouterr().err)
