# python bench/scaling.py bench_modes.json [--json OUT] [--png OUT]
"""Scaling model: project the three modes to N nodes from a modes_bench run.

Calibrated from ``bench/modes_bench.py`` JSON (one node, W0 workers + S0 = 1 server); pure
functions, no MPI. Weak scaling: N nodes, k workers per node (default W0), one server per
node, so W = N*k workers, S = N servers, batch b per worker fixed. Per mode and node count:

  step(N) = local + wait(N) + exchange(N) + allgather(N) + allreduce(N)   (no overlap)

  local     the workers' measured phases except ``wait`` (data, pull, fwd_bwd, push,
            allreduce, dense_apply, eval) put on the measured median step:
            phase_fraction * step_seconds_median. Measured pull/push/allreduce (shared
            memory on one node) stay as local cost; the wire time below is added on top.
            allreduce mode: + row_apply * U * (W - W0) (every worker applies the optimizer
            to the rows all W workers gathered: W*U, an upper bound of their union).
  wait(N)   max(0, wait0 + server(N) - server0): workers wait for the servers' optimizer;
            server(N) = sparse0 * g + dense0 * g   with g = (W/S) / (W0/S0), the rows
            (and, ps, dense gradient copies) each server receives relative to the run;
            ``--ps-server-dense shard`` scales ps's dense part by S0/S instead (Adam on a
            P/S shard only). With the defaults g = 1: server time stays as measured.
  exchange  hybrid, ps: (server_nic(get) + server_nic(acc)) / bw + m * (N-1) * lat, with
            server_nic(x) = (W/S) * x * (N-1)/N = k*x*(N-1)/N (a server's NIC per phase,
            off-node part; by symmetry also what a node's k workers move the other way),
            get = U*E*4 (+ Pp*4 in ps), acc = get (+ U*8 row ids to the servers when the
            sparse optimizer runs there), m = 2 (+1) messages per remote server.
  allgather allreduce mode: ring Allgather of counts (8 B), ids (U*8), rows (U*E*4) over
            W: (W-1) * (bytes/bw + lat) each.
  allreduce hybrid, allreduce: ring Allreduce of P*4: 2(W-1)/W * P*4/bw + 2(W-1)*lat.
            Only the inter-node link counts (node-contiguous ring: one inter-node edge per
            node, the slowest edge sets every step; intra-node edges free). ``--overlap``:
            max(0, that - 2/3 * fwd_bwd) (the Allreduce hides behind backward).
  At N = 1 every wire term is 0: step(1) = the measured median step by construction.

U = mean unique ids per worker step (measured), E = row width (17: dim 16 + wide weight),
P = dense params, Pp = P padded to 256-wide rows (ps dense table). samples/s = W*b/step.
Saturation: the first N with parallel efficiency X(N) / (N * X(1)) < 50%; plateau: the
first N whose doubling from N/2 raised total samples/s by < 10%.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pshybrid.optim import SLOTS
from pshybrid.registry import DENSE_ROW
ROW_WIDTH = 17  # modes_bench's fused row: embedding dim 16 + the wide (linear) weight
BWD_FRACTION = 2 / 3  # --overlap: share of fwd_bwd that is backward (2 of 3 matmul passes)
PAPER_HYBRID_OVER_PS_16 = 1.48  # the paper: Hybrid 48% faster than TF-PS at 16 nodes
NODES = (1, 2, 4, 8, 16, 32, 64, 128)
MODES = ("hybrid", "ps", "allreduce", "compute")  # compute: no wire at all, the ideal line
EFFICIENCY, GAIN = 0.5, 0.10  # saturation: efficiency < 50%; plateau: < 10% per doubling


@dataclass(frozen=True)
class Link:
    latency: float  # seconds per message
    bandwidth: float  # bytes/s, each direction (full duplex)
    label: str = ""


PRESETS = {"eth25": Link(10e-6, 3.1e9, "25 Gb/s Ethernet"),
           "ib100": Link(1.5e-6, 12.5e9, "100 Gb/s InfiniBand")}


def ring_allreduce(nbytes: float, W: int, link: Link) -> float:
    """Ring Allreduce of ``nbytes`` over W ranks: 2(W-1) steps of nbytes/W each."""
    return 2 * (W - 1) / W * nbytes / link.bandwidth + 2 * (W - 1) * link.latency if W > 1 else 0.0


def ring_allgather(nbytes_each: float, W: int, link: Link) -> float:
    """Ring Allgather, ``nbytes_each`` per rank: W-1 steps, each forwards one rank's block."""
    return (W - 1) * (nbytes_each / link.bandwidth + link.latency)


