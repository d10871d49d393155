"""What worker 0 prints before and during a run (pshybrid.report): the plan's roles, global
batch and bytes, hand-computed; the clock and rank-span texts; the progress line's ETA."""

import io
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from pshybrid import kernels
from pshybrid.config import TrainConfig
from pshybrid.limits import estimate, gib, model_size, per_rank
from pshybrid.report import SLOW_MIN_S, SLOW_RATIO, SLOW_SHARE, Reporter, banner, clock, span
from pshybrid.schema import Schema
from pshybrid.threads import rank_server_threads

COLD = kernels.numba_cache_cold  # the real one (the fixture below stands in for it)
SCHEMA = Schema(n_dense=2, cardinalities=(2**20, 2**20))  # 2 Mi rows


@pytest.fixture(autouse=True)
def warm_numba(monkeypatch):
    """As if numba's kernels were cached: the first-run note is tested on its own."""
    monkeypatch.setattr(kernels, "numba_cache_cold", lambda: False)


def topo(W, S, colocated=False):
    workers = list(range(W))
    servers = workers if colocated else list(range(W, W + S))
    size = W if colocated else W + S
    return SimpleNamespace(n_workers=W, n_servers=S, colocated=colocated, worker_ranks=workers,
                           server_ranks=servers, size=size, n_nodes=1, node_of_rank=[0] * size,
                           dedicated_servers_on=lambda node: 0 if colocated else S,
                           shared_cores=lambda: [])


