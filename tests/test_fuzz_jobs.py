"""Fuzz matrix: bad inputs to ``train``, ``export``, ``--resume``, ``eval``, ``predict`` and
``plot`` (and outputs that would write over an input, a checkpoint or a device), each one
whole command
in a subprocess with a timeout. Every one must end with exit status 2, exactly one
``pshybrid: error`` line per rank naming the problem, no ``Traceback``, and nothing that
existed before changed, removed or added (no partial output). Most run on one rank
(``python -m pshybrid train --mode allreduce --servers 0``); a few under ``mpiexec -n 2``
(hybrid, one server) check that every rank exits. ``test_report`` prints the counts
(``pytest -s``): tried, clear errors, hangs, tracebacks, silent accepts, data-loss cases.
"""

import collections
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from mpi_util import pshybrid, run_job, snapshot

pytestmark = pytest.mark.job
MODEL = ["--mlp", "8", "--embedding-dim", "4", "--batch-size", "8", "--steps", "3"]
ONE = ["--mode", "allreduce", "--servers", "0"]
TWO = ["--mode", "hybrid", "--servers", "1"]
TIMEOUT = 60
RESULTS: dict = {}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """d.h5 (2000 rows, <= 50 ids per field) and ck/ (step-2, step-4 = latest)."""
    d = tmp_path_factory.mktemp("fuzz")
    for argv in (["prep", "synthetic", "d.h5", "--rows", "2000", "--max-cardinality", "50"],
                 ["train", *ONE, *MODEL, "--data", "d.h5", "--steps", "4", "--checkpoint-dir",
                  "ck", "--checkpoint-every", "2"]):
        p = subprocess.run(pshybrid(*argv), cwd=d, capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr
    return d


# -- corruptions ------------------------------------------------------------------------------

def h5edit(rel, fn):
    def edit(w):
        with h5py.File(w / rel, "a") as f:
            fn(f)
    return edit


def replace_ds(key, fn):
    def edit(f):
        a = fn(f[key][...])
        del f[key]
        f[key] = a
    return edit


def setitem(idx, v):
    def fn(a):
        a = a.copy()
        a[idx] = v
        return a
    return fn


def write(rel, text):
    def edit(w):
        (w / rel).write_text(text)
    return edit


def symlink(rel, target):
    def edit(w):
        os.remove(w / rel)
        os.symlink(w / target, w / rel)
    return edit


def drop_last_row(f):
    arrays = {k: f[k][...][:-1] for k in f}
    for k, a in arrays.items():
        del f[k]
        f[k] = a


def truncate(rel):
    def edit(w):
        with open(w / rel, "r+b") as fh:
            fh.truncate(os.path.getsize(w / rel) // 2)
    return edit


def signature(rel, sig, nth=0):
    """Damage HDF5's own structure, not a value: the ``nth`` ``sig`` (b"TREE": a B-tree
    node, b"HEAP": a local heap; dense.h5's second TREE is /state's) overwritten; h5py then
    raises RuntimeError, not OSError (a traceback)."""
    def edit(w):
        data = (w / rel).read_bytes()
        at = -1
        for _ in range(nth + 1):
            at = data.index(sig, at + 1)
        with open(w / rel, "r+b") as fh:
            fh.seek(at)
            fh.write(b"XXXX")
    return edit


def unwritable():
    from pshybrid.safeio import check_writable_dir

    return "/sys/fs" if check_writable_dir("/sys/fs") else None


SHARD, DENSE = "ck/step-4/shard-00000.h5", "ck/step-4/dense.h5"
CARDS = lambda f: f.attrs["cardinalities"]  # noqa: E731

# id: (ranks, setup(w) or None, argv after `python -m pshybrid`, text the error must hold)
CASES = {
    # train: sizes (checked before anything is allocated)
    "batch_size_huge": (1, None, ["train", *ONE, *MODEL, "--batch-size", "99999999999"],
                        "--batch-size 99999999999"),
    "embedding_dim_huge": (1, None, ["train", *ONE, *MODEL, "--data", "d.h5",
                                     "--embedding-dim", "100000000"], "--embedding-dim 100000000"),
    "mlp_huge": (1, None, ["train", *ONE, *MODEL, "--mlp", "100000000,100000000"],
                 "--mlp 100000000,100000000"),
    "cross_layers_huge": (1, None, ["train", *ONE, *MODEL, "--model", "dcn", "--cross-layers",
                                    "1000000000000"], "--cross-layers"),
    "prefetch_huge": (1, None, ["train", *ONE, *MODEL, "--prefetch", "1000000000000"],
                      "--prefetch"),
    # train: outputs (checked writable before step 1)
    "metrics_missing_dir": (1, None, ["train", *ONE, *MODEL, "--metrics", "no/m.jsonl"],
                            "--metrics"),
    "metrics_is_dir": (1, None, ["train", *ONE, *MODEL, "--metrics", "ck"], "--metrics"),
    "ckdir_under_file": (1, None, ["train", *ONE, *MODEL, "--checkpoint-dir", "victim.txt/ck"],
                         "--checkpoint-dir"),
    "ckdir_unwritable": (1, None, ["train", *ONE, *MODEL, "--checkpoint-dir",
                                   f"{unwritable()}/pshybrid-ck"], "--checkpoint-dir"),
    "ckdir_holds_checkpoints": (1, None, ["train", *ONE, *MODEL, "--data", "d.h5",
                                          "--checkpoint-dir", "ck", "--keep-last", "1"],
                                "already holds checkpoints (latest: step-4)"),
    "resume_older_into_same_dir": (1, None, ["train", *ONE, *MODEL, "--data", "d.h5", "--resume",
                                             "ck/step-2", "--checkpoint-dir", "ck",
                                             "--keep-last", "1"], "newer than the resume point"),
    # train: data files
    "data_missing": (1, None, ["train", *ONE, *MODEL, "--data", "nope.h5"], "no such dataset"),
    "data_not_hdf5": (1, None, ["train", *ONE, *MODEL, "--data", "victim.txt"],
                      "not a readable HDF5 file"),
    "data_label_group": (1, h5edit("d.h5", lambda f: (f.__delitem__("label"),
                                                      f.create_group("label"))),
                         ["train", *ONE, *MODEL, "--data", "d.h5"], "/label is a group"),
    "data_cardinality_2e62": (1, h5edit("d.h5", lambda f: f.attrs.__setitem__(
        "cardinalities", setitem(0, 2**62)(CARDS(f)))),
        ["train", *ONE, *MODEL, "--data", "d.h5"], "cardinalities"),
    "data_cardinalities_float": (1, h5edit("d.h5", lambda f: f.attrs.__setitem__(
        "cardinalities", CARDS(f).astype(float))),
        ["train", *ONE, *MODEL, "--data", "d.h5"], "attribute cardinalities"),
    "eval_data_empty": (1, h5edit("d.h5", lambda f: None),  # placeholder, replaced below
                        ["train", *ONE, *MODEL, "--data", "d.h5", "--eval-data", "e.h5"],
                        "no rows"),
    # resume
    "resume_missing": (1, None, ["train", *ONE, *MODEL, "--resume", "nope"],
                       "nope: no such checkpoint directory"),
    "resume_latest_link": (1, symlink("ck/latest", "victim.txt"),
                           ["train", *ONE, *MODEL, "--data", "d.h5", "--resume", "ck"],
                           "latest is a symbolic link"),
    "resume_latest_escapes": (1, write("ck/latest", "../../etc\n"),
                              ["train", *ONE, *MODEL, "--data", "d.h5", "--resume", "ck"],
                              "latest holds"),
    "resume_w_fewer_columns": (1, h5edit(SHARD, replace_ds("w", lambda a: a[:, :-1])),
                               ["train", *ONE, *MODEL, "--data", "d.h5", "--resume", "ck",
                                "--steps", "6"], "shard-00000.h5: /w"),
    "resume_ids_negative": (1, h5edit(SHARD, replace_ds("ids", setitem(0, -1))),
                            ["train", *ONE, *MODEL, "--data", "d.h5", "--resume", "ck",
                             "--steps", "6"], "/ids[0] = -1"),
    "resume_ids_duplicated": (1, h5edit(SHARD, replace_ds("ids", setitem(1, 0))),
                              ["train", *ONE, *MODEL, "--data", "d.h5", "--resume", "ck",
                               "--steps", "6"], "more than once"),
    "resume_no_flat": (1, h5edit(DENSE, lambda f: f.__delitem__("flat")),
                       ["train", *ONE, *MODEL, "--data", "d.h5", "--resume", "ck", "--steps",
                        "6"], "dense.h5: /flat"),
    "resume_shard_name_escapes": (1, lambda w: write("ck/step-4/meta.json", (
        w / "ck/step-4/meta.json").read_text().replace("shard-00000.h5", "../../victim.txt"))(w),
        ["train", *ONE, *MODEL, "--data", "d.h5", "--resume", "ck", "--steps", "6"],
        "meta.json: shards"),
    "resume_truncated_shard": (1, truncate(SHARD), ["train", *ONE, *MODEL, "--data", "d.h5",
                                                    "--resume", "ck", "--steps", "6"],
                               "shard-00000.h5"),
    "resume_shard_btree": (1, signature(SHARD, b"TREE"), ["train", *ONE, *MODEL, "--data",
                                                          "d.h5", "--resume", "ck", "--steps",
                                                          "6"], "shard-00000.h5: corrupt"),
    "resume_dense_heap": (1, signature(DENSE, b"HEAP", 1), ["train", *ONE, *MODEL, "--data", "d.h5",
                                                        "--resume", "ck", "--steps", "6"],
                          "ck/step-4/dense.h5: "),
    "resume_other_model": (1, None, ["train", *ONE, *MODEL, "--data", "d.h5", "--resume", "ck",
                                     "--embedding-dim", "5"], "embedding_dim = 4"),
    # export
    "export_to_dir": (1, None, ["export", "ck", "ck"], "is a directory"),
    "export_to_missing_dir": (1, None, ["export", "ck", "no/x.h5"], "does not exist"),
    "export_missing_ckpt": (1, None, ["export", "nope", "x.h5"], "no such checkpoint"),
    "export_no_latest": (1, lambda w: os.remove(w / "ck/latest"), ["export", "ck", "x.h5"],
                         "it holds step-2, step-4 (name one: ck/step-4)"),
    "export_no_flat": (1, h5edit(DENSE, lambda f: f.__delitem__("flat")),
                       ["export", "ck", "x.h5"], "dense.h5: /flat"),
    "export_params_missing": (1, h5edit(DENSE, lambda f: f.attrs.__delitem__("params")),
                              ["export", "ck", "x.h5"], "attribute params"),
    "export_w_fewer_columns": (1, h5edit(SHARD, replace_ds("w", lambda a: a[:, :-1])),
                               ["export", "ck", "x.h5"], "shard-00000.h5: /w"),
    "export_ids_out_of_range": (1, h5edit(SHARD, replace_ds("ids", setitem(3, 10**6))),
                                ["export", "ck", "x.h5"], "is outside the table's rows"),
    "export_row_missing": (1, h5edit(SHARD, drop_last_row), ["export", "ck", "x.h5"],
                           "rows"),
    "export_shard_btree": (1, signature(SHARD, b"TREE"), ["export", "ck", "x.h5"],
                           "shard-00000.h5: corrupt"),
    "export_dense_btree": (1, signature(DENSE, b"TREE", 1), ["export", "ck", "x.h5"],
                           "ck/step-4/dense.h5: "),
    "export_meta_not_json": (1, write("ck/step-4/meta.json", "{"), ["export", "ck", "x.h5"],
                             "meta.json"),
    # every rank exits (2 ranks: a worker and a server)
    "mpi_embedding_dim_huge": (2, None, ["train", *TWO, *MODEL, "--embedding-dim", "100000000"],
                               "--embedding-dim 100000000"),
    "mpi_metrics_missing_dir": (2, None, ["train", *TWO, *MODEL, "--metrics", "no/m.jsonl"],
                                "--metrics"),
    "mpi_ckdir_holds_checkpoints": (2, None, ["train", *TWO, *MODEL, "--data", "d.h5",
                                              "--checkpoint-dir", "ck"], "already holds"),
    "mpi_resume_ids_duplicated": (2, h5edit(SHARD, replace_ds("ids", setitem(1, 0))),
                                  ["train", *TWO, *MODEL, "--data", "d.h5", "--resume", "ck",
                                   "--steps", "6"], "more than once"),
}


def _empty_eval(w):
    with h5py.File(w / "d.h5", "r") as src, h5py.File(w / "e.h5", "w") as f:
        for k in ("label", "dense", "sparse"):
            f[k] = np.zeros((0,) + src[k].shape[1:], src[k].dtype)
        for k, v in src.attrs.items():
            f.attrs[k] = v


CASES["eval_data_empty"] = (1, _empty_eval, *CASES["eval_data_empty"][2:])


def _other_schema(w):
    """o.h5: d.h5 with every cardinality doubled (its ids stay valid): another model."""
    shutil.copy(w / "d.h5", w / "o.h5")
    with h5py.File(w / "o.h5", "a") as f:
        f.attrs["cardinalities"] = CARDS(f) * 2


FIFO = lambda w: os.mkfifo(w / "f.h5")  # noqa: E731
NOT_REGULAR = "f.h5: cannot read a dataset: not a regular file (a FIFO, device or socket)"


# eval, predict, plot: a bad checkpoint, dataset or metrics file, or an output in the way
CASES.update({
    "eval_missing_ckpt": (1, None, ["eval", "nope", "d.h5"], "no such checkpoint"),
    "eval_best_unwritten": (1, None, ["eval", "ck/best", "d.h5"], "ck/best: no evaluated "
                            "checkpoint in ck (train writes best at a checkpoint of a step "
                            "--eval-data evaluated)"),
    "eval_missing_data": (1, None, ["eval", "ck", "nope.h5"], "no such dataset"),
    "eval_data_not_hdf5": (1, None, ["eval", "ck", "victim.txt"], "not a readable HDF5 file"),
    "eval_other_schema": (1, _other_schema, ["eval", "ck", "o.h5"], "other fields"),
    "eval_no_flat": (1, h5edit(DENSE, lambda f: f.__delitem__("flat")), ["eval", "ck", "d.h5"],
                     "dense.h5: /flat"),
    "eval_id_out_of_range": (1, h5edit("d.h5", replace_ds("sparse", setitem((5, 1), 10**6))),
                             ["eval", "ck", "d.h5"], "/sparse"),
    "predict_exists": (1, None, ["predict", "ck", "d.h5", "victim.txt"], "--overwrite"),
    "predict_missing_dir": (1, None, ["predict", "ck", "d.h5", "no/p.h5"], "no/p.h5"),
    "predict_other_schema": (1, _other_schema, ["predict", "ck", "o.h5", "p.h5"],
                             "other fields"),
    "plot_missing": (1, None, ["plot", "nope.jsonl", "x.png"], "nope.jsonl: no such file"),
    "plot_not_jsonl": (1, None, ["plot", "victim.txt", "x.png"], "victim.txt:1: not a JSON"),
    "plot_binary": (1, None, ["plot", "d.h5", "x.png"], "d.h5:1: not UTF-8 text (a --metrics "
                    "file of pshybrid train?)"),  # (it printed the codec's words)
    "plot_no_steps": (1, write("m.jsonl", '{"summary": true}\n'), ["plot", "m.jsonl", "x.png"],
                      "no step or evaluation records"),
    "plot_loss_not_number": (1, write("m.jsonl", '{"step": 1, "loss": "x", "samples_per_s": 2}'
                                      '\n'), ["plot", "m.jsonl", "x.png"], "m.jsonl:1: key 'loss'"),
    # a FIFO as a dataset (h5py blocked on it forever)
    "data_fifo": (1, FIFO, ["train", *ONE, *MODEL, "--data", "f.h5"], NOT_REGULAR),
    "eval_data_fifo": (1, FIFO, ["train", *ONE, *MODEL, "--data", "d.h5", "--eval-data",
                                 "f.h5"], NOT_REGULAR),
    "eval_fifo": (1, FIFO, ["eval", "ck", "f.h5"], NOT_REGULAR),
    "predict_fifo": (1, FIFO, ["predict", "ck", "f.h5", "p.h5"], NOT_REGULAR),
    "mpi_data_fifo": (2, FIFO, ["train", *TWO, *MODEL, "--data", "f.h5"], NOT_REGULAR),
    "mpi_eval_fifo": (2, FIFO, ["eval", "ck", "f.h5"], NOT_REGULAR),
    # a diverging loss (2e30 with --lr 1e30 exited 0); a seed past the tables' 32 bits
    "lr_1e30": (1, None, ["train", *ONE, *MODEL, "--lr", "1e30"], "per sample (above 1e6 x "
                "log 2 = 6.93e+05: diverging)"),
    "seed_2e64": (1, None, ["train", *ONE, *MODEL, "--seed", str(2**64)],
                  "--seed: must be an integer from 0 to 2**32 - 1"),
    "mpi_eval_other_schema": (2, _other_schema, ["eval", "ck", "o.h5"], "other fields"),
    "mpi_predict_exists": (2, None, ["predict", "ck", "d.h5", "victim.txt"], "--overwrite"),
})


def _null(w):
    """w/null: a character device like /dev/null (root only; skipped elsewhere)."""
    try:
        os.mknod(w / "null", 0o20666, os.makedev(1, 3))
    except OSError:
        pytest.skip("cannot make a device node here")


# Outputs that would destroy an input, a checkpoint or a device: every command refuses them
# with one line naming the path (issue 27, items 2-4).
CASES.update({
    "metrics_is_data": (1, None, ["train", *ONE, *MODEL, "--data", "d.h5", "--metrics", "d.h5"],
                        "--metrics d.h5 is the same file as --data d.h5"),
    "metrics_is_config": (1, write("c.toml", "steps = 3\n"), ["train", *ONE, *MODEL, "--config",
                                                             "c.toml", "--metrics", "c.toml"],
                          "same file as --config"),
    "metrics_in_checkpoint": (1, None, ["train", *ONE, *MODEL, "--metrics", "ck/latest"],
                              "inside the checkpoint directory"),
    "metrics_not_ours": (1, None, ["train", *ONE, *MODEL, "--metrics", "victim.txt"],
                         "not a --metrics file of pshybrid"),
    "metrics_device": (1, _null, ["train", *ONE, *MODEL, "--metrics", "null"],
                       "not a regular file"),
    "eval_metrics_is_data": (1, None, ["eval", "ck", "d.h5", "--metrics", "d.h5"],
                             "same file as DATA d.h5"),
    "export_over_latest": (1, None, ["export", "ck", "ck/latest"], "inside the checkpoint"),
    "export_over_data": (1, None, ["export", "ck/step-4", "d.h5"], "--overwrite"),
    "export_over_data_overwrite": (1, None, ["export", "ck/step-4", "d.h5", "--overwrite"],
                                   "not an output of pshybrid export"),
    "export_device": (1, _null, ["export", "ck", "null", "--overwrite"], "not a regular file"),
    "predict_over_checkpoint": (1, None, ["predict", "ck", "d.h5", "ck/step-2/dense.h5",
                                          "--overwrite"], "inside the checkpoint directory"),
    "predict_over_data": (1, None, ["predict", "ck", "d.h5", "d.h5", "--overwrite"],
                          "same file as DATA"),
    "predict_device": (1, _null, ["predict", "ck", "d.h5", "null", "--overwrite"],
                       "not a regular file"),
    "plot_over_run": (1, write("m.jsonl", '{"step": 1, "loss": 1, "samples_per_s": 2}\n'),
                      ["plot", "m.jsonl", "m.jsonl", "--overwrite"], "same file as RUN"),
    "prep_into_checkpoint": (1, None, ["prep", "synthetic", "ck/step-4/x.h5", "--rows", "100"],
                             "inside the checkpoint directory"),
    "mpi_metrics_is_data": (2, None, ["train", *TWO, *MODEL, "--data", "d.h5", "--metrics",
                                      "d.h5"], "same file as --data"),
})



def bump(key, idx):
    """Change one value of dataset ``key`` in place (its attributes, the checksum, stay)."""
    def edit(f):
        f[key][idx] = f[key][idx] + 1.0
    return edit


# A changed weight is found by its checksum, whichever command loads it (issue 27, item 11).
CASES.update({
    "resume_w_changed": (1, h5edit(SHARD, bump("w", (3, 1))), ["train", *ONE, *MODEL, "--data",
                         "d.h5", "--resume", "ck", "--steps", "6"], "/w fails its checksum"),
    "export_flat_changed": (1, h5edit(DENSE, bump("flat", 5)), ["export", "ck", "x.h5"],
                            "dense.h5: /flat fails its checksum"),
    "eval_slot_changed": (1, h5edit(SHARD, bump("acc", (0, 0))), ["eval", "ck", "d.h5"],
                          "shard-00000.h5: /acc fails its checksum"),
    "predict_state_changed": (1, h5edit(DENSE, bump("state/m", 0)), ["predict", "ck", "d.h5",
                                                                      "p.h5"], "/state/m fails"),
    "mpi_resume_w_changed": (2, h5edit(SHARD, bump("w", (3, 1))), ["train", *TWO, *MODEL,
                             "--data", "d.h5", "--resume", "ck", "--steps", "6"], "checksum"),
})


def run(ranks, argv, cwd):
    """(returncode or None on a hang, stderr)."""
    if ranks == 1:
        try:
            p = subprocess.run(pshybrid(*argv), cwd=cwd, capture_output=True, text=True,
                               timeout=TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None, ""
        return p.returncode, p.stderr + p.stdout
    old = os.getcwd()
    os.chdir(cwd)
    try:
        p = run_job(ranks, pshybrid(*argv), timeout=TIMEOUT)
    except AssertionError:  # run_job: a hang
        return None, ""
    finally:
        os.chdir(old)
    return p.returncode, p.stderr + p.stdout


def classify(rc, text, ranks, changed) -> str:
    if rc is None:
        return "hang"
    if "Traceback" in text:
        return "traceback"
    if rc == 0:
        return "silent accept"
    if changed:
        return "data loss"
    if rc == 2 and text.count("pshybrid: error") == ranks:
        return "clear error"
    return "unclear error"


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_cleanly(base, tmp_path, case):
    ranks, setup, argv, needle = CASES[case]
    if "None/" in " ".join(argv):
        pytest.skip("no unwritable directory on this machine")
    w = tmp_path / "w"
    shutil.copytree(base, w, symlinks=True)
    (w / "victim.txt").write_text("precious\n")
    if setup:
        setup(w)
    before = snapshot(w)
    rc, text = run(ranks, argv, w)
    after = snapshot(w)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    outcome = classify(rc, text, ranks, changed)
    RESULTS[case] = outcome
    assert outcome == "clear error", f"{outcome}: rc {rc}, changed {sorted(changed)}\n{text}"
    assert needle in text, text
    for r in range(ranks if ranks > 1 else 0):
        assert f"(rank {r}/{ranks})" in text, text


def test_data_truncated_mid_run_stops_the_run(base, tmp_path):
    """``truncate -s 25% d.h5`` while a run trains on it (after its first log line): one
    clear error naming the file, status 2, no traceback. HDF5 read past the new end as
    zeros and the run trained on them and exited 0 (oracle: the file's size at open)."""
    import time

    w = tmp_path / "w"
    shutil.copytree(base, w, symlinks=True)
    proc = subprocess.Popen(pshybrid("train", *ONE, *MODEL, "--data", "d.h5", "--steps",
                                     "1000000", "--log-every", "20", "--metrics", "m.jsonl",
                                     "--progress", "none"),
                            cwd=w, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (w / "m.jsonl").exists() or not (w / "m.jsonl").read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, proc.poll()
            time.sleep(0.05)
        with open(w / "d.h5", "r+b") as fh:
            fh.truncate(os.path.getsize(w / "d.h5") // 4)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert classify(proc.returncode, err + out, 1, set()) == "clear error", (proc.returncode, err)
    assert "d.h5: the dataset changed while it was read (now " in err, err


def test_report():
    """Counts of the matrix above (run with -s to see them)."""
    counts = collections.Counter(RESULTS.values())
    line = (f"fuzz: {len(RESULTS)} bad inputs tried, {counts['clear error']} clear errors, "
            f"{counts['hang']} hangs, {counts['traceback']} tracebacks, "
            f"{counts['silent accept']} silent accepts, {counts['data loss']} data-loss cases, "
            f"{counts['unclear error']} unclear errors")
    print("\n" + line)
    bad = {k: v for k, v in RESULTS.items() if v != "clear error"}
    assert not bad, bad


def test_two_jobs_sharing_one_checkpoint_dir(tmp_path):
    """Issue 27, item 5: a second job started beside a running one into the same
    --checkpoint-dir is refused naming the holder (host and pid) and changes nothing; the
    first, stopped by SIGTERM, checkpoints, exits 75 and releases the directory."""
    import signal
    import time

    from pshybrid.dirlock import LOCK_NAME

    argv = pshybrid("train", *ONE, *MODEL, "--steps", "100000", "--checkpoint-dir", "ck2",
                    "--checkpoint-every", "1", "--keep-last", "1", "--progress", "none")
    first = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, stdin=subprocess.DEVNULL)
    try:
        lock = tmp_path / "ck2" / LOCK_NAME
        deadline = time.time() + TIMEOUT
        while not lock.exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        held = lock.read_text()
        assert str(first.pid) in held, held
        rc, text = run(1, argv[3:], tmp_path)  # the same command again
        assert rc == 2 and f"pid {first.pid} on host" in text and "in use by another job" in text
        assert lock.read_text() == held
        while not (tmp_path / "ck2" / "latest").exists() and time.time() < deadline:
            time.sleep(0.05)  # the first job is in its loop: SIGTERM stops it at a step
        # once it has published a step too (it said "already holds checkpoints ... continue
        # them with --resume": a resume would then write into the running job's history)
        rc, text = run(1, argv[3:], tmp_path)
        assert rc == 2 and "in use by another job" in text and "--resume" not in text, text
    finally:
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=TIMEOUT)
    assert first.returncode == 75, (out, err)
    assert not lock.exists() and (tmp_path / "ck2" / "latest").exists()
