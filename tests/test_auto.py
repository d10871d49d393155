"""--mode auto: the cost model's choice against a brute-force minimum over its priced table
with forced rates (serial), the same choice on every rank, the trial's choice == the least
measured seconds per sample among the alternatives it trained, and training under auto
equal to training with the fixed alternative it picked (MPI, BSP)."""

from __future__ import annotations

import io
import math
import os
from dataclasses import replace

import numpy as np
import pytest
from mpi_util import SHARED_MEMORY, assert_all

from pshybrid import auto, planner, trials
from pshybrid.config import TrainConfig
from pshybrid.errors import ConfigError, PshybridError
from pshybrid.synthetic import SyntheticCTR
from pshybrid.train import train

FAST = planner.Link(1e-6, 10e9)
RATES = planner.Rates(fwd_bwd=1e-3, dense_apply=1e-4, row_apply=50e-9, batch=2e-4,
                      allreduce=FAST, get=FAST, acc=FAST)
SHAPE = planner.Shape(ranks=4, nodes=1, servers=1, batch=256, E=17, P=100_000, itemsize=4,
                      server_opt=True, U=2500.0, union={4: 8000.0, 3: 6500.0},
                      hot_share={0: 0.0, 1024: 0.4}, hot_touched={(4, 1024): 300.0,
                                                                  (3, 1024): 280.0})


def brute_force(rows):
    """The oracle: the least seconds per sample over the rows not refused."""
    ok = [r for r in rows if r["refused"] is None]
    return min(ok, key=lambda r: r["step"] / (r["workers"] * SHAPE.batch))["key"]


@pytest.mark.parametrize("rates,refused,expected", [
    # an Allreduce 10^4 times slower than RMA: ps moves its dense weights through the owners
    (replace(RATES, allreduce=planner.Link(1e-2, 1e6)), {}, "ps colocated"),
    # one second per RMA message: only the allreduce mode sends none
    (replace(RATES, get=planner.Link(1.0, 10e9), acc=planner.Link(1.0, 10e9)), {}, "allreduce -"),
    # ... and with it refused (memory), the fewest messages: 1 server, hybrid; its 1024 hot
    # rows take 40% of the rows off the server's optimizer, which the step (the next batch,
    # the Allreduce, the dense optimizer) hides only in part
    (replace(RATES, get=planner.Link(1.0, 10e9), acc=planner.Link(1.0, 10e9), row_apply=1e-7),
     {"allreduce -": "not enough memory"}, "hybrid dedicated, --replicate-rows 1024"),
    # ... and without hot rows to offer
    (replace(RATES, get=planner.Link(1.0, 10e9), acc=planner.Link(1.0, 10e9)),
     {"allreduce -": "not enough memory", "hybrid dedicated, --replicate-rows 1024": "memory"},
     "hybrid dedicated"),
    # a sparse optimizer so slow that no rank hides it: spread over every rank, and the
    # 1024 hot rows (300 touched per step, 40% of the ids) cut the owners' rows
    (replace(RATES, row_apply=1e-4), {"allreduce -": "memory"},
     "hybrid colocated, --replicate-rows 1024"),
])
def test_forced_rates_pick_the_brute_force_minimum(rates, refused, expected):
    alts = planner.alternatives(SHAPE)
    alt, row, rows = planner.choose(alts, rates, SHAPE, refused)
    assert len(rows) == len(alts) == len({r["key"] for r in rows})
    assert alt.key == row["key"] == brute_force(rows) == expected
    assert all(r["refused"] == refused.get(r["key"]) for r in rows)


