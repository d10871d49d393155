"""Bounded staleness (``--consistency ssp:K|asp``, ``--cache-rows``): the ssp:K bound on
every row a worker reads, with one worker slowed down; asp applies every pushed gradient
exactly once; a checkpoint is a BSP point that a resumed run continues exactly.

The bound's oracle: plain SGD with lr 1 and every embedding gradient forced to -1 adds
exactly 1 to every element of a row per occurrence of its id in a global batch, so a row
read at step t holds ``init + k`` with k the number of updates it reflects; the data say
how many occurrences the steps before ``t - K`` (must be reflected) and before ``t`` (can
be, at most) hold.
"""

import io
import time
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI
from mpi_util import assert_all
from test_train_mpi import BASE, DATA, rel_err, run

import pshybrid.train as train_module
from pshybrid.batches import BatchPlan, worker_batches
from pshybrid.layers import ParamSpace
from pshybrid.models import build_model
from pshybrid.modes.step import Mode
from pshybrid.registry import cache_serves
from pshybrid.store import EmbeddingStore

CFG = replace(BASE, mode="hybrid", sparse_optimizer="sgd", lr=1.0, steps=10, servers=1)


def _cumulative_occurrences(cfg, W: int):
    """cum[s, r]: occurrences of fused row r in the global batches of steps < s."""
    _, layout = build_model(cfg.model, DATA.schema, cfg.embedding_dim, cfg.mlp, ParamSpace(),
                            cfg.dtype, cfg.cross_layers)
    G = W * cfg.batch_size
    plan = BatchPlan(None, G, cfg.shuffle, cfg.seed)
    cum = np.zeros((cfg.steps + 1, layout.table.rows), np.int64)
    for t, (_, _, ids) in enumerate(worker_batches(DATA, plan, 0, cfg.steps, 0, G, layout)):
        cum[t + 1] = cum[t] + np.bincount(ids.ravel(), minlength=layout.table.rows)
    return cum


class _MinusOne:
    """A model whose embedding gradient is -1 everywhere (dense gradients as usual)."""

    def __init__(self, model):
        self.model = model

    def forward(self, dense, emb):
        return self.model.forward(dense, emb)

    def backward(self, dz):
        return -np.ones_like(self.model.backward(dz))


def _instrument(monkeypatch, reads):
    """Record every training read (step, ids, emb) and force the -1 gradients."""
    lookup, build = Mode.lookup, train_module.build_model

    def recorded(self, batch):
        emb = lookup(self, batch)
        if self.stale is not None and batch is self.stale.current:
            reads.append((self.stale.step, batch.ids.copy(), np.array(emb)))
        return emb

    def minus_one(*args):
        model, layout = build(*args)
        return _MinusOne(model), layout

    monkeypatch.setattr(Mode, "lookup", recorded)
    monkeypatch.setattr(train_module, "build_model", minus_one)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("bound,cache_rows,shared,prefetch", [
    (1, 0, "off", None), (0, 60, "off", None), (2, 60, "off", 2), (3, 60, "on", None)])
