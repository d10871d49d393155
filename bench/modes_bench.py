#!/usr/bin/env python3
# mpiexec -n 3 python bench/modes_bench.py [--workload paper|light --data FILE --eval-data FILE --shared-memory --steps 80 --warmup 20 --repeat 3 --bucket-mb 1 --consistency bsp,ssp:1 --cache-rows 0,N --wire-only --json bench_modes.json --png bench_modes.png]
"""Mode benchmark: the same model, data, seed and workers trained in hybrid, ps and
allreduce, and a compute-only run (same workers, no communication at all) as the floor, one
after another in one invocation.

It checks the claim of the reference hybrid-vs-parameter-server result (hybrid 48% faster
than TensorFlow-PS at 16 nodes; docs/benchmarks.md).

Workloads: ``paper`` (default) mirrors the reference result's workload: WDL, 26 Criteo-like
tables (Criteo Kaggle cardinalities capped at 10**6: 5.6M rows), dim 16, MLP 1024-512-256,
batch 256 per worker, Adagrad sparse / Adam dense; ``light`` is the same with MLP 64-32 (fwd_bwd ~1 ms:
what a GPU worker sees, where input and communication dominate). ``--data FILE`` reads a
dataset file instead of the synthetic stream. With N ranks: 1 server + N-1 workers in hybrid and
ps; allreduce and compute-only run on the same N-1 worker ranks (the server rank idles).
With one rank (``mpiexec -n 1 ... --modes allreduce,compute``) it times the single-process
reference: one worker, nothing on the wire.

The modes run ``--repeat`` times in interleaved rounds; each reports its median run (by
median step time). Per mode: samples/s from the median step time after warm-up, the
workers' per-phase split after warm-up (medians per step, with ``other``: the step no phase
timer covers, and ``apply``: the servers' optimizer, which overlaps the workers' phases;
the PNG stacks the means, which sum to the mean step), bytes per step per worker by kind
(the library's own counters, over every step, warm-up included) beside the analytic
formula computed from the data (its unique ids averaged over the timed steps only, as the
phases' costs per id are), peak RSS per role. Rank 0 prints a table with the Hybrid/PS and
Hybrid/AllReduce ratios and writes JSON (and a PNG with matplotlib).

Per-step phases (JSON, for ``bench/scaling.py``): each rank's phase timers are also read at
every step boundary (``StepTimers``), so besides the totals over all steps
(``phase_seconds_per_step``, warm-up included) each mode reports, over the timed steps only:
``phase_seconds_timed_median`` / ``_mean`` (per phase, the workers' mean of each step, then
the median / mean over steps), ``untimed_seconds_timed_median`` / ``_mean`` (the reporter's
step minus its timed phases: what no phase timer covers), ``step_seconds_timed_mean`` and
``server_apply_seconds_timed_median`` / ``_mean`` (the slowest server's optimizer per step),
and the series themselves (``timed_series``: per step, the workers' mean and each worker's
phases, the untimed rest, the server's apply). ``dense_allreduce_seconds``: the workers'
Allreduce of the P dense floats alone (median of 20), the on-node cost of the dense bytes.
``ranks`` and ``cores_per_rank`` (rank 0's share of its node, below 1 when oversubscribed:
``bench/scaling.py`` warns that such a calibration carries the ranks' descheduling).

Consistency (``--consistency bsp,ssp:1,ssp:4,asp --cache-rows 0,N``): hybrid and ps also
run once per other consistency and cache size given (named ``hybrid ssp:4 c=N``), in the
same interleaved rounds; a table then gives each one's samples/s beside its mode's bsp run,
the rows and bytes pulled per step per worker, the cache hit rate beside the ideal one (an
unbounded cache under the same bound, from worker 0's data: ``ideal_hit_rate``), the mean
and largest staleness, and with ``--eval-data`` the AUC after the same samples beside bsp's.

Wire only (``--wire-only``): every mode also runs as ``<mode> wire`` in the same rounds, its
model's forward/backward replaced by a zero-cost stand-in (``WireOnly``: zero logits, a
zero demb (B, F, E), the dense gradients zeroed once, and the ParamSpace's readiness
reports replayed in the real backward's order, recorded at its first step, a warm-up
step), the workers' dense optimizer by a no-op (``DeviceOptimizer``; ps's dense Adam on
the servers stays) and the sparse rows' expansion and gradient sums by a read of the
distinct rows and zero sums (``DeviceRows``): the pulls, pushes, Allreduce bytes, servers'
optimizers and every counter are those of the real run (the bytes table shows both),
without the CPU work a GPU worker moves to its GPU (fwd_bwd, dense_apply, the rows'
expansion and sums) -- what its CPU side sees. ``bench/scaling.py`` takes the CPU-side terms from these runs
when it replaces the compute. Their loss and AUC mean nothing (no evaluation).
"""

