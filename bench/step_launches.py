# python bench/step_launches.py [--steps 8] [--mlp 1024,512,256] [--json F]
"""Kernel launches and host waits per steady-state training step of a GPU worker, in each
mode, with CUDA graphs on and off (``--cuda-graphs``; docs/gpu.md), on any machine.

The whole training step runs on the CPU stand-in for CuPy (``tests/fake_cupy.py``), which
counts every operation a real run would put on a CUDA stream: a kernel (elementwise,
reduction, matmul, fancy read or write, a filled array, a cast), a raw kernel, a
host<->device copy, a graph launch. ``host waits`` are the library's own count
(``backend.host_waits``). The workload is the paper's WDL shape (26 fields, 13 dense
features, dim 16, MLP 1024-512-256) at batch 256 in float32, each field's ids drawn from
1,000 rows (the counts do not depend on the tables' size), the default optimizers and
``--bucket-mb``; the figures are the per-step counts of steps 3 to N-1 (after the eager
first step and the capture, before the last step's read-back), the largest of them.

It runs itself under ``mpiexec -n 2`` (one CPU server + one GPU worker in hybrid and ps,
two GPU workers colocated; allreduce on one worker), under a timeout. The last line reads
``graphs on: max N launches per step``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from timing import at_least, check_outputs, description  # noqa: E402  (bench/timing.py)

TIMEOUT = 240  # seconds for the mpiexec run
# (mode, placement, what runs): hybrid and ps use one CPU server rank beside the worker
CASES = [("allreduce", "dedicated", "1 GPU worker"),
         ("hybrid", "dedicated", "1 CPU server + 1 GPU worker"),
         ("ps", "dedicated", "1 CPU server + 1 GPU worker"),
         ("hybrid", "colocated", "2 GPU workers, colocated")]


def count(comm, mode: str, placement: str, graphs: str, steps: int, mlp=(1024, 512, 256)):
    """Train the workload on ``comm`` with GPU workers on the stand-in -> on worker 0 (the
    reporter), (launches, host waits) of each steady-state step; None elsewhere."""
    import fake_cupy
    import pytest

    from pshybrid.backend import host_waits
    from pshybrid.config import TrainConfig
    from pshybrid.synthetic import SyntheticCTR
    from pshybrid.train import train

    data = SyntheticCTR(seed=1, cardinalities=(1000,) * 26)
    cfg = TrainConfig(model="wdl", embedding_dim=16, mlp=tuple(mlp), batch_size=256,
                      steps=steps, log_every=10**6, device="cuda", cuda_graphs=graphs,
                      mode=mode, placement=placement, cuda_aware="off")
    if mode != "allreduce":
        cfg = replace(cfg, servers=None if placement == "colocated" else 1)
    mp = pytest.MonkeyPatch()
    try:
        fake, seen = fake_cupy.install(mp), []
        got = train(cfg, comm, dataset=data, out=io.StringIO(),
                    on_step=lambda done: seen.append((fake.state.launches, host_waits())))
    finally:
        mp.undo()
    if not got.summary:  # not worker 0
        return None
    diffs = np.diff(np.array(seen), axis=0)[2:-1]  # steps 3 .. N-1
    return diffs[:, 0].tolist(), diffs[:, 1].tolist()


def run_all(steps: int, mlp) -> list[dict]:
    """Under MPI (2 ranks): every case with graphs off and on -> rows (rank 0)."""
    from mpi4py import MPI

    comm, rows = MPI.COMM_WORLD, []
    for mode, placement, what in CASES:
        sub = comm.Split(0 if (mode != "allreduce" or comm.rank == 0) else MPI.UNDEFINED)
        row = {"mode": mode, "placement": placement, "ranks": what}
        for graphs in ("off", "on"):
            got = (count(sub, mode, placement, graphs, steps, mlp) if sub != MPI.COMM_NULL
                   else None)
            got = next((g for g in comm.gather(got, root=0) or [] if g is not None), None)
            if comm.rank == 0:  # worker 0's counts, from whichever rank it is
                row[graphs] = {"launches": max(got[0]), "host_waits": max(got[1]),
                               "launches_each_step": got[0]}
        if sub != MPI.COMM_NULL:
            sub.Free()
        rows.append(row)
    return rows


def report(rows: list[dict]) -> str:
    lines = [f"{'mode':<10} {'placement':<10} {'ranks':<28} {'graphs off':>22}  "
             f"{'graphs on':>22}"]
    for r in rows:
        cells = [f"{r[g]['launches']:>4} launches, {r[g]['host_waits']} wait" for g in
                 ("off", "on")]
        lines.append(f"{r['mode']:<10} {r['placement']:<10} {r['ranks']:<28} "
                     f"{cells[0]:>22}  {cells[1]:>22}")
    lines.append(f"graphs on: max {max(r['on']['launches'] for r in rows)} launches per step")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--steps", type=at_least(5), default=8,
                    help="training steps per run (2 warm-up steps, 1 steady, the last read back)")
    ap.add_argument("--mlp", default="1024,512,256",
                    help="the MLP's hidden sizes (a smaller one runs faster: the same counts "
                    "but for a layer's few kernels)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)  # under mpiexec
    args = ap.parse_args(argv)
    if not args.inside:
        from mpi_util import mpiexec

        check_outputs(ap, args.json)

        cmd = [mpiexec(), "-n", "2", sys.executable, os.path.abspath(__file__), "--inside",
               "--steps", str(args.steps), "--mlp", args.mlp] + (
                   ["--json", args.json] if args.json else [])
        try:
            return subprocess.run(cmd, timeout=TIMEOUT).returncode
        except subprocess.TimeoutExpired:
            print(f"step_launches: FAILED: mpiexec ran past {TIMEOUT}s", file=sys.stderr)
            return 1
    from pshybrid.launch import excepthook

    sys.excepthook = excepthook  # an error on one rank ends both (the other waits in MPI)
    rows = run_all(args.steps, [int(x) for x in args.mlp.split(",")])
    from mpi4py import MPI

    if MPI.COMM_WORLD.rank == 0:
        print(f"GPU worker launches and host waits per steady-state step, WDL (26 fields, "
              f"dim 16, MLP {args.mlp}), batch 256, float32, on the CuPy stand-in "
              f"(tests/fake_cupy.py), {args.steps} steps a run", flush=True)
        print(report(rows), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    from pshybrid.launch import run

    sys.exit(run(main))  # (Ctrl-C: one line and status 130, not a traceback)