def server_nic_bytes(per_worker: float, nodes: int, k: int) -> float:
    """Off-node bytes one server's NIC carries in one phase when each of W = nodes*k
    workers exchanges ``per_worker`` bytes spread over the S = nodes servers."""
    W, S = nodes * k, nodes
    return W / S * per_worker * (nodes - 1) / nodes


def server_exchange(get: float, acc: float, nodes: int, k: int, link: Link,
                    messages: int) -> float:
    """Get phase + Accumulate phase to the servers: bytes at the NIC bottleneck, plus one
    latency per remote server for each of ``messages`` rounds."""
    nic = server_nic_bytes(get, nodes, k) + server_nic_bytes(acc, nodes, k)
    return nic / link.bandwidth + messages * (nodes - 1) * link.latency


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
    ids: bool  # row ids go to the servers (server-side sparse optimizer)
    local: dict  # worker phases except wait, on the median step's footing
    wait: float  # the same for wait
    step: float  # measured median step
    raw: float  # sum of the raw per-step phase means (include the warm-up steps)
    server_sparse: float  # servers' optimizer time for the sparse rows (measured mean)
    server_dense: float  # ps: servers' optimizer time for the dense table
    row_apply: float  # a worker's sparse optimizer per row (allreduce mode's growth)


def calibrate(run: dict, mode: str, row_width: int = ROW_WIDTH) -> Calib:
    """Calib of ``mode`` from a modes_bench JSON dict. The ps server time is split with
    the same run's hybrid server time (sparse rows; the rest is dense; all dense without
    hybrid). row_apply: compute mode's push / U (segment_sum + update of U rows), else the
    hybrid server's time per row received, else 0."""
    res = run["results"]
    r = res[mode]
    ph = r["phase_seconds_per_step"]
    raw, step = sum(ph.values()), r["step_seconds_median"]
    a = step / raw if raw else 0.0
    U = statistics.fmean(r["unique_ids_per_worker_step"])
    W0, S0 = r["workers"], r["servers"]
    srv = r["server_apply_seconds_per_step"]
    hyb = res.get("hybrid", {}).get("server_apply_seconds_per_step")
    sparse = srv if mode != "ps" else min(srv, hyb or 0.0)
    if "compute" in res:
        row_apply = res["compute"]["phase_seconds_per_step"]["push"] / U
    else:
        row_apply = hyb / (res["hybrid"]["workers"] * U / res["hybrid"]["servers"]) if hyb else 0.0
    return Calib(mode, W0, S0, run["args"]["batch_size"], U, row_width, r["dense_params"],
                 r["bytes_per_step"].get("p2p_bytes", 0) > 0,
                 {p: v * a for p, v in ph.items() if p != "wait"}, ph.get("wait", 0.0) * a,
                 step, raw, sparse, srv - sparse, row_apply)


