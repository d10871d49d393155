# run as: python bench/scaling.py bench_modes.json [more runs] [--compute-speedup X | --compute-from F]
"""bench/scaling.py's command line as a pipeline of named steps: parse the flags, calibrate
(the compute replaced, the servers' terms from another run), print the validation, the
cross-workload check and the bytes, project every mode to N nodes, print the memory and
what ``--mode auto`` would pick, write the JSON and the plot. The model is
``bench/scaling.py``, its checks ``bench/scaling_checks.py``; no MPI."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

from pshybrid.optim import SLOTS
from pshybrid.planner import MEMORY_SHARE, PRESETS

import scaling
from scaling import (
    BESIDE,
    EFFICIENCY,
    GAIN,
    MODES,
    NODES,
    PAPER_HYBRID_OVER_PS_16,
    ROW_WIDTH,
    calibrate,
    calibrate_gpu,
    compute_from,
    predict,
    saturation,
    term_sources,
    with_compute,
    with_servers,
    with_speedup,
)
from scaling_checks import (
    auto_picks,
    counted_bytes,
    cross_workload,
    model_bytes,
    table_rows,
    validate,
    validation_summary,
)
from timing import above, at_least, check_outputs, description, write_json  # noqa: E402


def parser() -> argparse.ArgumentParser:
    """The flags (``--help``: the model's first docstring line)."""
    ap = argparse.ArgumentParser(description=description(scaling.__doc__))
    ap.add_argument("runs", nargs="+", help="modes_bench JSON files; the first calibrates, "
                    "the others validate (1 node)")
    ap.add_argument("--json", help="write the projection here")
    ap.add_argument("--png", help="write a log-log plot here (needs matplotlib)")
    ap.add_argument("--preset", default="eth25,ib100", help=f"comma list of {list(PRESETS)}")
    ap.add_argument("--latency", type=float, help="override the presets' latency (µs)")
    ap.add_argument("--bandwidth", type=above(0), help="override the presets' bandwidth (GB/s)")
    ap.add_argument("--workers-per-node", help="comma list (default: the first run's workers)")
    ap.add_argument("--nodes", default=",".join(map(str, NODES)))
    ap.add_argument("--overlap", action="store_true", help="dense Allreduce behind backward")
    ap.add_argument("--ps-server-dense", choices=("shard", "received"), default="shard",
                    help="ps servers' dense Adam: over their P/S shard, or per copy received")
    ap.add_argument("--ps-local-dense", choices=("share", "full"), default="share",
                    help="ps's measured one-node dense pull/push: the 1/N from the node's "
                         "own server, or all of it, on top of the wire")
    ap.add_argument("--intra-node", type=above(0), metavar="GB/s",
                    help="the dense bytes that stay on a node at this speed (e.g. NVLink) "
                         "instead of their measured one-node cost")
    ap.add_argument("--row-width", type=at_least(1), default=ROW_WIDTH)
    ap.add_argument("--hit-rate", type=float, default=None, metavar="H",
                    help="add hybrid-ssp: hybrid with this share of rows served by the "
                         "workers' caches (modes_bench's hit rate) and the Get pulled a step "
                         "ahead, behind the compute (--consistency ssp:K); 0 to 1")
    ap.add_argument("--node-memory", type=above(0), default=24.0, metavar="GB",
                    help="memory per node for the auto pick's memory check (default 24)")
    cg = ap.add_mutually_exclusive_group()
    cg.add_argument("--compute-speedup", type=above(0), metavar="X",
                    help="GPU-class workers: fwd_bwd and dense_apply divided by X (stated); "
                         "the other worker and server terms from the run's wire-only runs "
                         "(modes_bench --wire-only) where it has them")
    cg.add_argument("--compute-from", metavar="FILE",
                    help="GPU-class workers: fwd_bwd and dense_apply from a bench/gpu_check.py"
                         " JSON (its 'compute' entry with the run's MLP and batch size)")
    ap.add_argument("--servers-from", metavar="FILE",
                    help="hybrid and ps: the servers' apply (per row, per dense shard) and "
                         "the workers' wait beyond it from this modes_bench run of the same "
                         "model, e.g. one with a core per rank where the calibration run is "
                         "oversubscribed (its wire-only runs with a replaced compute)")
    ap.add_argument("--cross", nargs="+", metavar="FILE", default=(),
                    help="check the compute replacement: calibrated on the first run, "
                         "predict these runs of another workload (1 node) from the measured "
                         "compute ratio and the first run's wire-only terms; prints predicted "
                         "minus measured per term")
    return ap


def calibrations(a, run0: dict, name0: str) -> dict:
    """{mode: Calib} of the first run, its compute replaced where the flags say so (a GPU
    worker's CPU side: the wire-only runs)."""
    modes = [m for m in MODES if m in run0["results"]]
    calib = {m: calibrate(run0, m, a.row_width) for m in modes}
    if a.compute_speedup or a.compute_from:
        calib = {m: calibrate_gpu(run0, m, a.row_width, name0) for m in modes}
    if a.compute_speedup:
        calib = {m: with_speedup(c, a.compute_speedup) for m, c in calib.items()}
    elif a.compute_from:
        try:
            fb, da, label = compute_from(json.loads(Path(a.compute_from).read_text()),
                                         run0["args"])
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"--compute-from {a.compute_from}: {e}") from None
        calib = {m: with_compute(c, fb, da, label) for m, c in calib.items()}
    return calib


