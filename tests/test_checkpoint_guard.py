"""Checkpoint directories and exports cannot lose or leak data, by class (one process,
allreduce mode over COMM_SELF):

- ``latest`` always names a complete checkpoint: pruning never removes its target, newer
  steps or anything through a link; a fresh run into a directory holding checkpoints, or a
  run resumed from an older step into it, is refused before step 1 with nothing changed;
- no write goes through a pre-existing link (planted at every fixed temporary name, at
  ``latest``, at an export's output);
- a corrupt checkpoint is refused naming the file and the key, by resume and by export,
  and a refused export leaves no file;
- outputs are checked writable before step 1; a finished resumed run has nothing to do.
"""

import io
import json
import os
import re
import shutil
import time
from dataclasses import replace

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from mpi_util import snapshot
from pshybrid import checkpoint, checkpoint_files, export, limits
from pshybrid.config import TrainConfig
from pshybrid.data import DatasetWriter
from pshybrid.errors import ConfigError, InputError, PshybridError
from pshybrid.synthetic import SyntheticCTR
from pshybrid.train import train

DATA = SyntheticCTR(seed=5, n_dense=3, cardinalities=(7, 30, 200, 5), zipf=1.3)
ROWS = sum(DATA.schema.cardinalities)
BASE = TrainConfig(model="wdl", mode="allreduce", servers=0, embedding_dim=4, mlp=(8,),
                   batch_size=4, steps=4, log_every=1, seed=3)


def run(**kw):
    out = io.StringIO()
    res = train(replace(BASE, **kw), MPI.COMM_SELF, dataset=DATA, out=out)
    return res, out.getvalue()


def assert_latest_complete(root):
    name = open(os.path.join(root, "latest")).read().strip()
    assert not os.path.islink(os.path.join(root, "latest"))
    assert os.path.isfile(os.path.join(root, name, "meta.json")), (name, os.listdir(root))
    return name