def padded(P: int) -> int:
    return -(-P // DENSE_ROW) * DENSE_ROW


def predict(c: Calib, nodes: int, k: int, link: Link, overlap: bool = False,
            ps_server_dense: str = "received") -> dict:
    """Seconds per step by component, step, samples_per_s at ``nodes`` nodes x k workers."""
    W, S = nodes * k, nodes
    rows = c.U * c.E * 4
    out = dict(local=sum(c.local.values()), wait=c.wait, exchange=0.0, allgather=0.0,
               allreduce=0.0)
    if c.mode in ("hybrid", "ps"):
        get = rows + (padded(c.P) * 4 if c.mode == "ps" else 0)
        out["exchange"] = server_exchange(get, get + c.U * 8 * c.ids, nodes, k, link, 2 + c.ids)
        g = (W / S) / (c.workers / c.servers)
        dense = g if ps_server_dense == "received" else c.servers / S
        out["wait"] = max(0.0, c.wait + c.server_sparse * (g - 1) + c.server_dense * (dense - 1))
    if c.mode == "allreduce":
        out["local"] += c.row_apply * c.U * (W - c.workers)
        if nodes > 1:
            out["allgather"] = sum(ring_allgather(x, W, link) for x in (8, c.U * 8, rows))
    if c.mode in ("hybrid", "allreduce") and nodes > 1:
        ar = ring_allreduce(c.P * 4, W, link)
        out["allreduce"] = max(0.0, ar - BWD_FRACTION * c.local["fwd_bwd"]) if overlap else ar
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


def model_bytes(c: Calib) -> float:
    """Bytes per worker per step the model moves at the measured configuration, as the
    library's counters count them (Allgather: all W0 blocks, own included)."""
    rows = c.U * c.E * 4
    if c.mode == "hybrid":
        return 2 * rows + c.U * 8 * c.ids + c.P * 4
    if c.mode == "ps":
        return 2 * (rows + padded(c.P) * 4) + c.U * 8 * c.ids
    if c.mode == "allreduce":
        return c.workers * c.U * (8 + c.E * 4) + c.P * 4
    return 0.0


def validate(runs: list[tuple[str, dict]], row_width: int = ROW_WIDTH) -> list[dict]:
    """Own run: the model from the raw phase means vs the measured median step (residual
    of the phase accounting). Across runs: calibrated on run i, predicted at 1 node with
    run j's workers, vs run j's median step."""
    out = []
    for ni, ri in runs:
        for nj, rj in runs:
            for m in MODES:
                if m not in ri["results"] or m not in rj["results"]:
                    continue
                c, t = calibrate(ri, m, row_width), rj["results"][m]
                pred = c.raw if ni == nj else predict(c, 1, t["workers"], PRESETS["eth25"])["step"]
                meas = t["step_seconds_median"]
                out.append(dict(calibration=ni, target=nj, mode=m, workers=t["workers"],
                                measured_s=meas, predicted_s=pred, error=pred / meas - 1))
    return out


def table_rows(max_cardinality: int) -> int:
    """Rows of modes_bench's fused table: its CRITEO_KAGGLE cardinalities, capped (read
    from the source: importing modes_bench would start MPI)."""
    src = Path(__file__).with_name("modes_bench.py").read_text()
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "CRITEO_KAGGLE")
    return sum(min(c, max_cardinality) for c in ast.literal_eval(node.value))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="modes_bench JSON files; the first calibrates")
    ap.add_argument("--json", help="write the projection here")
    ap.add_argument("--png", help="write a log-log plot here (needs matplotlib)")
    ap.add_argument("--preset", default="eth25,ib100", help=f"comma list of {list(PRESETS)}")
    ap.add_argument("--latency", type=float, help="override the presets' latency (µs)")
    ap.add_argument("--bandwidth", type=float, help="override the presets' bandwidth (GB/s)")
    ap.add_argument("--workers-per-node", type=int, help="default: the first run's workers")
    ap.add_argument("--nodes", default=",".join(map(str, NODES)))
    ap.add_argument("--overlap", action="store_true", help="dense Allreduce behind backward")
    ap.add_argument("--ps-server-dense", choices=("received", "shard"), default="received")
    ap.add_argument("--row-width", type=int, default=ROW_WIDTH)
    a = ap.parse_args(argv)
    runs = [(p, json.loads(Path(p).read_text())) for p in a.runs]
    name0, run0 = runs[0]
    modes = [m for m in MODES if m in run0["results"]]
    calib = {m: calibrate(run0, m, a.row_width) for m in modes}
    c0 = next(iter(calib.values()))
    k = a.workers_per_node or c0.workers
    nodes = [int(x) for x in a.nodes.split(",")]
    links = {}
    for p in a.preset.split(","):
        lk = PRESETS[p]
        if a.latency is not None:
            lk = replace(lk, latency=a.latency * 1e-6, label=lk.label + " (latency set)")
        if a.bandwidth is not None:
            lk = replace(lk, bandwidth=a.bandwidth * 1e9, label=lk.label + " (bandwidth set)")
        links[p] = lk
    kw = dict(overlap=a.overlap, ps_server_dense=a.ps_server_dense)

    print(f"scaling model calibrated from {name0}: {', '.join(modes)}; measured {c0.workers} "
          f"workers + {c0.servers} server on 1 node, batch {c0.batch}, U={c0.U:.0f} unique "
          f"ids/worker/step, E={c0.E}, P={c0.P / 1e6:.2f}M; projected with {k} workers + 1 "
          f"server per node, {'overlap' if a.overlap else 'no overlap'}, ps server dense "
          f"time ~ {a.ps_server_dense}")
    val = validate(runs, a.row_width)
    print("validation at 1 node: own run = the raw phase means summed vs the median step "
          "(the projection is anchored on the median); other runs = the model calibrated on "
          "the first file, at the second's workers")
    for v in val:
        pair = v["target"] if v["calibration"] == v["target"] else \
            f"{v['calibration']} -> {v['target']}"
        print(f"  {pair}  {v['mode']:<10} W={v['workers']:<3} measured "
              f"{v['measured_s'] * 1e3:7.1f} ms  model {v['predicted_s'] * 1e3:7.1f} ms  "
              f"error {v['error']:+6.1%}")
    print("bytes per worker per step, model vs the library's counters:")
    for m, c in calib.items():
        got = sum(run0["results"][m]["bytes_per_step"].values())
        if got:
            mb = model_bytes(c)
            print(f"  {m:<10}{mb:>13,.0f}{got:>13,.0f}  {mb / got - 1:+.1%}")

    proj = {}
    for p, lk in links.items():
        print(f"\n{p}: {lk.label}, latency {lk.latency * 1e6:g} µs, bandwidth "
              f"{lk.bandwidth / 1e9:g} GB/s -- projected samples/s (all workers)")
        print(f"{'mode':<10}" + "".join(f"{'N=' + str(n):>10}" for n in nodes)
              + f"{'eff@max':>9}{'sat.':>6}{'plat.':>6}")
        proj[p] = {}
        for m, c in calib.items():
            pr = [predict(c, n, k, lk, **kw) for n in nodes]
            sps = [x["samples_per_s"] for x in pr]
            sat, plat = saturation(nodes, sps)
            eff = [x / (n / nodes[0] * sps[0]) for n, x in zip(nodes, sps)]
            proj[p][m] = dict(nodes=nodes, samples_per_s=sps, efficiency=eff,
                              step_s=[x["step"] for x in pr], components=pr,
                              saturation_nodes=sat, plateau_nodes=plat)
            print(f"{m:<10}" + "".join(f"{x:>10,.0f}" for x in sps) + f"{eff[-1]:>9.0%}"
                  f"{sat or '-':>6}{plat or '-':>6}")
    ratios = {}
    if "hybrid" in calib and "ps" in calib:
        for p, lk in links.items():
            ratios[p] = (predict(calib["hybrid"], 16, k, lk, **kw)["samples_per_s"]
                         / predict(calib["ps"], 16, k, lk, **kw)["samples_per_s"])
        print("\nHybrid/PS at 16 nodes: " + ", ".join(f"{p} {r:.2f}x" for p, r in ratios.items())
              + f"   (paper: {PAPER_HYBRID_OVER_PS_16:.2f}x vs TF-PS; here at 1 node: "
              f"{calib['ps'].step / calib['hybrid'].step:.2f}x measured)")
    print(f"saturation: first N with parallel efficiency < {EFFICIENCY:.0%} ('sat.'); plateau:"
          f" first N whose doubling gained < {GAIN:.0%} ('plat.'); '-': not within {nodes[-1]}")
    args0 = run0["args"]
    rows = table_rows(args0["max_cardinality"])
    slots = len(SLOTS[args0["sparse_optimizer"]])
    tb = rows * c0.E * 4
    mem = dict(table_rows=rows, allreduce_worker_bytes=tb * (1 + slots),
               server_bytes_times_nodes=tb * (1 + (slots + 1 if slots else 0)))
    print(f"memory: allreduce keeps the whole table ({rows / 1e6:.1f}M rows x {c0.E}) on every "
          f"worker: {mem['allreduce_worker_bytes'] / 1e9:.2f} GB with {args0['sparse_optimizer']}"
          f" state, at any N; hybrid/ps: {mem['server_bytes_times_nodes'] / 1e9:.2f} GB / N "
          f"per server")

    if a.json:
        Path(a.json).write_text(json.dumps(dict(
            calibrated_from=name0, workers_per_node=k, servers_per_node=1, **kw,
            links={p: asdict(lk) for p, lk in links.items()}, calib={m: asdict(c) for m, c in
                                                                     calib.items()},
            validation=val, projection=proj, hybrid_over_ps_16=ratios,
            paper_hybrid_over_ps_16=PAPER_HYBRID_OVER_PS_16, memory=mem), indent=1))
        print(f"wrote {a.json}")
    if a.png:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("no PNG: matplotlib is not installed (pip install 'pshybrid[bench]')")
            return 0
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (p, res), ls in zip(proj.items(), ("-", "--", ":", "-.")):
            for i, (m, r) in enumerate(res.items()):
                if m != "compute" or ls == "-":  # compute only: no wire, the same everywhere
                    ax.loglog(nodes, r["samples_per_s"], ls, color=f"C{i}", marker="o", ms=3,
                              label=f"{m} ({p})" if m != "compute" else "compute only (no wire)")
        ax.set_xlabel("nodes")
        ax.set_ylabel("samples/s (all workers)")
        ax.set_title(f"pshybrid scaling model: {k} workers + 1 server per node")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(a.png, dpi=120)
        print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
