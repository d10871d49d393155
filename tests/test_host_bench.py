"""bench/host_bench.py, quickly (one process, no MPI launch): every section's rows come out
printed and in --json, the pieces add up to the total, the planning pieces are the store's
own (the same unique ids, owner groups and datatypes as an ``EmbeddingStore`` plan makes
them: ``partition.group_by_owner_ref`` and mpi4py's list-built type are the oracles), and a
section added to ``SECTIONS`` runs like the built-in one; the benchmarks' outputs never
replace a file they did not write (``timing.check_outputs``)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from mpi4py import MPI

from pshybrid import partition
from pshybrid.store import ids_in_range, owner_types

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "bench"))
import host_bench  # noqa: E402


pytestmark = pytest.mark.usefixtures("modes_restored")  # (modes_bench registers "compute")


QUICK = ["--batch-sizes", "32", "256", "--steps", "4", "--warmup", "1",
         "--max-cardinality", "1000", "--rounds", "1", "--shard-rows", "20000",
         "--touched", "5000"]


def test_quick_run_prints_and_writes_every_row(tmp_path, capsys):
    out = tmp_path / "host.json"
    assert host_bench.main(QUICK + ["--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "input + planning per batch" in text and "target" in text and "memcpy" in text
    got = json.loads(out.read_text())
    assert got["args"]["batch_sizes"] == [32, 256] and got["args"]["steps"] == [4, 4]
    rows = got["sections"]["input"]
    assert [(r["source"], r["batch"]) for r in rows] == [
        ("synthetic", 32), ("hdf5", 32), ("synthetic", 256), ("hdf5", 256)]
    for r in rows:
        assert r["ids"] == 26 * r["batch"] and 0 < r["distinct"] <= r["ids"]
        assert all(r[k] > 0 for k in host_bench.PIECES + ("cpu", "memcpy"))
        assert np.isclose(r["total"], sum(r[k] for k in host_bench.PIECES))
        assert r["target"] == host_bench.TARGET_MS.get(r["batch"])
        assert f"{r['source']:<10} {r['batch']:>5}" in text
    assert rows[2]["target"] == 0.25
    apply = got["sections"]["apply"]
    assert [(r["kind"], r["memory"]) for r in apply] == [
        ("adagrad", "window"), ("adagrad", "numpy"), ("adam", "window"), ("adam", "numpy")]
    for r in apply:
        assert r["one"] > 0 and r["two"] > 0 and r["memcpy"] > 0
        assert np.isclose(r["speedup"], r["two"] / r["one"])
        assert f"{r['kind']:<9} {r['memory']:<6} {r['one']:>9.1f}" in text


def test_planning_pieces_are_the_plans():
    """The timed calls give what EmbeddingStore.plan commits, at 1 and 3 owners."""
    rng = np.random.default_rng(0)
    rows = 5000
    ids = rng.integers(0, rows, size=(64, 26))
    for S in (1, 3):
        checked, extent = ids_in_range("t", rows, ids)
        unique, inverse, bounds = partition.group_by_owner(checked, rows, S, extent)
        for g, w in zip((unique, inverse, bounds), partition.group_by_owner_ref(ids, rows, S)):
            np.testing.assert_array_equal(g, w)
        types = owner_types(MPI.FLOAT, host_bench.DIM, 4, unique, bounds, S)
        assert [s for s, _, _ in types] == list(range(S))
        for s, sl, dt in types:
            assert sl == slice(int(bounds[s]), int(bounds[s + 1]))
            disps = (unique[sl] // S * host_bench.DIM * 4).tolist()
            assert dt.decode()[1:] == ("HINDEXED_BLOCK", {"blocklength": host_bench.DIM,
                                                           "displacements": disps})
            dt.Free()


def test_an_added_section_runs_and_is_written(tmp_path, monkeypatch, capsys):
    seen = []

    def apply_rows(a):
        return [{"what": "apply", "steps": a.steps}]

    monkeypatch.setitem(host_bench.SECTIONS, "apply", (apply_rows, lambda r, a: seen.append(r)))
    out = tmp_path / "h.json"
    assert host_bench.main(["--sections", "apply", "--steps", "7", "--json", str(out)]) == 0
    assert seen == [[{"what": "apply", "steps": [7, 7]}]]
    assert json.loads(out.read_text())["sections"] == {"apply": seen[0]}


def _mapping_flags(a: np.ndarray) -> str:
    """The permissions of the /proc/self/maps line that holds ``a``'s first byte."""
    addr = a.ctypes.data
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line.split()[1]
    raise AssertionError("no mapping holds the array")