from __future__ import annotations

from pshybrid.threads import apply_thread_limits

apply_thread_limits()  # before NumPy loads its BLAS, as `python -m pshybrid` does

import argparse  # noqa: E402
import io
import statistics
import sys
from dataclasses import dataclass, replace

import numpy as np
from mpi4py import MPI

from pshybrid.config import TrainConfig
from pshybrid.batches import BatchPlan, read_ranges
from pshybrid.data import H5Dataset
from pshybrid.layers import ParamSpace
from pshybrid.models import build_model
from pshybrid.modes.dense import DENSE, AllreduceDense
from pshybrid.modes.sparse import SPARSE, ReplicatedSparse
from pshybrid.modes import step as mode_step
from pshybrid.registry import MODES, ModeSpec, consistency_error, refusal
from pshybrid.schema import field_offsets
from pshybrid.synthetic import CRITEO_KAGGLE, SyntheticCTR
from pshybrid.train import train
from pshybrid.transport import idle_barrier
from modes_report import (
    print_auc,
    print_bytes,
    print_ratios,
    print_reads,
    print_table,
    print_wire_bytes,
    write,
)
from timing import StepTimers, at_least, check_outputs, description, timed_stats
from wire import WIRE, wire_only



class LocalSparse(ReplicatedSparse):
    """A table per worker, updated with its own gradients only: nothing on the wire."""

    def exchange(self, uids, sums):
        return uids, sums


class LocalDense(AllreduceDense):
    """Dense weights per worker, updated with its own gradients only: no Allreduce."""

    def __init__(self, ctx, opt, bucket_bytes: int = 0):
        super().__init__(ctx, opt, 0)

    def start(self, step: int) -> None:
        pass


# The floor: every worker trains its own replica with nothing on the wire (a composition of
# the two strategies above, registered like the library's own modes).
SPARSE["local"], DENSE["local"] = LocalSparse, LocalDense
MODES["compute"] = ModeSpec("compute", "local", "local", "no communication (benchmark floor)")
WORKLOADS = {"paper": "1024,512,256", "light": "64,32"}


COUNTER = {"pull": "rma_get_bytes", "rma_acc": "rma_acc_bytes", "p2p": "p2p_bytes",
           "allreduce": "allreduce_bytes", "allgather": "allgather_bytes"}  # by Flow.kind


def analytic_bytes(mode, U, E, P, W, itemsize, server_optimizer=True):
    """Bytes per step per worker predicted from the data: U = unique ids of a worker's
    batch (list over workers), E = row width, P = dense parameters; what the catalogue says
    the mode moves (``ModeSpec.flows``). Embedding gradients go two-sided with the step
    message (rows + sums) to a server-side optimizer, else as an RMA Accumulate (direct
    SGD); ps's dense table (Adam here) is pulled and accumulated."""
    spec, out = MODES.get(mode), {}
    for f in spec.flows(E, P, itemsize, server_optimizer) if spec else ():
        k = COUNTER[f.kind]
        out[k] = out.get(k, 0) + f.step_bytes(U[0], sum(U))
    return out


def _variants(modes, consistency: str, cache_rows: str, wire: bool = False) -> dict:
    """name -> (mode, --consistency, --cache-rows, wire only): every mode at bsp, hybrid and
    ps with each other consistency and cache size, and with ``wire`` every mode wire-only."""
    out = {m: (m, "bsp", 0, False) for m in modes}
    for m in (m for m in modes if MODES[m].stale_reads):
        for c in (c for c in consistency.split(",") if c != "bsp"):
            for n in (int(x) for x in cache_rows.split(",")):
                out[f"{m} {c} c={n}"] = (m, c, n, False)
    out.update({m + WIRE: (m, "bsp", 0, True) for m in modes if wire})
    return out