def steps_in(root):
    return sorted(n for n in os.listdir(root) if n.startswith("step-"))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A checkpoint directory with step-2 and step-4 (latest)."""
    ck = str(tmp_path_factory.mktemp("pristine") / "ck")
    run(steps=4, checkpoint_dir=ck, checkpoint_every=2)
    assert steps_in(ck) == ["step-2", "step-4"]
    return ck


@pytest.fixture
def ck(pristine, tmp_path):
    dst = str(tmp_path / "ck")
    shutil.copytree(pristine, dst, symlinks=True)
    return dst


# -- pruning and lineage -----------------------------------------------------------------

@pytest.mark.parametrize("kw", [
    dict(steps=2, keep_last=1),                       # fresh, fewer steps than the directory
    dict(steps=6, keep_last=1),                       # fresh, more steps
    dict(steps=3, keep_last=1, resume="step-2"),      # resumed from an older step
])
def test_runs_that_could_lose_checkpoints_are_refused_before_step_1(ck, kw):
    before = snapshot(ck)
    if "resume" in kw:
        kw["resume"] = os.path.join(ck, kw["resume"])
    with pytest.raises(InputError) as e:
        run(checkpoint_dir=ck, **kw)
    msg = str(e.value)
    assert ck in msg and "step-4" in msg and ("--resume" in msg or "Resume from" in msg), msg
    assert snapshot(ck) == before


@pytest.mark.parametrize("kw", [
    dict(checkpoint_dir="step-4"),                     # a step directory itself
    dict(checkpoint_dir="step-4/sub"),                 # below one
    dict(checkpoint_dir="sub"),                        # beside the steps, inside the root
    dict(checkpoint_dir="step-2", resume="step-2"),    # resumed into the step it came from
    dict(tensorboard="tb"),                            # the run's own --checkpoint-dir
    dict(tensorboard="step-2/tb"),
])
def test_a_checkpoint_dir_or_tensorboard_inside_a_checkpoint_is_refused(ck, tmp_path, kw):
    """Oracle: nothing in the checkpoint directory changes, and its step-4 (latest) and
    step-2 still load as themselves (no inner ``latest`` is followed); a resume, an eval
    and an export of them would read another model if the run went ahead."""
    kw = {k: os.path.join(ck, v) for k, v in kw.items()}
    own = {} if "checkpoint_dir" in kw else {"checkpoint_dir": str(tmp_path / "own")}
    before = snapshot(ck)
    with pytest.raises((InputError, ConfigError)) as e:
        run(steps=6, **own, **kw)
    assert "lies inside the checkpoint directory" in str(e.value), str(e.value)
    assert snapshot(ck) == before and not os.path.exists(tmp_path / "own")
    for d in (ck, os.path.join(ck, "step-4"), os.path.join(ck, "step-2")):
        want = os.path.join(ck, "step-4") if d == ck else d
        assert checkpoint_files.resolve(d) == want


def test_a_step_directory_resolves_to_itself_whatever_it_holds(ck):
    """A step directory holding a ``latest`` (left by an earlier version that let a run
    write a checkpoint there) is still that step: eval, export and --resume load it."""
    step = os.path.join(ck, "step-2")
    with open(os.path.join(step, "latest"), "w") as f:
        f.write("step-4\n")
    os.mkdir(os.path.join(step, "step-4"))
    assert checkpoint_files.resolve(step) == step


def test_latest_always_names_a_complete_checkpoint_through_resumes(tmp_path):
    ck = str(tmp_path / "ck")
    run(steps=4, checkpoint_dir=ck, checkpoint_every=1, keep_last=2)
    assert steps_in(ck) == ["step-3", "step-4"] and assert_latest_complete(ck) == "step-4"
    run(steps=7, checkpoint_dir=ck, checkpoint_every=2, keep_last=1, resume=ck)
    assert steps_in(ck) == ["step-7"] and assert_latest_complete(ck) == "step-7"
    run(steps=8, checkpoint_dir=ck, keep_last=3, resume=os.path.join(ck, "step-7"))
    assert steps_in(ck) == ["step-7", "step-8"] and assert_latest_complete(ck) == "step-8"


def test_prune_removes_only_older_real_step_directories(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    for n in (1, 5, 10, 30):
        (root / f"step-{n}").mkdir()
        (root / f"step-{n}" / "meta.json").write_text("{}")
    os.symlink(outside, root / "step-3")
    (root / "latest").write_text("step-10\n")
    checkpoint._prune(str(root), 1, 10, None)  # (their meta.json record no evaluation)
    assert steps_in(root) == ["step-10", "step-3", "step-30"]  # newer and links stay
    assert (outside / "keep").read_text() == "x"
    # latest is protected even when it is not the newest written (defence in depth)
    (root / "latest").write_text("step-3\n")
    checkpoint._prune(str(root), 1, 30, None)
    assert (outside / "keep").exists() and os.path.islink(root / "step-3")


def test_a_checkpoint_records_its_evaluation_and_pruning_keeps_the_best(tmp_path):
    """--eval-every with --checkpoint-every and --keep-last: each checkpoint of an evaluated
    step records that evaluation (meta.json "eval"), and pruning keeps the one of the best
    AUC beside the newest (it removed it: the model to export was gone), the run's last
    line names it, and so does ``ck/best``, which every command taking a checkpoint takes
    (as ``ck/latest``). Oracles: the metrics file's evaluations; AUCs set by hand (one
    null: an AUC of one class); a link planted at ``best`` is replaced, never followed."""
    from pshybrid.synthetic import write_synthetic

    ev, ck, m = str(tmp_path / "ev.h5"), str(tmp_path / "ck"), str(tmp_path / "m.jsonl")
    write_synthetic(ev, 64, n_dense=3, cardinalities=DATA.schema.cardinalities, seed=1)
    out = run(steps=6, checkpoint_dir=ck, checkpoint_every=2, keep_last=1, eval_data=ev,
              eval_every=2, metrics=m)[1]
    with open(m) as f:
        evals = {r["step"]: {"auc": r["auc"], "logloss": r["logloss"]}
                 for r in map(json.loads, f) if r.get("eval")}
    assert sorted(evals) == [2, 4, 6], evals
    top = max((e["auc"], n) for n, e in evals.items())[1]
    assert steps_in(ck) == sorted({"step-6", f"step-{top}"}), (steps_in(ck), evals)
    assert (f"best evaluated checkpoint: {ck}/step-{top} (auc {evals[top]['auc']:.4f})\n"
            in out), out
    for pointer, name in (("best", f"step-{top}"), ("latest", "step-6"), ("best/", f"step-{top}")):
        assert checkpoint_files.resolve(os.path.join(ck, pointer)) == os.path.join(ck, name)
    run(steps=2, checkpoint_dir=str(tmp_path / "ck0"))  # (no evaluation: no best)
    with pytest.raises(InputError, match=r"ck0/best: no evaluated checkpoint in \S+ck0 \(train "
                       r"writes best at a checkpoint of a step --eval-data evaluated\)"):
        checkpoint_files.resolve(str(tmp_path / "ck0" / "best"))
    for name in steps_in(ck):
        n = int(name[5:])
        assert checkpoint_files.read_meta(os.path.join(ck, name))["eval"] == evals[n]
    ck2 = str(tmp_path / "ck2")
    run(steps=5, checkpoint_dir=ck2, checkpoint_every=1, eval_data=ev, eval_every=1)
    for n, auc in zip(range(1, 6), (0.7, None, 0.9, 0.6, 0.65)):
        path = os.path.join(ck2, f"step-{n}", "meta.json")
        with open(path) as f:
            meta = json.load(f)
        meta["eval"]["auc"] = auc
        with open(path, "w") as f:
            json.dump(meta, f)
    victim = tmp_path / "victim"
    victim.write_text("step-5\n")
    os.remove(os.path.join(ck2, "best"))
    os.symlink(victim, os.path.join(ck2, "best"))
    kept = checkpoint_files.best(checkpoint_files.list_steps(ck2))
    checkpoint._point_best(ck2, kept)
    checkpoint._prune(ck2, 1, 5, kept)
    assert steps_in(ck2) == ["step-3", "step-5"] and victim.read_text() == "step-5\n"
    assert checkpoint_files.read_latest(ck2, "best") == "step-3"


# -- links ------------------------------------------------------------------------------------

def test_no_write_through_links_planted_at_temporary_names(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    vdir = tmp_path / "vdir"
    vdir.mkdir()
    (vdir / "f").write_text("y")
    ck = tmp_path / "ck"
    ck.mkdir()
    for name in ("latest.tmp", ".latest.tmp", ".step-2.tmp", ".step-4.tmp"):
        os.symlink(victim, ck / name)
    os.symlink(vdir, ck / ".step-3.tmp")
    run(steps=4, checkpoint_dir=str(ck), checkpoint_every=1, keep_last=1)
    assert victim.read_text() == "precious\n" and snapshot(vdir) == {"f": snapshot(vdir)["f"]}
    assert (vdir / "f").read_text() == "y"
    assert assert_latest_complete(str(ck)) == "step-4" and steps_in(ck) == ["step-4"]
    assert os.path.islink(ck / "latest.tmp")  # left alone, never followed


def test_a_planted_latest_link_is_refused_not_followed(ck, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("step-2\n")
    os.remove(os.path.join(ck, "latest"))
    os.symlink(victim, os.path.join(ck, "latest"))
    before = snapshot(ck)
    for kw in (dict(resume=ck), dict(resume=os.path.join(ck, "step-4"), checkpoint_dir=ck)):
        with pytest.raises(InputError) as e:
            run(steps=6, **kw)
        assert "latest" in str(e.value), e.value
    with pytest.raises(InputError):
        export.export(ck, str(tmp_path / "out.h5"))
    assert victim.read_text() == "step-2\n" and snapshot(ck) == before
    assert not os.path.exists(tmp_path / "out.h5")


def test_export_never_writes_through_links(ck, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out.h5"
    for name in ("out.h5.tmp", "out.tmp", ".out.h5.tmp"):
        os.symlink(victim, tmp_path / name)
    export.export(ck, str(out))
    assert victim.read_text() == "precious\n"
    assert not out.is_symlink()
    with h5py.File(out, "r") as f:
        assert f.attrs["step"] == 4
    linked = tmp_path / "linked.h5"  # a link at OUT names an existing file: not an export's
    os.symlink(victim, linked)
    with pytest.raises(PshybridError, match="not an output of pshybrid export"):
        export.export(ck, str(linked), overwrite=True)
    assert victim.read_text() == "precious\n" and linked.is_symlink()
    export.export(ck, str(out), overwrite=True)  # an earlier export: replaced


# -- corrupt checkpoints ---------------------------------------------------------------------

def _shard_edit(fn):
    def edit(ck):
        with h5py.File(os.path.join(ck, "step-4", "shard-00000.h5"), "a") as f:
            arrays = {k: f[k][...] for k in f}
            for k in list(f):
                del f[k]
            for k, a in fn(arrays).items():
                f[k] = a
    return edit


def _dense_edit(fn):
    def edit(ck):
        with h5py.File(os.path.join(ck, "step-4", "dense.h5"), "a") as f:
            fn(f)
    return edit


def _set(a, idx, v):
    a = a.copy()
    a[idx] = v
    return a


def _write(name, text):
    def edit(ck):
        with open(os.path.join(ck, name), "w") as f:
            f.write(text)
    return edit


CORRUPT = {
    "w_fewer_columns": (_shard_edit(lambda a: dict(a, w=a["w"][:, :-1])), "shard-00000.h5: /w"),
    "ids_negative": (_shard_edit(lambda a: dict(a, ids=_set(a["ids"], 0, -1))),
                     "shard-00000.h5: /ids[0] = -1"),
    "ids_out_of_range": (_shard_edit(lambda a: dict(a, ids=_set(a["ids"], 5, ROWS))),
                         f"/ids[5] = {ROWS} is outside"),
    "ids_duplicated": (_shard_edit(lambda a: dict(a, ids=_set(a["ids"], 1, a["ids"][0]))),
                       "more than once"),
    "row_missing": (_shard_edit(lambda a: {k: v[:-1] for k, v in a.items()}),
                    f"of the table's {ROWS} rows"),
    "slot_missing": (_shard_edit(lambda a: {k: v for k, v in a.items() if k != "acc"}),
                     "shard-00000.h5: keys"),
    "extra_key": (_shard_edit(lambda a: dict(a, junk=a["w"])), "shard-00000.h5: keys"),
    "w_nan": (_shard_edit(lambda a: dict(a, w=_set(a["w"], (3, 0), np.nan))),
              "/w row 3 (id "),
    "acc_inf": (_shard_edit(lambda a: dict(a, acc=_set(a["acc"], (ROWS - 2, 1), np.inf))),
                f"/acc row {ROWS - 2} (id "),
    "dense_no_flat": (_dense_edit(lambda f: f.__delitem__("flat")), "dense.h5: /flat"),
    "dense_flat_short": (_dense_edit(lambda f: (lambda a: (f.__delitem__("flat"),
                                                           f.create_dataset("flat", data=a[:-1])))(
        f["flat"][...])), "dense.h5: /flat"),
    "dense_params_missing": (_dense_edit(lambda f: f.attrs.__delitem__("params")),
                             "dense.h5: attribute params"),
    "dense_state_missing": (_dense_edit(lambda f: f.__delitem__("state/v")), "dense.h5: /state"),
    "meta_shard_escapes": (lambda ck: _write("step-4/meta.json", open(
        os.path.join(ck, "step-4", "meta.json")).read().replace(
        '"shard-00000.h5"', '"../../victim.h5"'))(ck), "meta.json: shards"),
    "meta_not_json": (_write("step-4/meta.json", "{"), "meta.json: unreadable"),
    "meta_model_unregistered": (lambda ck: _write("step-4/meta.json", open(  # (from Python)
        os.path.join(ck, "step-4", "meta.json")).read().replace(
        '"model": "wdl"', '"model": "sumpool"'))(ck),
        "model 'sumpool' is not one of this process's models"),
    "latest_escapes": (_write("latest", "../../etc\n"), "latest holds"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_corrupt_checkpoint_is_refused_by_export_and_resume(ck, tmp_path, kind):
    edit, needle = CORRUPT[kind]
    edit(ck)
    before = snapshot(ck)
    outdir = tmp_path / "out"
    outdir.mkdir()
    with pytest.raises(InputError) as e:
        export.export(ck, str(outdir / "x.h5"))
    assert needle in str(e.value), e.value
    assert os.listdir(outdir) == []  # no partial output
    with pytest.raises(PshybridError) as e:
        run(steps=6, resume=ck)
    assert needle in str(e.value), e.value
    assert snapshot(ck) == before


def test_an_export_given_where_a_checkpoint_is_expected_is_named(ck, tmp_path):
    """``eval``, ``predict``, ``export`` and ``train --resume`` of an export's file: one
    line naming the file, what wrote it and what the command takes; nothing written."""
    from pshybrid.cli import main
    from pshybrid.synthetic import write_synthetic

    ex, data = str(tmp_path / "ex.h5"), str(tmp_path / "d.h5")
    export.export(ck, ex)
    write_synthetic(data, 64, n_dense=3, cardinalities=DATA.schema.cardinalities, seed=1)
    outs = [str(tmp_path / n) for n in ("p.h5", "ex2.h5")]
    for argv in (["eval", ex, data], ["predict", ex, data, outs[0]], ["export", ex, outs[1]],
                 ["train", "--resume", ex, "--mode", "allreduce", "--steps", "6"]):
        with pytest.raises(InputError) as e:
            main(argv)
        msg = str(e.value)
        assert (ex in msg and "written by pshybrid export" in msg and "\n" not in msg
                and "checkpoint directory" in msg and "step-N" in msg), (argv, msg)
    assert not any(os.path.exists(o) for o in outs)


DAMAGE = {  # a checkpoint directory's latest (or the step it names) as the code detects it
    "intact": lambda ck: None,
    "latest_link": lambda ck: (os.remove(os.path.join(ck, "latest")),
                               os.symlink("step-4", os.path.join(ck, "latest"))),
    "latest_text": _write("latest", "garbage\n"),
    "latest_names_a_missing_step": _write("latest", "step-9\n"),
    "no_latest": lambda ck: os.remove(os.path.join(ck, "latest")),
    "latest_without_meta": lambda ck: os.remove(os.path.join(ck, "step-4", "meta.json")),
    "latest_meta_not_json": _write("step-4/meta.json", "{"),
    "latest_older_than_a_complete_step": _write("latest", "step-2\n"),
}


@pytest.mark.parametrize("resume", [None, "step-2"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_refused_run_dir_suggests_only_a_resume_that_works(ck, damage, resume):
    """Oracle: the resume a refusal of a fresh run (or of one resumed from an older step)
    into a directory holding checkpoints suggests runs; and one is suggested whenever the
    directory's newest step loads and its latest (if any) names a step."""
    DAMAGE[damage](ck)
    with pytest.raises(InputError) as e:
        run(steps=6, checkpoint_dir=ck, resume=resume and os.path.join(ck, resume))
    said = re.findall(r"(?:--resume|Resume from) (\S+?)[,\s]", str(e.value))
    if damage in ("intact", "latest_names_a_missing_step", "no_latest",
                  "latest_older_than_a_complete_step"):
        assert said, e.value
    for point in said:
        run(steps=6, checkpoint_dir=ck, resume=point)
        assert assert_latest_complete(ck) == "step-6", (e.value, point)