def test_banner_names_the_roles_the_global_batch_and_the_bytes():
    cfg = TrainConfig(embedding_dim=4, mlp=(8,), batch_size=64, sparse_optimizer="adagrad")
    P, E = model_size(cfg, SCHEMA)
    assert E == 5  # dim + the wide weight
    # 2 Mi rows x 5 floats x 4 bytes x (weights + 1 adagrad slot) = 80 MiB; 40 per server
    text = banner(cfg, topo(3, 2), SCHEMA, 500)
    per = {r: sum(p.nbytes for p in parts) for r, parts in estimate(cfg, SCHEMA, 3, 2).items()}
    T, rule = rank_server_threads(None, 2)  # this process's cores, a server's rule (2 here)
    assert text.splitlines() == [
        "plan: hybrid wdl on 5 ranks, 1 node: 3 workers (ranks 0-2), 2 servers (ranks 3-4)",
        "  global batch 192 = 3 workers x --batch-size 64; 500 steps",
        "  tables: 2 fields, 2,097,152 rows x 5 float32 + 1 adagrad state: 80.0 MiB, "
        "40.0 MiB per server",
        f"  dense: {P:,} parameters; a checkpoint holds about "
        f"{(80 * 2**20 + 2_097_152 * 8 + P * 4 * 3) / 2**20:,.1f} MiB",  # + the ids (int64),
        # adam's 2 slots per parameter
        f"  memory (the large arrays, as checked before step 1): {gib(per['worker'])} per "
        f"worker, {gib(per['server'])} per server",
        f"  sparse optimizer: {T} thread{'s' * (T > 1)} on each server's rows ({rule})"]
    assert per["server"] > 40 * 2**20   # the shard and what a step brings in
    text = banner(replace(cfg, server_threads=3), topo(3, 2), SCHEMA, 500)
    assert text.splitlines()[-1] == \
        "  sparse optimizer: 3 threads on each server's rows (--server-threads)"
    # --eval-data's rows: the logits it keeps and its larger activation batch, as checked
    big = {r: sum(p.nbytes for p in parts) for r, parts in estimate(
        cfg, SCHEMA, 3, 2, eval_rows=10**7).items()}
    ev = {r: sum(p.nbytes for p in parts if p.what.startswith("evaluation"))
          for r, parts in estimate(cfg, SCHEMA, 3, 2, eval_rows=10**7).items()}
    assert ev["worker"] == 16 * -(-10**7 // 3) and big["worker"] > per["worker"] + ev["worker"]
    assert ev["first"] + ev["worker"] == 26 * 10**7 and big["first"] == ev["first"]  # worker 0
    assert (f"{gib(big['worker'])} per worker, {gib(big['server'])} per server; worker 0 "
            f"{gib(big['first'])} more (the evaluation)") in banner(cfg, topo(3, 2), SCHEMA,
                                                                    500, eval_rows=10**7)


def test_banner_placements_and_the_small_data_warning():
    cfg = TrainConfig(embedding_dim=4, mlp=(8,), sparse_optimizer="sgd", mode="allreduce")
    text = banner(cfg, topo(1, 0), SCHEMA, 10, n_rows=1000)
    assert text.startswith("plan: allreduce wdl on 1 rank, 1 node: 1 worker, no server\n")
    assert "40.0 MiB, all of it on every worker" in text  # sgd: no state
    assert "on each worker's rows" in text
    assert ("warning: the tables have 2,097,152 rows, the data 1,000 rows x 2 fields = "
            "2,000 ids: most rows can never train") in text
    cfg = replace(cfg, mode="hybrid", placement="colocated")
    text = banner(cfg, topo(4, 4, colocated=True), SCHEMA, 10, n_rows=2**20)
    assert "4 workers, each owning a shard" in text and "10.0 MiB per rank" in text
    # a colocated rank is a worker and a server: its memory is both, said as one figure
    per = per_rank(estimate(cfg, SCHEMA, 4, 4))
    assert (f"{gib(per['worker'] + per['server'])} per rank (a worker's {gib(per['worker'])} "
            f"+ a shard's {gib(per['server'])})") in text and "per worker" not in text
    assert "on each rank's rows" in text
    assert "warning" not in text  # 2 Mi ids: as many as rows


def test_clock_and_span():
    assert [clock(s) for s in (0, 59.4, 3725, float("inf"))] == [
        "0:00:00", "0:00:59", "1:02:05", "--:--:--"]
    assert [span(r) for r in ([2], [0, 1, 2], [0, 2, 5])] == ["2", "0-2", "0,2,5"]


def test_progress_line_shows_elapsed_and_the_eta_at_this_rate():
    cfg = TrainConfig(batch_size=10, progress="lines")
    out = io.StringIO()
    rep = Reporter(cfg, out, 2, 1000)
    rep.t0 -= 65  # started 65 s ago
    rep.step({"step": 400, "loss": 0.5, "samples_per_s": 200.0, "seconds": {}})
    # 200 samples/s over 2 workers x 10 = 10 steps/s; 600 steps left: 60 s
    assert out.getvalue() == ("step 400/1000  loss 0.5000  200 samples/s  elapsed 0:01:05  "
                              "ETA 0:01:00\n")


def test_an_evaluation_of_one_class_says_it_has_no_auc():
    """(It printed ``auc nan ... (1 rows)``.) The record keeps the NaN; --metrics writes null."""
    out = io.StringIO()
    rep = Reporter(TrainConfig(progress="lines"), out, 1, 10)
    rep.evaluation({"eval": True, "step": 4, "auc": float("nan"), "logloss": 0.25, "rows": 1,
                    "base_rate_logloss": 0.0})
    rep.evaluation({"eval": True, "step": 8, "auc": 0.75, "logloss": 0.5, "rows": 5003,
                    "base_rate_logloss": 0.6})
    assert out.getvalue() == ("eval at step 4: auc n/a (one class)  logloss 0.2500  (1 row)\n"
                              "eval at step 8: auc 0.7500  logloss 0.5000  (5,003 rows)\n")


def test_an_evaluation_worse_than_the_base_rate_says_so():
    """A logloss above the base rate's (an overfitted model's) is named on the line; at or
    below it, and where there is no AUC, the line is as before."""
    out = io.StringIO()
    rep = Reporter(TrainConfig(progress="lines"), out, 1, 10)
    for step, loss, auc, base in ((1, 0.7149, 0.7584, 0.6754), (2, 0.6754, 0.8, 0.6754),
                                  (3, 0.5, float("nan"), 0.0)):  # (3: one class)
        rep.evaluation({"eval": True, "step": step, "auc": auc, "logloss": loss, "rows": 40_000,
                        "base_rate_logloss": base})
    assert out.getvalue() == (
        "eval at step 1: auc 0.7584  logloss 0.7149 (above the base rate's 0.6754: worse than "
        "predicting the mean label)  (40,000 rows)\n"
        "eval at step 2: auc 0.8000  logloss 0.6754  (40,000 rows)\n"
        "eval at step 3: auc n/a (one class)  logloss 0.5000  (40,000 rows)\n")


def test_an_evaluation_of_nan_logits_says_so_not_one_class():
    """NaN logits (a diverged model) have no AUC and a NaN logloss: the line names them."""
    out = io.StringIO()
    rep = Reporter(TrainConfig(progress="lines"), out, 1, 10)
    rep.evaluation({"eval": True, "step": 1, "auc": float("nan"), "logloss": float("nan"),
                    "rows": 9000})
    assert out.getvalue() == "eval at step 1: auc n/a (NaN logits)  logloss nan  (9,000 rows)\n"


def test_banner_notes_a_first_run_where_numba_compiles(monkeypatch):
    monkeypatch.setattr(kernels, "numba_cache_cold", lambda: True)
    cfg = TrainConfig(embedding_dim=4, mlp=(8,), mode="allreduce")
    assert banner(cfg, topo(1, 0), SCHEMA, 10).splitlines()[-1] == (
        "  first run in this environment: numba compiles the CPU kernels (some seconds; "
        "cached for later runs)")


def test_numba_cache_cold_looks_where_numba_keeps_the_kernels(tmp_path, monkeypatch):
    """Cold while no ``kernels.*.nbi`` index sits where numba's own locator keeps this
    package's cache: the package's ``__pycache__``, or under ``NUMBA_CACHE_DIR`` (where the
    note was never given: also where pshybrid points numba for a read-only install)."""
    import os

    if not kernels.numba_active():
        pytest.skip("numba is not installed")
    import numba
    from numba.core import caching

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    path = caching.FunctionCache(kernels._nb_gather.py_func)._cache_path
    assert path.startswith(str(tmp_path))
    assert COLD()
    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, "kernels._nb_x-1.py311.nbi"), "wb").close()
    assert not COLD()


