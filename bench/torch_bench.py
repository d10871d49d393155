#!/usr/bin/env python3
# python bench/torch_bench.py [--ranks 3 --steps 60 --warmup 10 --repeat 3 --mlp 1024,512,256 --max-cardinality 1000000 --json bench_torch.json]
"""pshybrid.torch beside the native trainer and plain PyTorch DDP, on the paper workload.

WDL, 26 Criteo-like tables (Criteo Kaggle cardinalities capped at ``--max-cardinality``),
dim 16, MLP 1024-512-256, batch 256 per worker, Adagrad rows / Adam dense, float32, the
synthetic stream; ``--ranks`` N: 1 server + N-1 workers. The variants, run in
interleaved rounds in one invocation (this machine's speed drifts between runs), each run
its own ``mpiexec -n N`` (fresh processes), each variant reporting its median run (each
run: the median step time after warm-up), in samples/s over all workers:

- ``native``: ``python -m pshybrid train --mode hybrid --model wdl`` (``train``);
- ``torch``: the same WDL written in PyTorch on ``pshybrid.torch`` (one table for every
  field, one lookup per step, ``DistributedOptimizer`` over ``torch.optim.Adam``);
- ``tables``: that torch WDL with one ``pt.Table`` and one ``pt.Embedding`` lookup per
  field (26 lookups a step);
- ``collection``: those 26 tables looked up by one ``pt.EmbeddingCollection`` (one
  lookup a step, as ``docs/torch.md``'s DLRM example);
- ``colocated``, ``native-colocated``: ``torch`` and ``native`` with every rank a worker
  holding a shard of the table (``placement="colocated"``, ``--placement colocated``): N
  workers, no server rank;
- ``ddp``: plain PyTorch ``DistributedDataParallel`` (gloo) on the N-1 worker ranks, the
  table replicated as ``nn.Embedding(sparse=True)`` updated by ``torch.optim.Adagrad``
  (the server rank idles).
"""

from __future__ import annotations

from pshybrid.threads import apply_thread_limits

# before NumPy loads its BLAS, as `python -m pshybrid` does; the driver's own limits (one
# process on the node) must not reach the runs it launches (``drive``): each rank sizes its
# own (inherited, the driver's 2 BLAS threads per rank x 3 ranks on 2 cores slowed the
# native variant 2x)
DRIVER_LIMITS = apply_thread_limits()

import argparse
import io
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

from pshybrid.config import TrainConfig
from pshybrid.schema import field_offsets
from pshybrid.synthetic import CRITEO_KAGGLE, SyntheticCTR
from pshybrid.threads import rank_cores
from pshybrid.train import train
from pshybrid.transport import idle_barrier
from timing import at_least, check_outputs, description  # bench/timing.py (a sibling)

D = 16


