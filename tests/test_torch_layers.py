"""pshybrid.torch's lookups against NumPy references, in one process (``allreduce`` mode on
COMM_SELF: the fused table on the worker): Embedding of two tables of different widths and
EmbeddingBag sum / mean, forward values and the SGD update their gradients make; the
collections (several tables in one lookup) against one module per table."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mpi4py import MPI

import pshybrid.torch as pt
from pshybrid.errors import InputError
from pshybrid.torch.session import session

LR = 0.5


@pytest.fixture
def job():
    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF,
            tables=[pt.Table("a", rows=20, dim=3, optimizer="sgd", lr=LR, dtype=torch.float64),
                    pt.Table("b", rows=9, dim=5, optimizer="sgd", lr=LR, dtype=torch.float64)])
    dummy = torch.nn.Linear(1, 1).double()
    opt = pt.DistributedOptimizer(torch.optim.SGD(dummy.parameters(), lr=0.1), dummy)
    yield session(), opt
    pt.shutdown()


def test_embedding_rows_and_their_update(job):
    s, opt = job
    t0 = s.mode.full_table().copy()
    assert t0.shape == (29, 5)  # "a" is padded to the fused width: columns 3, 4 never move
    ia = torch.tensor([[1, 4, 1], [0, 19, 4]])
    ib = torch.tensor([8, 0, 8, 8])
    ea, eb = pt.Embedding("a")(ia), pt.Embedding("b")(ib)
    np.testing.assert_array_equal(ea.detach().numpy(), t0[ia.numpy(), :3])
    np.testing.assert_array_equal(eb.detach().numpy(), t0[20 + ib.numpy()])
    rng = np.random.default_rng(0)
    ra, rb = rng.standard_normal(ea.shape), rng.standard_normal(eb.shape)
    loss = (ea * torch.from_numpy(ra)).sum() + (eb * torch.from_numpy(rb)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    want = t0.copy()
    np.add.at(want, ia.numpy().ravel(), np.pad(-LR * ra.reshape(-1, 3), ((0, 0), (0, 2))))
    np.add.at(want, 20 + ib.numpy(), -LR * rb)
    np.testing.assert_allclose(s.mode.full_table(), want, rtol=0, atol=1e-15)
    assert s.step == 1


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_against_numpy(job, mode):
    s, opt = job
    t0 = s.mode.full_table()[:20, :3].copy()
    values = torch.tensor([3, 3, 7, 0, 19, 5, 5, 5])
    offsets = torch.tensor([0, 3, 3, 5])  # bags [3 3 7] [] [0 19] [5 5 5]
    out = pt.EmbeddingBag("a", mode=mode)(values, offsets)
    bounds = [0, 3, 3, 5, 8]
    want, grad = np.zeros((4, 3)), np.zeros((20, 3))
    r = np.random.default_rng(1).standard_normal((4, 3))
    for i in range(4):
        rows = values.numpy()[bounds[i]:bounds[i + 1]]
        scale = 1.0 / max(len(rows), 1) if mode == "mean" else 1.0
        want[i] = t0[rows].sum(0) * scale
        np.add.at(grad, rows, np.broadcast_to(r[i] * scale, (len(rows), 3)))
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-14, atol=1e-15)
    opt.zero_grad()
    (out * torch.from_numpy(r)).sum().backward()
    opt.step()
    np.testing.assert_allclose(s.mode.full_table()[:20, :3], t0 - LR * grad, rtol=0,
                               atol=1e-14)


def _train_tables(collections: bool, sparse_opt: str, steps: int = 3):
    """3 steps of a loss over tables a (dim 3), b (dim 5) by ids and c (dim 2) by bags,
    looked up by one ``pt.Embedding``/``pt.EmbeddingBag`` per table or by an
    ``EmbeddingCollection`` of a, b and an ``EmbeddingBagCollection`` of c, a; step 1
    leaves b's rows out of the loss (their gradients None). -> (the fused table after,
    the ``prepare`` calls of each forward)."""
    pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF,
            tables=[pt.Table(n, rows=r, dim=d, optimizer=sparse_opt, lr=LR,
                             dtype=torch.float64) for n, r, d in (("a", 20, 3), ("b", 9, 5),
                                                                   ("c", 6, 2))])
    s = session()
    dummy = torch.nn.Linear(1, 1).double()
    opt = pt.DistributedOptimizer(torch.optim.SGD(dummy.parameters(), lr=0.1), dummy)
    calls, forwards, prepare = [], [], s.mode.prepare
    s.mode.prepare = lambda ids: calls.append(ids.size) or prepare(ids)
    rng = np.random.default_rng(3)
    try:
        for step in range(steps):
            ia, ib = torch.tensor(rng.integers(0, 20, (4, 2))), torch.tensor(rng.integers(0, 9, 4))
            bags = {"c": (torch.tensor([1, 5, 5, 0]), torch.tensor([0, 1, 1, 3])),
                    "a": (torch.tensor([2, 19]), torch.tensor([0, 0, 1, 2]))}
            before = len(calls)
            if collections:
                ea, eb = pt.EmbeddingCollection(["a", "b"])([ia, ib])
                ec, ea2 = pt.EmbeddingBagCollection(["c", "a"], mode="mean")(bags)
            else:
                ea, eb = pt.Embedding("a")(ia), pt.Embedding("b")(ib)
                ec, ea2 = (pt.EmbeddingBag(n, mode="mean")(*bags[n]) for n in ("c", "a"))
            forwards.append(len(calls) - before)
            loss = ea.square().sum() + ec.sum() * 0.5 + (ea2 @ torch.ones(3, 1).double()).sum()
            if step != 1:
                loss = loss + eb.sin().sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return s.mode.full_table(), forwards
    finally:
        s.mode.prepare = prepare
        pt.shutdown()


@pytest.mark.parametrize("sparse_opt", ["sgd", "adam"])
def test_collections_equal_one_module_per_table(sparse_opt):
    """Oracle: one ``pt.Embedding`` / ``pt.EmbeddingBag`` per table. The collections give
    the same tables after 3 steps (Adam: b's rows, left out of step 1's loss, get no update
    there, as an Embedding never used; a zero gradient sent would have moved them), with
    one ``prepare`` (one pull) per collection where the modules make one per table."""
    (want, per_table), (got, grouped) = (_train_tables(c, sparse_opt) for c in (False, True))
    np.testing.assert_array_equal(got, want)
    assert per_table == [4] * 3 and grouped == [2] * 3, (per_table, grouped)


def test_collection_inputs_and_misuse(job):
    """A (..., F) tensor is split by its last axis; a dict of bags is taken by name;
    wrong counts, names and kinds are one ``InputError`` naming the call."""
    s, _ = job
    t = s.mode.full_table()
    ids = torch.tensor([[1, 8], [19, 0]])
    ea, eb = pt.EmbeddingCollection(["a", "b"])(ids)
    np.testing.assert_array_equal(ea.detach().numpy(), t[[1, 19], :3])
    np.testing.assert_array_equal(eb.detach().numpy(), t[[28, 20]])
    for bad, match in ((torch.tensor([1, 2, 3]), r"ids of shape \(3,\): its last axis must "
                        r"have a column per table \(2\)"),
                       ([torch.tensor([1])], r"give one tensor of ids per table \(2: \['a', "
                        r"'b'\]\), got list of 1"),
                       ([torch.tensor([1]), np.array([1])], "ids of table 'b' must be a torch "
                        "tensor")):
        with pytest.raises(InputError, match=r"^pt.EmbeddingCollection: " + match):
            pt.EmbeddingCollection(["a", "b"])(bad)
    with pytest.raises(InputError, match=r"^pt.EmbeddingCollection: no table 'z'"):
        pt.EmbeddingCollection(["a", "z"])
    bags = pt.EmbeddingBagCollection(["a", "b"])
    with pytest.raises(InputError, match=r"no bags for table 'b' \(given \['a'\]\)"):
        bags({"a": (torch.tensor([1]), torch.tensor([0]))})
    with pytest.raises(InputError, match=r"table 'b': offsets must start at 0"):
        bags([(torch.tensor([1]), torch.tensor([0])), (torch.tensor([1]), torch.tensor([1]))])
    with pytest.raises(InputError, match=r"table 'a': give its bags as \(values, offsets\)"):
        bags([torch.tensor([1]), (torch.tensor([1]), torch.tensor([0]))])


@pytest.mark.parametrize("form", ["include_last_offset", "per_sample_weights", "2-d"])
def test_embedding_bag_takes_what_torchs_takes(job, form):
    """Oracle: ``torch.nn.EmbeddingBag`` over the same rows: the forward values and the
    SGD update its weight gradient makes, for offsets with the last one
    (``include_last_offset``), ``per_sample_weights`` and 2-D ids without offsets."""
    s, opt = job
    t0 = s.mode.full_table()[:20, :3].copy()
    values = torch.tensor([3, 3, 7, 0, 19, 5, 5, 5])
    kw, args = {}, (values, torch.tensor([0, 3, 3, 5]))
    mode = "mean" if form == "2-d" else "sum"
    if form == "include_last_offset":
        kw, args = {"include_last_offset": True}, (values, torch.tensor([0, 3, 3, 5, 8]))
    elif form == "per_sample_weights":
        args += (torch.linspace(-1, 2, 8, dtype=torch.float64),)
    else:
        args = (values.reshape(4, 2),)
    ref = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(t0.copy()), freeze=False,
                                                mode=mode, **kw)
    want = ref(*args)
    out = pt.EmbeddingBag("a", mode=mode, **kw)(*args)
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-14,
                               atol=1e-15)
    r = torch.from_numpy(np.random.default_rng(1).standard_normal(tuple(want.shape)))
    (want * r).sum().backward()
    opt.zero_grad()
    (out * r).sum().backward()
    opt.step()
    np.testing.assert_allclose(s.mode.full_table()[:20, :3],
                               t0 - LR * ref.weight.grad.numpy(), rtol=0, atol=1e-14)


def test_bad_input_names_the_table(job):
    with pytest.raises(InputError, match=r"table 'a': id 20 at position 1 is outside \[0, 20\)"):
        pt.Embedding("a")(torch.tensor([0, 20]))
    with pytest.raises(InputError, match="offsets must start at 0"):
        pt.EmbeddingBag("b")(torch.tensor([1, 2]), torch.tensor([1]))
    with pytest.raises(InputError, match=r"with include_last_offset, offsets end with the "
                       r"number of values \(2\), got \[1\]"):
        pt.EmbeddingBag("b", include_last_offset=True)(torch.tensor([1, 2]), torch.tensor([0, 1]))
    with pytest.raises(InputError, match="offsets must start at 0"):  # (before the slice)
        pt.EmbeddingBag("b", include_last_offset=True)(torch.tensor([1, 2]), torch.tensor([2]))
    for w in (None, torch.ones(2)):  # no bag: as torch's
        assert pt.EmbeddingBag("b")(torch.tensor([1, 2]), torch.tensor([], dtype=torch.int64),
                                    w).shape == (0, 5)
    with pytest.raises(InputError, match=r"values of shape \(2,\) need offsets"):
        pt.EmbeddingBag("b")(torch.tensor([1, 2]))
    with pytest.raises(InputError, match="per_sample_weights must be a floating tensor of the "
                       "values' shape, with mode 'sum'"):
        pt.EmbeddingBag("b", mode="mean")(torch.tensor([1, 2]), torch.tensor([0]),
                                          torch.ones(2))
    with pytest.raises(InputError, match="no table 'c'"):
        pt.Embedding("a").forward  # noqa: B018 - the module exists
        from pshybrid.torch.embedding import lookup
        lookup("c", torch.tensor([0]))


def test_misuse_is_one_error_naming_the_argument(job):
    """NumPy ids and an unknown table used to surface as AttributeError / KeyError from
    inside the lookup; a skipped ``opt.step()`` as an error about a layer applied twice;
    ``opt.no_sync()`` after a backward outside it, or a backward after ``synchronize()``
    (it added this worker's own gradient to the average), is named too."""
    from pshybrid.errors import ConfigError

    with pytest.raises(InputError, match=r"^pt.Embedding\('a'\): ids must be a torch tensor of "
                       r"integers, got numpy.ndarray \(torch.from_numpy\(ids\) makes one\)$"):
        pt.Embedding("a")(np.arange(3))
    with pytest.raises(InputError, match=r"^pt.EmbeddingBag\('b'\): offsets must be a torch "
                       "tensor of integers, got builtins.list$"):
        pt.EmbeddingBag("b")(torch.tensor([1, 2]), [0])
    for make in (pt.Embedding, pt.EmbeddingBag):
        with pytest.raises(InputError, match=rf"^pt.{make.__name__}\('nope'\): no table "
                           r"'nope'; pt.init made \['a', 'b'\]$"):
            make("nope")
    _, opt = job
    model = opt.model
    opt.zero_grad()
    model(torch.ones(2, 1, dtype=torch.float64)).sum().backward()
    with pytest.raises(ConfigError, match="a second backward pass reached parameter 'bias' "
                       r"before opt.step\(\): call opt.step\(\) after each loss.backward\(\)"):
        model(torch.ones(2, 1, dtype=torch.float64)).sum().backward()
    with pytest.raises(ConfigError, match=r"changed in place after loss.backward\(\) and "
                       r"before opt.step\(\) \(clipped, or a second backward\?\)"):
        opt.step()  # (the refused backward had added to 'bias': two batches' gradient)
    opt.zero_grad()
    opt.step()  # a zero gradient's step: the session goes on
    model(torch.ones(2, 1, dtype=torch.float64)).sum().backward()
    with pytest.raises(ConfigError, match=r"no_sync: a backward outside it \(or "
                       r"opt.synchronize\(\)\) already started this step's Allreduce"):
        with opt.no_sync():
            pass
    opt.step()
    with opt.no_sync():  # (all of a step's backward passes inside no_sync, then synchronize)
        model(torch.ones(2, 1, dtype=torch.float64)).sum().backward()
    opt.synchronize()
    with pytest.raises(ConfigError, match=r"already started this step's Allreduce"):
        with opt.no_sync():
            pass
    with pytest.raises(ConfigError, match=r"a backward pass after opt.synchronize\(\) and "
                       r"before opt.step\(\): step first"):
        model(torch.ones(2, 1, dtype=torch.float64)).sum().backward()
    opt.step()


@pytest.mark.parametrize("where,holder", [(dict(servers=0, mode="allreduce"), "1 worker"),
                                          (dict(placement="colocated"), "1 rank")])
def test_a_table_beyond_the_nodes_memory_is_refused_before_allocation(where, holder):
    """Oracle: ``limits.available_memory``; 10**12 rows of 16 float32 columns with
    Adagrad's slot (128 TB) used to fail in the shared-memory allocation."""
    from pshybrid.errors import ConfigError
    from pshybrid.limits import available_memory

    if available_memory() is None:
        pytest.skip("the node's available memory is unknown here")
    tables = [pt.Table("small", rows=10, dim=4), pt.Table("big", rows=10**12, dim=16)]
    with pytest.raises(ConfigError, match=r"^pt.init: not enough memory: the tables' "
                       r"1,000,000,000,010 rows x 16 columns x 2 slots \(adagrad\) need "
                       rf"119,209.3 GiB on this node \({holder}\), .* the largest is pt.Table "
                       r"'big' of 1,000,000,000,000 rows: give it fewer rows \(hash the ids\) "
                       rf"or more {'nodes' if 'placement' in where else 'servers'}$"):
        pt.init(comm=MPI.COMM_SELF, tables=tables, **where)
    pt.init(comm=MPI.COMM_SELF, tables=tables[:1], **where)  # nothing left behind
    pt.shutdown()


@pytest.mark.parametrize("seed", [2**32, -1, 1.5])
def test_a_seed_beyond_the_tables_32_bits_is_refused(seed):
    """Seed 2**32 initialised the very tables of seed 0 (the key takes 32 bits)."""
    from pshybrid.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^pt.init: seed {seed!r}: must be an integer from "
                       r"0 to 2\*\*32 - 1$"):
        pt.init(servers=0, mode="allreduce", comm=MPI.COMM_SELF, seed=seed,
                tables=[pt.Table("a", rows=4, dim=2)])