def test_numba_with_nowhere_to_cache_caches_in_the_temporary_directory(tmp_path, monkeypatch,
                                                                       capsys):
    """A read-only install and HOME (no numba locator: ``njit(cache=True)`` raised "no
    locator available", a traceback on every rank): NUMBA_CACHE_DIR goes to this user's
    directory in the temporary directory; where even that cannot be made, the kernels run
    as NumPy, with one warning; so do they where that directory is another user's or open
    to all (it was used as found)."""
    import os
    import tempfile

    numba = pytest.importorskip("numba")
    from numba.core import caching

    def nowhere(func):
        raise RuntimeError(f"cannot cache function {func.__name__!r}: no locator available")

    monkeypatch.setattr(caching, "FunctionCache", nowhere)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(numba.config, "CACHE_DIR", numba.config.CACHE_DIR)
    monkeypatch.setenv("NUMBA_CACHE_DIR", "")
    assert kernels._cache_somewhere(numba)
    path = tmp_path / f"pshybrid-numba-{os.getuid()}"
    assert numba.config.CACHE_DIR == os.environ["NUMBA_CACHE_DIR"] == str(path)
    assert path.is_dir()

    path.chmod(0o777)  # planted by another user (numba's cache holds pickles: code) ...
    assert not kernels._cache_somewhere(numba)
    assert "only it can write" in capsys.readouterr().err
    path.rmdir()
    (tmp_path / "theirs").mkdir()
    path.symlink_to(tmp_path / "theirs")  # ... or a link to their directory
    assert not kernels._cache_somewhere(numba)
    assert "only it can write" in capsys.readouterr().err

    def refused(*a, **k):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(os, "makedirs", refused)
    assert not kernels._cache_somewhere(numba)
    assert "pshybrid: warning: numba has nowhere to cache its kernels" in capsys.readouterr().err


