"""pshybrid.torch as whole jobs (``tests/test_torch_mpi.py``: W workers == 1 process with
the global batch, checkpoint -> resume; ``tests/test_torch_layers.py``: the lookups):

- the torch WDL == the native ``--model wdl`` resumed from the same native checkpoint (same
  per-step losses, same exported parameters, to float rounding), also on a file with
  multi-hot fields (``pt.batches``' bags into ``pt.EmbeddingBag``, mean-pooled);
- it learns: AUC on a ``prep synthetic`` validation split >= 0.97 x the planted AUC;
- server ranks exit 0 from ``pt.init`` once the workers shut down; a bad id ends every rank.

Jobs run ``tests/jobs/torch_wdl.py`` under mpiexec with a timeout (``mpi_util.run_job``).
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

import h5py
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mpi_util import pshybrid, run_job

import pshybrid.torch as pt
from pshybrid.export import export
from pshybrid.metrics import auc
from pshybrid.synthetic import write_synthetic

JOB = str(pathlib.Path(__file__).parent / "jobs" / "torch_wdl.py")
CARDS = (7, 30, 200, 5)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("torch")
    write_synthetic(str(d / "d.h5"), 400, seed=5, n_dense=3, cardinalities=CARDS, zipf=1.3)
    return d / "d.h5"


@pytest.fixture(scope="module")
def multi_hot_data(tmp_path_factory):
    from test_train_mpi import write_multi_hot

    path = tmp_path_factory.mktemp("torch") / "mh.h5"
    write_multi_hot(str(path), 200, seed=4)
    return path


def torch_job(n, data, out, *args, timeout=180):
    p = run_job(n, [sys.executable, JOB, "--data", str(data), "--out", str(out), *args],
                timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def results(out, workers):
    return [dict(np.load(f"{out}-{w}.npz")) for w in range(workers)]


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


pytestmark = [pytest.mark.job, pytest.mark.timeout(600)]  # jobs of a few seconds each


@pytest.mark.parametrize("multi_hot,warm", [(False, True), (True, False)])
def test_torch_wdl_equals_native_wdl_from_the_same_checkpoint(data, multi_hot_data, tmp_path,
                                                              multi_hot, warm):
    """Native WDL: 1 step, checkpoint, resumed to step 4. Torch WDL resumed from that
    checkpoint to step 4: the same per-step losses, and the exports of both final
    checkpoints hold the same parameters (the torch table = the native fields' embeddings
    and linear weights, fused). On the multi-hot file both pool its 2 multi-hot fields by
    their mean (the torch WDL: ``pt.EmbeddingBag`` on ``pt.batches``' bags). ``warm``: the
    checkpoint is of a run started ``--init-from`` another's 2 steps, with Adam on both
    sides, whose bias correction goes on counting those steps in torch too."""
    data, pooling = (multi_hot_data, "mean") if multi_hot else (data, "sum")
    sparse = "adam" if warm else "adagrad"
    common = ["--data", str(data), "--model", "wdl", "--embedding-dim", "4", "--mlp", "8,6",
              "--dtype", "float64", "--lr", "0.2", "--dense-lr", "0.05", "--seed", "3",
              "--no-shuffle", "--batch-size", "8", "--servers", "1", "--log-every", "1",
              "--progress", "none", "--pooling", pooling, "--sparse-optimizer", sparse,
              "--dense-optimizer", "adam"]
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    first = ["--steps", "1", "--checkpoint-dir", str(ck)]
    runs = ([["--steps", "2", "--checkpoint-dir", str(tmp_path / "ck0")],
             [*first, "--init-from", str(tmp_path / "ck0")]] if warm else [first])
    for extra in (*runs, ["--steps", "4", "--resume", str(ck), "--checkpoint-dir",
                          str(tmp_path / "n"), "--metrics", str(m)]):
        p = run_job(2, pshybrid("train", *common, *extra))
        assert p.returncode == 0, p.stderr
    p = torch_job(2, data, tmp_path / "t", "--batch", "8", "--steps", "4", "--resume", str(ck),
                  "--checkpoint", str(tmp_path / "tc"), "--checkpoint-at", "4",
                  "--pooling", pooling, "--sparse-opt", sparse)
    assert p.stdout.count("after init") == 1  # the server rank exited (0) inside pt.init
    native = [r["loss"] for r in map(json.loads, m.read_text().splitlines()) if "loss" in r
              and not r.get("summary")]
    got = results(tmp_path / "t", 1)[0]["losses"]
    assert len(native) == len(got) == 3 and rel_err(got, np.array(native)) < 1e-12
    for src, out in (("n", "n.h5"), ("tc", "t.h5")):
        export(str(tmp_path / src), str(tmp_path / out))
    with h5py.File(tmp_path / "n.h5") as n, h5py.File(tmp_path / "t.h5") as t:
        assert set(n["dense"]) == set(t["dense"])
        for k in n["dense"]:
            assert rel_err(t["dense"][k][...], n["dense"][k][...]) < 1e-12, k
        fields = pt.schema(data).sparse_names  # (the fused table's order)
        table = np.concatenate([np.column_stack([n["embeddings"][f][...], n["linear"][f][...]])
                                for f in fields])
        assert rel_err(t["embeddings"]["sparse"][...], table) < 1e-12


def test_learns_to_the_planted_auc(tmp_path):
    """`prep synthetic` train/valid pair (200k + 40k rows, fields capped at 1000 ids, as the
    native test); one epoch of the torch WDL on 2 workers (520 steps of 2 x 192): AUC on the
    validation rows >= 0.97 x the planted model's own AUC there (0.974 when written)."""
    train = tmp_path / "syn.h5"
    p = run_job(1, pshybrid("prep", "synthetic", str(train), "--rows", "240000",
                            "--valid-fraction", "0.1666667", "--max-cardinality", "1000",
                            "--seed", "1"))
    assert p.returncode == 0, p.stderr
    valid = tmp_path / "syn.valid.h5"
    torch_job(3, train, tmp_path / "L", "--valid", str(valid), "--batch", "192", "--steps",
              "0", "--dim", "8", "--mlp", "32,16", "--lr", "0.05", "--dense-lr", "0.003",
              "--float32", timeout=400)
    v = np.load(tmp_path / "L-valid.npz")
    with h5py.File(valid) as f:
        planted = float(f.attrs["planted_auc"])
    got = auc(v["logits"].astype(np.float64), v["label"].astype(np.float64))
    print(f"AUC {got:.4f} vs planted {planted:.4f}: {got / planted:.3f}")
    assert v["label"].size == 40000 and got >= 0.97 * planted


def test_a_bad_id_ends_every_rank(data, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch, pshybrid.torch as pt\n"
        "pt.init(servers=1, tables=[pt.Table('ids', rows=10, dim=2)])\n"
        "pt.Embedding('ids')(torch.tensor([[1, 2], [3, 10 + pt.worker_index()]]))\n")
    p = run_job(3, [sys.executable, str(bad)], timeout=60)
    assert p.returncode != 0
    # (each worker's bad id ends the job: the first to abort may end the other before it
    # prints; either line names the table, the id and its place)
    assert re.search(r"table 'ids': id 1[01] at position 3 is outside \[0, 10\)", p.stderr), (
        p.stderr)