def servers_from(a, calib: dict, name0: str) -> list[str]:
    """``--servers-from``: hybrid's and ps's servers' terms replaced in ``calib`` (in place)
    from that run; the lines that say what changed."""
    notes = []
    if not a.servers_from:
        return notes
    srv_run = json.loads(Path(a.servers_from).read_text())
    replaced = bool(a.compute_speedup or a.compute_from)
    cal = calibrate_gpu if replaced else calibrate  # as the calibration run's terms
    for m in [m for m in ("hybrid", "ps") if m in calib]:
        if m not in srv_run["results"]:
            raise SystemExit(f"--servers-from {a.servers_from}: no {m} run in it")
        try:
            new = with_servers(calib[m], cal(srv_run, m, a.row_width))
        except ValueError as e:
            raise SystemExit(f"--servers-from {a.servers_from}: {e}") from None
        was = calib[m]
        notes.append(
            f"  servers' terms of {m} from {a.servers_from}: apply "
            f"{(new.server_sparse + new.server_dense) * 1e3:.2f} ms, wait beyond it "
            f"{(new.wait - new.exposed) * 1e3:.2f} ms ({name0}'s: "
            f"{(was.server_sparse + was.server_dense) * 1e3:.2f}, "
            f"{(was.wait - was.exposed) * 1e3:.2f} ms)")
        calib[m] = new
    return notes


def links(a) -> dict:
    """{preset: Link} of ``--preset``, with ``--latency`` / ``--bandwidth`` set."""
    out = {}
    for p in a.preset.split(","):
        lk = PRESETS[p]
        if a.latency is not None:
            lk = replace(lk, latency=a.latency * 1e-6, label=lk.label + " (latency set)")
        if a.bandwidth is not None:
            lk = replace(lk, bandwidth=a.bandwidth * 1e9, label=lk.label + " (bandwidth set)")
        out[p] = lk
    return out


def print_header(a, name0: str, c0, modes: list, ks: list) -> None:
    """What the model is calibrated from and how it projects."""
    print(f"scaling model calibrated from {name0}: {', '.join(modes)}; measured {c0.workers} "
          f"workers + {c0.servers} server on 1 node, batch {c0.batch}, U={c0.U:.0f} unique "
          f"ids/worker/step, E={c0.E}, P={c0.P / 1e6:.2f}M; phases: {c0.stat}; projected with "
          f"{'/'.join(map(str, ks))} workers + 1 server per node, "
          f"{'overlap' if a.overlap else 'no overlap'}, ps server dense time ~ "
          f"{a.ps_server_dense}, ps one-node dense pull/push: {a.ps_local_dense}, on-node "
          f"dense bytes: {f'{a.intra_node:g} GB/s' if a.intra_node else 'as measured'}")


def print_assumption(a, calib: dict, run0: dict, name0: str) -> None:
    """A replaced compute, stated beside the measured one, and where the other terms come
    from."""
    ch = next(iter(calib.values()))
    if ch.compute == "measured":
        return
    print(f"ASSUMPTION: GPU-class workers: fwd_bwd and dense_apply = {ch.compute}: "
          + ", ".join(f"{m} {c.local.get('fwd_bwd', 0) * 1e3:.3f} + "
                      f"{c.local.get('dense_apply', 0) * 1e3:.3f} ms (measured "
                      f"{c0_.local.get('fwd_bwd', 0) * 1e3:.2f} + "
                      f"{c0_.local.get('dense_apply', 0) * 1e3:.2f})"
                      for (m, c), c0_ in zip(calib.items(),
                                             (calibrate(run0, m, a.row_width)
                                              for m in calib)))
          + "; every communication and server term stays as measured")
    for c in calib.values():
        print(f"  terms of {term_sources(c)}")
    if all(c.terms == BESIDE for c in calib.values()):
        print(f"  NOTE: {name0} has no wire-only runs (modes_bench --wire-only): the CPU-side "
              "terms are measured beside CPU compute (they overstate a GPU worker's)")


