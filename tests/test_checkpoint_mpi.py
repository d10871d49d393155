"""Checkpoints: exact resume, resharding to other server counts, export == live rows,
refusal of corrupt or mismatched checkpoints (every rank gets the same error)."""

import json
import math
import os
from dataclasses import replace

import h5py
import numpy as np
import pytest

from mpi_util import assert_all
from pshybrid.export import export
from pshybrid.errors import PshybridError
from test_train_mpi import BASE, DATA, rel_err, run


def same(a, b, W):
    """Bitwise with one worker; with several, concurrent Accumulates sum in a run-dependent
    order, so allow float64 rounding."""
    return np.array_equal(a, b) if W == 1 else rel_err(a, b) <= 1e-12


def resumed_verdict(comm, straight, resumed, what: str) -> None:
    """Collective: rank 0 compares the resumed run's final parameters with the straight
    run's (max relative error <= 1e-9), every rank gets the verdict."""
    ok, msg = True, ""
    if comm.rank == 0:
        e = max(rel_err(straight.table, resumed.table), rel_err(straight.dense, resumed.dense))
        if e > 1e-9:
            ok, msg = False, f"{what} differ by {e}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,sparse_opt,warmup", [
    ("hybrid", "adagrad", 0), ("hybrid", "adam", 0), ("ps", "adagrad", 0), ("ps", "adam", 0),
    ("allreduce", "adam", 0),
    ("hybrid", "sgd", 6)])  # with --l2 and a warm-up past the resume point: the servers'
#                             step count (the warm-up factor s/6) continues from the checkpoint
def test_resume_continues_exactly(comm, mpi_tmp_path, mode, sparse_opt, warmup):
    S = 0 if mode == "allreduce" else 1
    W = comm.size - S
    cfg = replace(BASE, mode=mode, servers=S, sparse_optimizer=sparse_opt,
                  dense_optimizer="adam", steps=8, log_every=2, warmup_steps=warmup,
                  l2=0.1 if warmup else 0.0)
    ckpt = str(mpi_tmp_path / f"ck-{mode}-{sparse_opt}-{warmup}")
    straight = run(cfg, comm)
    run(replace(cfg, steps=4, checkpoint_dir=ckpt), comm)
    resumed = run(replace(cfg, resume=ckpt), comm)
    ok, msg = True, ""
    if straight.role == "worker":
        if not (same(straight.table, resumed.table, W) and same(straight.dense, resumed.dense, W)):
            ok, msg = False, (f"resumed parameters differ: table {rel_err(straight.table, resumed.table)}"
                              f" dense {rel_err(straight.dense, resumed.dense)}")
        if comm.rank == 0:
            a = [(r["step"], r["loss"]) for r in straight.log if r["step"] > 4]
            b = [(r["step"], r["loss"]) for r in resumed.log]
            if [s for s, _ in a] != [s for s, _ in b] or \
                    not same(np.array([x for _, x in a]), np.array([x for _, x in b]), W):
                ok, msg = False, f"logged losses differ: {a} vs {b}"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("first,then", [("colocated", "dedicated"), ("dedicated", "colocated")])