def ideal_hit_rate(batches, bound: int | None) -> float:
    """The hit rate of an unbounded cache under the same rule (``batches``: worker 0's
    distinct rows per step): a row read at step t is a hit when it was pulled for an earlier
    step with version v >= t - bound (a pull for step t >= 1 has version t - 1, issued one
    step ahead; step 0's, the first, version 0; asp: bound 32). What any cache of any size
    could serve: the reference for a run's."""
    from pshybrid.modes.stale import ASP_AGE

    K = ASP_AGE if bound is None else bound
    version, hits, reads = {}, 0, 0
    for t, rows in enumerate(batches):
        for r in rows.tolist():
            v = version.get(r)
            if K and v is not None and t - v <= K:
                hits += 1
            else:
                version[r] = max(t - 1, 0) if K else t
        reads += len(rows)
    return hits / max(reads, 1)


def parser() -> argparse.ArgumentParser:
    """The flags (``--help``: the first line of this file's docstring)."""
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--steps", type=at_least(1), default=80)
    ap.add_argument("--warmup", type=at_least(0), default=20)
    ap.add_argument("--batch-size", type=at_least(1), default=256)
    ap.add_argument("--workload", choices=tuple(WORKLOADS), default="paper",
                    help="paper: MLP 1024-512-256 (compute-heavy on a CPU); light: MLP 64-32 "
                         "(~1 ms fwd_bwd: the GPU-like regime)")
    ap.add_argument("--mlp", default=None, help="hidden sizes (default: the workload's)")
    ap.add_argument("--data", default=None, help="train from this dataset file instead of "
                    "the synthetic stream (pshybrid prep ...)")
    ap.add_argument("--max-cardinality", type=at_least(1), default=1_000_000,
                    help="cap of each synthetic table (a --data file has its own)")
    ap.add_argument("--modes", default="hybrid,ps,allreduce,compute",
                    help="comma list (hybrid and ps need 2 ranks or more)")
    ap.add_argument("--repeat", type=at_least(1), default=3,
                    help="rounds of all modes, interleaved; each mode reports its median run "
                         "(2 shared cores drift by +-10%% between runs)")
    ap.add_argument("--sparse-optimizer", default="adagrad")
    ap.add_argument("--bucket-mb", type=float, default=1.0,
                    help="dense Allreduce buckets started during backward (0: one after it)")
    ap.add_argument("--shared-memory", action="store_true",
                    help="let single-node jobs pull through shared memory (default: RMA, as "
                         "between nodes, so the modes move what a cluster's network would)")
    ap.add_argument("--placement", choices=("dedicated", "colocated"), default="dedicated",
                    help="colocated: every rank a worker owning a shard (server modes), and "
                         "the other modes on every rank too")
    ap.add_argument("--replicate-rows", type=at_least(0), default=0,
                    help="hybrid: the N hottest rows on every worker (exact; docs/placement.md)")
    ap.add_argument("--consistency", default="bsp",
                    help="comma-separated: hybrid and ps also run with each (ssp:K, asp)")
    ap.add_argument("--cache-rows", default="0",
                    help="comma-separated --cache-rows sizes for the non-bsp runs")
    ap.add_argument("--eval-data", default=None,
                    help="evaluate every run at its end on this file (AUC after the same samples)")
    ap.add_argument("--wire-only", action="store_true",
                    help="also run every mode as '<mode> wire' (same rounds): forward/backward "
                         "replaced by a zero-cost stand-in, the same pulls, pushes, Allreduce "
                         "and server work without CPU compute beside them (what a GPU "
                         "worker's CPU side sees; bench/scaling.py uses them)")
    ap.add_argument("--json", default="bench_modes.json",
                    help="results, always written (an earlier output is replaced; default "
                         "%(default)s)")
    ap.add_argument("--png", default="bench_modes.png",
                    help="each variant's phases, always drawn where matplotlib is (an earlier "
                         "image is replaced; default %(default)s)")
    return ap