@pytest.mark.parametrize("consistency, noted", [("bsp", True), ("ssp:0", True), ("ssp:1", True),
                                                ("ssp:2", False), ("asp", False)])
def test_banner_notes_a_cache_that_can_never_serve(consistency, noted):
    """--cache-rows under bsp and ssp:0 never serves a row (``registry.cache_serves``;
    tests/test_stale_mpi.py runs both sides of it), under ssp:1 only the step after the
    start or a checkpoint: the plan says so; from ssp:2 on, and under asp, nothing is said;
    no note without a cache."""
    cfg = TrainConfig(embedding_dim=4, mlp=(8,), consistency=consistency, cache_rows=500)
    note = (f"  note: --cache-rows 500 under --consistency {consistency}: " + (
        "a cached row serves only the step after the start or a checkpoint (a cache serves "
        "every step under ssp:K with K >= 2, or asp)" if consistency == "ssp:1" else
        "no cached row is ever served (a cache serves under ssp:K with K >= 2, or asp); it "
        "only costs its upkeep"))
    assert (note in banner(cfg, topo(1, 1), SCHEMA, 10).splitlines()) == noted
    assert "note: --cache-rows" not in banner(replace(cfg, cache_rows=0), topo(1, 1), SCHEMA, 10)


@pytest.mark.parametrize("consistency, noted", [("bsp", False), ("ssp:0", False),
                                                ("ssp:1", False), ("ssp:2", True),
                                                ("ssp:40", True), ("asp", True)])
def test_banner_notes_a_bound_that_only_a_cache_uses(consistency, noted):
    """Without --cache-rows, reads are stale by the pull-ahead's one step alone: a bound
    beyond ssp:1 (or asp) runs as ssp:1 (tests/test_stale_mpi.py runs both): the plan says
    so; with a cache, and at a bound of 1 or less, nothing is said."""
    cfg = TrainConfig(embedding_dim=4, mlp=(8,), consistency=consistency)
    note = (f"  note: --consistency {consistency} without --cache-rows: the run is ssp:1's "
            "(every read pulled one step ahead; the rest of the bound is the cache's)")
    assert (note in banner(cfg, topo(1, 1), SCHEMA, 10).splitlines()) == noted
    assert note not in banner(replace(cfg, cache_rows=500), topo(1, 1), SCHEMA, 10)


@pytest.mark.parametrize("option", ["cache_rows", "replicate_rows"])
def test_banner_notes_a_cache_or_hot_set_larger_than_the_tables(option):
    """More cached or replicated rows than the tables hold (2 Mi): noted with both counts;
    the tables' own size is not."""
    rows = 2 * 2**20
    cfg = TrainConfig(embedding_dim=4, mlp=(8,), consistency="asp" if option == "cache_rows"
                      else "bsp")
    flag = "--" + option.replace("_", "-")
    for n, noted in ((rows + 1, True), (rows, False), (1000, False)):
        text = banner(replace(cfg, **{option: n}), topo(2, 1), SCHEMA, 10)
        assert (f"  note: {flag} {n:,} is more than the tables' {rows:,} rows" in text) == noted


def test_banner_notes_compressed_training_data():
    """A compressed --data costs 8x (lzf) to 12x (gzip) the CPU per batch of an uncompressed
    one (docs/data.md, Compression): the plan says so, and how to write an uncompressed
    file; nothing for an uncompressed one."""
    cfg = TrainConfig(embedding_dim=4, mlp=(8,), mode="allreduce")
    assert "compressed" not in banner(cfg, topo(1, 0), SCHEMA, 10, compression=None)
    assert ("  note: --data is lzf-compressed: its reads cost 8x or more an uncompressed file's "
            "CPU per batch (prep --compression none writes one)") in \
        banner(cfg, topo(1, 0), SCHEMA, 10, compression="lzf").splitlines()


