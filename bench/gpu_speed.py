"""Step 4 of bench/gpu_check.py (``--speed`` runs it alone): the training speed of the paper
WDL workload (``--model wdl --mlp 1024,512,256 --embedding-dim 16``, float32, synthetic
data) on GPU workers, at batch 256 and 4096, in four configurations (``CONFIGS``: allreduce
on 1 GPU worker; hybrid and ps with 1 CPU server + 1 GPU worker; hybrid with 1 CPU server + 2
GPU workers sharing the one GPU), each a ``pshybrid train --device cuda`` job under mpiexec
(bench/gpu_runs.py ``train_job``). Per run one line: samples/s of the last logged interval
(the steady state), ms per step (batch x workers / samples/s), the summary's ``gpu_busy``,
``host_syncs_per_step`` and ``cuda_graphs``. Under the table: the launches per step that
bench/step_launches.py counts on its stand-in (a real GPU cannot count them cheaply), and
a plain PyTorch script of the same model given as the peer (``--peer PATH``: run with
``BATCH`` 256 and 4096, it prints ``samples/s N`` on its last line) beside the allreduce run.
Then the targets (``verdicts``), each met or MISSED; a miss is reported, not fatal, while a
run that fails or times out fails the check. The whole step ends within ``BUDGET`` seconds."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time

from gpu_runs import ROOT, run_limited, steady, train_job

WORKLOAD = ("--model", "wdl", "--mlp", "1024,512,256", "--embedding-dim", "16",
            "--dtype", "float32")
# (label, mode, CPU servers, GPU workers): one process each, every worker on the one GPU
CONFIGS = (("allreduce 1GPU", "allreduce", 0, 1), ("hybrid 1S+1GPU", "hybrid", 1, 1),
           ("ps 1S+1GPU", "ps", 1, 1), ("hybrid 1S+2GPU", "hybrid", 1, 2))
# steps per worker at each batch size, in LOGS logged intervals: the last one is timed;
# at the targets an interval is ~0.15 s of training, start-up (~10-20 s) dominates a run
STEPS = {256: 400, 4096: 200}
LOGS = 2
BUDGET = 240  # seconds for the whole step: the 8 runs, the launch count, the peer
RUN_LIMIT, PEER_LIMIT, LAUNCH_LIMIT = 45, 40, 120  # seconds for each, within BUDGET
STARTUP = 15  # seconds a run takes to start on an H200: for the printed time estimate
RATE_TARGETS = {(4096, "allreduce 1GPU"): 2.8e6, (4096, "hybrid 1S+1GPU"): 2.6e6,
                (256, "allreduce 1GPU"): 280e3, (256, "hybrid 1S+1GPU"): 280e3}
HYBRID_OVER_PS = 1.48  # hybrid's samples/s over ps's with the same servers and workers
BUSY_TARGET, BUSY_BATCH = 0.5, 4096  # GPU busy of the allreduce and hybrid runs there
LAUNCHES = os.path.join(ROOT, "bench", "step_launches.py")


def train_options(batch: int, mode: str, servers: int) -> list[str]:
    steps = STEPS[batch]
    return ["--mode", mode, *(["--servers", str(servers)] if servers else []), *WORKLOAD,
            "--batch-size", str(batch), "--steps", str(steps), "--log-every",
            str(steps // LOGS)]


def plan_line() -> str:
    """The step counts chosen, and the time they should take at the target rates."""
    rate = {b: min(v for (bb, _), v in RATE_TARGETS.items() if bb == b) for b in STEPS}
    train = sum(STEPS[b] * b * w / rate[b] for b in STEPS for _, _, _, w in CONFIGS)
    runs = len(STEPS) * len(CONFIGS)
    return (f"training speed (--speed): paper WDL (MLP 1024,512,256, dim 16, float32, "
            f"synthetic data); {runs} runs: "
            + ", ".join(f"b{b}: {s} steps per worker, log every {s // LOGS}"
                        for b, s in STEPS.items())
            + f"; samples/s of the last interval; ~{train:.1f}s of training at the target "
            f"rates beside ~{STARTUP}s start-up per run: ~{runs * STARTUP + train:.0f}s for "
            f"the runs, within the step's {BUDGET}s")


def run_row(batch: int, config: tuple, recs: list[dict]) -> dict:
    """One run's numbers from its metrics records (ValueError when they lack them)."""
    label, mode, servers, workers = config
    rate, summ = steady(recs)
    return {"batch": batch, "config": label, "mode": mode, "servers": servers,
            "workers": workers, "steps": STEPS.get(batch), "samples_per_s": rate,
            "step_ms": batch * workers / rate * 1e3 if rate > 0 else float("inf"),
            "gpu_busy": summ.get("gpu_busy"),
            "host_syncs_per_step": summ.get("host_syncs_per_step"),
            "cuda_graphs": summ.get("cuda_graphs")}