@dataclass
class Bench:
    """What every step shares: the flags, the world, the W workers (and their own
    communicator), the modes to run, the data and its cardinalities, the base config."""

    a: argparse.Namespace
    world: MPI.Comm
    W: int
    colocated: bool
    modes: list
    workers_only: MPI.Comm
    data: object
    cards: tuple
    base: TrainConfig


def setup(a) -> Bench:
    """The workers, the data (its generator's tables built outside the timed runs) and
    the config every run starts from."""
    a.mlp = a.mlp or WORKLOADS[a.workload]
    world = MPI.COMM_WORLD
    colocated = a.placement == "colocated"
    # one rank: the single-process reference (modes without servers)
    W = world.size if colocated else max(world.size - 1, 1)
    modes = [m for m in a.modes.split(",")
             if world.size > 1 or colocated or not MODES[m].needs_servers]
    workers_only = world.Split(0 if world.rank < W else MPI.UNDEFINED, world.rank)
    if a.data:
        data = H5Dataset(a.data)
        cards = data.schema.cardinalities
    else:
        cards = tuple(min(c, a.max_cardinality) for c in CRITEO_KAGGLE)
        data = SyntheticCTR(seed=0, cardinalities=cards)
    data.rows(0, 1)  # build the generator's tables outside the timed runs
    base = TrainConfig(model="wdl", steps=a.steps, batch_size=a.batch_size, embedding_dim=16,
                       mlp=tuple(int(x) for x in a.mlp.split(",")), log_every=a.steps,
                       sparse_optimizer=a.sparse_optimizer, dense_optimizer="adam",
                       bucket_mb=a.bucket_mb, shared_memory="on" if a.shared_memory else "off")
    return Bench(a, world, W, colocated, modes, workers_only, data, cards, base)


def dense_params(b: Bench) -> int:
    """The model's dense parameter count, whatever modes run (ps has no Allreduce)."""
    ps_model = ParamSpace()
    build_model("wdl", b.data.schema, b.base.embedding_dim, b.base.mlp, ps_model, b.base.dtype)
    return ps_model.size


def warm_up(b: Bench) -> None:
    """Runs not measured: numba compiles its kernels on first use in each process."""
    world, colocated = b.world, b.colocated
    for mode in ("hybrid", "allreduce") if world.size > 1 or colocated else ("allreduce",):
        servers = MODES[mode].needs_servers
        comm = world if servers else b.workers_only
        if comm != MPI.COMM_NULL:
            server = dict(servers=None, placement="colocated") if colocated else dict(servers=1)
            train(replace(b.base, mode=mode, steps=3, **(server if servers else
                                                         dict(servers=0))),
                  comm, dataset=b.data, out=io.StringIO())
        idle_barrier(world)


def unique_ids(b: Bench, plan: BatchPlan, offsets) -> list | None:
    """Unique ids of each worker's timed batches (from the data): the same for every mode
    and run (rank 0; None elsewhere)."""
    a = b.a
    return [float(np.mean([np.unique(read_ranges(b.data, plan.ranges(t, w * a.batch_size,
                                                                      a.batch_size))[2]
                                     + offsets).size
                           for t in range(a.warmup, a.steps)]))
            for w in range(b.W)] if b.world.rank == 0 else None


def run_config(b: Bench, mode: str, consistency: str, cache_rows: int, wire: bool):
    """The config of one timed run."""
    on_workers = not MODES[mode].needs_servers
    return replace(b.base, mode=mode,
                   servers=0 if on_workers else (None if b.colocated else 1),
                   replicate_rows=b.a.replicate_rows if MODES[mode].hot_rows else 0,
                   placement="colocated" if b.colocated and not on_workers else "dedicated",
                   shared_memory="auto" if on_workers else b.base.shared_memory,
                   consistency=consistency, cache_rows=cache_rows,
                   eval_data=None if wire else b.a.eval_data)


