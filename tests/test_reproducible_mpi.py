"""Run-to-run reproducibility, bit for bit (docs/training.md, "Reproducibility").

The same options and seed give the same losses and final parameters to the bit, in float32
(where any change of a sum's order shows), in hybrid (dedicated and colocated), allreduce
and ps (ps at up to 2 workers: its dense table sums more workers' Accumulates in any order);
the options that only change how a step runs (--prefetch, --log-every, --server-threads,
--shared-memory) change no bit; another --seed changes the initial parameters.
"""

import io
from dataclasses import replace

import numpy as np
import pytest

from mpi_util import SHARED_MEMORY, assert_all
from pshybrid import pool
from pshybrid.config import TrainConfig
from pshybrid.synthetic import SyntheticCTR
from pshybrid.train import train

DATA = SyntheticCTR(seed=5, n_dense=3, cardinalities=(7, 30, 200, 5), zipf=1.3)
BASE = TrainConfig(model="wdl", embedding_dim=4, mlp=(8, 6), steps=4, batch_size=8,
                   dtype="float32", lr=0.2, dense_lr=0.05, seed=3, log_every=1,
                   shared_memory=SHARED_MEMORY, prefetch=0)
# (mode, placement): ps only where its dense Accumulates come from at most 2 workers
SETUPS = [("hybrid", "dedicated"), ("hybrid", "colocated"), ("allreduce", "dedicated"),
          ("ps", "dedicated")]
# the options that only change how a step runs, never what it computes
SAME_MATH = {"again": {}, "prefetch": {"prefetch": 2}, "log_every": {"log_every": 1000},
             "server_threads": {"server_threads": 3}, "shared_memory": {"shared_memory": "off"}}


def run(cfg, comm):
    return train(cfg, comm, dataset=DATA, collect=True, out=io.StringIO())


def setup(comm, mode, placement):
    if placement == "colocated":
        return replace(BASE, mode=mode, placement=placement, servers=None)
    S = 0 if mode == "allreduce" else 1
    if mode == "ps" and comm.size - S > 2:
        pytest.skip("ps sums 3+ workers' dense Accumulates in any order: float rounding")
    return replace(BASE, mode=mode, servers=S)


def differences(a, b) -> list[str]:
    """What differs, to the bit, between two workers' results: the parameters, and the
    per-step losses (worker 0 holds them) where both runs logged every step."""
    bad = [k for k, x, y in (("dense", a.dense, b.dense), ("table", a.table, b.table))
           if not np.array_equal(x, y)]
    la, lb = ([(r["step"], r["loss"]) for r in res.log] for res in (a, b))
    if len(la) == len(lb) and la != lb:  # (a run logging fewer steps averages them)
        bad.append("loss")
    return bad


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,placement", SETUPS)
@pytest.mark.parametrize("variant", list(SAME_MATH))
def test_same_seed_same_bits(comm, monkeypatch, mode, placement, variant):
    """Each variant's run == the base run, bit for bit (the apply split over threads at
    every row, so --server-threads does run threads on these small steps)."""
    monkeypatch.setattr(pool, "MIN_ROWS_PER_THREAD", 1)
    cfg = setup(comm, mode, placement)
    if variant == "shared_memory" and mode == "allreduce":
        pytest.skip("--shared-memory: no store in allreduce mode")
    ref = run(cfg, comm)
    got = run(replace(cfg, **SAME_MATH[variant]), comm)
    bad = differences(got, ref) if got.role == "worker" else []
    assert_all(comm, not bad, f"{variant} changed {bad}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,placement", SETUPS[:3])
def test_another_seed_other_parameters(comm, mode, placement):
    cfg = setup(comm, mode, placement)
    a, b = run(cfg, comm), run(replace(cfg, seed=cfg.seed + 1), comm)
    bad = differences(a, b) if a.role == "worker" else []
    assert_all(comm, {"dense", "table"} <= set(bad) or a.role != "worker",
               f"--seed changed only {bad}")