def test_price_terms_add_up_and_match_hand_arithmetic():
    """hybrid dedicated, 3 workers + 1 server: each term from the formulas by hand."""
    alt = planner.Alternative("hybrid", "dedicated", 0, 3, 1)
    t = planner.price(alt, replace(RATES, row_apply=1e-7), SHAPE)
    rows = 2500 * 17 * 4
    assert t["pull"] == pytest.approx(1e-6 + rows / 10e9)
    assert t["push"] == pytest.approx(2e-6 + 2500 * (8 + 17 * 4) / 10e9)
    ar = 2 * 2 / 3 * 400_000 / 10e9 + 2 * 2 * 1e-6
    assert t["allreduce"] == pytest.approx(ar)
    # the owners' apply, less what the workers do meanwhile: the Allreduce, the dense
    # optimizer and the next batch
    assert t["batch"] == pytest.approx(2e-4)
    assert t["server"] == pytest.approx(6500 * 1e-7 - ar - 1e-4 - 2e-4)
    assert t["server"] > 0
    parts = sum(v for k, v in t.items() if k not in ("step", "samples_per_s"))
    assert t["step"] == pytest.approx(parts)
    assert t["samples_per_s"] == pytest.approx(3 * 256 / t["step"])


def test_nothing_fits_is_an_error_naming_every_alternative():
    alts = planner.alternatives(SHAPE)
    with pytest.raises(ValueError, match="hybrid dedicated: no room"):
        planner.choose(alts, RATES, SHAPE, {a.key: "no room" for a in alts})


def test_alternatives_follow_the_ranks():
    one = replace(SHAPE, ranks=1, servers=0)
    keys = [a.key for a in planner.alternatives(one)]
    assert "hybrid dedicated" not in keys and "allreduce -" in keys
    gpu = [a for a in planner.alternatives(replace(SHAPE, cuda=True)) if a.replicate_rows]
    assert gpu == []


def test_memory_refusals_count_each_nodes_own_ranks():
    """One rank per node (3 nodes): each node holds a worker or a server, never both, so an
    alternative that fits one of either fits (it was charged a worker and a server on every
    node, and refused); on one node the same memory refuses it."""
    from pshybrid.limits import estimate

    schema = SyntheticCTR(n_dense=3, cardinalities=(2000,) * 8).schema
    cfg = TrainConfig(embedding_dim=8, mlp=(16,))
    alt = planner.Alternative("hybrid", "dedicated", 0, 1, 2)
    per = {r: sum(p.nbytes for p in parts)
           for r, parts in estimate(cfg, schema, 1, 2).items()}
    memory = (max(per.values()) + 4096) / planner.MEMORY_SHARE
    assert per["worker"] + per["server"] > memory * planner.MEMORY_SHARE
    assert auto.refusals(cfg, schema, [alt], 3, 3, memory) == {}
    assert "not enough memory" in auto.refusals(cfg, schema, [alt], 1, 3, memory)[alt.key]


@pytest.mark.parametrize("extra", [dict(placement="colocated"), dict(replicate_rows=8)])
def test_auto_refuses_the_options_it_chooses(extra):
    with pytest.raises(ConfigError, match="chooses --placement and --replicate-rows"):
        replace(TrainConfig(mode="auto"), **extra).validate()


# -- MPI ------------------------------------------------------------------------------------

DATA = SyntheticCTR(seed=5, n_dense=3, cardinalities=(7, 30, 200, 5), zipf=1.3)
BASE = TrainConfig(model="wdl", embedding_dim=4, mlp=(8, 6), steps=3, batch_size=4,
                   dtype="float64", lr=0.2, dense_lr=0.05, seed=3, log_every=1,
                   shared_memory=SHARED_MEMORY, progress="none")


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.mpi(min_size=2)
def test_nothing_fits_is_refused_before_the_probe_allocates(comm, monkeypatch):
    """A model far past any node's memory: refused on every rank before the dense weights
    are built or a batch is probed (the probe built them first and the job died of OOM)."""
    from pshybrid.layers import ParamSpace

    built = []
    monkeypatch.setattr(ParamSpace, "build", lambda *a: built.append(1))
    monkeypatch.setattr(auto, "measure", lambda *a: built.append(2))
    with pytest.raises(ConfigError) as e:
        auto.resolve(replace(BASE, mode="auto", embedding_dim=10**7, mlp=(4096,)), comm, DATA)
    msg = str(e.value)
    assert_all(comm, not built and "--mode auto (it plans within 80% of the" in msg
               and "no alternative fits" in msg and "--embedding-dim 10000000" in msg, msg)