@pytest.mark.parametrize("case", ["out_is_dir", "out_dir_missing", "no_flat"])
def test_refused_export_leaves_no_file(ck, tmp_path, case):
    outdir = tmp_path / "out"
    outdir.mkdir()
    out = {"out_is_dir": outdir, "out_dir_missing": outdir / "no" / "x.h5"}.get(
        case, outdir / "x.h5")
    if case == "no_flat":
        _dense_edit(lambda f: f.__delitem__("flat"))(ck)
    with pytest.raises(PshybridError) as e:
        export.export(ck, str(out))
    assert str(outdir) in str(e.value) or "dense.h5: /flat" in str(e.value), e.value
    assert os.listdir(outdir) == [] and os.listdir(tmp_path) == ["ck", "out"]


def _h5_items(path) -> dict:
    """Every dataset's (dtype, values) and every attribute of an HDF5 file, by name."""
    items = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda k, d: items.__setitem__(k, (d.dtype, d[...].tolist()))
                     if isinstance(d, h5py.Dataset) else None)
        items.update({f"attr {k}": str(v) for k, v in f.attrs.items()})
    return items


def test_an_export_holds_a_block_of_the_table_at_a_time(ck, tmp_path, monkeypatch):
    """Shards in training's row order stream a block at a time (here a row: 40 bytes), so
    a table larger than the memory available exports; a shard in another order (still a
    valid checkpoint: ids, rows and checksums permuted together) is assembled whole, so
    the same memory refuses it. Oracle: both exports, memory unlimited, are the same file."""
    from pshybrid.checksums import CRC_ATTR, crc32

    monkeypatch.setattr(export, "BLOCK_BYTES", 64)
    shuffled = str(tmp_path / "shuffled")
    shutil.copytree(ck, shuffled, symlinks=True)
    with h5py.File(os.path.join(shuffled, "step-4", "shard-00000.h5"), "a") as f:
        perm = np.random.default_rng(0).permutation(f["ids"].shape[0])
        for k in f:
            a = f[k][...][perm]
            f[k][...] = a
            f[k].attrs[CRC_ATTR] = crc32(a)
    monkeypatch.setattr(limits, "available_memory", lambda: 1024)
    export.export(ck, str(tmp_path / "streamed.h5"))
    with pytest.raises(PshybridError) as e:
        export.export(shuffled, str(tmp_path / "whole.h5"))
    assert re.fullmatch(rf"export of {shuffled}/step-4: the table \(.*, 2 slots\) is assembled "
                        rf"in memory \({shuffled}/step-4/shard-00000.h5: /ids\[0\] = "
                        rf"{perm[0]}, not 0, where training writes shard s of n with the rows "
                        r"s, s \+ n, \.\.\. in order\), which needs .*, .* is available",
                        str(e.value)), e.value
    monkeypatch.setattr(limits, "available_memory", lambda: None)
    export.export(shuffled, str(tmp_path / "whole.h5"))
    assert _h5_items(tmp_path / "streamed.h5") == _h5_items(tmp_path / "whole.h5")


def test_a_checkpoint_write_holds_no_temporary_of_the_tables_size(tmp_path, monkeypatch):
    """A checkpoint's write made an array of the shard's ids (8 B a row) and a bool array
    of each slot's size (its finiteness), up to 47% over the shard with plain SGD at a small
    dim: the memory check before step 1 counts neither, so a run that passed it could fail
    at its first checkpoint. Oracle: tracemalloc's peak over ``checkpoint.save`` (NumPy's
    allocations included) against the table's bytes (here 72 MB); the ids written are the
    table's rows."""
    import tracemalloc

    peaks, real = [], checkpoint.save

    def measured(*args, **kw):
        tracemalloc.start()
        try:
            return real(*args, **kw)
        finally:
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()

    monkeypatch.setattr(checkpoint, "save", measured)
    rows = 2_000_000 + 5
    data = SyntheticCTR(seed=5, n_dense=3, cardinalities=(2_000_000, 5), zipf=1.3)
    ck = tmp_path / "ck"
    train(replace(BASE, steps=1, checkpoint_dir=str(ck), sparse_optimizer="sgd",
                  embedding_dim=8), MPI.COMM_SELF, dataset=data, out=io.StringIO())
    assert len(peaks) == 1 and peaks[0] < 0.1 * rows * 9 * 4, peaks
    with h5py.File(ck / "step-1" / "shard-00000.h5", "r") as f:
        assert np.array_equal(f["ids"][...], np.arange(rows)) and f["w"].shape == (rows, 9)


def test_a_checkpoint_is_timed_apart_from_training_and_said(tmp_path, monkeypatch):
    """A checkpoint's write counted as training time: the log after a slow one (here 3 s
    added to each) and the summary reported rates that fell with the disk, and no line said
    a checkpoint was written. Oracles: each checkpoint's line names its directory, the size
    of the files in it and at least the 3 s; the log interval across it took less than the
    3 s; the summary's rows over its rate leave both writes' 6 s out of ``seconds``, which
    the phase ``checkpoint`` holds."""
    real = checkpoint.save

    def slow(*args, **kw):
        time.sleep(3)
        return real(*args, **kw)

    monkeypatch.setattr(checkpoint, "save", slow)
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    _, out = run(steps=4, log_every=2, checkpoint_dir=str(ck), checkpoint_every=2,
                 metrics=str(m))
    for step in (2, 4):
        d = ck / f"step-{step}"
        said = [ln.split(" in ") for ln in out.splitlines() if ln.startswith(
            f"checkpoint {d}: {limits.gib(sum(f.stat().st_size for f in d.iterdir()))} in ")]
        assert len(said) == 1 and float(said[0][1].removesuffix(" s")) >= 3, out
    recs = _records(m)
    logs, summary = [r for r in recs if "loss" in r], recs[-1]
    assert [r["step"] for r in logs] == [2, 4] and all(
        2 * BASE.batch_size / r["samples_per_s"] < 3 for r in logs), logs
    assert summary["phase_seconds"]["checkpoint"] >= 6, summary
    assert 4 * BASE.batch_size / summary["samples_per_s"] <= summary["seconds"] - 6, summary


def test_a_resume_says_the_checkpoints_size_and_its_loads_seconds(ck, monkeypatch):
    """Oracle: the line after a resume names the checkpoint, the size of its step's files
    and at least the 1 s added to its shards' read."""
    real = checkpoint.read_shards

    def slow(*args, **kw):
        time.sleep(1)
        return real(*args, **kw)

    monkeypatch.setattr(checkpoint, "read_shards", slow)
    _, out = run(steps=6, resume=ck)
    size = limits.gib(sum(f.stat().st_size for f in os.scandir(os.path.join(ck, "step-4"))))
    said = re.findall(rf"^resumed from {re.escape(ck)} at step 4 \({re.escape(size)} in "
                      r"([0-9.]+) s\)$", out, re.M)
    assert len(said) == 1 and float(said[0]) >= 1, out


@pytest.mark.parametrize("n,me", [(1, 0), (3, 1)])
@pytest.mark.parametrize("prefix", [0, 1, 5, 8, 13, "all"])
@pytest.mark.parametrize("tail", ["in_order", "reversed", "duplicate", "missing", "foreign",
                                  "outside"])
def test_a_readers_ids_are_checked_alike_in_training_order_or_not(n, me, prefix, tail):
    """A reader's ids skip the sort and the bitset while they come as training writes them
    (rows me, me + n, ... in order); at the first chunk that does not, the bitset takes the
    rows so far (a prefix of any length mod 8) and checks on. Oracle, by construction: an
    in-order prefix of this reader's rows, then a chunk with one fault (or none), gives
    that fault's error naming the row, or none."""
    from pshybrid.shard_files import _Rows

    rows = 61
    mine = list(range(me, rows, n))
    c = len(mine) if prefix == "all" else prefix
    rest = mine[c:]
    chunk, want = {
        "in_order": (rest, None), "reversed": (rest[::-1], None),
        "duplicate": ([mine[max(c - 1, 0)]] + rest[1:] + ([mine[0]] if c == 0 else []),
                      f"holds row {mine[max(c - 1, 0)]} more than once"),
        "missing": (rest[:-1] if rest else [], f"the shards hold {len(mine) - 1:,} of"),
        "foreign": (rest + [mine[-1] + 1], "is a row of shard" if n > 1 else "more than once"),
        "outside": (rest + [rows], f"= {rows} is outside the table's rows"),
    }[tail]
    if tail == "missing" and not rest:
        chunk, want = [], None
        c -= 1  # (the prefix short of its last row)
        want = f"the shards hold {c:,} of"
    if tail == "foreign" and n == 1:
        chunk = rest + [mine[-1]]  # (every row is this reader's: a repeat instead)
        want = f"holds row {mine[-1]} more than once"
    r = _Rows(rows, n, me)
    got = None
    try:
        r.add("f.h5", np.array(mine[:c], np.int64), 0)
        r.add("f.h5", np.array(chunk, np.int64), c)
        r.check_complete("ck")
    except InputError as e:
        got = str(e)
    assert (got is None) if want is None else (got is not None and want in got), (got, want)


# -- before step 1 ---------------------------------------------------------------------------

def unwritable_dir(tmp_path) -> str:
    """A directory this process cannot create files in (root ignores permissions: /sys)."""
    from pshybrid.safeio import check_writable_dir

    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    for cand in (str(d), "/sys/fs"):
        if check_writable_dir(cand) is not None:
            return cand
    pytest.skip("no unwritable directory available")


