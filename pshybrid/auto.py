"""``--mode auto``: measure this job (a probe of a few seconds), price every alternative
with ``planner`` and resolve the options to the cheapest, the same on every rank.

The probe, on every rank of the job at once: the id statistics of the first global batches
of the training order (distinct ids per worker batch and per global batch, the share of
them among the N hottest rows, as ``--replicate-rows`` ranks rows); this model's forward
and backward on one real batch, the dense optimizer over the dense parameters, the sparse
optimizer per row, reading and deduplicating one batch; an Allreduce of one element and of
the dense gradient's size (at least ``AR_FLOATS``); an RMA Get and Accumulate of one
element and of one batch's rows from the next rank, and every rank's Accumulate into one
owner at once; a Barrier. Every time is the median of
a few repeats on each rank, then the largest over the ranks (the slowest rank sets a
synchronous step), so every rank prices the same numbers and picks the same alternative.
Memory: an alternative whose ranks on a node would need more than
``planner.MEMORY_SHARE`` of the node's available memory (the least any rank sees) is
refused (``limits.check_sizes``), before the probe builds the model's weights or a batch's
arrays: none fitting stops the run there.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, replace

import numpy as np
from mpi4py import MPI

from . import planner, trials
from .batches import BatchPlan, read_ids, training_data
from .errors import ConfigError, PshybridError
from .layers import ParamSpace, bce_with_logits
from .limits import available_memory, check_sizes, gib
from .registry import MODES, is_colocated, placement_name
from .models import build_model
from .optim import Optimizer
from .partition import group_by_owner
from .preflight import before_probe
from .threads import rank_server_threads
from .topology import check_servers, default_servers, place_servers, roles_per_node
from .transport import agree

REPEATS = 7  # timed repeats of each probe (after one untimed warm-up); the median counts
AR_FLOATS = 1 << 19  # the Allreduce's bandwidth is timed on at least this many floats
STAT_STEPS = 8  # global batches whose ids the probe counts (modes.hot counts 32 to pick rows)


def resolve(cfg, comm, dataset=None, out=None, trial=None):
    """Collective over ``comm``: (``cfg`` with mode, placement, --replicate-rows and
    --servers of the chosen alternative, the record of the decision for the summary, the
    dataset to train on: ``dataset``, or the synthetic stream the probe built, whose
    planted model is then not built twice). The choice: the cheapest priced one; with
    ``trial`` (``train.train``) and ``--auto-trial-steps`` > 0, the fastest measured among
    the model's leaders (``trials``). Rank 0 prints the choice and every alternative's
    predicted (and measured) step."""
    t0 = time.perf_counter()
    pc = comm.Dup()
    opened = []
    try:
        data = _open(cfg, pc, dataset, opened)
        start = before_probe(cfg, pc, data.schema,  # (what step 1's check refuses, first)
                             getattr(data, "n_rows", None))
        finite = getattr(data, "n_rows", None) is not None  # (--epochs counts its rows)
        params = ParamSpace()
        model, layout = build_model(cfg.model, data.schema, cfg.embedding_dim, cfg.mlp, params,
                                    cfg.dtype, cfg.cross_layers, cfg.pooling, cfg.bottom_mlp)
        nodes = pc.allreduce(int(_local_rank(pc) == 0))
        S = _servers(cfg, data, nodes, pc.size)
        shape, read = id_stats(cfg, data, layout, pc.size, S, nodes, params.size)
        mem = available_memory()
        # Wire: Allreduce(MIN) of the available memory and of a node's cores: all wait.
        memory, cores = pc.allreduce((mem if mem is not None else -1, os.cpu_count() or 1),
                                     op=MPI.MIN)
        memory = memory if memory >= 0 else None
        alts = planner.alternatives(shape)
        refused = _unfit(cfg, data, alts, nodes, pc.size, memory)
        params.build(np, np.dtype(cfg.dtype), cfg.seed)
        rates = measure(pc, cfg, model, params, layout, shape, read, cores)
        alt, row, rows = planner.choose(alts, rates, shape, refused)
        probe_s, trial_s, key = time.perf_counter() - t0, None, None
        steps = trials.trial_steps(cfg, getattr(data, "n_rows", None), pc.size, start)
        if trial is not None and steps:
            key, trial_s = trials.settle(rows, lambda r: chosen_config(cfg, _alt(r), finite),
                                         trial, comm, data, steps, cfg.batch_size)
        if key is not None:
            row = next(r for r in rows if r["key"] == key)
            alt = _alt(row)
    finally:
        for d in opened:
            d.close()
        pc.Free()
    chosen = chosen_config(cfg, alt, finite)
    record = dict(choice=alt.key, predicted_step_s=row["step"],
                  predicted_samples_per_s=row["samples_per_s"], alternatives=rows,
                  rates=asdict(rates), unique_ids=shape.U, memory_bytes=memory,
                  probe_seconds=probe_s, measured=key is not None,
                  trials_stopped=trial_s is not None and key is None,
                  measured_step_s=row.get("measured_step"), trial_seconds=trial_s)
    if comm.rank == 0 and out is not None:
        out.write(describe(record) + idle_servers(cfg, chosen))
        out.flush()
    return chosen, record, (None if opened else data)


def _servers(cfg, data, nodes: int, ranks: int) -> int:
    """S of the dedicated alternatives: ``--servers`` (checked as the fixed modes check it;
    0: colocated and allreduce alone) or one per node; a ConfigError where the data holds
    no global batch of the fewest workers any alternative has."""
    if cfg.servers is not None:
        check_servers(cfg.servers, ranks, need_servers=False)
    S = cfg.servers if cfg.servers is not None else default_servers(nodes, ranks)
    short = _short(cfg, data, ranks - S if S else ranks)
    if short:
        raise ConfigError(f"--mode auto: no alternative fits: {short} (the fewest workers of "
                          "any)", collective=True)
    return S


def _unfit(cfg, data, alts, nodes: int, ranks: int, memory) -> dict:
    """{key: why} of the alternatives memory (``refusals``) or the data's rows (``_short``)
    rule out; a ConfigError naming each when none is left (before the probe allocates)."""
    refused = refusals(cfg, data.schema, alts, nodes, ranks, memory)
    short = {a.key: why for a in alts if (why := _short(cfg, data, a.workers))}
    if len(refused.keys() | short.keys()) == len(alts):
        within = (f" (it plans within {planner.MEMORY_SHARE:.0%} of the {gib(memory)} a "
                  "node has available, the 'available' below)" if refused else "")
        raise ConfigError(f"--mode auto{within}: no alternative fits: " + "; ".join(
            f"{a.key}: {short.get(a.key) or refused[a.key]}" for a in alts), collective=True)
    return {**refused, **short}


def _short(cfg, data, W: int) -> str | None:
    """Why the data's rows hold no global batch of ``W`` workers (``train`` refuses such a
    run), or None."""
    n, G = getattr(data, "n_rows", None), W * cfg.batch_size
    if n is None or G <= n:
        return None
    return (f"{getattr(data, 'path', 'the dataset')}: {n:,} rows, fewer than one global "
            f"batch ({W} x --batch-size {cfg.batch_size} = {G:,})")


def _alt(row: dict) -> planner.Alternative:
    return planner.Alternative(row["mode"], row["placement"], row["replicate_rows"],
                               row["workers"], row["servers"])


def chosen_config(cfg, alt, finite_data: bool = False):
    """``cfg`` resolved to ``alt`` (validated; ``finite_data`` as ``TrainConfig.validate``)."""
    colocated = is_colocated(alt.placement)
    c = replace(cfg, mode=alt.mode, replicate_rows=alt.replicate_rows,
                placement=placement_name(colocated),
                servers=alt.servers if MODES[alt.mode].needs_servers and not colocated else None)
    c.validate(finite_data)
    return c


def idle_servers(cfg, chosen) -> str:
    """The note when ``--servers S`` (S >= 1) was given and the choice has no server rank
    (allreduce, a colocated placement): the option did nothing, which the fixed modes
    refuse; else ''."""
    if not cfg.servers or chosen.servers is not None:
        return ""
    shards = MODES[chosen.mode].needs_servers  # (a colocated placement: no server rank)
    what = f"{chosen.mode} {chosen.placement}" if shards else chosen.mode
    why = "puts a shard on every rank" if shards else "keeps every table on every worker"
    return (f"auto: note: --servers {cfg.servers} does nothing in this run: the choice, "
            f"{what}, {why} (--servers sets the dedicated alternatives' server ranks)\n")


def describe(record: dict) -> str:
    """What rank 0 prints: the rates, then every alternative, the chosen one marked."""
    r = record["rates"]
    lines = [(f"auto: probed in {record['probe_seconds']:.2f} s: fwd_bwd "
              f"{r['fwd_bwd'] * 1e3:.2f} ms, dense optimizer {r['dense_apply'] * 1e3:.2f} ms, "
              f"sparse optimizer {r['row_apply'] * 1e9:.0f} ns/row, batch "
              f"{r['batch'] * 1e3:.2f} ms, {record['unique_ids']:.0f} distinct ids per "
              f"worker batch; Allreduce {_link(r['allreduce'])}, Get {_link(r['get'])}, "
              f"Accumulate {_link(r['acc'])}")]
    if record.get("measured"):
        tried = [x for x in record["alternatives"] if x.get("measured_step") is not None]
        lines.append(f"auto: {len(tried)} alternatives trained for "
                     f"{record['trial_seconds']:.2f} s; the fastest measured per sample is "
                     f"chosen (those within {trials.TIE:.0%} of it are tied: the first below "
                     "wins)")
    elif record.get("trials_stopped"):
        lines.append(f"auto: a signal stopped the trials after {record['trial_seconds']:.2f} "
                     "s: the cost model's choice (the run stops within its first two steps)")
    for x in record["alternatives"]:
        mark = ("  <- chosen" + (" (measured)" if record.get("measured") else "")
                if x["key"] == record["choice"] else "")
        seen = x.get("measured_step")
        seen = f", measured {seen * 1e3:8.3f} ms" if seen is not None else ""
        head = f"  {x['key']:<40} W={x['workers']:<3} S={x['servers']:<3}"
        if x["refused"]:
            lines.append(f"{head} refused: {x['refused']}")
        else:
            lines.append(f"{head} predicted step {x['step'] * 1e3:8.3f} ms "
                         f"{x['samples_per_s']:>12,.0f} samples/s{seen}{mark}")
    return "\n".join(lines) + "\n"


def _link(k: dict) -> str:
    """A probed link as text; n/a where nothing crossed (one rank: no peer to time)."""
    if not math.isfinite(k["bandwidth"]):
        return "n/a (no peer)"
    return f"{k['latency'] * 1e6:.1f} us + {k['bandwidth'] / 1e9:.2f} GB/s"


def _local_rank(comm) -> int:
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.rank
    finally:
        local.Free()


def _open(cfg, comm, dataset, opened):
    """The training data (as ``train`` opens it), with one verdict on every rank."""
    err, data = None, dataset
    try:
        data = training_data(cfg, dataset, opened)
    except PshybridError as e:
        err = e
    agree(comm, err)  # Wire: allgather of each rank's verdict; everyone raises the same
    return data


# -- the data's ids -------------------------------------------------------------------------

def id_stats(cfg, data, layout, N: int, S: int, nodes: int, P: int):
    """(planner.Shape, a reader of worker 0's first batch: ``batches.read_ids``, so multi-hot
    fields' ids count too): distinct ids per worker batch (worker w: rows [w*b, (w+1)*b) of
    the global batch) and per global batch of each worker count the alternatives have, and
    for each --replicate-rows candidate the share of a worker's distinct ids among the
    hottest rows of the sample and the hot rows a global batch touches."""
    b, n_rows = cfg.batch_size, getattr(data, "n_rows", None)
    # the workers sampled: as many as the data holds batches for (``_short``: the rest)
    fit = N if n_rows is None else max(1, min(N, n_rows // b))
    plan = BatchPlan(n_rows, fit * b, cfg.shuffle, cfg.seed)
    steps = STAT_STEPS if plan.steps_per_epoch is None else max(1, min(STAT_STEPS,
                                                                      plan.steps_per_epoch))
    Ws = sorted({w for w in (N, N - S) if 1 <= w <= fit})
    # each step's fused ids per worker (flat: multi-hot fields' ids included)
    per = [[read_ids(data, plan.ranges(t, w * b, b), layout.offsets)[2].ravel()
            for w in range(fit)] for t in range(steps)]
    rows, counts = np.unique(np.concatenate([x for g in per for x in g]), return_counts=True)
    heat = np.empty(rows.size, np.int64)  # each sampled row's place in the hottest-first order
    heat[np.lexsort((rows, -counts))] = np.arange(rows.size)  # as modes.hot: count, then id

    def places(ids):  # the hottest-first places of ids' distinct rows
        return heat[np.searchsorted(rows, np.unique(ids))]

    worker = [places(x) for g in per for x in g]
    by_w = {W: [places(np.concatenate(g[:W])) for g in per] for W in Ws}
    union = {W: float(np.mean([p.size for p in by_w[W]])) for W in Ws}
    share, touched = {0: 0.0}, {}
    hot = cfg.device == "cpu"
    for n in planner.HOT_ROWS[1:] if hot else ():
        if n >= rows.size:
            break
        share[n] = float(np.mean([(p < n).mean() for p in worker]))
        for W in Ws:
            touched[(W, n)] = float(np.mean([(p < n).sum() for p in by_w[W]]))
    shape = planner.Shape(ranks=N, nodes=nodes, servers=S, batch=b, E=layout.table.dim, P=P,
                          itemsize=np.dtype(cfg.dtype).itemsize,
                          server_opt=Optimizer(cfg.sparse_optimizer, cfg.sparse_lr,
                                               l2=cfg.l2).needs_weights,
                          cuda=cfg.device == "cuda",
                          U=float(np.mean([u.size for u in worker])), union=union,
                          hot_share=share, hot_touched=touched)
    return shape, lambda: read_ids(data, plan.ranges(0, 0, b), layout.offsets)


# -- the rates ------------------------------------------------------------------------------

def _typical(fn, repeats: int = REPEATS, sync=None) -> float:
    """The median time of ``fn`` over ``repeats`` calls after an untimed one (first-use
    compilation, page faults): on a busy node the typical call, time slices lost included."""
    fn()
    times = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def measure(comm, cfg, model, params, layout, shape, read, cores: int):
    """planner.Rates, every figure the slowest rank's (``cores``: of a node, the least)."""
    dt = np.dtype(cfg.dtype)
    label, dense, ids, *bags = read()  # bags: the multi-hot fields' lengths, if any
    label, dense = label.astype(dt), dense.astype(dt)
    rng = np.random.default_rng(cfg.seed)
    emb = rng.uniform(-0.05, 0.05, ids.shape + (shape.E,)).astype(dt)

    def fwd_bwd():
        z = model.forward(dense, emb, *bags)
        _, dz = bce_with_logits(z, label)
        params.zero_grad()
        model.backward(dz * (1.0 / dz.size))

    dense_opt = Optimizer(cfg.dense_optimizer, cfg.dense_rate, l2=cfg.l2)
    state = {k: np.zeros_like(params.flat) for k in dense_opt.slots}
    comm.Barrier()  # every rank computes at once, as in training
    compute = _typical(fwd_bwd)
    dense_apply = _typical(lambda: dense_opt.update(params.flat, params.flat_grad, state, 1))
    n = max(1, int(max(shape.union.values(), default=shape.U)))
    R = min(max(4 * n, 1024), layout.table.rows)
    rows = np.sort(rng.choice(R, size=min(n, R), replace=False)).astype(np.int64)
    sparse_opt = Optimizer(cfg.sparse_optimizer, cfg.sparse_lr, l2=cfg.l2)
    w, g = np.zeros((R, shape.E), dt), np.zeros((R, shape.E), dt)
    sstate = {k: np.zeros_like(w) for k in sparse_opt.slots}
    threads = rank_server_threads(cfg.server_threads)[0]  # as a rank applies in training
    row_apply = _typical(lambda: sparse_opt.apply_slot(w, g, sstate, 1, rows,
                                                       threads=threads)) / rows.size
    batch = _typical(lambda: group_by_owner(read()[2], layout.table.rows, max(1, shape.servers)))
    links = _wire(comm, shape, dt)
    mine = np.array([compute, dense_apply, row_apply, batch, *links])
    # Wire: Allreduce(MAX) of the 14 figures: all wait.
    t = np.empty_like(mine)
    comm.Allreduce(mine, t, op=MPI.MAX)
    ar = _fit(t[4], t[5], max(shape.P, AR_FLOATS) * dt.itemsize, 2 * (comm.size - 1),
              2 * (comm.size - 1) / comm.size)
    rows, dense = _rows_bytes(shape), planner.padded(shape.P) * dt.itemsize
    rates = planner.Rates(fwd_bwd=t[0], dense_apply=t[1], row_apply=t[2], batch=t[3],
                          allreduce=ar, get=_fit(t[6], t[7], rows, 1, 1),
                          acc=_fit(t[9], t[10], rows, 1, 1), barrier=t[12],
                          get_dense=_fit(t[6], t[8], dense, 1, 1),
                          acc_dense=_fit(t[9], t[11], dense, 1, 1), cores=cores,
                          acc_owner=(comm.size - 1) * max(rows, dense) / t[13] if t[13] else 0.0)
    return rates