@pytest.mark.mpi(min_size=2)
def test_auto_picks_the_same_on_every_rank(comm):
    """Every rank resolves to the same options and prices the same table, and the choice
    is the brute-force minimum of that table."""
    cfg, record, _ = auto.resolve(replace(BASE, mode="auto"), comm, DATA)
    mine = (cfg.mode, cfg.placement, cfg.replicate_rows, cfg.servers, record["choice"],
            [(r["key"], r["step"], r["refused"]) for r in record["alternatives"]])
    every = comm.allgather(mine)
    ok = all(x == every[0] for x in every) and brute_force(record["alternatives"]) == \
        record["choice"] and 0 < record["predicted_step_s"] < math.inf
    assert_all(comm, ok, f"{mine} vs rank 0 {every[0]}")


@pytest.mark.parametrize("extra,n_rows,ranks,timed", [
    (dict(steps=5, auto_trial_steps=10**6), None, 1, 5),
    (dict(steps=5000, auto_trial_steps=20), None, 4, 20),
    (dict(steps=0, auto_trial_steps=20), None, 1, 0),
    (dict(epochs=2, data="d.h5", batch_size=10, auto_trial_steps=10**6), 1000, 4, 2 * 25),
])
def test_trial_steps_are_bounded_by_the_runs_steps(extra, n_rows, ranks, timed):
    assert trials.trial_steps(replace(BASE, **extra), n_rows, ranks) == timed


@pytest.mark.parametrize("steps,start,timed", [(42, 41, 1), (42, 42, 0), (5000, 41, 20)])
def test_trial_steps_of_a_resumed_run_are_bounded_by_the_steps_left(steps, start, timed):
    """Resumed at step 41 of 42, 5 alternatives x 23 steps prepared the 1 step left."""
    cfg = replace(BASE, steps=steps, auto_trial_steps=20)
    assert trials.trial_steps(cfg, None, 3, start) == timed


def test_auto_trains_no_trial_longer_than_the_run():
    """Oracle: the configs ``resolve`` hands its trial (a stand-in for ``train``, which
    records them): 3 warm-up + 5 timed steps for ``--steps 5``, whatever
    ``--auto-trial-steps`` says (10**6 trial steps before a 5-step run used to run)."""
    from types import SimpleNamespace

    from mpi4py import MPI

    seen = []

    def fake_train(cfg, comm, dataset=None, out=None):
        seen.append(cfg.steps)
        return SimpleNamespace(step_seconds=[1e-3] * min(cfg.steps, 100), preempted=None)
    cfg = replace(BASE, mode="auto", steps=5, auto_trial_steps=10**6)
    auto.resolve(cfg, MPI.COMM_SELF, DATA, io.StringIO(), trial=fake_train)
    assert seen and set(seen) == {trials.WARM + 5}, seen


def test_a_signal_during_the_trials_ends_them_and_keeps_the_models_pick():
    """A trial a signal stopped (``TrainResult.preempted``) ends the trials: the choice is
    the cost model's, nothing measured is kept, the record and the printout say so (every
    later trial recorded 0.000 ms, the first of them was "chosen (measured)")."""
    from types import SimpleNamespace

    from mpi4py import MPI

    seen = []

    def fake_train(cfg, comm, dataset=None, out=None):
        seen.append(cfg.mode)
        stopped = 5 if len(seen) == 2 else None  # the signal arrives in the second trial
        return SimpleNamespace(step_seconds=[1e-3] * cfg.steps, preempted=stopped)
    cfg = replace(BASE, mode="auto", steps=50, auto_trial_steps=5)
    shown = io.StringIO()
    chosen, record, _ = auto.resolve(cfg, MPI.COMM_SELF, DATA, shown, trial=fake_train)
    assert chosen.mode == record["choice"].split()[0]
    assert len(seen) == 2 and record["trials_stopped"] and not record["measured"]
    assert all(r.get("measured_step") is None for r in record["alternatives"])
    assert record["choice"] == min(
        (r for r in record["alternatives"] if r["refused"] is None),
        key=lambda r: r["step"] / r["workers"])["key"]
    assert "a signal stopped the trials" in shown.getvalue()
    assert "(measured)" not in shown.getvalue(), shown.getvalue()