@pytest.mark.parametrize("case", ["metrics_missing_dir", "metrics_is_dir", "ckdir_under_file",
                                  "ckdir_unwritable", "ckdir_is_file"])
def test_outputs_are_checked_before_step_1(tmp_path, case):
    f = tmp_path / "file.txt"
    f.write_text("x")
    kw = {"metrics_missing_dir": dict(metrics=str(tmp_path / "no" / "m.jsonl")),
          "metrics_is_dir": dict(metrics=str(tmp_path)),
          "ckdir_under_file": dict(checkpoint_dir=str(f / "ck")),
          "ckdir_is_file": dict(checkpoint_dir=str(f)),
          "ckdir_unwritable": dict(checkpoint_dir=os.path.join(unwritable_dir(tmp_path), "ck"))
          }[case]
    before = snapshot(tmp_path)
    out = io.StringIO()
    with pytest.raises(ConfigError) as e:
        train(replace(BASE, **kw), MPI.COMM_SELF, dataset=DATA, out=out)
    assert ("--metrics" if "metrics" in case else "--checkpoint-dir") in str(e.value)
    assert out.getvalue() == ""  # refused before step 1
    assert snapshot(tmp_path) == before


def test_resumed_run_already_past_steps_has_nothing_to_do(ck):
    before = snapshot(ck)
    res, out = run(steps=2, resume=ck, checkpoint_dir=ck, keep_last=1)
    assert "nothing to do" in out and "step 4 >= --steps 2" in out and "done:" not in out, out
    assert out.count("\n") == 1 and res.summary == {}
    assert snapshot(ck) == before


@pytest.mark.parametrize("mode", ["allreduce", "auto"])
@pytest.mark.parametrize("case", ["unwritable", "full"])
def test_nothing_to_do_needs_no_room_for_a_checkpoint(ck, tmp_path, monkeypatch, case, mode):
    """A finished run run again (a requeued job) writes nothing: a directory that could not
    take a checkpoint now (read-only, a full disk) does not turn its ``nothing to do`` into
    a refusal (--mode auto: not before its probe either); one step more to run is refused,
    as before step 1."""
    ckdir = ck
    if case == "unwritable":
        ckdir = os.path.join(unwritable_dir(tmp_path), "ck")
    else:
        monkeypatch.setattr(limits, "checkpoint_bytes", lambda *a: 1 << 62)
    before = snapshot(tmp_path)
    res, out = run(steps=4, resume=ck, checkpoint_dir=ckdir, mode=mode)
    assert "nothing to do" in out and res.summary == {}, out
    assert snapshot(tmp_path) == before
    with pytest.raises(ConfigError) as e:
        run(steps=5, resume=ck, checkpoint_dir=ckdir, mode=mode)
    assert "--checkpoint-dir" in str(e.value)
    assert snapshot(tmp_path) == before


def test_empty_eval_file_is_refused(tmp_path):
    path = str(tmp_path / "empty.h5")
    s = DATA.schema
    with DatasetWriter(path, s.dense_names, s.sparse_names) as w:
        w.close(s.cardinalities)
    with pytest.raises(InputError) as e:
        run(eval_data=path)
    assert path in str(e.value) and "no rows" in str(e.value)


def _records(path):
    return [json.loads(line) for line in open(path)]


def test_metrics_are_appended_across_a_stop_and_a_resume(tmp_path):
    """Oracle: one unbroken record of steps 1..6 in one file, each run starting with its
    config record (the start step it resumed from), after a run of 4 steps and a resume."""
    ck, m = str(tmp_path / "ck"), str(tmp_path / "m.jsonl")
    run(steps=4, checkpoint_dir=ck, metrics=m)
    run(steps=6, resume=ck, checkpoint_dir=ck, metrics=m)
    recs = _records(m)
    assert [(r["command"], r["start_step"]) for r in recs if "config" in r] == [
        ("train", 0), ("train", 4)]
    assert "config" in recs[0] and recs[0]["config"]["steps"] == 4
    assert [r["step"] for r in recs if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert [r["steps"] for r in recs if r.get("summary")] == [4, 6]


def test_an_eval_file_that_is_also_a_training_file_is_refused(tmp_path):
    """``--data DIR`` takes in the ``.valid.h5`` prep wrote beside OUT: an --eval-data
    that comes into --data through a directory (by any name) is refused before step 1; a
    file named in both (a training set's own AUC) or in another directory is fine."""
    from pshybrid.synthetic import write_synthetic

    d = tmp_path / "days"
    d.mkdir()
    cards = dict(n_dense=3, cardinalities=DATA.schema.cardinalities, seed=1)
    write_synthetic(str(d / "train.h5"), 300, 0.2, str(d / "train.valid.h5"), **cards)
    os.symlink(d / "train.valid.h5", tmp_path / "v.h5")
    for data, ev in ((str(d), str(d / "train.valid.h5")),
                     (f"{tmp_path / 'v.h5'},{d}", str(tmp_path / "v.h5"))):
        with pytest.raises(InputError, match="is also a training file"):
            train(replace(BASE, data=data, eval_data=ev), MPI.COMM_SELF, out=io.StringIO())
    res = train(replace(BASE, data=str(d / "train.h5"), eval_data=str(d / "train.h5")),
                MPI.COMM_SELF, out=io.StringIO())
    assert res.evals and res.evals[-1]["rows"] == 240
    os.replace(d / "train.valid.h5", tmp_path / "valid.h5")
    res = train(replace(BASE, data=str(d), eval_data=str(tmp_path / "valid.h5")),
                MPI.COMM_SELF, out=io.StringIO())
    assert res.evals and res.evals[-1]["rows"] == 60


def test_metrics_are_strict_json_when_nothing_was_trained_or_scored(tmp_path):
    """A run of 0 steps has no loss and no base rate: null, not a NaN literal nor a made-up
    0.0; an AUC of a one-class eval file (NaN) is null too. Every line parses as strict
    JSON (no NaN, Infinity)."""
    m = str(tmp_path / "m.jsonl")
    ev = tmp_path / "one_class.h5"
    w = DatasetWriter(str(ev), DATA.schema.dense_names, DATA.schema.sparse_names)
    w.append(np.ones(5, np.float32), np.zeros((5, 3), np.float32), np.ones((5, 4), np.int64))
    w.close(DATA.schema.cardinalities)
    _, out = run(steps=0, metrics=m)
    run(steps=2, metrics=m, eval_data=str(ev))

    def strict(c):
        raise ValueError(f"not strict JSON: {c}")

    recs = [json.loads(line, parse_constant=strict) for line in open(m)]
    first, second = [r for r in recs if r.get("summary")]
    assert (first["final_loss"], first["base_rate"], first["base_rate_logloss"]) == (
        None, None, None)
    assert "final loss - (base-rate logloss -)" in out
    assert second["final_loss"] > 0 and second["base_rate"] is not None
    evals = [r for r in recs if r.get("eval")]
    assert [r["auc"] for r in evals] == [None] and evals[0]["logloss"] > 0


def test_metrics_file_of_another_kind_is_refused_not_truncated(tmp_path):
    other = tmp_path / "notes.jsonl"
    other.write_text('{"step": 1}\n')
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError) as e:
        run(metrics=str(other))
    assert "not a --metrics file of pshybrid" in str(e.value) and str(other) in str(e.value)
    assert snapshot(tmp_path) == before


def test_a_metrics_path_that_is_a_link_is_refused_before_step_1(tmp_path):
    """A link to a --metrics file of pshybrid passed the check (it follows links) and the
    run's O_NOFOLLOW open then raised a traceback after start-up; a dangling one was called
    'not writable'. Both are one line now, and nothing changes."""
    run(steps=1, metrics=str(tmp_path / "m.jsonl"))
    os.symlink(tmp_path / "m.jsonl", tmp_path / "to-m.jsonl")
    os.symlink(tmp_path / "none.jsonl", tmp_path / "dangling.jsonl")
    before = snapshot(tmp_path)
    for link in ("to-m.jsonl", "dangling.jsonl"):
        with pytest.raises(ConfigError) as e:
            run(steps=1, metrics=str(tmp_path / link))
        assert str(e.value) == (f"--metrics {tmp_path / link} is a symbolic link: lines are "
                                "appended to the file itself, never through a link; give "
                                "the file it names")
    assert snapshot(tmp_path) == before


# -- one job per checkpoint directory --------------------------------------------------------

def _plant_lock(root, pid, start=None):
    import socket

    from pshybrid import dirlock

    os.makedirs(root, exist_ok=True)
    text = f"{socket.gethostname()} {pid} {start or dirlock._start_time(pid)}\n"
    with open(os.path.join(root, dirlock.LOCK_NAME), "w") as f:
        f.write(text)
    return text


def test_a_checkpoint_dir_held_by_a_live_job_is_refused_before_step_1(tmp_path):
    ck = str(tmp_path / "ck")
    _plant_lock(ck, os.getppid())  # a live process on this host: another job
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError) as e:
        run(checkpoint_dir=ck)
    assert "in use by another job" in str(e.value) and f"pid {os.getppid()}" in str(e.value)
    assert snapshot(tmp_path) == before