def test_a_new_mode_of_existing_strategies_is_sized_and_described_by_them(monkeypatch):
    """A mode with the rows on every worker and the dense weights on the servers (a ModeSpec
    of existing strategies, docs/architecture.md): the memory check puts the table on each
    worker and only the dense shard on the servers, and the plan says so (both chose on
    "are there servers", which put its table on the servers)."""
    from pshybrid.limits import estimate
    from pshybrid.registry import MODES, ModeSpec

    monkeypatch.setitem(MODES, "rps", ModeSpec("rps", "replicated", "servers", "a test"))
    assert MODES["rps"].table_parts(1) == (
        ("worker", "embedding table"), ("worker", "exchanged gradient rows"),
        ("server", "shard of the dense table"), ("worker", "pulled dense table"))
    cfg = TrainConfig(mode="rps", servers=1, embedding_dim=4, mlp=(8,), batch_size=64)
    est = estimate(cfg, SCHEMA, 2, 1)
    parts = {role: {p.what for p in est[role]} for role in ("worker", "server")}
    assert "embedding table" in parts["worker"] and parts["server"] == {
        "shard of the dense table"}, parts
    text = banner(cfg, topo(2, 1), SCHEMA, 10)
    assert "all of it on every worker" in text and "on each worker's rows" in text, text


def test_banner_notes_an_epoch_that_drops_a_sizeable_share_of_the_rows():
    cfg = TrainConfig(embedding_dim=4, mlp=(8,), batch_size=512, mode="allreduce")
    text = banner(cfg, topo(3, 0), SCHEMA, 3, n_rows=2047)   # G = 1536: 511 rows dropped
    assert ("note: an epoch trains 1,536 of the 2,047 rows: the last partial global batch "
            "(511 rows of 1,536) is dropped, other rows each epoch (--shuffle)") in text
    text = banner(replace(cfg, shuffle=False), topo(3, 0), SCHEMA, 3, n_rows=2047)
    assert "the same last rows every epoch (--no-shuffle)" in text
    assert "an epoch trains" not in banner(cfg, topo(3, 0), SCHEMA, 3, n_rows=1536 * 200 + 5)


def test_a_long_run_keeps_a_bounded_log_in_memory(monkeypatch):
    """Worker 0 kept every step's wall time and every log record for the whole run (~46 B
    a step, a leak over days): now the first STEP_SECONDS_KEPT step times (what --mode
    auto's trials time) and the last LOG_KEPT to 2 x LOG_KEPT records; the summary is the
    last record's."""
    import pshybrid.steplog as steplog
    import pshybrid.train as train_mod
    from mpi4py import MPI

    monkeypatch.setattr(steplog, "LOG_KEPT", 5)
    monkeypatch.setattr(steplog, "STEP_SECONDS_KEPT", 7)
    cfg = TrainConfig(mode="allreduce", servers=0, embedding_dim=4, mlp=(8,), batch_size=8,
                      steps=20, log_every=1, progress="none")
    res = train_mod.train(cfg, MPI.COMM_SELF, out=io.StringIO())
    assert [r["step"] for r in res.log] == list(range(13, 21))  # to the last 5 when over 10
    assert len(res.step_seconds) == 7 and res.summary["final_loss"] == res.log[-1]["loss"]


IDLE = {"auto_trial_steps": 5, "cross_layers": 3, "bottom_mlp": (8,), "cuda_aware": "off",
        "cuda_graphs": "on", "shared_memory": "off", "pooling": "mean", "shuffle": False}
IDLE_FLAGS = ("--auto-trial-steps 5", "--cross-layers 3", "--bottom-mlp 8", "--cuda-aware off",
              "--cuda-graphs on", "--shared-memory off", "--pooling mean", "--no-shuffle")


def idle_notes(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "does nothing in this run" in ln]