@pytest.mark.mpi(min_size=2)
def test_data_short_of_a_global_batch_refuses_those_alternatives(comm, mpi_tmp_path):
    """A file of (N - 1) * b + b / 2 rows holds a global batch of the dedicated
    alternatives' N - 1 workers, not of the N of colocated and allreduce: those are refused
    naming the rows, the choice is a dedicated one (the probe divided by zero steps per
    epoch: a traceback on every rank); with b larger than the file, one ConfigError naming
    it and the fewest workers' batch."""
    from pshybrid.files import open_dataset
    from pshybrid.synthetic import write_synthetic

    b, N = 8, comm.size
    path = str(mpi_tmp_path / "short.h5")
    if comm.rank == 0:
        write_synthetic(path, (N - 1) * b + b // 2, seed=1, n_dense=3,
                        cardinalities=(7, 30, 200, 5))
    comm.Barrier()
    data = open_dataset(path)
    try:
        cfg = replace(BASE, mode="auto", data=path, batch_size=b, auto_trial_steps=0)
        chosen, record, _ = auto.resolve(cfg, comm, data, io.StringIO())
        with pytest.raises(ConfigError, match=r"no alternative fits: .*short.h5: \d+ rows, "
                           r"fewer than one global batch \(\d+ x --batch-size 80"):
            auto.resolve(replace(cfg, batch_size=80), comm, data, io.StringIO())
    finally:
        data.close()
    rows = {r["key"]: r for r in record["alternatives"]}
    ok = chosen.placement == "dedicated" and all(
        ("fewer than one global batch" in (r["refused"] or "")) == (r["workers"] == N)
        for r in rows.values())
    assert_all(comm, ok, f"{chosen.placement}: {[(k, r['refused']) for k, r in rows.items()]}")


@pytest.mark.mpi(min_size=2)
def test_auto_trains_as_the_fixed_choice(comm, mpi_tmp_path):
    """Training under auto == training with the options it picked (BSP, float64), both
    resumed from a checkpoint that a fixed ``ps`` run wrote: auto may pick another mode and
    placement than the checkpoint's, and its trial steps consume none of the data order."""
    ck = str(mpi_tmp_path / "ck-ps")
    train(replace(BASE, mode="ps", servers=1, steps=2, checkpoint_dir=ck), comm, dataset=DATA,
          out=io.StringIO())
    base = replace(BASE, steps=5, resume=ck)
    got = train(replace(base, mode="auto", auto_trial_steps=3), comm, dataset=DATA, collect=True,
                out=io.StringIO())
    # the reporter (world rank 0, a worker in every placement) holds the summary
    s = comm.bcast(got.summary if comm.rank == 0 else None, root=0)
    fixed = replace(base, mode=s["mode"], servers=None if s["auto"]["choice"].startswith(
        ("allreduce", f"{s['mode']} colocated")) else s["servers"],
        placement="colocated" if "colocated" in s["auto"]["choice"] else "dedicated",
        replicate_rows=next(a["replicate_rows"] for a in s["auto"]["alternatives"]
                             if a["key"] == s["auto"]["choice"]))
    ref = train(fixed, comm, dataset=DATA, collect=True, out=io.StringIO())
    ok, msg = True, ""
    if comm.rank == 0:
        errs = {"dense": rel_err(got.dense, ref.dense), "table": rel_err(got.table, ref.table),
                "loss": rel_err(np.array([r["loss"] for r in got.log]),
                                np.array([r["loss"] for r in ref.log]))}
        rows = {a["key"] for a in s["auto"]["alternatives"]}
        if max(errs.values()) > 1e-12 or [r["step"] for r in got.log] != [3, 4, 5] or \
                s["auto"]["choice"] not in rows or ref.summary["workers"] != s["workers"]:
            ok, msg = False, f"auto ({s['auto']['choice']}) vs fixed: {errs}, log {got.log}"
    assert_all(comm, ok, msg)


@pytest.mark.parametrize("mode,placement,server_opt,barriers", [
    ("hybrid", "dedicated", True, 1), ("hybrid", "colocated", True, 2),
    ("hybrid", "dedicated", False, 0), ("hybrid", "colocated", False, 0),
    ("ps", "dedicated", False, 1), ("ps", "colocated", True, 2)])