def print_notes(run0: dict, name0: str, c0, modes: list, ks: list, srv_notes: list) -> None:
    """The servers' terms replaced, and what the calibration run lacks."""
    cpr = run0.get("cores_per_rank")
    for line in srv_notes:
        print(line)
    if cpr is not None and cpr < 1:
        print(f"  NOTE: {name0} ran {run0.get('ranks', '?')} ranks with {cpr:.2f} cores each: "
              "they deschedule each other and its terms carry that (the waits for the "
              "servers most); the model gives every rank its own cores, so calibrate on a "
              "run with at least one core per rank (docs/benchmarks.md)")
    if c0.workers == 1 and max(ks) > 1 and {"hybrid", "allreduce"} & set(modes):
        print(f"  NOTE: {name0} has one worker: its dense Allreduce moved no bytes on the node,"
              f" so the projections with {max(ks)} workers per node lack that on-node cost "
              "(calibrate on a run with 2 or more workers)")


def print_validation(runs: list, row_width: int, name0: str, c0) -> tuple[list, dict]:
    """The model at 1 node vs each run's measured step; (per-run rows, per-mode summary)."""
    val = validate(runs, row_width)
    print(f"validation at 1 node: the model calibrated on {name0} (its step: the phases "
          "summed) vs each run's measured median step (the first: the residual of the phase "
          "accounting)")
    for v in val:
        print(f"  {v['target']}  {v['mode']:<10} W={v['workers']:<3} measured "
              f"{v['measured_s'] * 1e3:8.2f} ms  model {v['predicted_s'] * 1e3:8.2f} ms  "
              f"error {v['error']:+6.1%}")
    summary = validation_summary([v for v in val if v["workers"] == c0.workers])
    for m, v in summary.items():
        print(f"  {m:<10} the model vs the median of the {v['runs']} other runs' steps: "
              f"{v['predicted_s'] * 1e3:.2f} vs {v['measured_s'] * 1e3:.2f} ms, error "
              f"{v['error']:+.1%} (per run {v['min_error']:+.1%} to {v['max_error']:+.1%})")
    return val, summary


def print_cross(paths, run0: dict, row_width: int, name0: str, c0) -> dict:
    """``--cross``: each other workload predicted from the first run; {path: rows}."""
    cross = {}
    for path in paths:
        dst = json.loads(Path(path).read_text())
        cross[path] = cw = cross_workload(run0, dst, row_width)
        print(f"cross-workload: {name0} -> {path}: fwd_bwd and dense_apply / "
              f"{cw[0]['ratio']:.1f} (measured compute ratio), dense params "
              f"{c0.P:,} -> {dst['results'][cw[0]['mode']]['dense_params']:,}")
        for v in cw:
            print(f"  {v['mode']:<10} measured {v['measured_s'] * 1e3:7.2f} ms  model "
                  f"{v['predicted_s'] * 1e3:7.2f} ms  error {v['error']:+6.1%}   (dense terms "
                  f"not resized: {v['predicted_same_dense_s'] * 1e3:7.2f} ms "
                  f"{v['error_same_dense']:+6.1%})")
            print("    predicted - measured, ms: " + " ".join(
                f"{k} {d * 1e3:+.2f}" for k, d in v["diff"].items() if abs(d) >= 5e-6)
                  + f"   (terms: {v['terms']})")
    return cross


def print_bytes(calib: dict, run0: dict) -> None:
    """Bytes per worker per step: the model's beside the library's counters."""
    print("bytes per worker per step, model vs the library's counters:")
    unknown = False
    for m, c in calib.items():
        got = counted_bytes(run0["results"][m]["bytes_per_step"])
        mb = model_bytes(c)
        for kind in sorted(set(got) | set(mb)):
            g, x = got.get(kind, 0.0), mb.get(kind, 0.0)
            note = f"{x / g - 1:+.2%}" if g and x else "NOT IN THE MODEL" if g else "model only"
            unknown |= bool(g and not x)
            print(f"  {m:<10}{kind:<12}{x:>13,.0f}{g:>13,.0f}  {note}")
    if unknown:  # (bench/sample_modes.json: its pushes were RMA Accumulates, now messages)
        print("  (bytes NOT IN THE MODEL: the run's library moved them another way than this "
              "version does, so the kinds beside them differ too: a run from an older version?)")