def test_a_metrics_file_another_run_writes_is_refused_before_step_1(tmp_path):
    """Oracle: the file's bytes. Two jobs given one --metrics file (jobs/local.toml names
    one) interleaved their lines, every step twice, with nothing to tell them apart. The
    writer holds the file's flock; a run that finds it held is refused before step 1 and
    the file is unchanged; once the holder has ended, the same run appends to it."""
    import subprocess
    import sys

    from pshybrid.report import open_metrics

    m = tmp_path / "m.jsonl"
    res, _ = run(metrics=str(m), steps=2)
    before = m.read_bytes()
    holder = subprocess.Popen(  # another run writing it (what open_metrics holds)
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
         str(m)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match="is being written by another run"):
            run(metrics=str(m), steps=2)
        with pytest.raises(ConfigError, match="is being written by another run"):
            open_metrics(str(m))  # (two starting at once: the second to open it)
        assert m.read_bytes() == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    run(metrics=str(m), steps=2)
    assert m.read_bytes().startswith(before) and len(m.read_bytes()) > len(before)


def test_a_stale_lock_is_named_and_taken_over_and_every_run_releases_its_lock(tmp_path):
    from pshybrid import dirlock

    ck = str(tmp_path / "ck")
    _plant_lock(ck, os.getppid(), start="1")  # that pid now runs another process
    res, out = run(checkpoint_dir=ck)
    assert "stale lock" in out and "now another process" in out, out
    assert not os.path.exists(os.path.join(ck, dirlock.LOCK_NAME))

    def fail(done):  # an error after step 5, on every rank: the lock is released
        if done == 5:
            raise PshybridError("stop here", collective=True)
    with pytest.raises(PshybridError, match="stop here"):
        train(replace(BASE, steps=6, resume=ck, checkpoint_dir=ck), MPI.COMM_SELF,
              dataset=DATA, out=io.StringIO(), on_step=fail)
    assert sorted(os.listdir(ck)) == ["latest", "step-4"]


def test_a_lock_held_by_a_killed_but_unreaped_process_is_stale(tmp_path):
    """A job killed with kill -9 whose ranks are zombies for a moment (their parents died
    too) holds nothing: the next run into its directory takes the lock over."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while time.time() < deadline and _state(child.pid) != "Z":  # exited, not reaped
        time.sleep(0.01)
    try:
        ck = str(tmp_path / "ck")
        _plant_lock(ck, child.pid)
        _, out = run(checkpoint_dir=ck)
        assert "stale lock" in out, out
    finally:
        child.wait()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


# -- checksums -------------------------------------------------------------------------------

def test_every_array_carries_its_checksum_and_a_change_is_named(ck, tmp_path):
    """Oracle: zlib.crc32 of each dataset's bytes, recomputed here; one changed value in
    any array fails resume and export naming the file, the key and both checksums."""
    import zlib

    step = os.path.join(ck, "step-4")
    assert json.load(open(os.path.join(step, "meta.json")))["checksums"] == "crc32"
    for name in ("dense.h5", "shard-00000.h5"):
        with h5py.File(os.path.join(step, name), "r") as f:
            keys = []
            f.visit(lambda k: keys.append(k) if isinstance(f[k], h5py.Dataset) else None)
            assert keys
            for k in keys:
                assert f[k].attrs["crc32"] == zlib.crc32(np.ascontiguousarray(f[k][...])), k
    with h5py.File(os.path.join(step, "shard-00000.h5"), "a") as f:
        f["acc"][2, 1] += 1.0
        want = int(f["acc"].attrs["crc32"])
    for load in (lambda: export.export(ck, str(tmp_path / "x.h5")),
                 lambda: run(steps=6, resume=ck)):
        with pytest.raises(InputError) as e:
            load()
        assert "shard-00000.h5: /acc fails its checksum" in str(e.value)
        assert f"stored {want:#010x}" in str(e.value), e.value
    assert not (tmp_path / "x.h5").exists()


def test_a_checkpoint_without_checksums_loads_with_one_warning(ck, tmp_path, capfd):
    """Checkpoints written before the checksums: no meta.json 'checksums', no attributes."""
    step = os.path.join(ck, "step-4")
    meta = json.load(open(os.path.join(step, "meta.json")))
    del meta["checksums"]
    with open(os.path.join(step, "meta.json"), "w") as f:
        json.dump(meta, f)
    for name in ("dense.h5", "shard-00000.h5"):
        with h5py.File(os.path.join(step, name), "a") as f:
            f.visititems(lambda k, d: d.attrs.__delitem__("crc32")
                         if isinstance(d, h5py.Dataset) else None)
    res, _ = run(steps=6, resume=ck)
    export.export(ck, str(tmp_path / "x.h5"))
    err = capfd.readouterr().err
    assert res.summary["steps"] == 6 and err.count("no checksums") == 2, err


# -- a full disk -----------------------------------------------------------------------------

@pytest.fixture
def file_limit():
    """``limit(n)``: a file size limit of n bytes (``ulimit -f``: writes past it fail with
    EFBIG, Python ignores SIGXFSZ), restored after the test."""
    import resource

    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    yield lambda n: resource.setrlimit(resource.RLIMIT_FSIZE, (n, old[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, old)


def _resume_failing_at_6(ck, at5):
    def hook(done):
        if done == 5:
            at5()
    with pytest.raises(PshybridError) as e:
        train(replace(BASE, steps=6, resume=ck, checkpoint_dir=ck), MPI.COMM_SELF,
              dataset=DATA, out=io.StringIO(), on_step=hook)
    return str(e.value)


def test_a_checkpoint_the_disk_cannot_hold_keeps_the_last_one(ck, file_limit, monkeypatch):
    """A file size limit, a full disk (statvfs), an OSError while writing: each is one
    message naming the directory and the error, the temporary directory is gone and
    ``latest`` still names the previous checkpoint (and the lock is released)."""
    import errno

    def no_room(path):
        return os.statvfs_result((4096, 4096, 100, 1, 1, 100, 1, 1, 0, 255))

    def enospc(tmp, *a):
        open(os.path.join(tmp, "dense.h5"), "w").write("partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    cases = {"File too large": lambda: file_limit(16384),
             "No space left on device": lambda: monkeypatch.setattr(os, "statvfs", no_room),
             os.strerror(errno.ENOSPC): lambda: monkeypatch.setattr(checkpoint, "_write_files",
                                                                    enospc)}
    for why, at5 in cases.items():
        msg = _resume_failing_at_6(ck, at5)
        monkeypatch.undo()
        file_limit(2**62)
        assert f"checkpoint step-6 not written in {ck}" in msg and why in msg, msg
        assert f"{ck}/latest still names step-4" in msg and "\n" not in msg, msg
        assert sorted(os.listdir(ck)) == ["latest", "step-2", "step-4"], os.listdir(ck)
        assert assert_latest_complete(ck) == "step-4"


def test_a_disk_that_cannot_hold_one_checkpoint_is_refused_before_step_1(tmp_path,
                                                                         monkeypatch):
    """The plan knows a checkpoint's size, yet only ``ulimit -f`` was checked before step
    1: a run trained to the end, then its one checkpoint did not fit and the compute was
    lost. Now refused before step 1, naming the size and the free space; nothing made."""
    monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result(
        (4096, 4096, 100, 1, 1, 100, 1, 1, 0, 255)))  # (4 KiB free)
    done = []
    with pytest.raises(ConfigError) as e:
        train(replace(BASE, steps=3, checkpoint_dir=str(tmp_path / "ck")), MPI.COMM_SELF,
              dataset=DATA, out=io.StringIO(), on_step=done.append)
    assert done == [] and os.listdir(tmp_path) == []
    assert re.fullmatch(rf"--checkpoint-dir {tmp_path}/ck: its checkpoints cannot be written: "
                        r"about [0-9.]+ (KiB|MiB) is needed, its disk has 4\.0 KiB free \(No "
                        r"space left on device\)", str(e.value)), str(e.value)


def test_export_to_a_full_disk_is_refused_before_writing(ck, tmp_path, file_limit, monkeypatch):
    out = tmp_path / "x.h5"
    file_limit(4096)
    with pytest.raises(PshybridError, match="file size limit") as e:
        export.export(ck, str(out))
    file_limit(2**62)
    monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result((4096,) * 2 + (9, 1, 1) +
                                                                    (9, 1, 1, 0, 255)))
    with pytest.raises(PshybridError, match="No space left on device"):
        export.export(ck, str(out))
    assert str(out) in str(e.value) and os.listdir(tmp_path) == ["ck"]


def test_a_metrics_disk_that_fills_warns_once_and_training_goes_on(tmp_path, file_limit,
                                                                   capfd):
    m = tmp_path / "m.jsonl"

    def fill(done):
        if done == 2:
            file_limit(m.stat().st_size)  # the next line no longer fits
    res = train(replace(BASE, steps=5, metrics=str(m)), MPI.COMM_SELF, dataset=DATA,
                out=io.StringIO(), on_step=fill)
    file_limit(2**62)
    err = capfd.readouterr().err
    assert err.count("pshybrid: warning: --metrics") == 1 and "File too large" in err, err
    assert res.metrics_failed and res.summary["steps"] == 5  # trained to the end
    assert [r["step"] for r in _records(m) if "loss" in r] == [1, 2]


def test_a_metrics_line_cut_short_by_a_killed_job_stays_alone(tmp_path):
    m = tmp_path / "m.jsonl"
    run(steps=2, metrics=str(m))
    m.write_text(m.read_text() + '{"step": 3, "lo')  # killed while writing step 3's line
    run(steps=2, metrics=str(m))
    lines = m.read_text().splitlines()
    cut = lines.index('{"step": 3, "lo')  # alone on its line, the next run's config after it
    assert '"config"' in lines[cut + 1] and '"summary"' in lines[-1], lines


def test_a_resume_from_another_directory_names_the_stored_relative_paths(tmp_path, capsys,
                                                                       monkeypatch):
    """A run started in ``a`` with ``--metrics m.jsonl``, resumed from ``b``: its records
    went to a new ``b/m.jsonl`` without a word (docs: "one unbroken record"). Oracle: one
    line names --metrics and both directories; resumed from ``a``, no such line."""
    from pshybrid.cli import main

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert main(["train", "--mode", "allreduce", "--servers", "0", "--embedding-dim", "4",
                 "--mlp", "8", "--batch-size", "4", "--steps", "2", "--progress", "none",
                 "--metrics", "m.jsonl", "--checkpoint-dir", "ck"]) == 0
    for where, steps in (("a", "3"), ("b", "4")):
        monkeypatch.chdir(tmp_path / where)
        capsys.readouterr()
        assert main(["train", "--resume", str(tmp_path / "a" / "ck"), "--steps", steps]) == 0
        notes = [ln for ln in capsys.readouterr().out.splitlines() if "relative" in ln]
        want = [f"resume: --metrics m.jsonl: relative, as given by the run that wrote it in "
                f"{tmp_path / 'a'}, so taken from this directory instead ({tmp_path / 'b'}); "
                "give them as absolute paths to use that run's files"]
        assert notes == (want if where == "b" else []), notes


def _same_exports(got_ck, want_ck, tmp_path) -> int:
    """Both checkpoints exported (to ``tmp_path``): every dataset equal, bit for bit, at the
    same step, which is returned."""
    got = export.export(str(got_ck), str(tmp_path / "a.h5"))
    want = export.export(str(want_ck), str(tmp_path / "b.h5"))
    assert got["step"] == want["step"]
    with h5py.File(tmp_path / "a.h5") as a, h5py.File(tmp_path / "b.h5") as b:
        names = []
        b.visit(lambda n: names.append(n) if isinstance(b[n], h5py.Dataset) else None)
        assert names and all(np.array_equal(a[n][()], b[n][()]) for n in names)
    return got["step"]


def test_resume_takes_the_checkpoints_options_and_names_the_changed_ones(tmp_path, capsys):
    """``train --resume DIR --steps 8`` alone trains on the first run's --data with its
    options (what the command line changes is named) == the resume with every option
    restated, bit for bit; without the stored options it would fall back to the synthetic
    stream and be refused as other fields."""
    from pshybrid.cli import main

    path = str(tmp_path / "d.h5")
    s = DATA.schema
    with DatasetWriter(path, s.dense_names, s.sparse_names) as w:
        w.append(*DATA.rows(0, 512))
        w.close(s.cardinalities)
    first = ["--mode", "allreduce", "--servers", "0", "--data", path, "--embedding-dim", "4",
             "--mlp", "8", "--batch-size", "4", "--seed", "3", "--dtype", "float64",
             "--progress", "none"]
    for ck in ("short", "long"):
        assert main(["train", *first, "--steps", "4", "--checkpoint-dir",
                     str(tmp_path / ck)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "short"), "--steps", "8"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"resume: the options of {tmp_path}/short/step-4/meta.json, "
                           "changed: --steps 8 (was 4)\n"), said
    assert f"resumed from {tmp_path}/short at step 4" in said
    assert main(["train", *first, "--steps", "8", "--checkpoint-dir", str(tmp_path / "long"),
                 "--resume", str(tmp_path / "long")]) == 0
    assert _same_exports(tmp_path / "short", tmp_path / "long", tmp_path) == 8


def test_a_checkpoint_without_rates_resumes_at_the_rates_it_trained_at(tmp_path, capsys):
    """A checkpoint written before the learning rates' defaults went by optimizer for SGD
    too (its meta.json has no ``rates``) stored ``--lr none`` and ``--dense-lr none``, which
    then meant 0.05 for sgd rows and ``--lr`` for the dense parameters: resumed, it goes on
    at them (== the run given them explicitly, bit for bit), not at today's 0.5 and 0.01."""
    from pshybrid.cli import main

    first = ["--mode", "allreduce", "--servers", "0", "--embedding-dim", "4", "--mlp", "8",
             "--batch-size", "4", "--seed", "3", "--dtype", "float64", "--progress", "none",
             "--sparse-optimizer", "sgd", "--dense-optimizer", "sgd"]
    rates = ["--lr", "0.05", "--dense-lr", "0.05"]
    old, explicit = tmp_path / "old", tmp_path / "explicit"
    for ck in (old, explicit):
        assert main(["train", *first, *rates, "--steps", "4", "--checkpoint-dir", str(ck)]) == 0
    meta_path = old / "step-4" / "meta.json"  # as the code before wrote it
    meta = json.loads(meta_path.read_text())
    assert meta.pop("rates") == {"lr": 0.05, "dense_lr": 0.05}
    meta["config"].update(lr=None, dense_lr=None)
    meta_path.write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["train", "--resume", str(old), "--steps", "8"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"resume: the options of {meta_path}, changed: --steps 8 (was 4)\n")
    assert main(["train", *first, *rates, "--steps", "8", "--checkpoint-dir", str(explicit),
                 "--resume", str(explicit)]) == 0
    assert _same_exports(old, explicit, tmp_path) == 8