def test_sync_points_are_where_the_owners_step(mode, placement, server_opt, barriers):
    """A step of the owners (server-side optimizer, ps's dense Adam) costs a Barrier (two
    colocated: also every rank's message), hybrid with plain SGD has none; and each
    collective of the workers one (hybrid's dense Allreduce)."""
    W, S = (3, 1) if placement == "dedicated" else (4, 4)
    base = planner.price(planner.Alternative(mode, placement, 0, W, S), RATES,
                         replace(SHAPE, server_opt=server_opt))
    slow = planner.price(planner.Alternative(mode, placement, 0, W, S),
                         replace(RATES, barrier=1.0), replace(SHAPE, server_opt=server_opt))
    barriers += 1 if mode == "hybrid" else 0  # the dense Allreduce
    assert slow["sync"] == barriers and slow["step"] - base["step"] == pytest.approx(barriers)


def test_cpu_dilation_counts_busy_ranks_per_core():
    """The probe ran all 3 ranks on 2 cores at once (1.5 ranks per core): a dedicated
    placement's 2 workers get a core each (2/3 of the probe's time), colocated and
    allreduce keep all 3 busy (as probed); unknown cores or enough of them: unchanged."""
    s3 = replace(SHAPE, ranks=3, servers=1)
    ded, col = (planner.Alternative("hybrid", p, 0, w, n)
                for p, w, n in (("dedicated", 2, 1), ("colocated", 3, 3)))
    assert planner.dilation(ded, replace(RATES, cores=2), s3) == pytest.approx(2 / 3)
    assert planner.dilation(col, replace(RATES, cores=2), s3) == 1.0
    assert planner.dilation(ded, RATES, s3) == planner.dilation(ded, replace(RATES, cores=8),
                                                                s3) == 1.0
    t = planner.price(ded, replace(RATES, cores=2), s3)
    assert t["compute"] == pytest.approx((RATES.fwd_bwd + RATES.dense_apply) * 2 / 3)


def test_a_crowded_owner_bounds_the_accumulates():
    """ps: the W/S workers per owner Accumulate their dense share into it at once; at the
    owner's measured crowded rate that bounds the push (hand arithmetic); a server-side
    sparse optimizer's rows go two-sided and are not Accumulated."""
    alt = planner.Alternative("ps", "dedicated", 0, 3, 1)
    slow = replace(RATES, acc_owner=1e6)
    dense = planner.padded(SHAPE.P) * 4
    assert planner.price(alt, slow, SHAPE)["push"] == pytest.approx(3 * dense / 1e6)
    hyb = planner.Alternative("hybrid", "dedicated", 0, 3, 1)
    assert planner.price(hyb, slow, SHAPE)["push"] == planner.price(hyb, RATES, SHAPE)["push"]
    sgd = replace(SHAPE, server_opt=False)
    assert planner.price(hyb, slow, sgd)["push"] == pytest.approx(3 * 2500 * 17 * 4 / 1e6)


def test_allreduce_mode_waits_at_four_collectives_and_hot_rows_at_one_more():
    slow = replace(RATES, barrier=1.0)
    ar = planner.price(planner.Alternative("allreduce", "-", 0, 4, 0), slow, SHAPE)
    hot = planner.price(planner.Alternative("hybrid", "colocated", 1024, 4, 4), slow, SHAPE)
    one = planner.price(planner.Alternative("allreduce", "-", 0, 1, 0), slow, SHAPE)
    assert (ar["sync"], hot["sync"], one["sync"]) == (4, 1 + 1 + 2, 0)


def _row(key, mode, sps, refused=None, placement="dedicated"):
    return dict(key=key, mode=mode, samples_per_s=sps, refused=refused, placement=placement)


