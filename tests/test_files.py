"""``--data`` with several files or a directory: the rows of the concatenation (oracle: the
one file holding the same rows), every worker's batches, and training itself the same as
on the one file; ``--data`` given several ways (commas, repeated, TOML array)."""

import io
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

from pshybrid.batches import BatchPlan, read_ids, worker_batches
from pshybrid.config import ArgumentParser, TrainConfig, add_arguments, resolve
from pshybrid.data import DatasetWriter, H5Dataset
from pshybrid.errors import InputError
from pshybrid.files import H5Files, dataset_paths, open_dataset
from pshybrid.schema import GROW, Schema
from pshybrid.train import train

CARDS = (7, 30, 50, 20)


class FusedOffsets:
    """The part of a ``FusedTable`` that ``worker_batches`` reads."""

    def __init__(self, offsets):
        self.offsets = offsets


def rows(n, seed, multi_hot):
    """label, dense, sparse and (with ``multi_hot``) 2 bags of 1-4 ids a row."""
    rng = np.random.default_rng(seed)
    k = 2 if multi_hot else 4
    lengths = [rng.integers(1, 5, n) for _ in range(4 - k)]
    return (rng.integers(0, 2, n).astype(np.float32), rng.random((n, 3), np.float32),
            np.stack([rng.integers(0, c, n) for c in CARDS[:k]], 1),
            [(rng.integers(0, c, int(m.sum())), m) for c, m in zip(CARDS[k:], lengths)])


def write(path, parts, multi_hot):
    """One file of the rows of ``parts`` (each a ``rows`` tuple), in order."""
    k = 2 if multi_hot else 4
    with DatasetWriter(path, ["d0", "d1", "d2"], [f"s{i}" for i in range(k)],
                       [f"m{i}" for i in range(4 - k)]) as w:
        for p in parts:
            w.append(*p)
        w.close(CARDS)
    return str(path)


@pytest.fixture(params=[False, True], ids=["single-hot", "multi-hot"])
def files(tmp_path, request):
    """(three files, the one file of their rows concatenated, multi_hot)."""
    mh = request.param
    parts = [rows(n, seed, mh) for seed, n in enumerate((700, 1, 1500))]
    (tmp_path / "d").mkdir()
    names = [write(tmp_path / f"d/{i}.h5", [p], mh) for i, p in enumerate(parts)]
    return names, write(tmp_path / "all.h5", parts, mh), mh


def test_rows_bags_and_validation_of_the_concatenation(files):
    names, whole, mh = files
    many, one = H5Files(names), H5Dataset(whole)
    assert many.n_rows == one.n_rows == 2201 and many.schema == one.schema
    for a, b in ((0, 2201), (650, 702), (700, 701), (699, 2000), (1500, 1500)):
        for x, y in zip(many.rows(a, b), one.rows(a, b)):
            assert np.array_equal(x, y)
        if mh:
            for (v, n), (w, m) in zip(many.bags(a, b), one.bags(a, b)):
                assert np.array_equal(v, w) and np.array_equal(n, m)
    many.validate(0, many.n_rows)
    many.close()
    one.close()


@pytest.mark.parametrize("shuffle", [False, True])
def test_worker_batches_of_several_files_are_the_ones_of_the_concatenation(files, shuffle):
    names, whole, mh = files
    many, one = H5Files(names), H5Dataset(whole)
    plan = BatchPlan(many.n_rows, 3 * 100, shuffle, seed=4)   # W=3 x b=100: 7 steps an epoch
    offsets = np.array([0, 10, 100, 1000])              # fused-table offsets of the fields
    for w in range(3):
        got = worker_batches(many, plan, 0, 15, w * 100, 100, FusedOffsets(offsets), depth=0)
        want = worker_batches(one, plan, 0, 15, w * 100, 100, FusedOffsets(offsets), depth=0)
        for step, (g, x) in enumerate(zip(got, want)):
            oracle = read_ids(one, plan.ranges(step, w * 100, 100), offsets)  # plain reads
            assert len(g) == len(x) == len(oracle) == (4 if mh else 3)
            for a, b, c in zip(g, x, oracle):
                assert np.array_equal(a, b) and np.array_equal(a, c)
    many.close()
    one.close()