def make_wdl(emb, n_dense, cards, mlp, fused=True):
    """The native WDL (docs/models.md) in PyTorch; ``emb``: ids (B, F) -> (B, F, D + 1),
    of the fused table (``fused``: the fields' offsets added) or per field. (torch is
    imported only by the torch variants: the native run's processes never load it.)"""
    import torch

    class WDL(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = emb
            offsets = field_offsets(cards) if fused else np.zeros(len(cards), np.int64)
            self.register_buffer("offsets", torch.from_numpy(offsets))
            self.wide = torch.nn.Linear(n_dense, 1)
            sizes, layers = [n_dense + len(cards) * D, *mlp], []
            for a, b in itertools.pairwise(sizes):
                layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
            self.deep = torch.nn.Sequential(*layers, torch.nn.Linear(sizes[-1], 1))

        def forward(self, dense, sparse):
            e = self.emb(sparse + self.offsets)
            deep_in = torch.cat([dense, e[:, :, :D].flatten(1)], dim=1)
            return (self.wide(dense) + self.deep(deep_in))[:, 0] + e[:, :, D].sum(1)

    return WDL()


def train_steps(model, batches, opts, mark):
    """One step per (label, dense, sparse) batch: BCE loss, zero_grad, backward, step."""
    import torch

    loss_fn = torch.nn.BCEWithLogitsLoss()
    for label, dense, sparse in batches:
        loss = loss_fn(model(dense, sparse), label)
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()
        mark()


def step_times(run_steps) -> list[float]:
    """Call ``run_steps(mark)``, which calls ``mark()`` after each step: each step's time."""
    marks = [time.perf_counter()]
    run_steps(lambda: marks.append(time.perf_counter()))
    return list(np.diff(marks))


def run_native(a, data, cards, world, placement="dedicated"):
    cfg = TrainConfig(model="wdl", mode="hybrid", steps=a.steps, batch_size=a.batch,
                      servers=None if placement == "colocated" else 1, placement=placement,
                      embedding_dim=D, mlp=a.mlp, sparse_optimizer="adagrad",
                      dense_optimizer="adam", log_every=a.steps)  # shared memory: auto, as torch
    res = train(cfg, world, dataset=data, out=io.StringIO())
    return res.step_seconds if res.role == "worker" else None


def run_torch(a, data, cards, world, per_field=None, placement="dedicated"):
    """``per_field``: None (one table), "tables" or "collection" (26 tables)."""
    import torch

    import pshybrid.torch as pt

    names = [f"C{f + 1}" for f in range(len(cards))] if per_field else ["sparse"]
    sizes = cards if per_field else [sum(cards)]
    if not pt.init(servers=None if placement == "colocated" else 1, placement=placement,
                   mode="hybrid", seed=0, comm=world, exit_servers=False,
                   tables=[pt.Table(n, rows=r, dim=D + 1, lr=0.05)
                           for n, r in zip(names, sizes)]):
        return None
    if per_field == "tables":
        embs = torch.nn.ModuleList(pt.Embedding(n) for n in names)
        emb = lambda ids: torch.stack([e(ids[:, f]) for f, e in enumerate(embs)], 1)  # noqa: E731
    elif per_field == "collection":
        both = pt.EmbeddingCollection(names)
        emb = lambda ids: torch.stack(both(ids), 1)  # noqa: E731
    else:
        emb = pt.Embedding("sparse")
    model = make_wdl(emb, data.schema.n_dense, cards, a.mlp, fused=not per_field)
    opt = pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3), model)
    batches = ((b.label, b.dense, b.sparse) for b in pt.batches(data, a.batch, steps=a.steps))
    times = step_times(lambda mark: train_steps(model, batches, [opt], mark))
    pt.shutdown()
    return times