def _num(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def row_line(row: dict) -> str:
    graphs = f"  cuda graphs {row['cuda_graphs']}" if row.get("cuda_graphs") else ""
    return (f"  b{row['batch']:<5} {row['config']:<15} {row['samples_per_s']:>12,.0f} "
            f"samples/s {row['step_ms']:8.3f} ms/step  GPU busy "
            f"{_num(row.get('gpu_busy'), '.2f'):>4}  host syncs/step "
            f"{_num(row.get('host_syncs_per_step'), '.3f')}{graphs}")


def _verdict(target: str, value, need: float, unit: str) -> dict:
    return {"target": target, "value": value, "need": need, "unit": unit,
            "met": None if value is None else bool(value >= need)}


def verdicts(rows: list[dict]) -> list[dict]:
    """Every target beside what was measured: ``met`` True, False, or None (not measured:
    the run is missing, or its summary lacks the key)."""
    got = {(r["batch"], r["config"]): r for r in rows}
    out = []
    for (batch, label), need in RATE_TARGETS.items():
        r = got.get((batch, label))
        out.append(_verdict(f"b{batch} {label}", r and r["samples_per_s"], need, "samples/s"))
    for batch in STEPS:
        for label, mode, servers, workers in CONFIGS:
            if mode != "ps":
                continue
            twin = next((c[0] for c in CONFIGS if c[1:] == ("hybrid", servers, workers)), None)
            h, p = got.get((batch, twin)), got.get((batch, label))
            ratio = h["samples_per_s"] / p["samples_per_s"] if h and p else None
            out.append(_verdict(f"b{batch} {twin} / {label}", ratio, HYBRID_OVER_PS, "x"))
    for label, mode, _, _ in CONFIGS:
        if mode != "ps":
            r = got.get((BUSY_BATCH, label))
            out.append(_verdict(f"b{BUSY_BATCH} {label} GPU busy", r and r.get("gpu_busy"),
                                BUSY_TARGET, "busy"))
    return out


def _fmt(v: float, unit: str) -> str:
    return {"samples/s": f"{v:,.0f}", "x": f"{v:.2f}x", "busy": f"{v:.2f}"}[unit]


def verdict_line(v: dict) -> str:
    got = "n/a" if v["value"] is None else _fmt(v["value"], v["unit"])
    mark = {True: "met", False: "MISSED", None: "n/a (not measured)"}[v["met"]]
    return f"  {v['target']:<38} {got:>12}  target >= {_fmt(v['need'], v['unit'])}  {mark}"


def missed(checks: list[dict]) -> list[str]:
    """The misses, one phrase each, for the list the check prints at its end."""
    return [f"{v['target']} {_fmt(v['value'], v['unit'])} < {_fmt(v['need'], v['unit'])}"
            for v in checks if v["met"] is False]


def parse_peer(stdout: str) -> float | None:
    """The samples/s the peer prints on its last line (``... samples/s N``)."""
    found = re.findall(r"samples/s\s+([0-9][0-9.eE+]*)", stdout)
    return float(found[-1]) if found else None


def launch_line(p, why: str = "") -> str:
    """The last line of bench/step_launches.py's output (``graphs on: max N launches per
    step``) from its CompletedProcess, or why it is not available (``p`` None)."""
    if p is not None and p.returncode:
        err = (p.stderr.strip().splitlines() or ["no output"])[-1]
        why = f"exit {p.returncode}: {err}"
    lines = [] if p is None else p.stdout.strip().splitlines()
    if p is None or p.returncode or not lines:
        return f"launch count: not available ({why or 'no output'})"
    return f"launches per step (bench/step_launches.py, counted on its stand-in): {lines[-1]}"


def _env() -> dict:
    path = [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


def count_launches(until: float) -> str:
    if not os.path.isfile(LAUNCHES):
        return launch_line(None, f"{os.path.relpath(LAUNCHES, ROOT)} not found")
    p = run_limited("launch count", [sys.executable, LAUNCHES], LAUNCH_LIMIT, until,
                    env=_env())
    return launch_line(p, "not run or timed out: see above")


def run_peer(path: str, rows: list[dict], until: float) -> dict:
    """The peer script at ``path`` at each batch size, printed beside pshybrid's allreduce
    run; {batch: samples/s or None}. None given, missing or failing: reported, not fatal."""
    if path is None or not os.path.isfile(path):
        print("peer: " + ("none given (--peer PATH)" if path is None else f"{path} not found")
              + ": not run")
        return {}
    ours = {r["batch"]: r["samples_per_s"] for r in rows if r["mode"] == "allreduce"}
    out = {}
    for batch in STEPS:
        p = run_limited(f"peer b{batch}", [sys.executable, path], PEER_LIMIT, until,
                        env=dict(os.environ, BATCH=str(batch)))
        rate = parse_peer(p.stdout) if p is not None and not p.returncode else None
        out[batch] = rate
        if rate is None:
            why = "not run or timed out" if p is None else \
                f"exit {p.returncode}: {(p.stderr.strip().splitlines() or ['no output'])[-1]}"
            print(f"  peer b{batch}: no samples/s ({why})")
            continue
        mine = ours.get(batch)
        ratio = f"; pshybrid allreduce 1GPU / peer = {mine / rate:.2f}x" if mine else ""
        print(f"  peer b{batch}: {p.stdout.strip().splitlines()[-1]}{ratio}")
    return out


def measure(mpi: dict, batch: int, config: tuple, tmp: str, until: float) -> dict | None:
    """One run of the table: its row, or None (reported) when it failed."""
    label, mode, servers, workers = config
    metrics = os.path.join(tmp, f"b{batch}-{mode}-{servers}s{workers}w.jsonl")
    recs = train_job(mpi, f"b{batch} {label}", servers + workers,
                     train_options(batch, mode, servers), metrics, RUN_LIMIT, until)
    if recs is None:
        return None
    try:
        return run_row(batch, config, recs)
    except ValueError as e:
        print(f"  b{batch} {label}: FAILED ({e})")
        return None


def bench_speed(mpi: dict, peer: str | None) -> tuple[bool, list[str], dict]:
    """The step: (every run passed, the missed targets, the JSON document's ``speed``)."""
    until = time.time() + BUDGET
    print("\n" + plan_line() + "\n  (launches per step: under the table)", flush=True)
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for batch in STEPS:
            for config in CONFIGS:
                row = measure(mpi, batch, config, tmp, until)
                ok &= row is not None
                if row is not None:
                    rows.append(row)
                    print(row_line(row), flush=True)
    launches = count_launches(until)
    print(launches, flush=True)
    peers = run_peer(peer, rows, until)
    checks = verdicts(rows)
    print("targets:\n" + "\n".join(verdict_line(v) for v in checks))
    doc = {"steps": STEPS, "log_intervals": LOGS, "runs": rows, "launches": launches,
           "peer": peers, "targets": checks}
    return ok, missed(checks), doc