def test_the_plan_notes_each_option_the_run_never_reads():
    """Options off their defaults that this run never reads (a config file kept across
    runs, an option of another mode or model): one note each, naming it as given; and the
    run trains to the same parameters as without them, bit for bit (the oracle that they
    do nothing); at their defaults, or where they are read, nothing is said."""
    from mpi4py import MPI
    from pshybrid.train import train
    base = TrainConfig(mode="allreduce", embedding_dim=4, mlp=(8,), steps=3, batch_size=32,
                       progress="none")
    idle = replace(base, **IDLE)
    text = banner(idle, topo(1, 0), SCHEMA, 3)
    assert [n.split(" does nothing")[0] for n in idle_notes(text)] == [
        f"  note: {flag}" for flag in IDLE_FLAGS]
    assert idle_notes(banner(base, topo(1, 0), SCHEMA, 3)) == []
    runs = [train(c, MPI.COMM_SELF, collect=True, out=io.StringIO()) for c in (base, idle)]
    assert runs[0].dense.tobytes() == runs[1].dense.tobytes()
    assert runs[0].table.tobytes() == runs[1].table.tobytes()
    read = replace(base, mode="hybrid", model="dcn", checkpoint_dir="ck", device="cuda",
                   cuda_aware="off", cuda_graphs="on", keep_last=2, cross_layers=3,
                   shared_memory="off", pooling="mean", shuffle=False)
    multi = Schema(n_dense=2, cardinalities=(2**20, 2**20), multi_hot=1)
    assert idle_notes(banner(read, topo(1, 1), multi, 3, n_rows=1000, auto=False)) == []
    dlrm = replace(read, model="dlrm", cross_layers=2, bottom_mlp=(8,))
    assert idle_notes(banner(dlrm, topo(1, 1), multi, 3, n_rows=1000, auto=False)) == []
    auto = replace(base, mode="hybrid", auto_trial_steps=5)
    assert idle_notes(banner(auto, topo(1, 1), SCHEMA, 3, auto=True)) == []


@pytest.mark.parametrize("mode,noted", [("ps", True), ("hybrid", False), ("allreduce", False)])
def test_the_plan_notes_bucket_mb_where_no_dense_gradient_is_allreduced(mode, noted):
    """--mode ps keeps the dense weights on the servers: its --bucket-mb does nothing
    (``ModeSpec.dense_allreduce``; the modes' own tests run the buckets)."""
    cfg = TrainConfig(mode=mode, embedding_dim=4, mlp=(8,), bucket_mb=4.0)
    assert idle_notes(banner(cfg, topo(1, 1), SCHEMA, 3)) == ([
        f"  note: --bucket-mb 4.0 does nothing in this run: --mode {mode} Allreduces no "
        "dense gradient"] if noted else [])


@pytest.mark.parametrize("sparse,dense", [("adagrad", "sgd"), ("sgd", "sgd"),
                                          ("adam", "sgd"), ("sgd", "adam")])
def test_the_plan_notes_adams_decays_and_eps_where_no_optimizer_reads_them(sparse, dense):
    """--beta1 and --beta2 are read by adam only, --eps by adagrad and adam: set with
    neither, they were silently idle. Oracle: the run trains to the same bits without
    them where they are noted, and to other values where they are not."""
    from mpi4py import MPI
    from pshybrid.train import train
    base = TrainConfig(mode="allreduce", embedding_dim=4, mlp=(8,), steps=3, batch_size=32,
                       progress="none", lr=0.05, sparse_optimizer=sparse, dense_optimizer=dense)
    given = replace(base, beta1=0.5, beta2=0.9, eps=0.5)
    noted = [n.split(" does nothing")[0] for n in idle_notes(banner(given, topo(1, 0),
                                                                    SCHEMA, 3))]
    runs = [train(c, MPI.COMM_SELF, collect=True, out=io.StringIO()) for c in (base, given)]
    same = (runs[0].dense.tobytes() == runs[1].dense.tobytes()
            and runs[0].table.tobytes() == runs[1].table.tobytes())
    assert same == (len(noted) == 3)
    flags = ("  note: --beta1 0.5", "  note: --beta2 0.9", "  note: --eps 0.5")
    assert noted == [f for f in flags if f in noted] and bool(noted) == ("adam" not in (
        sparse, dense)) and (flags[2] in noted) == (sparse == dense == "sgd")