def entries(calib: dict, hit_rate: float | None) -> list:
    """(name, Calib, ssp options) per projected row: every mode, and with ``--hit-rate``
    hybrid-ssp (hybrid with that hit rate and the pull ahead)."""
    out = [(m, c, {}) for m, c in calib.items()]
    if hit_rate is not None and "hybrid" in calib:
        out.append(("hybrid-ssp", calib["hybrid"], {"hit_rate": hit_rate, "pull_ahead": True}))
    return out


def project_table(calib: dict, nodes: list, k: int, lk, kw: dict, hit_rate) -> dict:
    """One link and k workers per node: each mode's samples/s at every N, printed as a
    row; {mode: projection}."""
    res = {}
    for m, c, x in entries(calib, hit_rate):
        pr = [predict(c, n, k, lk, **kw, **x) for n in nodes]
        sps = [x["samples_per_s"] for x in pr]
        sat, plat = saturation(nodes, sps)
        eff = [x / (n / nodes[0] * sps[0]) for n, x in zip(nodes, sps)]
        res[m] = dict(nodes=nodes, samples_per_s=sps, efficiency=eff,
                      step_s=[x["step"] for x in pr], components=pr,
                      saturation_nodes=sat, plateau_nodes=plat)
    w = max([11] + [len(f"{x:,.0f}") + 2 for r in res.values() for x in r["samples_per_s"]])
    print(f"{'mode':<10}" + "".join(f"{'N=' + str(n):>{w}}" for n in nodes)
          + f"{'eff@max':>9}{'sat.':>6}{'plat.':>6}")
    for m, r in res.items():
        print(f"{m:<10}" + "".join(f"{x:>{w},.0f}" for x in r["samples_per_s"])
              + f"{r['efficiency'][-1]:>9.0%}{r['saturation_nodes'] or '-':>6}"
              f"{r['plateau_nodes'] or '-':>6}")
    return res


def print_ratio_16(calib: dict, k: int, lk, kw: dict, hit_rate) -> float:
    """Hybrid over PS at 16 nodes, the terms of both steps (and hybrid-ssp's); the ratio."""
    h, q = (predict(calib[m], 16, k, lk, **kw) for m in ("hybrid", "ps"))
    ratio = q["step"] / h["step"]
    terms = ("compute", "local", "imbalance", "wait", "exchange", "ps_dense", "allreduce")
    print(f"Hybrid/PS at 16 nodes: {ratio:.2f}x   step ms (hybrid | "
          f"ps): " + "  ".join(f"{t} {h[t] * 1e3:.2f} | {q[t] * 1e3:.2f}" for t in terms))
    if hit_rate is not None:
        s = predict(calib["hybrid"], 16, k, lk, **kw, hit_rate=hit_rate, pull_ahead=True)
        print(f"Hybrid-ssp (hit rate {hit_rate:.0%}, pull ahead)/PS (bsp) at 16 "
              f"nodes: {q['step'] / s['step']:.2f}x   exchange ms {s['exchange'] * 1e3:.2f}"
              f" (hybrid bsp {h['exchange'] * 1e3:.2f})")
    return ratio


def project(a, calib: dict, lks: dict, ks: list, nodes: list, kw: dict) -> tuple[dict, dict]:
    """Every link and k: the projection table and Hybrid/PS at 16 nodes; (projection,
    {preset: {k: Hybrid/PS at 16 nodes}})."""
    proj, ratios = {}, {}
    for p, lk in lks.items():
        proj[p], ratios[p] = {}, {}
        for k in ks:
            print(f"\n{p}: {lk.label}, latency {lk.latency * 1e6:g} µs, bandwidth "
                  f"{lk.bandwidth / 1e9:g} GB/s, {k} workers + 1 server per node -- "
                  f"projected samples/s (all workers)")
            proj[p][str(k)] = project_table(calib, nodes, k, lk, kw, a.hit_rate)
            if "hybrid" in calib and "ps" in calib:
                ratios[p][str(k)] = print_ratio_16(calib, k, lk, kw, a.hit_rate)
    return proj, ratios