def test_resume_across_placements(comm, mpi_tmp_path, first, then):
    """A checkpoint written with one placement resumes with the other (same global batch)
    and continues as a straight run would."""
    G = math.lcm(comm.size - 1, comm.size)

    def place(placement):
        if placement == "colocated":
            return dict(placement="colocated", servers=None, batch_size=G // comm.size)
        return dict(placement="dedicated", servers=1, batch_size=G // (comm.size - 1))

    ckpt = str(mpi_tmp_path / f"ck-{first}-{then}")
    cfg = replace(BASE, sparse_optimizer="adam", dense_optimizer="adam", steps=6)
    straight = run(replace(cfg, **place(then)), comm)
    run(replace(cfg, steps=3, checkpoint_dir=ckpt, **place(first)), comm)
    resumed = run(replace(cfg, resume=ckpt, **place(then)), comm)
    resumed_verdict(comm, straight, resumed, f"{first} -> {then}: resumed parameters")


@pytest.mark.mpi(min_size=2)
def test_resume_with_replicated_hot_rows(comm, mpi_tmp_path):
    """The replicated rows are written back to their owners before a checkpoint and read
    from them on resume: a resumed --replicate-rows run equals a straight run without."""
    ckpt = str(mpi_tmp_path / "ck-hot")
    cfg = replace(BASE, servers=1, sparse_optimizer="adagrad", steps=6)
    straight = run(cfg, comm)
    run(replace(cfg, steps=3, checkpoint_dir=ckpt, replicate_rows=20), comm)
    resumed = run(replace(cfg, resume=ckpt, replicate_rows=20), comm)
    resumed_verdict(comm, straight, resumed, "resumed with hot rows: parameters")


@pytest.mark.mpi(min_size=5)
def test_reshard_to_other_server_counts(comm, mpi_tmp_path):
    """Checkpoint with S=2, resume with S=1, 2, 3 (same global batch 12): identical
    parameters right after loading, and training continues identically."""
    ckpt = str(mpi_tmp_path / "ck-reshard")
    cfg = replace(BASE, servers=2, batch_size=4, steps=3, sparse_optimizer="adam",
                  checkpoint_dir=ckpt)
    run(cfg, comm)
    loaded, continued = {}, {}
    for S in (1, 2, 3):
        c = replace(cfg, servers=S, batch_size=12 // (comm.size - S), checkpoint_dir=None,
                    resume=ckpt)
        loaded[S] = run(replace(c, steps=3), comm)
        continued[S] = run(replace(c, steps=6), comm)
    ok, msg = True, ""
    if comm.rank == 0:
        for S in (1, 3):
            if not (np.array_equal(loaded[S].table, loaded[2].table)
                    and np.array_equal(loaded[S].dense, loaded[2].dense)):
                ok, msg = False, f"S={S}: loaded parameters differ from S=2"
            e = max(rel_err(continued[S].table, continued[2].table),
                    rel_err(continued[S].dense, continued[2].dense))
            if e > 1e-9:
                ok, msg = False, f"S={S}: continued training differs by {e}"
    assert_all(comm, ok, msg)


def _shards_scattered(step_dir, rows, slots):
    """{slot: (rows, E)} straight from a checkpoint's shard files (each id's row put in its
    place): the export's oracle, written without the export's code."""
    meta = json.load(open(os.path.join(step_dir, "meta.json")))
    out = {}
    for name in meta["shards"]:
        with h5py.File(os.path.join(step_dir, name), "r") as f:
            ids = f["ids"][...]
            for k in ("w", *slots):
                out.setdefault(k, np.full((rows, f[k].shape[1]), np.nan))[ids] = f[k][...]
    return out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("servers,sparse_opt", [(1, "adagrad"), (2, "adam"), (3, "adagrad")])
def test_export_equals_live_rows(comm, mpi_tmp_path, monkeypatch, servers, sparse_opt):
    """Oracles: the live table and the shard files read directly. Exported a block at a
    time: one block, the fewest rows a block holds (one row of each shard) and blocks that
    cross the fields' boundaries, from 1-3 shards."""
    if comm.size - servers < 1:
        pytest.skip(f"{servers} servers need at least {servers + 1} ranks")
    from pshybrid import export as export_module

    ckpt = str(mpi_tmp_path / f"ck-export-{servers}")
    cfg = replace(BASE, servers=servers, steps=3, sparse_optimizer=sparse_opt,
                  checkpoint_dir=ckpt)
    live = run(cfg, comm)
    ok, msg = True, ""
    if comm.rank == 0:
        cards, slots = DATA.cardinalities, {"adagrad": ("acc",), "adam": ("m", "v")}[sparse_opt]
        offsets = np.concatenate(([0], np.cumsum(cards)[:-1]))
        files = _shards_scattered(os.path.join(ckpt, "step-3"), sum(cards), slots)
        for block in (1 << 30, 1, 7 * 5 * 8 * (1 + len(slots))):  # (7 rows of 5 float64)
            monkeypatch.setattr(export_module, "BLOCK_BYTES", block)
            out = str(mpi_tmp_path / f"export-{servers}-{block}.h5")
            export(ckpt, out)
            with h5py.File(out, "r") as f:
                ok, msg = _exported_as(f, live, files, cards, offsets, slots, block)
            if not ok:
                break
    assert_all(comm, ok, msg)


def _exported_as(f, live, files, cards, offsets, slots, block):
    """(ok, why not): the export ``f`` holds the live rows, the shards' slots, the live
    dense parameters and the data's schema."""
    if f.attrs["step"] != 3 or json.loads(f.attrs["config"])["model"] != "wdl":
        return False, f"block {block}: step or config {f.attrs['step']} {f.attrs['config']}"
    if json.loads(f.attrs["schema"]) != DATA.schema.to_dict() or json.loads(
            f.attrs["field_names"]) != [*DATA.schema.dense_names, *DATA.schema.sparse_names]:
        return False, f"schema {f.attrs['schema']} != the data's {DATA.schema}"
    for i, name in enumerate(("C1", "C2", "C3", "C4")):
        span = slice(offsets[i], offsets[i] + cards[i])
        rows = live.table[span]
        if not (np.array_equal(f[f"embeddings/{name}"][...], rows[:, :4])
                and np.array_equal(f[f"linear/{name}"][...], rows[:, 4])):
            return False, f"block {block}: exported table {name} != live rows"
        for k in slots:
            if not np.array_equal(f[f"optimizer/embeddings/{name}/{k}"][...], files[k][span]):
                return False, f"block {block}: exported {name}/{k} != the shards' rows"
    flat = np.concatenate([f[f"dense/{k}"][...].ravel() for k in
                           ("wide.dense.weight", "wide.dense.bias")])
    if not np.array_equal(flat, live.dense[:flat.size]):
        return False, "exported dense != live"
    return True, ""


@pytest.mark.mpi(min_size=2)
def test_corrupt_or_mismatched_checkpoint_is_refused(comm, mpi_tmp_path):
    ckpt = str(mpi_tmp_path / "ck-bad")
    cfg = replace(BASE, servers=1, steps=2, checkpoint_dir=ckpt)
    run(cfg, comm)
    checks = []
    with pytest.raises(PshybridError) as e:
        run(replace(cfg, embedding_dim=5, checkpoint_dir=None, resume=ckpt), comm)
    checks.append("embedding_dim = 4" in str(e.value) and "meta.json" in str(e.value))
    comm.Barrier()
    if comm.rank == 0:
        shard = os.path.join(ckpt, "step-2", "shard-00000.h5")
        with open(shard, "r+b") as f:
            f.truncate(os.path.getsize(shard) // 2)
    comm.Barrier()
    with pytest.raises(PshybridError) as e:
        run(replace(cfg, checkpoint_dir=None, resume=ckpt), comm)
    checks.append("shard-00000.h5" in str(e.value))
    assert_all(comm, all(checks), f"messages: {checks}")


@pytest.mark.mpi(min_size=2)
def test_a_write_failing_on_one_rank_fails_every_rank_and_keeps_latest(comm, mpi_tmp_path,
                                                                       monkeypatch):
    """A server's disk is full while the checkpoint of step 4 is written: every rank raises
    the same one-line error, the temporary directory is gone, latest names step-2; then a
    value changed in the shard is found by the checksum on every rank at resume."""
    import errno

    from pshybrid import checkpoint

    ckpt = str(mpi_tmp_path / "ck-full")
    cfg = replace(BASE, servers=1, steps=2, checkpoint_dir=ckpt)
    run(cfg, comm)
    write = checkpoint._write_files

    def full_on_servers(tmp, step, cfg, topo, *rest):
        if topo.is_server:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(tmp, step, cfg, topo, *rest)
    monkeypatch.setattr(checkpoint, "_write_files", full_on_servers)
    with pytest.raises(PshybridError) as e:
        run(replace(cfg, steps=4, resume=ckpt), comm)
    monkeypatch.undo()
    msg = str(e.value)
    checks = ["step-4 not written" in msg and "No space left on device" in msg and
              "latest still names step-2" in msg and "\n" not in msg]
    comm.Barrier()
    checks.append(sorted(os.listdir(ckpt)) == ["latest", "step-2"])
    comm.Barrier()
    if comm.rank == 0:
        with h5py.File(os.path.join(ckpt, "step-2", "shard-00000.h5"), "a") as f:
            f["w"][1, 0] += 1.0
    comm.Barrier()
    with pytest.raises(PshybridError) as e:
        run(replace(cfg, steps=4, checkpoint_dir=None, resume=ckpt), comm)
    checks.append("shard-00000.h5: /w fails its checksum" in str(e.value))
    assert_all(comm, all(checks), f"{checks}: {msg} / {e.value}")


def _edit_shard(comm, path, edit) -> None:
    """Rank 0 rewrites every dataset of shard ``path`` as ``edit({name: array})`` says,
    keeping its attributes (the checksums of the arrays as written)."""
    comm.Barrier()
    if comm.rank == 0:
        with h5py.File(path, "r+") as f:
            attrs = {k: dict(f[k].attrs) for k in f}
            for k, a in edit({k: f[k][...] for k in f}).items():
                del f[k]
                f[k] = a
                f[k].attrs.update(attrs[k])
    comm.Barrier()


@pytest.mark.mpi(min_size=3)
def test_same_server_count_reads_its_own_shard_and_checks_it(comm, mpi_tmp_path,
                                                             monkeypatch):
    """Resumed by as many servers as wrote it, each server opens its own shard alone (no
    reading of every id, no table-sized bitset), and resumes exactly; a row of another
    shard, or one missing, is still refused, naming the shard file, on every rank."""
    from pshybrid import checkpoint_files

    ckpt = str(mpi_tmp_path / "ck-own")
    cfg = replace(BASE, servers=2, steps=2, checkpoint_dir=ckpt)
    run(cfg, comm)
    shard = os.path.join(ckpt, "step-2", "shard-00001.h5")
    again = replace(cfg, steps=3, checkpoint_dir=None, resume=ckpt)
    opened, h5 = [], checkpoint_files.open_h5
    monkeypatch.setattr(checkpoint_files, "open_h5", lambda p: opened.append(p) or h5(p))
    resumed_verdict(comm, run(replace(cfg, steps=3, checkpoint_dir=None), comm),
                    run(again, comm), "resumed with the same servers")
    shards = sorted(os.path.basename(p) for p in opened if "shard-" in p)
    monkeypatch.undo()
    assert_all(comm, len(shards) <= 1, f"opened {shards}")
    messages = []
    for edit in (lambda a: dict(a, ids=np.concatenate(([0], a["ids"][1:]))),
                 lambda a: {k: v[:-1] for k, v in a.items()}):   # (ids[0] put back) a row less
        _edit_shard(comm, shard, edit)
        with pytest.raises(PshybridError) as e:
            run(again, comm)
        messages.append(str(e.value))
        _edit_shard(comm, shard, lambda a: dict(a, ids=np.concatenate(([1], a["ids"][1:]))))
    half = sum(DATA.cardinalities) // 2
    want = ["shard-00001.h5: /ids[0] = 0 is a row of shard 0 of 2",
            f"shard-00001.h5: the shards hold {half - 1:,} of the table's {half:,} rows "
            "(r % 2 == 1)"]
    assert_all(comm, all(w in m for w, m in zip(want, messages)), f"{messages}")