def test_resume_options_are_checked_together_with_the_stored_ones(tmp_path, capsys):
    """``--resume ck --epochs 2``: --epochs needs --data, which only the checkpoint gives;
    checked alone (before the stored options are under it) it used to be refused."""
    from pshybrid.cli import main

    path, s = str(tmp_path / "d.h5"), DATA.schema
    with DatasetWriter(path, s.dense_names, s.sparse_names) as w:
        w.append(*DATA.rows(0, 256))
        w.close(s.cardinalities)
    first = ["--mode", "allreduce", "--servers", "0", "--data", path, "--embedding-dim", "4",
             "--mlp", "8", "--batch-size", "64", "--progress", "none", "--checkpoint-dir",
             str(tmp_path / "ck")]
    assert main(["train", *first, "--epochs", "1"]) == 0  # 4 steps an epoch
    assert main(["train", "--resume", str(tmp_path / "ck"), "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert "changed: --epochs 2 (was 1)" in out and "done: allreduce wdl  8 steps" in out, out
    # a run of --steps resumed with --epochs: the stored --steps is named as dropped
    assert main(["train", *first[:-1], str(tmp_path / "ck2"), "--steps", "2"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "ck2"), "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert ("changed: --epochs 1 (was none), --steps 2 no longer counts (--epochs decides)"
            in out and "done: allreduce wdl  4 steps" in out), out


def test_a_resume_with_another_global_batch_says_what_changes(tmp_path, capsys):
    """meta.json records the global batch; a resume with another one is told that its step
    count no longer points at the rows where the checkpoint stopped (it was silent)."""
    from pshybrid.cli import main

    path, s = str(tmp_path / "d.h5"), DATA.schema
    with DatasetWriter(path, s.dense_names, s.sparse_names) as w:
        w.append(*DATA.rows(0, 256))
        w.close(s.cardinalities)
    first = ["--mode", "allreduce", "--servers", "0", "--data", path, "--embedding-dim", "4",
             "--mlp", "8", "--batch-size", "64", "--progress", "none", "--steps", "2",
             "--checkpoint-dir", str(tmp_path / "ck")]
    assert main(["train", *first]) == 0
    meta = json.load(open(tmp_path / "ck" / "step-2" / "meta.json"))
    assert meta["global_batch"] == 64
    capsys.readouterr()
    for batch, warned in (("64", False), ("32", True)):
        assert main(["train", "--resume", str(tmp_path / "ck"), "--steps", "3",
                     "--checkpoint-dir", "none", "--batch-size", batch]) == 0
        out = capsys.readouterr().out
        assert ("resume: warning: " in out) == warned, out
    assert ("was trained with a global batch of 64, this run's is 32 (1 worker x "
            "--batch-size 32): step 2 goes on at batch 2 of 32 rows") in out, out
    # a checkpoint of a version before global_batch, whose shuffle kept the partial block
    # (all 256 rows here) last: the rest of its epoch is read in another order
    del meta["global_batch"]
    with open(tmp_path / "ck" / "step-2" / "meta.json", "w") as f:
        json.dump(meta, f)
    for flag, warned in (("--shuffle", True), ("--no-shuffle", False)):
        assert main(["train", "--resume", str(tmp_path / "ck"), "--steps", "3",
                     "--checkpoint-dir", "none", flag]) == 0
        out = capsys.readouterr().out
        assert ("whose shuffle kept the last, partial block of --data's 256 rows last" in out
                ) == warned, out


def test_a_resume_on_data_of_another_row_count_says_what_changes(tmp_path, capsys):
    """meta.json records --data's rows, on which the order depends (an epoch's steps, the
    blocks shuffled); a resume on a file of another row count at the same path (re-prepped
    in place) is told that its rows are not where the checkpoint stopped (it was silent),
    and where in the new order it goes on (a later day's file is entered mid-epoch)."""
    from pshybrid.batches import BatchPlan
    from pshybrid.cli import main

    path, s = str(tmp_path / "d.h5"), DATA.schema

    def write(n):
        with DatasetWriter(path, s.dense_names, s.sparse_names) as w:
            w.append(*DATA.rows(0, n))
            w.close(s.cardinalities)

    write(256)
    assert main(["train", "--mode", "allreduce", "--servers", "0", "--data", path,
                 "--embedding-dim", "4", "--mlp", "8", "--batch-size", "64", "--progress",
                 "none", "--steps", "2", "--checkpoint-dir", str(tmp_path / "ck")]) == 0
    assert json.load(open(tmp_path / "ck" / "step-2" / "meta.json"))["data_rows"] == 256
    capsys.readouterr()
    # shuffled (the default), the order changes with the blocks of 1024 rows; unshuffled,
    # with an epoch's steps (rows // 64) only
    for n, shuffle, warned in ((256, [], False), (320, [], True), (2100, [], True),
                               (300, ["--no-shuffle"], False), (320, ["--no-shuffle"], True)):
        write(n)
        assert main(["train", "--resume", str(tmp_path / "ck"), "--steps", "3",
                     "--checkpoint-dir", "none", *shuffle]) == 0
        out = capsys.readouterr().out
        assert ("resume: warning: " in out) == warned, (n, shuffle, out)
        if warned:
            assert (f"was trained on --data of 256 rows, this run's has {n:,}: step 2 goes on "
                    f"in the order of {n:,} rows") in out, out
            # where step 2 enters the new data's order: BatchPlan's epoch and batch
            spe = BatchPlan(n, 64, not shuffle, 0).steps_per_epoch
            assert f"at batch {2 % spe} of epoch {2 // spe} ({spe} steps an epoch)" in out, out


def test_a_moved_or_copied_checkpoint_resumed_saves_where_it_is_now(tmp_path, capsys,
                                                                  monkeypatch):
    """Oracle: the directories' contents. A checkpoint directory renamed (or a step copied
    elsewhere) and resumed without --checkpoint-dir saves beside the checkpoint it resumed,
    and says so; before, the stored name made a second history at the old path (a moved
    directory: silently, while the new ``latest`` stayed behind) or was refused (a copy)."""
    import shutil

    from pshybrid.cli import main
    from pshybrid.launch import run

    small = ["--mode", "allreduce", "--servers", "0", "--embedding-dim", "4", "--mlp", "8",
             "--progress", "none"]
    ck, moved = tmp_path / "ck", tmp_path / "moved"
    monkeypatch.chdir(tmp_path)  # (restored after the test: it changes directory below)
    assert main(["train", *small, "--steps", "2", "--checkpoint-dir", str(ck)]) == 0
    shutil.copytree(ck / "step-2", tmp_path / "copy" / "step-2")
    ck.rename(moved)
    capsys.readouterr()
    assert run(main, ["train", "--resume", str(moved), "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert (f"--checkpoint-dir {moved} (was {ck}: the resumed checkpoint is in this "
            "directory now)") in out, out
    assert not ck.exists() and (moved / "latest").read_text().strip() == "step-3"
    assert run(main, ["train", "--resume", str(tmp_path / "copy" / "step-2"),
                      "--steps", "4"]) == 0
    assert sorted(os.listdir(tmp_path / "copy")) == ["latest", "step-2", "step-4"]
    assert sorted(os.listdir(moved)) == ["latest", "step-2", "step-3"]
    assert run(main, ["train", "--resume", str(moved / "step-2"), "--steps", "5"]) == 2
    assert f"--checkpoint-dir {moved} holds step-3" in capsys.readouterr().err  # a branch
    os.symlink(moved / "step-3", tmp_path / "best")  # a link to a step: its real directory
    os.chdir(tmp_path / "copy")
    assert run(main, ["train", "--resume", str(tmp_path / "best"), "--steps", "6"]) == 0
    assert sorted(os.listdir(moved)) == ["latest", "step-2", "step-3", "step-6"]
    os.chdir(moved / "step-6")  # a step named from inside it
    assert run(main, ["train", "--resume", ".", "--steps", "7"]) == 0
    assert (moved / "latest").read_text().strip() == "step-7"
    assert sorted(os.listdir(tmp_path / "copy")) == ["latest", "step-2", "step-4"]
    # a step copied under another name (best/): its parent is no checkpoint directory (it
    # was made one: latest, step-N and the lock in a home or working directory)
    shutil.copytree(moved / "step-7", tmp_path / "home" / "best")
    os.chdir(tmp_path / "home")
    capsys.readouterr()
    assert run(main, ["train", "--resume", "best", "--steps", "8"]) == 2
    assert ("--resume best: a step directory named 'best', not step-N" in
            capsys.readouterr().err and sorted(os.listdir(".")) == ["best"])
    assert run(main, ["train", "--resume", "best", "--steps", "8", "--checkpoint-dir",
                      "runs"]) == 0
    assert sorted(os.listdir(".")) == ["best", "runs"] and os.path.isdir("runs/step-8")


def test_the_deepest_checkpoint_path_is_named_as_checkpoints_name_their_files():
    """``checkpoint_files.DEEPEST``, what the check before step 1 measures against PATH_MAX,
    is a step's temporary directory and a shard as the writer names them."""
    tmp, shard = os.path.split(checkpoint_files.DEEPEST)
    assert checkpoint_files.TEMP_RE.fullmatch(tmp) and checkpoint_files.SHARD_RE.fullmatch(shard)
    assert len(tmp) >= len(f".step-{2**63}.abcdefgh.tmp")


def test_a_failed_evaluation_keeps_its_steps_checkpoint(tmp_path, monkeypatch):
    """A step's checkpoint is written before that step's evaluation: an evaluation that
    failed at the last step (out of memory; its file replaced) ended the run before its
    checkpoint, losing every step since the one before (500 steps in the audit). Oracles:
    with the AUC failing at step 4, ck/latest names step-4, whose parameters are the
    uninterrupted run's; a --resume evaluates it then."""
    from pshybrid import steplog
    from pshybrid.synthetic import write_synthetic

    ev, ck = str(tmp_path / "ev.h5"), str(tmp_path / "ck")
    write_synthetic(ev, 64, n_dense=3, cardinalities=DATA.schema.cardinalities, seed=1)

    def fail(*args):
        raise MemoryError("the evaluation")

    monkeypatch.setattr(steplog, "auc", fail)
    with pytest.raises(MemoryError):
        run(steps=4, checkpoint_dir=ck, checkpoint_every=3, eval_data=ev)
    assert assert_latest_complete(ck) == "step-4"
    assert "eval" not in checkpoint_files.read_meta(os.path.join(ck, "step-4"))
    monkeypatch.undo()
    want, got = (train(replace(BASE, **kw), MPI.COMM_SELF, dataset=DATA, collect=True,
                       out=io.StringIO()) for kw in ({}, {"resume": ck, "eval_data": ev}))
    assert np.array_equal(got.dense, want.dense) and np.array_equal(got.table, want.table)
    assert [e["step"] for e in got.evals] == [4]


def _files_counting_scans(paths, monkeypatch) -> list:
    """Synthetic dataset files at ``paths`` (256 rows each, seeds 1, 2, ...); -> the list
    every later ``H5Dataset.validate`` appends its file's path to."""
    from pshybrid.data import H5Dataset
    from pshybrid.synthetic import write_synthetic

    for seed, path in enumerate(paths, 1):
        write_synthetic(path, 256, n_dense=3, cardinalities=DATA.schema.cardinalities,
                        seed=seed)
    scans, real = [], H5Dataset.validate
    monkeypatch.setattr(H5Dataset, "validate", lambda d, a, b: scans.append(d.path) or
                        real(d, a, b))
    return scans


def test_a_resume_scans_no_data_file_its_run_scanned_unchanged(tmp_path, monkeypatch):
    """Every start scanned every row of --data and --eval-data (a multi-TB dataset read
    whole at each requeue). A checkpoint records the files its run scanned (inode, size,
    modification time) and a resume, eval or predict on them unchanged scans none. Oracles:
    the scans counted (none at the resume and eval; the touched file alone after a touch);
    the recorded keys are the files' own; the resumed run == the uninterrupted one."""
    from pshybrid.scoring import score

    t, ev, ck = str(tmp_path / "t.h5"), str(tmp_path / "ev.h5"), str(tmp_path / "ck")
    scans = _files_counting_scans((t, ev), monkeypatch)
    cfg = dict(data=t, eval_data=ev, checkpoint_dir=ck, checkpoint_every=2)
    train(replace(BASE, steps=2, **cfg), MPI.COMM_SELF, out=io.StringIO())
    assert sorted(scans) == [ev, t]
    st = [os.stat(p) for p in (t, ev)]
    assert checkpoint_files.read_meta(os.path.join(ck, "step-2"))["scanned"] == [
        [s.st_ino, s.st_size, s.st_mtime_ns] for s in st]
    scans.clear()
    got = train(replace(BASE, steps=4, resume=ck, **cfg), MPI.COMM_SELF, collect=True,
                out=io.StringIO())
    score(ck, ev, MPI.COMM_SELF)
    assert scans == []
    want = train(replace(BASE, steps=4, data=t), MPI.COMM_SELF, collect=True,
                 out=io.StringIO())
    assert np.array_equal(got.dense, want.dense) and np.array_equal(got.table, want.table)
    os.utime(t, ns=(st[0].st_atime_ns, st[0].st_mtime_ns + 10**9))  # touched
    scans.clear()
    train(replace(BASE, steps=6, resume=ck, **cfg), MPI.COMM_SELF, out=io.StringIO())
    assert scans == [t]


def test_the_resume_skip_is_per_file_and_never_for_keys_stored_elsewhere(tmp_path,
                                                                       monkeypatch):
    """A resume skips the scan file by file (a day's file added to --data rescanned every
    other), and never skips a file whose keys lie in another file (an external link,
    external storage: that file may change unseen, and the rows are not checked again
    when read: a replaced link target's ids went into the next field's rows). Oracles: the
    scans counted; ``files.scan_key`` of each kind of file."""
    import h5py

    from pshybrid import files
    from pshybrid.data import H5Dataset

    a, b, ck = str(tmp_path / "a.h5"), str(tmp_path / "b.h5"), str(tmp_path / "ck")
    scans = _files_counting_scans((a, b), monkeypatch)
    cfg = dict(data=f"{a},{b}", checkpoint_dir=ck, checkpoint_every=2)
    train(replace(BASE, steps=2, **cfg), MPI.COMM_SELF, out=io.StringIO())
    st = os.stat(b)
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    scans.clear()
    train(replace(BASE, steps=4, resume=ck, **cfg), MPI.COMM_SELF, out=io.StringIO())
    assert scans == [b]
    linked, stored = str(tmp_path / "linked.h5"), str(tmp_path / "stored.h5")
    with h5py.File(a, "r") as src:
        for path in (linked, stored):
            with h5py.File(path, "w") as f:
                f.attrs.update(src.attrs)
                f["label"], f["dense"] = src["label"][...], src["dense"][...]
                if path == linked:
                    f["sparse"] = h5py.ExternalLink(a, "/sparse")
                else:  # (the ids' bytes in a raw file of their own)
                    ids = src["sparse"][...]
                    ids.tofile(str(tmp_path / "ids.bin"))
                    f.create_dataset("sparse", ids.shape, ids.dtype,
                                     external=[(str(tmp_path / "ids.bin"), 0, ids.nbytes)])
    for path, want in ((a, True), (linked, False), (stored, False)):
        d = H5Dataset(path)
        try:
            assert (files.scan_key(d) is not None) == want, path
        finally:
            d.close()


@pytest.mark.parametrize("model,key,other", [("dcn", "cross_layers", 3),
                                             ("dlrm", "bottom_mlp", (8, 4))])
def test_a_models_own_options_must_match_only_where_the_model_has_them(tmp_path, model, key,
                                                                       other):
    """A wdl checkpoint resumed with another --cross-layers (--bottom-mlp) was refused over
    an option wdl never reads (the plan notes it as unused). Oracle: wdl resumed with
    another value == the run uninterrupted; a dcn (dlrm) checkpoint resumed with another
    value is refused, naming it."""
    def trained(**kw):
        return train(replace(BASE, steps=4, **kw), MPI.COMM_SELF, dataset=DATA,
                     out=io.StringIO(), collect=True)

    run(steps=2, checkpoint_dir=str(tmp_path / "wdl"))
    got, want = trained(resume=str(tmp_path / "wdl"), **{key: other}), trained()
    assert np.array_equal(got.dense, want.dense) and np.array_equal(got.table, want.table)
    run(model=model, steps=2, checkpoint_dir=str(tmp_path / model))
    saved = getattr(BASE, key)
    with pytest.raises(InputError, match=re.escape(f"checkpoint has {key} = {saved!r} but this "
                                                   f"run asks for {other!r}")):
        run(model=model, steps=4, resume=str(tmp_path / model), **{key: other})


def test_a_finished_run_leaves_nothing_behind(monkeypatch):
    """A run's Job (its model, mode, batches: a train run's arrays) is freed when train
    returns, by reference counting: a reference cycle through the step timer (job.watch's
    phase lookup held the job) kept each run's arrays past gc.freeze until a full
    collection (a second train() in the process, --mode auto's trials: peak memory +25%
    in modes_bench). Oracle: a weak reference to the Job is dead on return, no gc run."""
    import gc
    import weakref

    from pshybrid import train as train_module

    jobs, setup = [], train_module.setup
    monkeypatch.setattr(train_module, "setup",
                        lambda *a, **k: (job := setup(*a, **k), jobs.append(weakref.ref(job)))[0])
    gc.disable()
    try:
        run(steps=3)
        assert len(jobs) == 1 and jobs[0]() is None, gc.get_referrers(jobs[0]())
    finally:
        gc.enable()


def test_a_resume_or_concatenation_of_other_cardinalities_names_the_vocabulary(tmp_path):
    """A later day prepped with a vocabulary of its own (other cardinalities) is refused, at
    resume and beside the first day's file, and the refusal names the way out: the first
    file's --vocabulary (the tables cannot grow)."""
    from pshybrid.cli import main

    s = DATA.schema

    def write(path, cards):
        with DatasetWriter(str(path), s.dense_names, s.sparse_names) as w:
            label, dense, ids = DATA.rows(0, 256)
            w.append(label, dense, np.minimum(ids, np.asarray(cards) - 1))
            w.close(cards)
        return str(path)

    day1 = write(tmp_path / "day1.h5", s.cardinalities)
    day2 = write(tmp_path / "day2.h5", [c + 1 for c in s.cardinalities])
    small = ["--mode", "allreduce", "--servers", "0", "--embedding-dim", "4", "--mlp", "8",
             "--batch-size", "64", "--progress", "none"]
    assert main(["train", *small, "--data", day1, "--steps", "2", "--checkpoint-dir",
                 str(tmp_path / "ck")]) == 0
    for args in (["--resume", str(tmp_path / "ck"), "--data", day2, "--steps", "4",
                  "--checkpoint-dir", "none"], [*small, "--data", f"{day1},{day2}"]):
        with pytest.raises(InputError, match="the cardinality of field 0.*--vocabulary"):
            main(["train", *args])


def test_data_of_another_vocabulary_with_the_same_cardinalities_is_refused(tmp_path):
    """Two days of one csv field, each prepped with a vocabulary of its own: the same 3
    values, so the same cardinality, but other ids (by each day's counts). The ids would be
    read as the first day's values: the file's vocabulary digest (prep --min-count's, kept
    in meta.json's schema) refuses it at resume, in eval and predict, beside the first day
    in --data and as --eval-data; the day prepped with the first's --vocabulary is taken."""
    from pshybrid.cli import main

    for day, rows in (("a", "1,x\n1,x\n0,y\n1,z\n"), ("b", "0,y\n0,y\n1,x\n0,z\n")):
        (tmp_path / f"{day}.csv").write_text("y,c\n" + rows)
        assert main(["prep", "csv", str(tmp_path / f"{day}.csv"), str(tmp_path / f"{day}.h5"),
                     "--label", "y", "--sparse", "c", "--min-count", "1"]) == 0
    assert main(["prep", "csv", str(tmp_path / "b.csv"), str(tmp_path / "bv.h5"), "--label",
                 "y", "--sparse", "c", "--vocabulary", str(tmp_path / "a.h5")]) == 0
    a, b, bv, ck = (str(tmp_path / n) for n in ("a.h5", "b.h5", "bv.h5", "ck"))
    small = ["--placement", "colocated", "--embedding-dim", "4", "--mlp", "8", "--batch-size",
             "2", "--progress", "none"]
    assert main(["train", *small, "--data", a, "--steps", "2", "--checkpoint-dir", ck]) == 0
    assert main(["train", "--resume", ck, "--data", bv, "--steps", "4",
                 "--checkpoint-dir", "none"]) == 0          # the first day's ids: taken
    says = r"the vocabulary \(the values the ids stand for, prep --min-count's\): [0-9a-f]{16}"
    for argv in (["train", "--resume", ck, "--data", b, "--steps", "4", "--checkpoint-dir",
                  "none"], ["eval", ck, b], ["predict", ck, b, str(tmp_path / "p.h5")],
                 ["train", *small, "--data", f"{a},{b}", "--steps", "2"],
                 ["train", *small, "--data", a, "--eval-data", b, "--steps", "2"]):
        with pytest.raises(InputError, match=says):
            main(argv)
    assert not os.path.exists(tmp_path / "p.h5")


def test_hashed_files_of_other_multi_hot_separators_are_refused(tmp_path):
    """Two days of one multi-hot csv field, hashed with the same --buckets (the same
    cardinalities), one split at '|' and one at ';': the same items would get other ids
    ('x;y' is one item at '|'). Refused at resume, in eval and predict, beside the first day
    in --data and as --eval-data, naming the field and both separators; a day split at the
    first's separator is taken, and so is a file that records no separator (an earlier
    version's)."""
    from pshybrid.cli import main

    rows = "1,a,x{0}y\n0,b,y{0}z\n1,a,z\n0,c,x{0}z\n"
    for day, sep, opt in (("a", "|", "g"), ("b", ";", "g:;"), ("c", "|", "g:|")):
        (tmp_path / f"{day}.csv").write_text("y,u,g\n" + rows.format(sep))
        assert main(["prep", "csv", str(tmp_path / f"{day}.csv"), str(tmp_path / f"{day}.h5"),
                     "--label", "y", "--sparse", "u", "--multi-hot", opt,
                     "--buckets", "16"]) == 0
    a, b, c, ck = (str(tmp_path / n) for n in ("a.h5", "b.h5", "c.h5", "ck"))
    small = ["--placement", "colocated", "--embedding-dim", "4", "--mlp", "8", "--batch-size",
             "2", "--progress", "none"]
    assert main(["train", *small, "--data", a, "--steps", "2", "--checkpoint-dir", ck]) == 0
    refusals = (["train", "--resume", ck, "--data", b, "--steps", "4", "--checkpoint-dir",
                 "none"], ["eval", ck, b], ["predict", ck, b, str(tmp_path / "p.h5")],
                ["train", *small, "--data", f"{a},{b}", "--steps", "2"],
                ["train", *small, "--data", a, "--eval-data", b, "--steps", "2"])
    for argv in refusals:
        with pytest.raises(InputError, match=r"separator of multi-hot field 'g': "
                                             r"'\|' in [^,]*, ';' in ") as e:
            main(argv)
        assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "p.h5")
    assert main(["train", *small, "--data", f"{a},{c}", "--eval-data", c, "--steps", "2"]) == 0
    with h5py.File(b, "a") as f:
        del f.attrs["multi_hot_separators"]
    for argv in refusals:
        assert main(argv) == 0
    with h5py.File(b, "a") as f:
        f.attrs["multi_hot_separators"] = "{}"
    with pytest.raises(InputError, match=f"{b}: attribute multi_hot_separators"):
        main(["eval", ck, b])