def test_apply_shards_in_window_memory_are_shared_and_equal():
    """apply_bench's ``window`` shard lies in a shared mapping (as an MPI window's), holds
    the values of the ``numpy`` one, and an optimizer step updates both alike."""
    from apply_bench import OPTIMIZERS, make_shard, step_inputs

    shards = {m: make_shard("adagrad", 3000, memory=m) for m in ("window", "numpy")}
    assert _mapping_flags(shards["window"][0]).endswith("s")
    assert _mapping_flags(shards["window"][1]["acc"]).endswith("s")
    assert not _mapping_flags(shards["numpy"][0]).endswith("s")
    rows, g = step_inputs(3000, 500, 17, np.float32, 0, seed=3)[0]
    for w, state in shards.values():
        OPTIMIZERS["adagrad"].update_rows(w, rows, g, state, 1)
    (w1, s1), (w2, s2) = shards["window"], shards["numpy"]
    assert np.array_equal(w1, w2) and np.array_equal(s1["acc"], s2["acc"])
    assert not np.array_equal(w1[rows], make_shard("adagrad", 3000)[0][rows])  # it moved


def test_a_benchmarks_outputs_never_replace_what_they_did_not_write(tmp_path):
    """--json and --png are checked before anything runs: an existing file that is not an
    earlier JSON output (an image) is refused, byte for byte unchanged, and so is an image
    format matplotlib cannot write and an output that is an input; earlier outputs and new
    names are fine. Through host_bench's own command line too (exit status 2)."""
    import argparse

    from timing import check_outputs

    data, earlier, image = tmp_path / "d.h5", tmp_path / "old.json", tmp_path / "old.png"
    data.write_bytes(b"\x89HDF\r\n\x1a\n a dataset")
    earlier.write_text('{"results": {}}')
    image.write_bytes(b"\x89PNG\r\n\x1a\n...")
    ap = argparse.ArgumentParser(prog="bench")
    for json_path, png, why in ((data, None, "not an earlier JSON output"),
                                (image, None, "not an earlier JSON output"),
                                (None, earlier, "not an image"),
                                (None, tmp_path / "x.h5", "unknown image format 'h5'"),
                                (tmp_path / "new.json", data, "same file as --data")):
        with pytest.raises(SystemExit) as e:
            check_outputs(ap, json_path and str(json_path), png and str(png),
                          [("--data", str(data))])
        assert e.value.code == 2
    check_outputs(ap, str(earlier), str(image))
    check_outputs(ap, str(tmp_path / "new.json"), str(tmp_path / "new.pdf"))
    before = data.read_bytes()
    with pytest.raises(SystemExit) as e:
        host_bench.main(["--sections", "input", "--json", str(data)])
    assert e.value.code == 2 and data.read_bytes() == before


def test_a_json_output_that_fails_midway_leaves_the_earlier_one_whole(tmp_path):
    """``write_json`` (every benchmark's ``--json``): a document that fails while it is
    written (here an object JSON cannot hold, after the results) leaves the earlier output
    byte for byte, so the next run's ``check_outputs`` still takes it; a good one replaces
    it."""
    import json

    from timing import write_json

    earlier = tmp_path / "bench.json"
    earlier.write_text('{"results": {"hybrid": 1}}')
    with pytest.raises(TypeError):
        write_json(str(earlier), {"results": {"hybrid": 2}, "machine": object()})
    assert earlier.read_text() == '{"results": {"hybrid": 1}}'
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # (no temporary left)
    write_json(str(earlier), {"results": {"hybrid": 2}})
    assert json.loads(earlier.read_text()) == {"results": {"hybrid": 2}}