def _rows_bytes(shape) -> int:
    return max(1, int(shape.U)) * shape.E * shape.itemsize


def _fit(small: float, big: float, nbytes: int, messages: float, share: float):
    """Link from a tiny and a full-size timing: latency per message, bytes per second."""
    if messages == 0:
        return planner.Link(0.0, float("inf"))
    lat = small / messages
    # latency-bound sizes: at least half of the full-size time is put on the bytes
    return planner.Link(lat, share * nbytes / max(big - messages * lat, big / 2, 1e-12))


def _wire(comm, shape, dt):
    """This rank's (Allreduce small, big, Get 1, rows, dense, Accumulate 1, rows, dense,
    every rank's Accumulate into one, Barrier) seconds."""
    mpi_t = MPI.DOUBLE if dt == np.float64 else MPI.FLOAT
    big, one = np.zeros(max(shape.P, AR_FLOATS), dt), np.zeros(1, dt)
    sink = np.empty_like(big)
    # Wire: Allreduce of one element and of max(P, AR_FLOATS) floats, every rank, a few
    # times (a small P alone would time the latency, not the bandwidth).
    barrier = _typical(comm.Barrier)
    ar_small = _typical(lambda: comm.Allreduce(one, sink[:1]), REPEATS, comm.Barrier)
    ar_big = _typical(lambda: comm.Allreduce(big, sink), REPEATS, comm.Barrier)
    count = _rows_bytes(shape) // dt.itemsize
    dense = planner.padded(shape.P)
    win = MPI.Win.Allocate(max(count, dense) * dt.itemsize, dt.itemsize, comm=comm)
    buf = np.zeros(max(count, dense), dt)
    target = (comm.rank + 1) % comm.size
    try:
        win.Lock_all()

        def op(kind, k):
            if kind == "get":
                win.Get([buf[:k], mpi_t], target, [0, k, mpi_t])
            else:
                win.Accumulate([buf[:k], mpi_t], target, [0, k, mpi_t], op=MPI.SUM)
            win.Flush(target)

        # Wire: one-sided Get / Accumulate of 1 element, of one batch's rows and of the ps
        # dense table from the next rank; each rank waits only for its own flush.
        times = [_typical(lambda kd=kind, k=k: op(kd, k), REPEATS, comm.Barrier)
                 for kind in ("get", "acc") for k in (1, count, dense)]
        # Wire: every rank but 0 Accumulates the larger size into rank 0 at once (what the
        # workers of a ps or plain-SGD step do to an owner); rank 0 only waits.
        size = max(count, dense)

        def crowd():
            if comm.rank:
                win.Accumulate([buf[:size], mpi_t], 0, [0, size, mpi_t], op=MPI.SUM)
                win.Flush(0)

        times.append(_typical(crowd, REPEATS, comm.Barrier) if comm.size > 1 else 0.0)
        win.Unlock_all()
    finally:
        win.Free()
    return (ar_small, ar_big, *times[:6], barrier, times[6])