def print_summary(ratios: dict, calib: dict, nodes: list) -> None:
    """Hybrid/PS at 16 nodes beside the reference result, and the saturation legend."""
    if ratios and any(ratios.values()):
        print("\nHybrid/PS at 16 nodes: " + ", ".join(
            f"{p} k={k} {r:.2f}x" for p, rs in ratios.items() for k, r in rs.items())
            + f"   (paper: {PAPER_HYBRID_OVER_PS_16:.2f}x vs TF-PS; here at 1 node: "
            f"{calib['ps'].step / calib['hybrid'].step:.2f}x measured)")
    print(f"saturation: first N with parallel efficiency < {EFFICIENCY:.0%} ('sat.'); plateau:"
          f" first N whose doubling gained < {GAIN:.0%} ('plat.'); '-': not within {nodes[-1]}")


def memory(run0: dict, c0) -> dict:
    """The table's bytes on an allreduce worker and over the servers, printed."""
    args0 = run0["args"]
    rows = run0.get("table_rows") or table_rows(args0["max_cardinality"])  # (older runs)
    slots = len(SLOTS[args0["sparse_optimizer"]])
    tb = rows * c0.E * 4
    mem = dict(table_rows=rows, allreduce_worker_bytes=tb * (1 + slots),
               server_bytes_times_nodes=tb * (1 + slots))
    print(f"memory: allreduce keeps the whole table ({rows:,} rows x {c0.E}) on every "
          f"worker: {mem['allreduce_worker_bytes'] / 1e9:.2f} GB with {args0['sparse_optimizer']}"
          f" state, at any N; hybrid/ps: {mem['server_bytes_times_nodes'] / 1e9:.2f} GB / N "
          f"per server")
    return mem


def print_picks(proj: dict, mem: dict, node_memory: float, nodes: list) -> dict:
    """What ``--mode auto`` would pick at each N, printed; {preset: {k: [mode per N]}}."""
    picks = auto_picks(proj, mem["allreduce_worker_bytes"], node_memory * 1e9)
    print(f"--mode auto would pick (the most samples/s among hybrid, ps and allreduce with "
          f"dedicated servers; allreduce only where k whole tables fit "
          f"{MEMORY_SHARE:.0%} of {node_memory:g} GB per node):")
    for p, byk in picks.items():
        for k, ms in byk.items():
            print(f"  {p:<6} k={k:<3}" + "".join(f"{'N=' + str(n)}:{m:<10}"
                                                for n, m in zip(nodes, ms)))
    return picks


def write_png(path: str, proj: dict, lks: dict, ks: list, nodes: list, compute: str) -> None:
    """A log-log plot of samples/s against nodes, one panel per link."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no PNG: matplotlib is not installed (pip install 'pshybrid[bench]')")
        return
    fig, axes = plt.subplots(1, len(proj), figsize=(6 * len(proj), 4.5), squeeze=False)
    for ax, (p, byk) in zip(axes[0], proj.items()):
        for ci, (k, res) in enumerate(byk.items()):
            for m, r in res.items():
                if len(ks) > 1 and m not in ("hybrid", "ps"):
                    continue  # several k: hybrid against ps only
                ls = {"hybrid": "-", "ps": "--", "allreduce": ":"}.get(m, "-.")
                color = f"C{ci}" if len(ks) > 1 else \
                    f"C{MODES.index(m) if m in MODES else len(MODES)}"
                ax.loglog(nodes, r["samples_per_s"], ls, color=color, marker="o", ms=3,
                          label=f"{m}, {k}/node" if len(ks) > 1 else m)
        ax.set_xlabel("nodes")
        ax.set_ylabel("samples/s (all workers)")
        ax.set_title(f"{p}: {lks[p].label}", fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"pshybrid scaling model, compute {compute}, "
                 f"{'/'.join(map(str, ks))} workers + 1 server per node", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def _counts(ap, text: str | None) -> list[int]:
    """The integers of a comma list (None: none), or ``ap.error`` naming it."""
    try:
        return [int(x) for x in text.split(",")] if text else []
    except ValueError as e:
        ap.error(f"--nodes / --workers-per-node: {e}")


def _json(ap, path: str, what: str):
    """A JSON file's content, or ``ap.error`` naming ``what`` (the option) and the file."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        ap.error(f"{what} {path}: not a readable JSON file ({e})")