def test_trial_candidates_are_the_leaders_and_each_close_families_best():
    """The model's 3 best not refused, plus each (mode, placement)'s best within 3x of the
    best."""
    rows = [_row("h1", "hybrid", 100.0), _row("h2", "hybrid", 90.0),
            _row("h3", "hybrid", 80.0, refused="memory"), _row("h4", "hybrid", 70.0),
            _row("h5", "hybrid", 60.0), _row("p1", "ps", 40.0), _row("p2", "ps", 35.0),
            _row("a", "allreduce", 30.0)]
    assert [r["key"] for r in trials.candidates(rows)] == ["h1", "h2", "h4", "p1"]
    assert [r["key"] for r in trials.candidates(rows, family=4.0)] == \
        ["h1", "h2", "h4", "p1", "a"]
    assert [r["key"] for r in trials.candidates(rows, leaders=1, family=1.0)] == ["h1"]
    assert trials.candidates([_row("x", "ps", 1.0, refused="memory")]) == []
    # the paper workload's table (per-sample order): hybrid dedicated is 4th of the model's
    # and the best of its family, so it is tried
    paper = [_row("pc", "ps", 21.3, placement="colocated"),
             _row("hc", "hybrid", 21.1, placement="colocated"),
             _row("a", "allreduce", 20.97, placement="-"), _row("hd", "hybrid", 20.92),
             _row("pd", "ps", 19.8), _row("hc1k", "hybrid", 15.0, placement="colocated")]
    assert [r["key"] for r in trials.candidates(paper)] == ["pc", "hc", "a", "hd", "pd"]


@pytest.mark.parametrize("allreduce_step,want", [(2.9, "hd"), (2.7, "a")])
def test_a_trial_within_the_tie_goes_to_the_first_in_the_tables_order(allreduce_step, want):
    """Oracle: the steps handed in. Per sample, hybrid dedicated (2 workers, step 2.0) is
    1.0, allreduce (3 workers) 0.967 (3.3% faster: tied, the first in the table's order
    wins) or 0.9 (10% faster: it wins); 10 identical runs on a busy node picked 4
    alternatives before ties were kept."""
    from types import SimpleNamespace

    from mpi4py import MPI

    rows = [dict(_row("hd", "hybrid", 100.0), workers=2),
            dict(_row("a", "allreduce", 90.0, placement="-"), workers=3)]
    step = {"hybrid": 2.0, "allreduce": allreduce_step}

    def train_fn(cfg, comm, dataset, out):  # (the warm-up's steps are not counted)
        return SimpleNamespace(preempted=None,
                               step_seconds=[9.0] * trials.WARM + [step[cfg.mode]] * 3)

    key, _ = trials.settle(rows, lambda r: replace(BASE, mode=r["mode"]), train_fn,
                           MPI.COMM_SELF, None, 3, 10)
    assert key == want and [r["measured_step"] for r in rows] == [2.0, allreduce_step]


@pytest.mark.mpi(min_size=2)
def test_trials_pick_the_least_measured_per_sample_and_write_nothing(comm, mpi_tmp_path):
    """With trial steps: every rank makes the same choice; the trained rows are the
    candidates, each with a measured step; the choice is the one with the least measured
    seconds per sample (the oracle: the recorded measurements), or the first in the
    table's order within ``trials.TIE`` of it; no trial writes a metrics file or a
    checkpoint."""
    metrics, ck, tb = mpi_tmp_path / "m.jsonl", mpi_tmp_path / "ck", mpi_tmp_path / "tb"
    cfg = replace(BASE, mode="auto", auto_trial_steps=2, metrics=str(metrics),
                  checkpoint_dir=str(ck), checkpoint_every=1, tensorboard=str(tb))
    chosen, record, _ = auto.resolve(cfg, comm, DATA, trial=train)
    rows = record["alternatives"]
    tried = {r["key"] for r in rows if r["measured_step"] is not None}
    fastest = min(r["measured_step"] / r["workers"] for r in rows if r["key"] in tried)
    best = next(r["key"] for r in rows if r["key"] in tried and
                r["measured_step"] / r["workers"] <= fastest * (1 + trials.TIE))
    mine = (chosen.mode, chosen.placement, chosen.replicate_rows, chosen.servers,
            record["choice"], [(r["key"], r["measured_step"]) for r in rows])
    every = comm.allgather(mine)
    ok = all(x == every[0] for x in every) and record["measured"] and \
        tried == {r["key"] for r in trials.candidates(rows)} and best == record["choice"] \
        and all(r["measured_step"] > 0 for r in rows if r["key"] in tried) and \
        record["measured_step_s"] == next(r["measured_step"] for r in rows
                                          if r["key"] == best) and \
        not metrics.exists() and not ck.exists() and not tb.exists()
    assert_all(comm, ok, f"{mine}, best measured {best}, files {list(mpi_tmp_path.iterdir())}")