def test_every_read_meets_the_ssp_bound_with_a_slow_worker(comm, monkeypatch, bound,
                                                           cache_rows, shared, prefetch):
    """(--prefetch 2: the batches and their plans made on the data thread.) With a cache
    that can serve (``registry.cache_serves``) the reads reach the bound; without one, or
    with a cache that cannot (ssp:0), no cached row is served and the staleness is the
    pull-ahead's alone (1, or 0 at ssp:0)."""
    cfg = replace(CFG, consistency=f"ssp:{bound}", cache_rows=cache_rows, shared_memory=shared,
                  prefetch=prefetch)
    W = comm.size - 1
    init = run(replace(cfg, mode="allreduce", servers=0, steps=0, consistency="bsp",
                       cache_rows=0), MPI.COMM_SELF).table
    cum = _cumulative_occurrences(cfg, W)
    reads = []
    _instrument(monkeypatch, reads)
    slow = comm.rank == 1  # a worker (the server is the highest rank)
    got = run(cfg, comm) if not slow else \
        train_module.train(cfg, comm, dataset=DATA, collect=True, out=io.StringIO(),
                           on_step=lambda done: time.sleep(0.02))
    ok, msg, stale = True, "", 0
    for t, ids, emb in reads:
        k = emb - init[ids]
        kr = np.round(k)
        lower, upper = cum[max(t - bound, 0)][ids][..., None], cum[t][ids][..., None]
        if np.abs(k - kr).max() > 1e-6 or (kr < lower).any() or (kr > upper).any():
            i = tuple(np.argwhere((kr < lower) | (kr > upper) | (np.abs(k - kr) > 1e-6))[0])
            ok, msg = False, (f"step {t}: row {ids[i[:2]]} reflects {k[i]} updates, not in "
                              f"[{lower[i[:2]][0]}, {upper[i[:2]][0]}]")
            break
        stale += int((kr < upper).sum())
    if got.role == "worker":
        if len(reads) != cfg.steps:
            ok, msg = False, f"{len(reads)} training reads recorded, not {cfg.steps}"
        tr = got.summary.get("reads", {}) if comm.rank == 0 else {}
        serves = cache_rows and cache_serves(cfg.consistency)
        if comm.rank == 0 and (tr["max_staleness"] != bound if serves else
                               tr["max_staleness"] != min(bound, 1) or tr["cache_hit_rate"]):
            ok, msg = False, f"reported reads: {tr}"
    total_stale = comm.allreduce(stale)
    if bound and cache_rows and not total_stale:  # else the bound was never put to the test
        ok, msg = False, "no read was stale: the instrument cannot tell ssp from bsp"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("shared", ["off", "on"])
def test_asp_applies_every_pushed_gradient_once(comm, monkeypatch, shared):
    """asp with a cache: the final table == the initial one - lr * the sum of every gradient
    row any worker pushed (recorded), and differs from bsp's (reads were stale)."""
    cfg = replace(CFG, consistency="asp", cache_rows=60, lr=0.2, shared_memory=shared,
                  servers=1 if comm.size <= 3 else 2)
    init = run(replace(cfg, mode="allreduce", servers=0, steps=0, consistency="bsp",
                       cache_rows=0), MPI.COMM_SELF).table
    bsp = run(replace(cfg, consistency="bsp", cache_rows=0), comm)
    pushed = []
    push = EmbeddingStore.push

    def recorded(self, table, ids, grads, scale=1.0, **kw):
        if table == "sparse":
            pushed.append((ids.unique.copy(), np.array(grads) * scale))
        return push(self, table, ids, grads, scale=scale, **kw)

    monkeypatch.setattr(EmbeddingStore, "push", recorded)
    got = run(cfg, comm)
    every = comm.gather(pushed, root=0)
    ok, msg = True, ""
    if comm.rank == 0:
        expect = init.copy()
        for ids, delta in (p for worker in every for p in worker):
            np.add.at(expect, ids, delta)
        n = sum(len(w) for w in every)
        if n != (comm.size - cfg.servers) * cfg.steps:
            ok, msg = False, f"{n} pushes recorded"
        elif rel_err(got.table, expect) > 1e-12:
            ok, msg = False, f"table vs init + pushed: {rel_err(got.table, expect)}"
        elif rel_err(got.table, bsp.table) < 1e-9 or not got.summary["reads"]["cache_hit_rate"]:
            ok, msg = False, "asp ran as bsp: no stale read, no cache hit"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,sparse_opt", [("hybrid", "adagrad"), ("ps", "adam")])