@pytest.mark.parametrize("script,flag", [
    ("data_bench", "--steps"), ("kernels_bench", "--repeat"), ("host_bench", "--rounds"),
    ("apply_bench", "--repeat"), ("modes_bench", "--steps"), ("store_bench", "--warmup"),
    ("auto_bench", "--repeat"), ("prep_bench", "--repeats"), ("scale_bench", "--steps"),
    ("torch_bench", "--steps"), ("step_launches", "--steps")])
def test_a_count_below_its_least_is_one_usage_error_before_any_work(script, flag, capsys):
    """``--steps 0`` and the like were tracebacks after the setup (an empty median, a
    division by zero). Oracle: exit status 2 and argparse's line naming the option, which
    it prints before anything runs."""
    if script == "torch_bench":
        pytest.importorskip("torch")
    import importlib

    with pytest.raises(SystemExit) as e:
        importlib.import_module(script).main([flag, "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {flag}: 0: must be >= " in err, err


def test_at_least_parses_integers_from_its_least():
    import argparse

    from timing import at_least

    assert at_least(0)("0") == 0 and at_least(5)("5") == 5
    for bad in ("4", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            at_least(5)(bad)


def test_apply_bench_refuses_more_touched_rows_than_the_shard_has(capsys):
    import apply_bench

    with pytest.raises(SystemExit) as e:
        apply_bench.main(["--rows", "100", "--touched", "101"])
    assert e.value.code == 2 and "--touched 101 is more than" in capsys.readouterr().err


@pytest.mark.parametrize("bound", [1, 2, None])
def test_ideal_hit_rate_is_what_an_unbounded_cache_serves(bound):
    """modes_bench's "ideal" hit rate was below the measured one under ssp:1 (it gave step
    0's pull, which is not ahead, version -1). Oracle: the worker's own ``Pipeline`` with a
    cache no two rows share a slot of (so nothing is evicted), over a fake store, serves
    exactly that share of the reads."""
    from types import SimpleNamespace

    from pshybrid.modes.stale import Pipeline, RowCache
    from pshybrid.store import Plan

    import modes_bench

    rng = np.random.default_rng(3)
    ids = rng.choice(10**6, 60, replace=False)
    n = 1 << 16
    assert np.unique(RowCache(n, 1, np.float32).slots(ids)).size == ids.size  # no collision
    steps = [np.unique(rng.choice(ids, rng.integers(1, 20))) for _ in range(40)]
    steps[1] = np.union1d(steps[1], steps[0][:2])  # (ssp:1 serves only these: step 0's pull)
    store = SimpleNamespace(pull_start=lambda name, plan: plan,
                            pull_wait=lambda plan: np.zeros((plan.unique.size, 1), np.float32))
    sparse = SimpleNamespace(store=store, name="t", pull_types=True,
                             layout=SimpleNamespace(table=SimpleNamespace(dim=1,
                                                                          dtype=np.float32)))
    pipe = Pipeline(sparse, bound, n)
    batches = [SimpleNamespace(plan=Plan(store, "t", u, u, np.arange(u.size),
                                         np.array([0, u.size])), inverse=np.arange(u.size))
               for u in steps]
    for t, b in enumerate(batches):
        pipe.begin(t)
        pipe.upcoming = batches[t + 1] if t + 1 < len(batches) else None
        pipe.lookup(b)
    served, pulled = pipe.total[:2]
    assert served > 0
    assert modes_bench.ideal_hit_rate(steps, bound) == served / (served + pulled)