@pytest.mark.parametrize("source", ["stream", "file"])
def test_id_stats_count_each_workers_own_batch(tmp_path, source):
    """Oracle: the distinct ids of worker w's batch are those of rows [w*b, (w+1)*b) of the
    global batch, read whole (one ``read_ids`` of the step's N*b rows); a file of 600 rows,
    shuffled, gives 3 steps of 3 x 64 rows (worker 2's rows once read past the batch: a
    crash or 2-3x the count)."""
    from pshybrid.batches import BatchPlan, read_ids
    from pshybrid.files import open_dataset
    from pshybrid.layers import ParamSpace
    from pshybrid.models import build_model
    from pshybrid.synthetic import write_synthetic

    cfg = TrainConfig(batch_size=64, embedding_dim=4, mlp=(8,), seed=3)
    cards = dict(n_dense=3, cardinalities=(7, 300, 2000, 50))
    if source == "file":
        write_synthetic(str(tmp_path / "d.h5"), 600, seed=2, **cards)
        data = open_dataset(str(tmp_path / "d.h5"))
    else:
        data = SyntheticCTR(seed=2, **cards)
    _, layout = build_model(cfg.model, data.schema, 4, (8,), ParamSpace(), "float32", 0)
    N, b = 3, cfg.batch_size
    shape, read = auto.id_stats(cfg, data, layout, N, 1, 1, 1000)
    plan = BatchPlan(getattr(data, "n_rows", None), N * b, cfg.shuffle, cfg.seed)
    steps = auto.STAT_STEPS if source == "stream" else 3
    glob = [read_ids(data, plan.ranges(t, 0, N * b), layout.offsets)[2] for t in range(steps)]
    per = [np.unique(g[w * b:(w + 1) * b]).size for g in glob for w in range(N)]
    assert shape.U == pytest.approx(np.mean(per))
    for W in (N, N - 1):
        assert shape.union[W] == pytest.approx(np.mean([np.unique(g[:W * b]).size
                                                        for g in glob]))
    np.testing.assert_array_equal(read()[2], glob[0][:b])


def test_the_owners_dense_optimizer_is_ps_alone():
    """ps: the owners run the dense optimizer, each over its P / S (the server term holds
    dense_apply / S, whether or not a crowded owner's Accumulate rate was measured);
    hybrid's runs on the workers (in compute): with plain SGD its owners apply nothing
    (it was charged dense_apply / S on them as well)."""
    rows_free = replace(RATES, acc_owner=1e6, row_apply=0.0)
    sgd = replace(SHAPE, server_opt=False)
    for rates in (rows_free, replace(rows_free, acc_owner=0.0)):
        hyb = planner.price(planner.Alternative("hybrid", "colocated", 0, 4, 4), rates, sgd)
        ps = planner.price(planner.Alternative("ps", "colocated", 0, 4, 4), rates, sgd)
        assert hyb["server"] == 0.0 and ps["server"] == pytest.approx(RATES.dense_apply / 4)


@pytest.mark.parametrize("sparse,l2,owners_step", [("sgd", 0.0, False), ("sgd", 0.01, True),
                                                   ("adagrad", 0.0, True)])
def test_plain_sgd_with_l2_is_priced_as_the_owners_step_it_trains_with(sparse, l2, owners_step):
    """L2 reads the weights it changes, so SGD with --l2 trains with the owners' step
    (``Optimizer.needs_weights``), not a blind Accumulate: the price follows (it was
    priced as plain SGD: no owners' apply, one barrier fewer)."""
    from pshybrid.layers import ParamSpace
    from pshybrid.models import build_model

    cfg = TrainConfig(batch_size=8, embedding_dim=4, mlp=(8,), sparse_optimizer=sparse, l2=l2)
    _, layout = build_model(cfg.model, DATA.schema, 4, (8,), ParamSpace(), "float32", 0)
    shape, _ = auto.id_stats(cfg, DATA, layout, 3, 1, 1, 1000)
    assert shape.server_opt is owners_step