def test_epochs_over_a_python_dataset_equal_epochs_over_its_file(files):
    """docs/training.md: a dataset object with ``n_rows`` takes --epochs as --data does (it
    was refused: "--epochs needs --data"); the same rows, the same training."""
    _, whole, _ = files
    cfg = TrainConfig(model="wdl", mode="allreduce", servers=0, embedding_dim=4, mlp=(8,),
                      epochs=2, batch_size=96, dtype="float64", seed=2, log_every=1000)
    ref = train(replace(cfg, data=whole), MPI.COMM_SELF, collect=True, out=io.StringIO())
    ds = open_dataset(whole)
    got = train(cfg, MPI.COMM_SELF, dataset=ds, collect=True, out=io.StringIO())
    ds.close()
    assert got.summary["steps"] == ref.summary["steps"] == 2 * (ds.n_rows // 96)
    assert np.array_equal(got.dense, ref.dense) and np.array_equal(got.table, ref.table)
    ds = open_dataset(whole)  # --mode auto's choice is checked the same way (it was refused)
    got = train(replace(cfg, mode="auto", servers=None, auto_trial_steps=0), MPI.COMM_SELF,
                dataset=ds, collect=True, out=io.StringIO())
    ds.close()
    assert got.summary["steps"] == 2 * (ds.n_rows // 96)


def test_training_on_several_files_or_a_directory_equals_the_one_file(files, tmp_path):
    names, whole, _ = files
    cfg = TrainConfig(model="wdl", mode="allreduce", servers=0, embedding_dim=4, mlp=(8,),
                      epochs=1, batch_size=96, dtype="float64", seed=2, log_every=1000,
                      eval_data=whole, data=whole)
    ref = train(cfg, MPI.COMM_SELF, collect=True, out=io.StringIO())
    for spec in (",".join(names), str(tmp_path / "d")):
        got = train(replace(cfg, data=spec, eval_data=spec), MPI.COMM_SELF, collect=True,
                    out=io.StringIO())
        assert np.array_equal(got.dense, ref.dense) and np.array_equal(got.table, ref.table)
        untimed = [[{k: v for k, v in e.items() if k != "time"} for e in r.evals]
                   for r in (got, ref)]  # every record carries its wall-clock time
        assert untimed[0] == untimed[1] and untimed[0]


def test_data_option_commas_repeats_and_toml_array(tmp_path):
    p = ArgumentParser()
    add_arguments(p, TrainConfig)
    ns = p.parse_args(["--data", "a.h5,b.h5", "--data", "c.h5", "--eval-data", "v.h5"])
    assert resolve(TrainConfig, ns).data == "a.h5,b.h5,c.h5"
    (tmp_path / "c.toml").write_text('data = ["x.h5", "y.h5"]\neval-data = "v.h5"\n')
    cfg = resolve(TrainConfig, p.parse_args(["--config", str(tmp_path / "c.toml")]))
    assert (cfg.data, cfg.eval_data) == ("x.h5,y.h5", "v.h5")


def test_directory_files_by_name_and_errors(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    for name in ("b.h5", "a.h5", "notes.txt", "c.h5"):
        (d / name).write_bytes(b"")
    assert dataset_paths(f"{d},x.h5") == [str(d / n) for n in ("a.h5", "b.h5", "c.h5")] + \
        ["x.h5"]
    (tmp_path / "e").mkdir()
    with pytest.raises(InputError, match="a directory without"):
        dataset_paths(str(tmp_path / "e"))
    with pytest.raises(InputError, match="an empty file name"):
        dataset_paths("a.h5,,b.h5")
    a = write(tmp_path / "a.h5", [rows(5, 0, False)], False)
    b = write(tmp_path / "b.h5", [rows(5, 0, True)], True)
    with pytest.raises(InputError, match="b.h5: its fields differ from .*a.h5.s: "):
        open_dataset(f"{a},{b}")
    bad = rows(5, 1, False)
    bad[2][3, 1] = 99
    c = write(tmp_path / "c.h5", [bad], False)
    with pytest.raises(InputError, match=r"c.h5: /sparse row 3 has an id outside"):
        open_dataset(f"{a},{c}").validate(0, 10)


@pytest.mark.parametrize("other,what,way", [
    (dict(n_dense=3, dense_names=("d0", "d1", "d2")), "dense fields: 2 in a, 3 in b",
     "other columns: the files of one model are prepped with the same --dense, --sparse and "
     "--multi-hot columns"),
    (dict(cardinalities=(3, 5)), "the cardinality of field 1 ('s1'): 4 in a, 5 in b", GROW),
    (dict(vocabulary="f00"), "the vocabulary (the values the ids stand for, prep "
     "--min-count's): e0 in a, f00 in b", GROW),
    (dict(separators=(";",)), "the item separator of multi-hot field 's1': '|' in a, ';' "
     "in b", "prep it with the same --multi-hot s1:SEP")])
def test_a_schema_difference_names_the_way_out_of_its_kind(other, what, way):
    """Files (or a checkpoint and its data) that differ: the refusal's way out is the one
    for that difference (it added the --vocabulary/--buckets advice to every kind, a dense
    column too); a second difference is counted."""
    mine = Schema(2, (3, 4), ("d0", "d1"), ("s0", "s1"), multi_hot=1, vocabulary="e0",
                  separators=("|",))
    theirs = replace(mine, **other)
    assert mine.difference(theirs, "a", "b") == f"{what} ({way})"
    assert mine.difference(mine, "a", "b") is None
    if "cardinality" in what:  # (a second difference, a later one: counted)
        second = mine.difference(replace(theirs, dense_names=("d0", "x")), "a", "b")
        assert second == f"{what} ({way}; 1 more difference)", second


def test_checkpoint_records_the_multi_hot_fields(tmp_path):
    """A checkpoint's schema names the multi-hot fields; resuming it on data whose same
    cardinalities are all single-hot is refused, naming the difference; save -> resume on
    the same data continues exactly (2 + 2 steps == 4 steps)."""
    import json

    mh = write(tmp_path / "mh.h5", [rows(300, 1, True)], True)
    flat = write(tmp_path / "flat.h5", [rows(300, 1, False)], False)
    cfg = TrainConfig(model="deepfm", mode="allreduce", servers=0, embedding_dim=4, mlp=(8,),
                      steps=2, batch_size=32, dtype="float64", seed=2, log_every=1000,
                      data=mh, checkpoint_dir=str(tmp_path / "ck"), pooling="mean")
    train(cfg, MPI.COMM_SELF, out=io.StringIO())
    meta = json.loads((tmp_path / "ck" / "step-2" / "meta.json").read_text())
    assert meta["schema"]["multi_hot"] == 2 and meta["config"]["pooling"] == "mean"
    with pytest.raises(InputError, match="multi-hot fields"):
        train(replace(cfg, data=flat, resume=str(tmp_path / "ck"), checkpoint_dir=None,
                      steps=4), MPI.COMM_SELF, out=io.StringIO())
    resumed = train(replace(cfg, resume=str(tmp_path / "ck"), checkpoint_dir=None, steps=4),
                    MPI.COMM_SELF, collect=True, out=io.StringIO())
    straight = train(replace(cfg, checkpoint_dir=None, steps=4), MPI.COMM_SELF, collect=True,
                     out=io.StringIO())
    assert np.array_equal(resumed.table, straight.table)
    assert np.array_equal(resumed.dense, straight.dense)
