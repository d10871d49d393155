# python bench/scaling.py bench_modes.json [more runs] [--compute-speedup X | --compute-from F]
"""Scaling model: project the three modes to N nodes from a modes_bench run.

Calibrated from ``bench/modes_bench.py`` JSON (one node, W0 workers + S0 = 1 server); pure
functions, no MPI. Weak scaling: N nodes, k workers per node (default W0), one server per
node, so W = N*k workers, S = N servers, batch b per worker fixed. Per mode and node count:

  step(N) = compute + local + imbalance + wait(N) + exchange(N) + ps_dense(N)
            + allgather(N) + allreduce(N)                                (no overlap)

  calib.    per phase, the workers' seconds per step averaged over the timed steps whose
            step time ranks in the middle half (25th-75th percentile; warm-up excluded): a
            decomposition of the typical step that adds up (means are additive, medians
            are not), robust to the outliers of a shared machine; ``other`` = the step time
            no phase timer covers, taken the same way. Runs from before modes_bench kept
            per-step series: the phase means of all steps put on the median step (legacy).
  compute   fwd_bwd + dense_apply, as measured, or replaced: ``--compute-speedup X``
            (divided by X), ``--compute-from F`` (a bench/gpu_check.py JSON: its
            ``compute`` entry with this run's MLP and batch). Everything else stays measured:
            when the compute is replaced (also ``--cross``) and the run has wire-only runs
            (``modes_bench --wire-only``: ``<mode> wire``, the same pulls, pushes, Allreduce
            and servers without the model's compute), every other term (local, wait,
            imbalance's non-compute part, the servers' apply) comes from the mode's
            wire-only run (``calibrate_gpu``): a GPU worker's matmuls leave the CPU alone;
            without them, from the run itself (measured beside CPU compute). The imbalance
            stays the real run's, scaled with the compute (see ``calibrate_gpu``).
  local     the other measured phases (data, pull, push, allreduce, eval) + other.
            allreduce mode: + row_apply * U * (W - W0) (every worker applies the optimizer
            to the rows all W workers gathered: W*U, an upper bound of their union).
            ``dense_local``: the part that moves the dense weights on the node (hybrid's
            Allreduce phase, the rest of the allreduce mode's push after its rows' part,
            ps's dense pull and push = ps minus hybrid); it scales with P across models.
            hybrid, allreduce: x the ring's on-node bytes per worker relative to the run,
            2(W-1)/W * (k-1)/k over 2(W0-1)/W0 (all edges on the node when N = 1; none
            with one worker per node), on top of the wire term below. A run with one
            worker (W0 = 1) moved no dense bytes on its node: its Allreduce phases are a
            fixed cost, and projections with k > 1 lack the on-node part (a NOTE says so).
  wait(N)   max(0, wait0 + exposed(N) - exposed0): workers wait for the servers'
            optimizer, exposed = max(0, server - hidden): server(N) = sparse0 * g +
            dense0 * h, less what the workers do meanwhile: hidden = the next batch's
            data phase (read and planned while the servers apply), in hybrid also the dense
            Allreduce phase (+ its wire time at N > 1) and dense_apply (the rest of
            wait0: completing the sends, the acknowledgements, stays). g = (W/S) /
            (W0/S0): rows each server receives relative to the run; h = S0/S
            (``--ps-server-dense shard``, default: ps's dense Adam runs over the server's
            P/S shard, the Accumulates into its gradient slot are the workers' push) or g
            (``received``: a server whose CPU handles every worker's dense copy).
            ``--servers-from F``: sparse0, dense0 and wait0 - exposed0 from F's run of
            the same model (``with_servers``: one with a core per rank, where the
            calibration run's ranks share cores and deschedule each other).
  imbalance the workers' wait for the slowest one at the sync point (the workers' mean
            minus the least worker's time in the syncing phases), scaled with the compute.
  exchange  hybrid, ps: (server_nic(get) + server_nic(put)) / bw + m * (N-1) * lat, with
            server_nic(x) = (W/S) * x * (N-1)/N = k*x*(N-1)/N (a server's NIC per phase,
            off-node part; by symmetry also what a node's k workers move the other way),
            get = U*E*4; put = U*8 + U*E*4 (row ids and gradient sums, two-sided, to a
            server-side optimizer) or U*E*4 (direct SGD: one Accumulate). m messages per
            remote server, one latency each: hybrid 3 (Get, ids, sums) or 2 (Get,
            Accumulate); ps 5 (+ the dense Get and Accumulate) or 4.
  ps_dense  ps: the dense table through the servers' NICs: 2 * server_nic(Pp*4) / bw;
            the measured on-node cost of its pull and push (``dense_local``) is kept for
            the 1/N share from the node's own server only (``--ps-local-dense share``,
            default) or all of it (``full``: one-node RMA as slow as measured, on top).
            ``--intra-node GB/s``: the on-node dense bytes (hybrid: the ring's on-node
            edges; ps: the own server's share of 2 * Pp*4) at that speed instead.
  allgather allreduce mode: ring Allgather of counts (8 B), ids (U*8), rows (U*E*4) over
            W: (W-1) * (bytes/bw + lat) each.
  allreduce hybrid, allreduce: ring Allreduce of P*4: 2(W-1)/W * P*4/bw + 2(W-1)*lat.
            Only the inter-node link counts (node-contiguous ring: one inter-node edge per
            node, the slowest edge sets every step; intra-node edges free). ``--overlap``:
            max(0, that - 2/3 * fwd_bwd) (the Allreduce hides behind backward).
  At N = 1 with k = W0 every wire term is 0: step(1) is the calibrated step.

U = mean unique ids per worker step (measured), E = row width (17: dim 16 + wide weight),
P = dense params, Pp = P padded to 256-wide rows (ps dense table). samples/s = W*b/step.
Saturation: the first N with parallel efficiency X(N) / (N * X(1)) < 50%; plateau: the
first N whose doubling from N/2 raised total samples/s by < 10%.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass, field, replace

from pshybrid.registry import MODES as CATALOGUE, ModeSpec

# the wire terms --mode auto prices with (one copy): links, ring collectives, server NICs
from pshybrid.planner import (
    PRESETS,
    Link,
    padded,
    ring_allgather,
    ring_allreduce,
    server_messages,
    server_nic_bytes,
)

ROW_WIDTH = 17  # modes_bench's fused row: embedding dim 16 + the wide (linear) weight
BWD_FRACTION = 2 / 3  # --overlap: share of fwd_bwd that is backward (2 of 3 matmul passes)
# the reference hybrid-vs-parameter-server result: hybrid 48% faster than TensorFlow-PS at 16
# nodes (docs/benchmarks.md; printed as "paper: 1.48x")
PAPER_HYBRID_OVER_PS_16 = 1.48
NODES = (1, 2, 4, 8, 16, 32, 64, 128)
MODES = ("hybrid", "ps", "allreduce", "compute")  # compute: no wire at all, the ideal line
COMPUTE = ("fwd_bwd", "dense_apply")  # what a GPU worker replaces
# phases in which workers wait for each other (the step's sync point): the Allreduce's
# completion, the servers' step (acknowledgements), the allreduce mode's Allgather (in push)
SYNC = {"hybrid": ("allreduce", "wait"), "ps": ("wait",), "allreduce": ("push", "allreduce"),
        "compute": ()}
BESIDE = "the run (measured beside CPU compute)"  # the CPU-side terms without wire runs
EFFICIENCY, GAIN = 0.5, 0.10  # saturation: efficiency < 50%; plateau: < 10% per doubling


def server_exchange(get: float, acc: float, nodes: int, k: int, link: Link,
                    messages: int) -> float:
    """Get phase + push phase to the servers: bytes at the NIC bottleneck, plus one
    latency per remote server for each of ``messages`` messages."""
    nic = server_nic_bytes(get, nodes, k) + server_nic_bytes(acc, nodes, k)
    return nic / link.bandwidth + messages * (nodes - 1) * link.latency


def ring_on_node(nodes: int, k: int, W0: int) -> float:
    """The dense Allreduce's on-node bytes per worker at ``nodes`` x k workers relative to
    the measured run (W0 workers, one node): a ring moves 2(W-1)/W of the buffer per
    worker, over an on-node edge for (k-1)/k of the workers (all of them on one node)."""
    W = nodes * k
    on = 1.0 if nodes == 1 else (k - 1) / k
    return (2 * (W - 1) / W * on) / (2 * (W0 - 1) / W0) if W0 > 1 else 1.0


def middle_half(steps) -> list[int]:
    """Indices of the steps whose times rank in the middle half (ranks n//4 .. n - n//4 - 1
    of the sorted times; every step when n < 4)."""
    n = len(steps)
    order = sorted(range(n), key=lambda i: steps[i])
    q = n // 4 if n >= 4 else 0
    return sorted(order[q:n - q])


def series_means(series: dict, sync: tuple = ()) -> dict:
    """modes_bench's ``timed_series`` -> the middle-half means: {phases: {p: s}, imbalance,
    other, server_apply, step}; phases + imbalance + other add up to step exactly. Each
    phase in ``sync`` (where workers wait for each other) is split, given each worker's
    series, into its least worker's time (the phase's own cost: the last worker to arrive
    waits least) and the rest (the workers' mean minus that): ``imbalance``."""
    idx = middle_half(series["step"])

    def mean(xs):
        return statistics.fmean(xs[i] for i in idx)

    phases = {p: mean(v) for p, v in series["phases"].items()}
    imbalance, by_worker = 0.0, series.get("phases_by_worker")
    if by_worker:
        for p in sync:
            lo = mean([min(w[p][t] for w in by_worker) for t in range(len(series["step"]))])
            imbalance += phases[p] - lo
            phases[p] = lo
    return dict(phases=phases, imbalance=imbalance, other=mean(series["untimed"]),
                server_apply=mean(series["server_apply"]), step=mean(series["step"]))


@dataclass(frozen=True)
class Calib:
    """One mode of one modes_bench run (seconds per step)."""

    mode: str
    workers: int  # W0, all on the one measured node
    servers: int  # S0
    batch: int
    U: float  # mean unique ids per worker step
    E: int  # row width (floats)
    P: int  # dense parameters
    ids: bool  # a server-side sparse optimizer: row ids + sums go two-sided to the servers
    local: dict  # worker phases except wait
    wait: float  # the workers' wait phase
    other: float  # the part of a step no phase timer covers
    step: float  # measured median step (timed steps)
    raw: float  # sum of the raw per-step phase means (include the warm-up steps)
    server_sparse: float  # servers' optimizer time for the sparse rows
    server_dense: float  # ps: servers' optimizer time for the dense table
    row_apply: float  # a worker's sparse optimizer per row (allreduce mode's growth)
    imbalance: float = 0.0  # workers waiting for the slowest at the sync point (SYNC)
    exposed: float = 0.0  # max(0, server apply - hidden) of the run (see predict)
    dense_local: dict = field(default_factory=dict)  # on-node cost of the dense bytes, by
    #   phase: hybrid's Allreduce phase (least worker), the allreduce mode's push less its
    #   rows' part (W0 * the compute-only push), ps's dense pull and push shares (ps minus
    #   hybrid); part of ``local``
    stat: str = "middle-half mean"  # how the phases were taken from the run
    compute: str = "measured"  # where fwd_bwd / dense_apply come from
    terms: str = BESIDE  # where every other term but the imbalance comes from

    @property
    def modeled(self) -> float:
        """The model's step at the measured configuration (1 node, W0 workers)."""
        return predict(self, 1, self.workers, Link(0.0, math.inf))["step"]


def facts(mode: str) -> ModeSpec:
    """The catalogue's entry of a measured mode; modes_bench's ``compute`` floor (and any
    other benchmark-only mode) as two local strategies: no server, no collective."""
    return CATALOGUE.get(mode) or ModeSpec(mode, "local", "local", "benchmark only")


def _terms(r: dict, mode: str) -> dict:
    """series_means of one mode's result; legacy runs (no per-step series): the phase
    means over all steps put on the median step."""
    if "timed_series" in r:
        return series_means(r["timed_series"], SYNC.get(mode, ()))
    ph = r["phase_seconds_per_step"]
    raw = sum(ph.values())
    a = r["step_seconds_median"] / raw if raw else 0.0
    return dict(phases={p: v * a for p, v in ph.items()}, imbalance=0.0, other=0.0,
                server_apply=r["server_apply_seconds_per_step"], step=r["step_seconds_median"])


def calibrate(run: dict, mode: str, row_width: int = ROW_WIDTH) -> Calib:
    """Calib of ``mode`` from a modes_bench JSON dict: the middle-half means of the timed
    steps (``timed_series``, ``series_means``), or, for older runs, the raw phase means put
    on the median step. The ps server time is split with the same run's hybrid server time
    (sparse rows; the rest is dense; all dense without hybrid), and ps's pull and push
    likewise (its dense table's share = ps minus hybrid). row_apply: compute mode's push / U
    (segment_sum + update of U rows), else the hybrid server's time per row received."""
    res = run["results"]
    r = res[mode]
    t = _terms(r, mode)
    ph, srv = t["phases"], t["server_apply"]
    U = statistics.fmean(r["unique_ids_per_worker_step"])
    W0, S0 = r["workers"], r["servers"]
    hyb = _terms(res["hybrid"], "hybrid") if "hybrid" in res else None
    spec = facts(mode)
    sparse = min(srv, hyb["server_apply"] if hyb else 0.0) if spec.dense_on_servers else srv
    row_apply = 0.0
    if "compute" in res and U:
        row_apply = _terms(res["compute"], "compute")["phases"]["push"] / U
    elif hyb and hyb["server_apply"] and U:
        row_apply = hyb["server_apply"] / (res["hybrid"]["workers"] * U /
                                           res["hybrid"]["servers"])
    dense_local = {}
    if spec.dense_allreduce and W0 == 1:
        pass  # one worker's Allreduce moves no bytes: what its phases hold is a fixed cost
    elif spec.dense_allreduce and spec.sparse_on_servers:  # the least worker's wait for the dense Allreduce: all dense bytes
        dense_local = {"allreduce": ph.get("allreduce", 0.0)}
    elif spec.replicated:  # push = the rows' Allgather and optimizer + the Iallreduce
        #   the Allgather progresses; the rows' part: the optimizer on all W0 workers' rows
        rows_part = row_apply * U * W0 if "compute" in res else \
            ph.get("push", 0.0) - min(hyb["phases"].get("allreduce", 0.0) if hyb else 0.0,
                                      ph.get("push", 0.0))
        dense_local = {"push": max(0.0, ph.get("push", 0.0) - rows_part)}
    elif spec.dense_on_servers and hyb:
        dense_local = {p: max(0.0, ph.get(p, 0.0) - hyb["phases"].get(p, 0.0))
                       for p in ("pull", "push")}
    local = {p: v for p, v in ph.items() if p != "wait"}
    wait = ph.get("wait", 0.0)
    exposed = max(0.0, srv - hidden(mode, local))
    return Calib(mode, W0, S0, run["args"]["batch_size"], U, row_width, r["dense_params"],
                 r["bytes_per_step"].get("p2p_bytes", 0) > 0, local, wait, t["other"],
                 r["step_seconds_median"], sum(r["phase_seconds_per_step"].values()),
                 sparse, srv - sparse, row_apply, t["imbalance"], exposed, dense_local,
                 "middle-half mean" if "timed_series" in r else
                 "legacy: phase means of all steps on the median step")


def hidden(mode: str, local: dict, allreduce_wire: float = 0.0) -> float:
    """What the workers do between sending the servers the step message and waiting for
    the servers' step, hiding the servers' apply: the next batch's reading and planning
    (``data``), and in hybrid the dense Allreduce's completion (on the node, plus its wire
    time) and the dense optimizer."""
    spec = facts(mode)
    if not spec.sparse_on_servers:
        return 0.0
    out = local.get("data", 0.0)
    if spec.dense_allreduce:
        out += local.get("allreduce", 0.0) + allreduce_wire + local.get("dense_apply", 0.0)
    return out


# -- the compute a GPU worker replaces, and a different dense size ---------------------------

def with_compute(c: Calib, fwd_bwd: float, dense_apply: float, label: str) -> Calib:
    """``c`` with the workers' fwd_bwd and dense_apply replaced (seconds per step); the
    imbalance at the sync point scales with them (assumed a fixed share of the compute);
    every other term stays measured. ps keeps dense_apply 0: its dense optimizer runs on
    the (CPU) servers, a server term."""
    local = dict(c.local, fwd_bwd=fwd_bwd)
    if not facts(c.mode).dense_on_servers:
        local["dense_apply"] = dense_apply
    before = sum(c.local.get(p, 0.0) for p in COMPUTE)
    after = sum(local.get(p, 0.0) for p in COMPUTE)
    return replace(c, local=local, compute=label,
                   imbalance=c.imbalance * after / before if before else c.imbalance)


WIRE = " wire"  # modes_bench's name suffix of the wire-only runs


def wire_view(run: dict) -> dict | None:
    """The run's wire-only results under their modes' names (a modes_bench-shaped dict, so
    ``calibrate`` reads them as a run), or None when it has none."""
    res = {k[:-len(WIRE)]: r for k, r in run["results"].items() if k.endswith(WIRE)}
    return dict(run, results=res) if res else None


def calibrate_gpu(run: dict, mode: str, row_width: int = ROW_WIDTH,
                  name: str = "the run") -> Calib:
    """``calibrate`` for a replaced compute: fwd_bwd, dense_apply and the imbalance from the
    real run (for ``with_compute`` to replace and scale), every other term from the mode's
    wire-only run when the run has one (``<mode> wire``: local phases, other, wait and its
    exposure, the servers' apply, the on-node dense costs, row_apply, all taken without CPU
    compute beside them). The wire-only run's own imbalance is not a GPU worker's: with
    nothing between their MPI calls, three ranks spinning on this box's two cores
    deschedule each other (0.7-3.0 ms a step for the paper workload, more than a light
    run's 0.2-0.9 ms with its compute). Without a wire-only run: ``calibrate(run, mode)``,
    the terms as measured beside the CPU compute."""
    c = calibrate(run, mode, row_width)
    wv = wire_view(run)
    if wv is None or mode not in wv["results"]:
        return c
    w = calibrate(wv, mode, row_width)
    local = dict(w.local, **{p: c.local[p] for p in COMPUTE if p in c.local})
    return replace(w, local=local, step=c.step, raw=c.raw, imbalance=c.imbalance,
                   terms=f"'{mode}{WIRE}' of {name} (no CPU compute beside)")


def term_sources(c: Calib) -> str:
    """Where each term of ``c`` comes from, in words."""
    return (f"{c.mode}: fwd_bwd, dense_apply <- {c.compute}; imbalance <- the run, x the "
            f"compute ratio; data, pull, push, allreduce, eval, other, wait, the servers' "
            f"apply <- {c.terms}")


def with_speedup(c: Calib, x: float) -> Calib:
    """``--compute-speedup x``: fwd_bwd and dense_apply divided by x."""
    return with_compute(c, c.local.get("fwd_bwd", 0.0) / x, c.local.get("dense_apply", 0.0) / x,
                        f"measured / {x:g}")


def compute_from(doc: dict, args: dict) -> tuple[float, float, str]:
    """(fwd_bwd, dense_apply, label) from a bench/gpu_check.py JSON: the entry of
    ``doc["compute"]`` timed with the calibration run's MLP and batch size."""
    for name, e in doc.get("compute", {}).items():
        if e["mlp"] == args["mlp"] and e["batch_size"] == args["batch_size"]:
            return (e["fwd_bwd_seconds"], e["dense_apply_seconds"],
                    f"{doc.get('device', '?')} ({name}: MLP {e['mlp']}, batch "
                    f"{e['batch_size']})")
    have = [(e["mlp"], e["batch_size"]) for e in doc.get("compute", {}).values()]
    raise ValueError(f"no compute entry for MLP {args['mlp']} batch {args['batch_size']} "
                     f"(the file has {have or 'none'})")


def with_dense_params(c: Calib, P: int) -> Calib:
    """``c`` for a model with P dense parameters instead: the terms that move or update the
    dense weights on the node (``dense_local``) and the servers' dense Adam (in the
    workers' wait, ``predict``) scale with P; the rest stays."""
    f = P / c.P if c.P else 1.0
    local = dict(c.local)
    for p, v in c.dense_local.items():
        local[p] += v * (f - 1)
    return replace(c, P=P, local=local, dense_local={p: v * f for p, v in c.dense_local.items()},
                   server_dense=c.server_dense * f)


def with_servers(c: Calib, o: Calib) -> Calib:
    """``--servers-from``: ``c`` with its servers' terms from ``o``, the same mode of another
    run of the same model (one with a core per rank: its servers apply and answer without
    being descheduled): the sparse apply per row received (x the rows a server of ``c``'s
    run receives, W0/S0 relative to ``o``'s), the dense Adam per shard (x S0 of ``o`` / S0 of
    ``c``), and the workers' wait beyond the exposed apply (``o.wait - o.exposed``: message
    latency and the acknowledgement); the exposure is recomputed against ``c``'s own hidden work."""
    if o.mode != c.mode or o.P != c.P:
        raise ValueError(f"--servers-from needs the same mode and model: {o.mode} with "
                         f"{o.P:,} dense params vs {c.mode} with {c.P:,}")
    sparse = o.server_sparse * (c.workers / c.servers) / (o.workers / o.servers)
    dense = o.server_dense * o.servers / c.servers
    exposed = max(0.0, sparse + dense - hidden(c.mode, c.local))
    return replace(c, server_sparse=sparse, server_dense=dense, exposed=exposed,
                   wait=max(0.0, o.wait - o.exposed) + exposed)


# -- the model -------------------------------------------------------------------------------

def dense_on_node(c: Calib, flows, nodes: int, k: int, intra_node: float | None,
                  ps_local_dense: str) -> float:
    """The on-node cost of the dense flows (``c``'s measured ``dense_local``, or bytes at
    ``intra_node``) at ``nodes`` x k workers: the Allreduce's on-node ring share; the dense
    table's pull and push to the servers (ps), half the measured cost each, the share from
    the node's own server (``full``: all of it, on top of the wire time)."""
    dense, to = sum(c.dense_local.values()), 0.0
    for f in (f for f in flows if not f.per_id):
        if f.allreduced:
            r = ring_on_node(nodes, k, c.workers)
            to += dense * r if intra_node is None else \
                r * 2 * (c.workers - 1) / c.workers * f.nbytes / intra_node
        elif f.to_servers:
            share = 1 / nodes if ps_local_dense == "share" else 1.0
            to += share * (dense / 2 if intra_node is None else f.nbytes / intra_node)
    return to


def predict(c: Calib, nodes: int, k: int, link: Link, overlap: bool = False,
            ps_server_dense: str = "shard", ps_local_dense: str = "share",
            intra_node: float | None = None, hit_rate: float = 0.0,
            pull_ahead: bool = False) -> dict:
    """Seconds per step by component, step, samples_per_s at ``nodes`` nodes x k workers.
    ``intra_node`` (bytes/s): the on-node dense bytes at that speed instead of the
    measured on-node costs (``dense_local``). ``--consistency ssp:K`` (hybrid, ps):
    ``hit_rate``, the share of a step's distinct rows served by the worker's cache (not
    pulled: fewer Get bytes on the wire); ``pull_ahead``, the rows' Get (its wire bytes and
    latency) travels while the previous step computes, hidden up to the compute time. The
    measured on-node pull phase stays as measured."""
    W, S = nodes * k, nodes
    loc = dict(c.local)  # the measured phases at this configuration
    spec = facts(c.mode)
    flows = spec.flows(c.E, c.P, 4, c.ids)  # the catalogue's bytes of a worker's step
    dense = sum(c.dense_local.values())
    to = dense_on_node(c, flows, nodes, k, intra_node, ps_local_dense)
    for p, v in c.dense_local.items():  # the measured on-node cost, by phase -> ``to``
        loc[p] += (v / dense * to if dense else to / len(c.dense_local)) - v
    for f in (f for f in flows if f.gathered):  # every worker applies every gathered row
        loc["push"] = loc.get("push", 0.0) + c.row_apply * c.U * (W - c.workers)
    comp = sum(loc.get(p, 0.0) for p in COMPUTE)
    out = dict(compute=comp, local=sum(loc.values()) - comp + c.other,
               imbalance=c.imbalance, wait=c.wait, exchange=0.0, ps_dense=0.0, allgather=0.0,
               allreduce=0.0)
    if spec.sparse_on_servers:
        rows_to = [f for f in flows if f.to_servers and f.per_id]
        get = sum(f.step_bytes(c.U, W * c.U) for f in rows_to if f.pulls) * (1 - hit_rate)
        put = sum(f.step_bytes(c.U, W * c.U) for f in rows_to if not f.pulls)
        out["exchange"] = server_exchange(get, put, nodes, k, link,
                                          server_messages(c.mode, c.ids))
        if pull_ahead:  # the Get's wire time, behind the compute
            out["exchange"] -= min(server_exchange(get, 0.0, nodes, k, link, 1), comp)
        out["ps_dense"] = sum(server_nic_bytes(f.nbytes, nodes, k) for f in flows
                              if f.to_servers and not f.per_id) / link.bandwidth
    if nodes > 1:  # the catalogue's Allgathers (the allreduce mode: counts, ids, rows)
        out["allgather"] = sum(ring_allgather(x, W, link) for f in flows if f.gathered
                               for x in f.blocks(c.U))
    for f in (f for f in flows if f.allreduced and nodes > 1):
        ar = ring_allreduce(f.nbytes, W, link)
        out["allreduce"] = max(0.0, ar - BWD_FRACTION * c.local["fwd_bwd"]) if overlap else ar
    if spec.sparse_on_servers:
        g = (W / S) / (c.workers / c.servers)
        h = g if ps_server_dense == "received" else c.servers / S
        server = c.server_sparse * g + c.server_dense * h
        exposed = max(0.0, server - hidden(c.mode, loc, out["allreduce"]))
        out["wait"] = max(0.0, c.wait + exposed - c.exposed)
    out["step"] = sum(out.values())
    out["samples_per_s"] = W * c.batch / out["step"] if out["step"] > 0 else float("inf")
    return out


def saturation(nodes, sps, efficiency: float = EFFICIENCY, gain: float = GAIN):
    """(first N with sps[N] / (N/N0 * sps[N0]) < efficiency, first N whose step from the
    previous N gained < ``gain`` per doubling); None where not reached."""
    eff = next((n for n, x in zip(nodes, sps) if x / (n / nodes[0] * sps[0]) < efficiency), None)
    plateau = next((n1 for n0, n1, x0, x1 in zip(nodes, nodes[1:], sps, sps[1:])
                    if (x1 / x0) ** (1 / math.log2(n1 / n0)) < 1 + gain),
                   None)
    return eff, plateau


# -- above the model: its checks and the command line (bench/scaling_checks.py,
# bench/scaling_cli.py import it; run as a script, this file is imported once more as
# ``scaling`` for them, and that module runs the command line)

if __name__ == "__main__":
    import scaling
    from pshybrid.launch import run

    sys.exit(run(scaling.main))  # (Ctrl-C: one line and status 130, not a traceback)

from scaling_checks import (  # noqa: E402
    COUNTERS,
    auto_picks,
    compute_ratio,
    counted_bytes,
    cross_workload,
    model_bytes,
    table_rows,
    term_diff,
    validate,
    validation_summary,
)
from scaling_cli import main  # noqa: E402