def _run(ap, path: str, what: str = "RUN") -> dict:
    """A modes_bench JSON file's content, or ``ap.error`` saying why it is not one."""
    run = _json(ap, path, what)
    if not isinstance(run, dict) or not isinstance(run.get("results"), dict):
        ap.error(f"{what} {path}: not a modes_bench output (no 'results')")
    measured = [m for m in MODES if m in run["results"]]
    if not measured:
        ap.error(f"{what} {path}: 'results' holds none of the modes {', '.join(MODES)}")
    for m in measured:  # (what the calibration reads; older runs: the phase means)
        r = run["results"][m]
        lack = [k for k in RESULT_KEYS + (() if isinstance(r, dict) and "timed_series" in r
                                          else LEGACY_KEYS)
                if not isinstance(r, dict) or k not in r]
        if lack:
            ap.error(f"{what} {path}: results.{m} lacks {', '.join(lack)} (not a modes_bench "
                     "output)")
    return run


RESULT_KEYS = ("workers", "servers", "unique_ids_per_worker_step", "bytes_per_step",
               "dense_params")
LEGACY_KEYS = ("phase_seconds_per_step", "step_seconds_median", "server_apply_seconds_per_step")


def main(argv=None) -> int:
    """Parse, calibrate, check, project, print, write."""
    ap = parser()
    a = ap.parse_args(argv)
    check_outputs(ap, a.json, a.png, [("RUN", p) for p in a.runs] + [
        ("--cross", p) for p in a.cross] + [(o, p) for o, p in (
            ("--servers-from", a.servers_from), ("--compute-from", a.compute_from)) if p])
    nodes, given_ks = _counts(ap, a.nodes), _counts(ap, a.workers_per_node)
    if any(n < 1 for n in nodes + given_ks):
        ap.error("--nodes and --workers-per-node: counts of at least 1")
    if unknown := set(a.preset.split(",")) - set(PRESETS):
        ap.error(f"--preset: unknown {', '.join(sorted(unknown))} (known: {', '.join(PRESETS)})")
    if a.latency is not None and not 0 <= a.latency < float("inf"):
        ap.error(f"--latency {a.latency:g}: microseconds, 0 or more")
    if a.hit_rate is not None and not 0 <= a.hit_rate <= 1:
        ap.error(f"--hit-rate {a.hit_rate}: a share of the rows, from 0 to 1")
    runs = [(p, _run(ap, p)) for p in a.runs]
    name0, run0 = runs[0]
    for opt, p in [("--cross", p) for p in a.cross] + [("--servers-from", a.servers_from)] * bool(
            a.servers_from):  # (checked before anything is printed, as the runs are)
        _run(ap, p, opt)
    if a.compute_from and not isinstance(_json(ap, a.compute_from, "--compute-from"), dict):
        ap.error(f"--compute-from {a.compute_from}: not a gpu_check --compute-only output")
    modes = [m for m in MODES if m in run0["results"]]
    c0 = calibrate(run0, modes[0], a.row_width)
    calib = calibrations(a, run0, name0)
    srv_notes = servers_from(a, calib, name0)
    ks = given_ks or [c0.workers]
    lks = links(a)
    kw = dict(overlap=a.overlap, ps_server_dense=a.ps_server_dense,
              ps_local_dense=a.ps_local_dense,
              intra_node=a.intra_node * 1e9 if a.intra_node else None)
    print_header(a, name0, c0, modes, ks)
    print_assumption(a, calib, run0, name0)
    print_notes(run0, name0, c0, modes, ks, srv_notes)
    val, summary = print_validation(runs, a.row_width, name0, c0)
    cross = print_cross(a.cross, run0, a.row_width, name0, c0)
    print_bytes(calib, run0)
    proj, ratios = project(a, calib, lks, ks, nodes, kw)
    print_summary(ratios, calib, nodes)
    mem = memory(run0, c0)
    picks = print_picks(proj, mem, a.node_memory, nodes)
    compute = next(iter(calib.values())).compute
    if a.json:
        write_json(a.json, dict(auto_picks=picks,
            calibrated_from=name0, servers_from=a.servers_from,
            calibration_cores_per_rank=run0.get("cores_per_rank"), workers_per_node=ks,
            servers_per_node=1, **kw, compute=compute,
            links={p: asdict(lk) for p, lk in lks.items()},
            calib={m: asdict(c) for m, c in calib.items()}, validation=val,
            validation_summary=summary,
            cross_workload=cross, projection=proj, hybrid_over_ps_16=ratios,
            paper_hybrid_over_ps_16=PAPER_HYBRID_OVER_PS_16, memory=mem))
        print(f"wrote {a.json}")
    if a.png:
        write_png(a.png, proj, lks, ks, nodes, compute)
    return 0