# -- memory ---------------------------------------------------------------------------------

def refusals(cfg, schema, alts, nodes: int, ranks: int, memory) -> dict:
    """{alternative key: why it does not fit} for those whose ranks on some node need more
    than ``MEMORY_SHARE`` of ``memory`` (None: unknown, nothing refused): each node's
    workers and servers as the run would place them (``place_servers``) on ``ranks`` spread
    evenly over ``nodes`` in blocks, the check before step 1's count on each."""
    out = {}
    if memory is None:
        return out
    layout = [r * nodes // ranks for r in range(ranks)]
    for a in alts:
        c = replace(cfg, mode=a.mode, replicate_rows=a.replicate_rows, servers=a.servers,
                    placement=placement_name(is_colocated(a.placement)))
        if is_colocated(a.placement):  # every rank a worker and a shard holder
            workers = servers = range(ranks)
        else:
            servers = place_servers(layout, a.servers)
            workers = [r for r in range(ranks) if r not in servers]
        counts = set(roles_per_node(layout, workers, servers).values())
        try:
            for w_here, s_here in sorted(counts, reverse=True):
                check_sizes(c, schema, a.workers, a.servers,
                            int(memory * planner.MEMORY_SHARE), w_here, s_here)
        except ConfigError as e:
            out[a.key] = str(e)
    return out