def test_checkpoint_is_a_bsp_point_resume_continues_exactly(comm, mpi_tmp_path, mode,
                                                             sparse_opt):
    """ssp:2 with a cache, checkpointing at step 4: a run resumed from that checkpoint ends
    with the parameters and losses of the straight run (same-node reads: deterministic)."""
    cfg = replace(BASE, mode=mode, servers=1, sparse_optimizer=sparse_opt, steps=8,
                  log_every=1, consistency="ssp:2", cache_rows=60, shared_memory="on")
    ck, ck2 = str(mpi_tmp_path / f"a-{mode}"), str(mpi_tmp_path / f"b-{mode}")
    straight = run(replace(cfg, checkpoint_dir=ck, checkpoint_every=4), comm)
    run(replace(cfg, steps=4, checkpoint_dir=ck2), comm)
    resumed = run(replace(cfg, resume=ck2), comm)
    bsp = run(replace(cfg, consistency="bsp", cache_rows=0), comm)
    ok, msg = True, ""
    if comm.rank == 0:
        errs = {"table": rel_err(resumed.table, straight.table),
                "dense": rel_err(resumed.dense, straight.dense),
                "loss": rel_err(np.array([r["loss"] for r in resumed.log]),
                                np.array([r["loss"] for r in straight.log[4:]]))}
        if max(errs.values()) > 1e-12:
            ok, msg = False, f"resumed vs straight: {errs}"
        elif rel_err(straight.table, bsp.table) < 1e-9:
            ok, msg = False, "ssp:2 gave bsp's parameters: nothing was stale"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("consistency", ["ssp:4", "asp"])
def test_a_bound_beyond_one_without_a_cache_is_ssp_1(comm, consistency):
    """Without --cache-rows only the pull-ahead is stale: ssp:K (K >= 2) and asp end with
    ssp:1's parameters, bit for bit (same-node reads: deterministic), and differ from
    bsp's; the plan's note (``report._hot_notes``) says so."""
    cfg = replace(BASE, servers=1, steps=8, shared_memory="on", consistency=consistency)
    got, one = run(cfg, comm), run(replace(cfg, consistency="ssp:1"), comm)
    bsp = run(replace(cfg, consistency="bsp"), comm)
    ok, msg = True, ""
    if comm.rank == 0:
        if rel_err(got.table, one.table) or rel_err(got.dense, one.dense):
            ok, msg = False, f"{consistency} without a cache is not ssp:1's run"
        elif rel_err(got.table, bsp.table) < 1e-9:
            ok, msg = False, "ssp:1 gave bsp's parameters: nothing was stale"
        elif got.summary["reads"]["max_staleness"] != 1:
            ok, msg = False, f"reported reads: {got.summary['reads']}"
    assert_all(comm, ok, msg)


@pytest.mark.parametrize("n", [64, 4096], ids=["small-cache", "large-cache"])  # both paths
def test_row_cache_admits_each_slots_best_candidate(n):
    """``RowCache.admit`` == the per-slot rule written out (the most frequent candidate, a
    resident refreshed on ties, then the first offered; it replaces the resident only if
    more frequent), over many steps of random offers; it no longer allocates a cache-sized
    array a step."""
    from pshybrid.modes.stale import RowCache

    rng = np.random.default_rng(0)
    cache = RowCache(n, 2, np.float64)
    want_ids, want_rows = np.full(n, -1), np.zeros((n, 2))
    for step in range(200):
        ids = np.unique(rng.zipf(1.3, 40) % 500)
        cache.count(ids)
        rows = rng.standard_normal((ids.size, 2))
        slots, freq = cache.slots(ids), cache.counts[cache._hash(ids, cache.counts.size, 17)]
        best = {}
        for i, (sl, f, v) in enumerate(zip(slots, freq, ids)):
            key = (2 * f + (want_ids[sl] == v), -i)
            if sl not in best or key > best[sl][0]:
                best[sl] = (key, i)
        for sl, (_, i) in best.items():
            cur = want_ids[sl]
            cur_f = cache.counts[cache._hash(np.array([max(cur, 0)]), cache.counts.size, 17)][0]
            if cur < 0 or cur == ids[i] or freq[i] > cur_f:
                want_ids[sl], want_rows[sl] = ids[i], rows[i]
        cache.admit(ids, rows, step)
        assert np.array_equal(cache.ids, want_ids) and np.array_equal(cache.rows, want_rows)