@pytest.mark.parametrize("warmup,steps,noted", [(10, 9, True), (10, 10, False), (0, 9, False)])
def test_the_plan_notes_a_warm_up_longer_than_the_run(warmup, steps, noted):
    """A warm-up of more steps than the run never reaches --lr's full rate (the factor is
    s/K at step s <= K: ``optim.Schedule``); one of as many steps reaches it at the last."""
    cfg = TrainConfig(embedding_dim=4, mlp=(8,), warmup_steps=warmup)
    notes = [ln for ln in banner(cfg, topo(1, 1), SCHEMA, steps).splitlines()
             if "--warmup-steps" in ln]
    assert notes == ([f"  note: --warmup-steps 10 is more than the run's {steps} steps: the "
                      "learning rate never reaches its full value"] if noted else [])


def test_the_small_data_warning_counts_multi_hot_values(tmp_path):
    """``n_ids`` of a file and of files read as one (``files.H5Files``) equals the ids its
    rows and bags hold (counted from what they return); the plan's warning compares the
    tables' rows with that count: 40 rows of 2 fields with bags of 1-200 ids are more ids
    than 2,000 rows (no warning), where rows x fields alone (80) warned."""
    from pshybrid.data import DatasetWriter, H5Dataset
    from pshybrid.files import H5Files
    rng = np.random.default_rng(0)
    paths = []
    for k, n in enumerate((40, 25)):
        lengths = rng.integers(1, 200, n)
        paths.append(str(tmp_path / f"m{k}.h5"))
        with DatasetWriter(paths[-1], ["I0"], ["C0"], ["tags"]) as w:
            w.append(rng.integers(0, 2, n).astype(np.float32), rng.random((n, 1), np.float32),
                     rng.integers(0, 5, (n, 1)), [(rng.integers(0, 1995, lengths.sum()),
                                                   lengths)])
            w.close([5, 1995])
    for d in (H5Dataset(paths[0]), H5Files(paths)):
        counted_ids = d.rows(0, d.n_rows)[2].size + sum(v.size for v, _ in d.bags(0, d.n_rows))
        assert d.n_ids == counted_ids
        d.close()
    first = H5Dataset(paths[0])
    schema, n = first.schema, first.n_rows
    cfg = TrainConfig(embedding_dim=4, mlp=(8,))
    assert first.n_ids > 2000 > n * 2
    assert "warning" not in banner(cfg, topo(1, 1), schema, 10, n_rows=n, ids=first.n_ids)
    assert "warning: the tables have 2,000 rows, the data 40 rows x 2 fields = 80 ids" in (
        banner(cfg, topo(1, 1), schema, 10, n_rows=n))
    text = banner(cfg, topo(1, 1), Schema(1, (5, 5000), multi_hot=1), 10, n_rows=n,
                  ids=first.n_ids)
    assert (f"warning: the tables have 5,005 rows, the data 40 rows with {first.n_ids:,} ids: "
            "most rows can never train") in text
    first.close()
    from mpi4py import MPI

    from pshybrid.train import train
    out = io.StringIO()  # the run's own plan: train passes the file's count through
    train(TrainConfig(mode="allreduce", embedding_dim=2, mlp=(4,), steps=1, batch_size=8,
                      progress="none", data=paths[0]), MPI.COMM_SELF, out=out)
    assert out.getvalue().startswith("plan: ") and "the tables have" not in out.getvalue()


def test_the_plan_notes_steps_that_epochs_replace():
    """``TrainConfig(epochs=1, steps=10)`` from Python trained the epoch's steps and said
    nothing of ``steps`` (the command line refuses both; a TOML file's steps under
    --epochs is the same case); at its default nothing is said."""
    cfg = TrainConfig(embedding_dim=4, mlp=(8,), data="d.h5", epochs=1, steps=10)
    notes = idle_notes(banner(cfg, topo(1, 1), SCHEMA, 128, n_rows=4096))
    assert notes == ["  note: --steps 10 does nothing in this run: --epochs decides the steps"]
    assert idle_notes(banner(replace(cfg, steps=2000), topo(1, 1), SCHEMA, 128,
                             n_rows=4096)) == []