def record(b: Bench, mode: str, wire: bool, res, wall: float, per_rank, tm, U) -> dict:
    """Rank 0's record of one timed run."""
    a, s = b.a, res.summary
    step = statistics.median(res.step_seconds[a.warmup:])
    return {
        "mode": mode, "wire_only": wire, "reads": s.get("reads"), "auc": s.get("auc"),
        "samples_per_s": b.W * a.batch_size / step, "step_seconds_median": step,
        "wall_seconds": wall, "phase_seconds_per_step":
            {k: v / a.steps for k, v in s["phase_seconds"].items()},
        "phase_fraction": s["phase_fraction"],
        "server_apply_seconds_per_step": s["server_apply_seconds"] / a.steps,
        "bytes_per_step": s["traffic_per_step"], "unique_ids_per_worker_step": U,
        "peak_rss_mb": s["peak_rss_mb"], "workers": b.W,
        "servers": s["servers"], "placement": a.placement,
        "final_loss": s["final_loss"],
        **timed_stats([st for w, st, _ in per_rank if w], tm.steps[a.warmup:],
                      res.step_seconds[a.warmup:],
                      [ap for w, _, ap in per_rank if not w])}


def timed_runs(b: Bench, U) -> dict:
    """Every variant ``--repeat`` times in interleaved rounds; {name: [record per run]}
    (rank 0; empty elsewhere)."""
    a, world = b.a, b.world
    runs: dict[str, list] = {}
    variants = _variants(b.modes, a.consistency, a.cache_rows, a.wire_only)
    for key in [k for _ in range(a.repeat) for k in variants]:
        mode, consistency, cache_rows, wire = variants[key]
        comm = b.workers_only if not MODES[mode].needs_servers else world
        if comm == MPI.COMM_NULL:  # the idle server rank of a workers-only mode
            idle_barrier(world)  # Wire: polite zero-byte barrier: leaves the cores to workers
            continue
        cfg = run_config(b, mode, consistency, cache_rows, wire)
        t0 = MPI.Wtime()
        with wire_only(wire):
            res = train(cfg, comm, dataset=b.data, out=io.StringIO(),
                        on_step=lambda done: StepTimers.last.mark())
        wall = MPI.Wtime() - t0
        tm = StepTimers.last  # this rank's Mode timers of the run
        # Wire: gather of each rank's per-step phases and server applies to rank 0.
        per_rank = comm.gather((MPI.COMM_WORLD.rank < b.W, tm.steps[a.warmup:],
                                tm.applies[a.warmup:]), root=0)
        idle_barrier(world)  # Wire: zero-byte barrier; the next mode starts on a quiet machine
        if world.rank == 0:
            runs.setdefault(key, []).append(record(b, mode, wire, res, wall, per_rank, tm, U))
    return runs


def dense_allreduce_alone(b: Bench, P: int) -> float | None:
    """The dense Allreduce alone, between the same workers with nothing beside it: the
    on-node cost of the dense bytes (bench/scaling.py scales it with P across workloads)."""
    dense_allreduce = None
    if b.workers_only != MPI.COMM_NULL and P:
        buf, times = np.ones(P, np.float32), []
        for _ in range(25):
            b.workers_only.Barrier()  # Wire: zero-byte barrier over the workers
            t0 = MPI.Wtime()
            b.workers_only.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)  # Wire: P floats, all workers
            times.append(MPI.Wtime() - t0)
        dense_allreduce = statistics.median(times[5:])
    idle_barrier(b.world)
    return dense_allreduce