def test_a_second_optimizer_replaces_the_first(job):
    """A new ``DistributedOptimizer`` (a new training phase) takes over the session: the
    first one's gradient hooks are gone (they fired too and reported a second backward),
    and stepping the first is one clear error."""
    from pshybrid.errors import ConfigError

    s, first = job
    model = first.model
    second = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2), model)
    for _ in range(2):
        second.zero_grad()
        model(torch.ones(2, 1, dtype=torch.float64)).sum().backward()
        second.step()
    assert s.optimizer is second and first.hooks == []
    with pytest.raises(ConfigError, match="a newer DistributedOptimizer replaced this one"):
        first.step()


def test_a_second_optimizer_of_a_resumed_session_keeps_the_weights_as_trained(tmp_path):
    """The checkpoint a session resumes is loaded by its first ``DistributedOptimizer``:
    a second one (a new phase) starts from the weights the first trained (it reloaded the
    checkpoint's, losing the phase)."""
    tables = [pt.Table("a", rows=20, dim=3, lr=LR, dtype=torch.float64)]

    def phase(opt, model, emb, steps=1):
        for _ in range(steps):
            opt.zero_grad()
            model(emb(torch.tensor([1, 4, 19]))).square().sum().backward()
            opt.step()

    def start(**kw):
        pt.init(servers=0, mode="allreduce", seed=7, comm=MPI.COMM_SELF, tables=tables, **kw)
        model, emb = torch.nn.Linear(3, 1).double(), pt.Embedding("a")
        return model, emb, pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                   model)

    model, emb, opt = start()
    phase(opt, model, emb)
    pt.checkpoint(str(tmp_path / "ck"))
    pt.shutdown()
    try:
        model, emb, opt = start(resume=str(tmp_path / "ck"))
        resumed = model.weight.detach().clone()
        phase(opt, model, emb, 3)
        trained = model.weight.detach().clone()
        assert not torch.equal(trained, resumed)
        pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
        assert torch.equal(model.weight.detach(), trained)
    finally:
        pt.shutdown()