@pytest.mark.parametrize("servers", [1, 5, -1])
def test_servers_that_leave_no_worker_are_refused_under_auto_too(servers):
    """--servers S >= ranks (or < 0) under auto: the fixed modes' one error (auto silently
    dropped every dedicated alternative and trained another placement)."""
    from mpi4py import MPI

    with pytest.raises(ConfigError, match="leaves no worker|must be >= 0"):
        auto.resolve(replace(BASE, mode="auto", servers=servers, auto_trial_steps=0),
                     MPI.COMM_SELF, DATA, io.StringIO())


@pytest.mark.parametrize("extra,match", [
    (dict(metrics="/nonexistent/dir/m.jsonl"), "--metrics: directory /nonexistent/dir"),
    (dict(eval_data="nope.h5"), "nope.h5: no such dataset file"),
    (dict(resume="nockpt"), "nockpt: no such checkpoint directory")])
def test_what_step_1s_check_refuses_is_refused_before_the_probe(monkeypatch, extra, match):
    """Outputs, --eval-data and --resume that the check before step 1 refuses were found
    only after the probe and every trial (14 s of them on the light workload, minutes on
    a large table). Oracle: the same refusal, and no probe measured."""
    from mpi4py import MPI

    def probed(*a, **k):
        raise AssertionError("the probe ran before the refusal")
    monkeypatch.setattr(auto, "measure", probed)
    with pytest.raises(PshybridError, match=match):
        auto.resolve(replace(BASE, mode="auto", **extra), MPI.COMM_SELF, DATA, io.StringIO())


def test_auto_trials_read_a_data_file(tmp_path):
    """--mode auto --data FILE --checkpoint-dir ck --keep-last 1 with trials: each trial was
    given the opened file as ``dataset=`` beside its ``data`` and refused ('cfg.data ... and
    dataset= both given'); oracle: the run trains its steps on the file and saves its own
    checkpoint alone."""
    from mpi4py import MPI

    from pshybrid.synthetic import write_synthetic

    path = str(tmp_path / "d.h5")
    write_synthetic(path, 400, seed=1, n_dense=3, cardinalities=(7, 30, 200, 5))
    ck = str(tmp_path / "ck")  # (a trial writes no checkpoint: its --keep-last is dropped too)
    got = train(replace(BASE, mode="auto", data=path, auto_trial_steps=2, steps=6,
                        checkpoint_dir=ck, keep_last=1), MPI.COMM_SELF, out=io.StringIO())
    assert got.summary["steps"] == 6 and got.summary["auto"]["measured"]
    assert sorted(os.listdir(ck)) == ["latest", "step-6"]


def test_auto_refuses_a_python_dataset_as_train_does():
    """A dataset= without a schema under --mode auto: an AttributeError in the probe ended
    the job (MPI_Abort) where the fixed modes say one ConfigError."""
    from mpi4py import MPI

    class NoSchema:
        n_rows = 1000

        def rows(self, a, b):
            return None

    with pytest.raises(ConfigError, match="its schema is not a pshybrid.schema.Schema"):
        train(replace(BASE, mode="auto"), MPI.COMM_SELF, dataset=NoSchema(), out=io.StringIO())


@pytest.mark.parametrize("servers", [None, 0, 1])
def test_servers_the_choice_has_no_use_for_are_noted(servers):
    """--servers S >= 1 under auto, the choice allreduce or colocated: the run has no server
    rank (the fixed modes refuse such a --servers), so the printout says it did nothing
    (it was silent); oracle: the resolved config's servers, every alternative."""
    cfg = replace(BASE, mode="auto", servers=servers)
    for alt in planner.alternatives(SHAPE):
        chosen = auto.chosen_config(cfg, alt)
        note = auto.idle_servers(cfg, chosen)
        unused = bool(servers) and chosen.servers is None
        assert bool(note) == unused, (alt, note)
        assert not note or (f"--servers {servers} does nothing" in note
                            and chosen.mode in note and note.endswith("\n"))