def results_of(b: Bench, runs: dict, plan: BatchPlan, offsets, P: int) -> dict:
    """The median run by step time per variant, with its ideal hit rate (cached runs), the
    dense parameter count and the analytic bytes."""
    a, results = b.a, {}
    for mode, rs in runs.items():  # the median run by step time represents the mode
        rs = sorted(rs, key=lambda r: r["step_seconds_median"])
        results[mode] = dict(rs[len(rs) // 2],
                             step_seconds_median_runs=[r["step_seconds_median"] for r in rs])
    worker0 = [np.unique(read_ranges(b.data, plan.ranges(t, 0, a.batch_size))[2] + offsets)
               for t in range(a.steps)]
    for k, (_, consistency, cache_rows, _) in _variants(b.modes, a.consistency,
                                                         a.cache_rows).items():
        if cache_rows and k in results:
            from pshybrid.modes.stale import staleness_bound

            results[k]["ideal_hit_rate"] = ideal_hit_rate(worker0, staleness_bound(consistency))
    for m, r in results.items():
        r["dense_params"] = P
        r["bytes_analytic"] = analytic_bytes(r["mode"], r["unique_ids_per_worker_step"], 17, P,
                                             b.W, 4, a.sparse_optimizer != "sgd")
    return results


def check_variants(ap, a, modes: list) -> None:
    """Each run's --consistency and --cache-rows as ``run_config`` gives them to training,
    checked as training would (``--consistency ssp2``, or ``ssp:2`` with ``--placement
    colocated`` or ``--replicate-rows``, ended the job after the warm-up and the first runs)."""
    for consistency in a.consistency.split(","):  # (a typo: also where no mode runs it)
        if why := consistency_error(consistency):
            ap.error(f"--consistency {consistency}: {why}")
    for mode, consistency, cache_rows, _ in _variants(modes, a.consistency,
                                                      a.cache_rows).values():
        on_workers = not MODES[mode].needs_servers
        placement = "colocated" if a.placement == "colocated" and not on_workers else \
            "dedicated"
        servers = 0 if on_workers else (None if placement == "colocated" else 1)
        replicate = a.replicate_rows if MODES[mode].hot_rows else 0
        if why := refusal(mode, placement, servers, replicate, consistency, cache_rows, "cpu"):
            ap.error(f"{why} (the {mode} run of --consistency {consistency})")


def check_args(ap, a, ranks: int) -> None:
    """Every rank alike, before any collective: one usage error (exit status 2) instead of
    a traceback after the warm-up; a note of the modes one rank cannot run."""
    if a.steps <= a.warmup:
        ap.error(f"--steps {a.steps} leaves no timed step after --warmup {a.warmup}")
    modes = a.modes.split(",")
    if unknown := [m for m in modes if m not in MODES]:
        ap.error(f"--modes: unknown {', '.join(unknown)} (known: {', '.join(MODES)})")
    for opt, text in (("--mlp", a.mlp or "1"), ("--cache-rows", a.cache_rows)):
        if not all(x.strip().isdigit() for x in text.split(",")):
            ap.error(f"{opt} {text}: a comma list of whole numbers")
    skipped = [m for m in modes if MODES[m].needs_servers] if ranks == 1 and \
        a.placement != "colocated" else []
    if skipped == modes:
        ap.error(f"--modes {a.modes}: every one needs a server rank besides the workers: "
                 "launch 2 ranks or more (mpiexec -n 3), or add allreduce,compute")
    if skipped:
        print(f"note: one rank: {', '.join(skipped)} skipped (a server rank besides the "
              "workers needed: mpiexec -n 3)", file=sys.stderr)
    check_variants(ap, a, [m for m in modes if m not in skipped])
    check_outputs(ap, a.json, a.png, [(o, p) for o, p in (("--data", a.data),
                                                         ("--eval-data", a.eval_data)) if p])


def main(argv=None) -> int:
    """Set up, warm up, time every variant, then rank 0 prints and writes."""
    ap = parser()
    a = ap.parse_args(argv)
    check_args(ap, a, MPI.COMM_WORLD.size)
    b = setup(a)
    P = dense_params(b)
    mode_step.Timers = StepTimers  # every Mode built from here on keeps its steps' phases
    warm_up(b)
    offsets = field_offsets(b.cards)
    plan = BatchPlan(getattr(b.data, "n_rows", None), b.W * b.a.batch_size, b.base.shuffle,
                     b.base.seed)
    runs = timed_runs(b, unique_ids(b, plan, offsets))
    dense_allreduce = dense_allreduce_alone(b, P)
    if b.world.rank != 0:
        return 0
    results = results_of(b, runs, plan, offsets, P)
    print_table(b, results, P)
    print_bytes(b, results)
    print_wire_bytes(results)
    print_reads(results, b.W, 17 * 4)
    print_auc(b, results)
    print_ratios(b, results, P, dense_allreduce)
    write(b, results, dense_allreduce)
    return 0

if __name__ == "__main__":
    from pshybrid.launch import run

    sys.exit(run(main))  # an error on one rank ends the whole job, never a hang