@pytest.mark.parametrize("consistency, cache, said", [
    ("bsp", 0, ""), ("bsp", 300, "; --consistency bsp, a 300-row cache a worker"),
    ("ssp:4", 0, "; --consistency ssp:4"), ("asp", 2000, "; --consistency asp, a 2,000-row "
                                           "cache a worker")])
def test_the_plan_names_a_consistency_or_cache_off_the_default(consistency, cache, said):
    """The plan's batch line ends with the consistency and the cache where either is not
    the default (bsp, none): the console showed neither."""
    cfg = TrainConfig(embedding_dim=4, mlp=(8,), consistency=consistency, cache_rows=cache)
    line = banner(cfg, topo(1, 1), SCHEMA, 10).splitlines()[1]
    assert line == "  global batch 128 = 1 worker x --batch-size 128; 10 steps" + said, line


@pytest.mark.parametrize("reads", [None, {"cache_hit_rate": 0.18125, "mean_staleness": 1.354,
                                            "max_staleness": 4}])
def test_the_done_line_shows_the_reads_of_a_stale_run(reads):
    """With ``reads`` in the summary (ssp:K, asp, a cache) the done line shows the cache's
    share, the mean and the largest staleness, as the summary holds them; without, nothing
    (bsp without a cache: every read pulled at its step)."""
    out = io.StringIO()
    summary = {"summary": True, "mode": "hybrid", "model": "wdl", "steps": 10,
               "steps_run": 10, "samples_per_s": 1.0, "final_loss": 0.5,
               "base_rate_logloss": 0.6, "servers": 0, "workers": 1, "seconds": 2.0,
               "phase_fraction": {}, "slowest_worker": {"worker": 0, "rank": 0,
                                                        "own_seconds": 1.0,
                                                        "median_own_seconds": 1.0}}
    Reporter(TrainConfig(progress="lines"), out, 1, 10).close(
        summary if reads is None else {**summary, "reads": reads})
    done = next(line for line in out.getvalue().splitlines() if line.startswith("done: "))
    assert ("reads:" in done) == (reads is not None), done
    assert reads is None or done.endswith(
        "  |  reads: 18.1% from the cache, staleness mean 1.35, max 4"), done


@pytest.mark.parametrize("workers,own,median,named", [
    (4, 10.0, 10.0 / SLOW_RATIO, True),               # at the ratio, far past the share
    (4, 10.0, 10.0 / SLOW_RATIO * 1.01, False),       # just under the ratio
    (4, 1.0 + SLOW_SHARE * 20 * 0.99, 1.0, False),    # past the ratio, under the share
    (4, 0.1 + SLOW_MIN_S * 0.99, 0.1, False),         # past ratio and share, under the time
    (4, 0.1 + SLOW_MIN_S * 1.01, 0.1, True),
    (1, 10.0, 1.0, False)])                           # one worker waits for nobody
def test_the_done_line_names_a_slow_worker_past_both_bounds(workers, own, median, named):
    """``slowest worker w (rank r)`` where its own work is SLOW_RATIO x the median and more
    than SLOW_SHARE of the run's seconds (20 here) and SLOW_MIN_S past it (a short run on a
    busy machine named a worker 0.05 s slower than the others); else nothing."""
    out = io.StringIO()
    rep = Reporter(TrainConfig(progress="lines"), out, workers, 10)
    rep.close({"summary": True, "mode": "allreduce", "model": "wdl", "steps": 10,
               "steps_run": 10, "samples_per_s": 1.0, "final_loss": 0.5, "base_rate_logloss": 0.6,
               "servers": 0, "workers": workers, "seconds": 20.0, "phase_fraction": {},
               "slowest_worker": {"worker": 2, "rank": 5, "own_seconds": own,
                                  "median_own_seconds": median}})
    assert ("slowest worker 2 (rank 5): its own work" in out.getvalue()) == named, out.getvalue()