def run_ddp(a, data, cards, workers):
    """Plain PyTorch: DDP over gloo, the table replicated with sparse gradients."""
    import torch
    import torch.distributed as dist

    from pshybrid.batches import BatchPlan, worker_batches

    W, w = workers.size, workers.rank
    port = workers.bcast(_free_port() if w == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=w,
                            world_size=W)
    torch.manual_seed(0)
    emb = torch.nn.Embedding(sum(cards), D + 1, sparse=True)
    torch.nn.init.uniform_(emb.weight, -0.05, 0.05)
    model = torch.nn.parallel.DistributedDataParallel(
        make_wdl(emb, data.schema.n_dense, cards, a.mlp))
    opt_s = torch.optim.Adagrad(emb.parameters(), lr=0.05)
    opt_d = torch.optim.Adam([p for n, p in model.named_parameters() if "emb" not in n],
                             lr=1e-3)
    plan = BatchPlan(None, W * a.batch, False, 0)
    batches = ((torch.from_numpy(label), torch.from_numpy(dense), torch.from_numpy(sparse))
               for label, dense, sparse in worker_batches(data, plan, 0, a.steps, w * a.batch,
                                                          a.batch))
    times = step_times(lambda mark: train_steps(model, batches, [opt_s, opt_d], mark))
    dist.destroy_process_group()
    return times


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(a) -> int:
    """Under mpiexec: variant ``a.variant`` once; rank 0 writes its samples/s to ``a.json``."""
    world = MPI.COMM_WORLD
    W = world.size - (not a.variant.endswith("colocated"))
    workers = world.Split(0 if world.rank < W else MPI.UNDEFINED, world.rank)
    cards = tuple(min(c, a.max_cardinality) for c in CRITEO_KAGGLE)
    data = SyntheticCTR(seed=0, cardinalities=cards)
    data.rows(0, 1)  # the generator's tables, outside the timed steps
    if a.variant != "native":  # (pt.init sizes torch's pool the same way)
        import torch

        torch.set_num_threads(max(1, int(rank_cores())))
    if a.variant == "ddp":
        times = run_ddp(a, data, cards, workers) if workers != MPI.COMM_NULL else None
    else:
        run = {"native": run_native, "torch": run_torch,
               "tables": lambda *x: run_torch(*x, per_field="tables"),
               "collection": lambda *x: run_torch(*x, per_field="collection"),
               "colocated": lambda *x: run_torch(*x, placement="colocated"),
               "native-colocated": lambda *x: run_native(*x, placement="colocated")}[a.variant]
        times = run(a, data, cards, world)
    idle_barrier(world)  # Wire: zero-byte barrier
    if world.rank == 0:
        with open(a.json, "w") as f:
            json.dump({"samples_per_s": W * a.batch / statistics.median(times[a.warmup:]),
                       "rows": sum(cards)}, f)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--steps", type=at_least(1), default=60)
    ap.add_argument("--warmup", type=at_least(0), default=10)
    ap.add_argument("--repeat", type=at_least(1), default=3)
    ap.add_argument("--ranks", type=at_least(1), default=3,
                    help="1 server + ranks-1 workers (the colocated variants: ranks workers)")
    ap.add_argument("--batch", type=at_least(1), default=256)
    ap.add_argument("--mlp", default="1024,512,256")
    ap.add_argument("--max-cardinality", type=at_least(1), default=1_000_000)
    ap.add_argument("--variants", default="native,torch,ddp")
    ap.add_argument("--variant", help="(internal) run this one variant under mpiexec")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--json", default="bench_torch.json")
    a = ap.parse_args(argv)
    if a.steps <= a.warmup:
        ap.error(f"--steps {a.steps} leaves no timed step after --warmup {a.warmup}")
    if a.variant:
        a.mlp = tuple(int(x) for x in a.mlp.split(","))
        return one_run(a)
    check_outputs(ap, a.json)
    return drive(a, argv if argv is not None else sys.argv[1:])


def drive(a, argv) -> int:
    """Run every variant ``--repeat`` times, interleaved, each in its own mpiexec (a fresh
    set of processes: no run inherits another's state), and print the medians."""
    runs: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(v for _ in range(a.repeat) for v in a.variants.split(",")):
            out = os.path.join(tmp, f"{i}.json")
            cmd = [_mpiexec(), "-n", str(a.ranks), sys.executable, os.path.abspath(__file__),
                   *argv, "--variant", name, "--json", out]
            env = {k: v for k, v in os.environ.items() if k not in DRIVER_LIMITS}
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, check=False,
                               stdin=subprocess.DEVNULL, env=env)
            if p.returncode != 0:
                print(p.stdout[-3000:], p.stderr[-3000:], file=sys.stderr)
                return p.returncode
            with open(out) as f:
                got = json.load(f)
            runs.setdefault(name, []).append(got["samples_per_s"])
            print(f"run {i + 1}: {name:<17}{got['samples_per_s']:>10,.0f} samples/s", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"torch benchmark: WDL, 26 tables ({got['rows'] / 1e6:.1f}M rows, dim {D}), MLP "
          f"{a.mlp.replace(',', '-')}, batch {a.batch}/worker, {a.ranks - 1} workers + 1 "
          f"server (colocated: {a.ranks} workers), {a.steps} steps ({a.warmup} warm-up), "
          f"median of {a.repeat} interleaved runs")
    for k, v in med.items():
        ratio = f"  {v / med['native']:.2f}x native" if "native" in med else ""
        print(f"{k:<17}{v:>10,.0f} samples/s   runs {[round(x) for x in runs[k]]}{ratio}")
    with open(a.json, "w") as f:
        json.dump({"args": vars(a), "samples_per_s": runs, "median": med}, f, indent=1)
    return 0


def _mpiexec() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")


if __name__ == "__main__":
    if "--variant" in sys.argv:
        from pshybrid.launch import run

        sys.exit(run(main))  # an error on one rank ends the whole job, never a hang
    sys.exit(main())
