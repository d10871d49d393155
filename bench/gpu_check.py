# python bench/gpu_check.py
"""python bench/gpu_check.py [--quick] [--speed] [--skip-speed] [--skip-tests] [--skip-train]
[--compute-only] [--peer PATH] [--json F]

The one GPU check of pshybrid (docs/gpu.md; ~6 minutes on one H200, ~3 of them step 4; it
stops itself at 710 s, so it ends inside 12 minutes; ``--speed``: step 4 alone, stopped at
290 s, inside 5 minutes). Run it as a plain process, NOT under mpiexec: it launches its MPI
jobs itself as subprocesses.

0. says which MPI library loads and whether it is CUDA-aware, in one line; an MPI that does
   not load (no libmpi, no mpiexec, no pytest-mpi) is named there, and the steps that need
   it are reported NOT RUN while the rest still runs;
1. builds the CUDA kernels (kernels/*.cu, NVRTC through cupy.RawModule; build time printed)
   and checks gather and scatter-add against their NumPy twins (float32/float64, vector and
   scalar paths);
2. times them beside the device-to-device copy of the same bytes: many back-to-back launches
   of the bound kernel between two CUDA events (bench/timing.py ``per_launch``), the copy
   the same way, in the same run; target printed beside each: >= 0.7x the copy bandwidth;
   scatter-add as a step calls it (a memset and the kernel, into a reused buffer) >= 0.6x at
   dims 16 and 64; the fused rows of dim 17 as a step carries them (padded to 20, the
   17-wide rows' copy over the 20-wide kernel) >= 0.7x;
3. times a training step, hybrid vs ps, one GPU worker + one CPU server rank, and
   allreduce on one GPU worker (DLRM, float32, batch 4096, steady-state interval of the
   run's metrics, phase split), and prints each run's host syncs per training step (the
   summary's ``host_syncs_per_step``: one per step plus one per log interval; another
   count fails the check);
4. times training on GPU workers (bench/gpu_speed.py; ``--speed``: this step alone, within
   240 s): the paper WDL workload (MLP 1024,512,256, dim 16, float32), batch 256 and 4096,
   in allreduce (1 GPU worker), hybrid and ps (1 CPU server + 1 GPU worker) and hybrid (1
   CPU server + 2 GPU workers on the one GPU): samples/s, ms per step, GPU busy, host syncs
   per step, CUDA graphs; the launches per step bench/step_launches.py counts; the naive
   PyTorch peer (``--peer PATH``: a script of the same model) beside allreduce; each
   target met or missed (b4096: allreduce >= 2.8M samples/s, hybrid 1S+1GPU >= 2.6M, GPU
   busy >= 0.5; b256: allreduce and hybrid >= 280k; hybrid >= 1.48x ps); into ``--json``
   under ``speed``;
5. runs tests/test_gpu.py with PSHYBRID_REQUIRE_GPU=1 (serial tests, then the MPI tests under
   ``mpiexec -n 3``: 1 server and W = 2 GPU workers, float64 == NumPy in hybrid, ps and
   allreduce, over RMA with several Allreduce buckets, and float32 == NumPy), so nothing
   passes by skipping;
6. times a worker's compute of the modes benchmark's workloads on the GPU (``time_compute``:
   the ``fwd_bwd`` and ``dense_apply`` phases of bench/modes_bench.py's paper and light
   workloads, batch 256) and writes them with the results to ``--json`` (default
   gpu_check.json) under ``compute``: what ``bench/scaling.py --compute-from`` reads.
   ``--compute-only``: this step alone (seconds).
Exit status: 0 when every correctness check, training run and test that could run passed (a
missed speed target, or an MPI step this machine cannot run, is reported, not fatal); 1
otherwise; 2 when no CUDA device is usable (the reason is printed: cupy missing, driver too
old, ...).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpu_speed  # noqa: E402 - bench/ on the path first
from gpu_runs import _T0, budget, run_limited, set_budget, steady, train_job  # noqa: E402
from timing import check_outputs, description, write_json  # noqa: E402

TARGET = 0.7
CALL_TARGET = 0.6  # scatter-add as a step calls it (memset + kernel), at dims 16 and 64
BUDGET = 420  # seconds for the subprocesses of every step but 4 (gpu_speed.BUDGET its own)
MARGIN = 50  # seconds past the subprocesses' budget: then the check stops (SIGALRM) and fails


def timed(cp, fn, repeat: int, launches: int) -> float:
    """Device seconds per call of ``fn``: ``launches`` back-to-back calls between two CUDA
    events, median of ``repeat`` rounds after 2 warm-ups (bench/timing.py: per_launch)."""
    from timing import CudaClock, per_launch

    return per_launch(fn, CudaClock(cp), launches, repeat)


def check_kernels(cp) -> bool:
    from pshybrid import cuda
    from pshybrid.kernels import gather_ref, scatter_add_ref

    rng = np.random.default_rng(0)
    ok = True
    for dtype in ("float32", "float64"):
        for dim in (1, 3, 4, 16, 17, 64):
            rows = rng.standard_normal((1000, dim)).astype(dtype)
            idx = np.concatenate([rng.integers(0, 1000, 20000), np.full(5000, 3)])
            g = cuda.gather(cp.asarray(rows), cp.asarray(idx)).get()
            vals = rng.integers(-8, 9, (idx.size, dim)).astype(dtype)  # exact in any order
            s = cuda.scatter_add(cp.asarray(idx), cp.asarray(vals), 1000).get()
            good = np.array_equal(g, gather_ref(rows, idx)) and \
                np.array_equal(s, scatter_add_ref(idx, vals, 1000))
            ok &= good
            if not good:
                print(f"  MISMATCH {dtype} dim {dim}")
    print(f"kernels vs NumPy twins (float32/float64, dims 1 3 4 16 17 64, duplicates): "
          f"{'ok' if ok else 'FAILED'}")
    return ok


def bench_kernels(cp, quick: bool) -> list[str]:
    from pshybrid import cuda

    n_rows, n = (1 << 20, 1 << 20) if not quick else (1 << 18, 1 << 18)
    repeat, launches = (20, 50) if not quick else (5, 20)
    rng = np.random.default_rng(1)
    idx = cp.asarray(rng.integers(0, n_rows, n))
    missed, took = [], {}  # (kernel, dtype, dim) -> seconds (the copy: kernel "copy")
    print(f"\n{'kernel':<12} {'dtype':<8} {'dim':>4} {'MB':>7} {'ms':>8} {'GB/s':>7} "
          f"{'copy GB/s':>9} {'x copy':>7}  target")
    for dtype, dim in (("float32", 16), ("float32", 64), ("float32", 128), ("float32", 17),
                       ("float32", 20), ("float64", 16), ("float64", 64)):
        table = cp.asarray(rng.standard_normal((n_rows, dim)).astype(dtype))
        values = cp.asarray(rng.standard_normal((n, dim)).astype(dtype))
        nbytes = values.nbytes  # rows moved by either kernel: read once, written once
        src, dst = cp.empty_like(values), cp.empty_like(values)

        def copy(dst=dst, src=src, nbytes=nbytes):
            dst.data.copy_from_device_async(src.data, nbytes)

        t_copy = took["copy", dtype, dim] = timed(cp, copy, repeat, launches)
        out, rows = cp.zeros((n_rows, dim), dtype), cp.empty_like(values)
        width, vec = cuda._width(dtype, dim, values, out, table, rows)
        runs = {"gather": cuda.launcher("gather_rows", dtype, width, n, (
                    table, idx, rows, np.int64(n), np.int64(width), np.int64(n_rows)), vec),
                "scatter_add": cuda.launcher("scatter_add_rows", dtype, width, n, (
                    idx, values, out, np.int64(n), np.int64(width), np.int64(n_rows)), vec),
                "  +call": lambda values=values, out=out: cuda.scatter_add(idx, values, n_rows,
                                                                            out=out)}
        for name, fn in runs.items():
            t = took[name, dtype, dim] = timed(cp, fn, repeat, launches)
            ratio = t_copy / t
            call = name == "  +call"
            target = CALL_TARGET if call else TARGET
            ok = ratio >= target
            counted = dim in (16, 64) if call else dim != 17  # 17: padded in a step (below)
            if not ok and counted:
                missed.append(f"{name.strip()} {dtype} dim {dim}: {ratio:.2f}x copy")
            note = ("  (scatter_add as a step calls it: memset + kernel)" if call else
                    "  (a step pads these rows: see 17->20)" if dim == 17 else "")
            print(f"{name:<12} {dtype:<8} {dim:>4} {nbytes / 1e6:>7.1f} {t * 1e3:>8.3f} "
                  f"{2 * nbytes / t / 1e9:>7.0f} {2 * nbytes / t_copy / 1e9:>9.0f} "
                  f"{ratio:>6.2f}x  >= {target:.2f}x {'ok' if ok else 'MISSED'}{note}")
    missed += padded_rows(took)
    print("GB/s = 2 x bytes of the (n, dim) rows (read + write) per second; ids uniform over "
          f"{n_rows} rows, n = {n}; each figure: {launches} back-to-back launches between two "
          f"CUDA events, median of {repeat}; the kernels alone (bound once; scatter_add adds "
          "into the same table every launch), the copy the same way; dim 20 = 17 padded to 4")
    return missed


def padded_rows(took: dict) -> list[str]:
    """The fused rows of dim 17 as training carries them on the device (padded to 20:
    graphs.DeviceStep): the copy of the 17-wide rows over the kernel on 20-wide ones ->
    the misses of the 0.7x target."""
    missed = []
    for name in ("gather", "scatter_add"):
        ratio = took["copy", "float32", 17] / took[name, "float32", 20]
        ok = ratio >= TARGET
        print(f"{name:<12} float32 17->20 as trained (copy of the 17-wide rows / kernel on "
              f"20-wide ones): {ratio:.2f}x  >= {TARGET:.2f}x {'ok' if ok else 'MISSED'}")
        if not ok:
            missed.append(f"{name} dim 17 as trained: {ratio:.2f}x copy")
    return missed


def bench_training(quick: bool, mpi: dict) -> bool:
    from pshybrid.registry import MODES

    steps = 60 if quick else 300
    logs = 3
    print(f"\ntraining step, 1 GPU worker (+ 1 CPU server in hybrid and ps: mpiexec -n 2), "
          f"dlrm float32, batch 4096, {steps} steps; samples/s of the last "
          f"{steps // logs}-step interval; host syncs per training step (worker 0's host "
          f"waits for the GPU: 1 per step + 1 per log interval = {1 + logs / steps:.2f})")
    res, ok = {}, True
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("hybrid", "ps", "allreduce"):
            on_servers = MODES[mode].needs_servers  # one CPU server beside the GPU worker
            servers = ["--servers", "1"] if on_servers else []
            t0 = time.time()
            recs = train_job(mpi, f"train {mode}", 2 if on_servers else 1, [
                "--mode", mode, *servers, "--model", "dlrm", "--batch-size", "4096",
                "--steps", str(steps), "--log-every", str(steps // logs)],
                os.path.join(tmp, f"{mode}.jsonl"), 60 if quick else 150)
            if recs is None:
                ok = False
                continue
            res[mode], summ = steady(recs)
            split = "  ".join(f"{k} {v:.0%}" for k, v in summ["phase_fraction"].items()
                              if v >= 0.01)
            syncs = summ.get("host_syncs_per_step", float("nan"))
            good = abs(syncs - (1 + logs / steps)) < 1e-9
            ok &= good
            print(f"  {mode:<9} {res[mode]:>10,.0f} samples/s  {4096 / res[mode] * 1e3:7.2f} "
                  f"ms/step  host syncs per training step {syncs:.3f} "
                  f"({'ok' if good else 'EXPECTED ' + format(1 + logs / steps, '.3f')})  "
                  f"final loss {summ['final_loss']:.4f}  startup "
                  f"{summ['startup_seconds']:.1f}s  wall {time.time() - t0:.0f}s  |  {split}")
    if "hybrid" in res and "ps" in res:
        print(f"  hybrid / ps = {res['hybrid'] / res['ps']:.2f}x samples/s "
              "(the reference hybrid-vs-parameter-server result: hybrid 48% faster than "
              "TensorFlow-PS at 16 nodes; here one worker, one node)")
    return ok


def mpi_probe() -> dict:
    """What this machine's MPI can do, without failing: ``lib`` (the MPI library, or None
    when mpi4py or libmpi does not load), ``mpiexec`` (a path, or None), ``pytest_mpi``
    (importable), ``aware`` and ``how`` (the CUDA-aware verdict) and ``line``: one line that
    says all of it, or what is missing."""
    import importlib.util
    import shutil

    from mpi_util import mpiexec

    out = {"lib": None, "aware": False, "how": "", "problems": []}
    try:
        from mpi4py import MPI

        from pshybrid.devices import cuda_aware_mpi

        out["lib"] = " ".join(MPI.Get_library_version().split("\n", 1)[0].split())
        out["aware"], out["how"] = cuda_aware_mpi()
    except Exception as e:  # noqa: BLE001 - reported in one line; the kernels still run
        out["problems"].append(f"mpi4py/libmpi does not load ({type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''})")
    exe = mpiexec()
    out["mpiexec"] = exe if os.path.isfile(exe) or shutil.which(exe) else None
    if out["mpiexec"] is None:
        out["problems"].append("no mpiexec (pip install mpich, or load the MPI module)")
    out["pytest_mpi"] = importlib.util.find_spec("pytest_mpi") is not None
    if not out["pytest_mpi"]:
        out["problems"].append("pytest-mpi missing (pip install -e '.[test]')")
    verdict = (f"CUDA-aware {'yes' if out['aware'] else 'no'} ({out['how']}): dense Allreduce "
               f"{'blocking on device buffers' if out['aware'] else 'staged through pinned host memory'}"
               if out["lib"] else "CUDA-aware: unknown")
    out["line"] = (f"MPI: {out['lib'] or 'NOT LOADABLE'}; {verdict}"
                   + (f"; NOT RUN where needed: {'; '.join(out['problems'])}"
                      if out["problems"] else ""))
    return out


def run_tests(mpi: dict, quick: bool) -> bool:
    """tests/test_gpu.py with PSHYBRID_REQUIRE_GPU=1: the serial tests (kernels, models,
    optimizers, single-rank training), then the MPI tests under ``mpiexec -n 3`` (1 server,
    W = 2 GPU workers); a run that this machine's MPI cannot do is reported, not failed."""
    env = dict(os.environ, PSHYBRID_REQUIRE_GPU="1")
    py = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider"]
    # the packaging test needs pip to fetch a build backend: not on an offline GPU box
    runs = [("serial", py + ["-m", "not mpi", "-k", "not installed_package", "tests/test_gpu.py"])]
    if mpi["lib"] and mpi["mpiexec"] and mpi["pytest_mpi"]:
        runs.append(("mpi -n 3", [mpi["mpiexec"], "-n", "3"] + py +
                     ["--with-mpi", "-m", "mpi", "tests/test_gpu.py"]))
    else:
        print(f"\n=== tests/test_gpu.py MPI tests: NOT RUN ({mpi['line']})")
    ok = True
    for label, cmd in runs:
        print(f"\n=== tests/test_gpu.py ({label}, PSHYBRID_REQUIRE_GPU=1): {' '.join(cmd)}",
              flush=True)
        p = run_limited(f"tests ({label})", cmd, 150 if quick else 240, env=env)
        if p is None:
            ok = False
            continue
        lines = p.stdout.strip().splitlines()
        for line in lines:  # the training oracles by name (W = 2, float32), pass or fail
            if "::test_train" in line and (" PASSED" in line or " FAILED" in line):
                print("  " + line.split("::", 1)[1])
        print("\n".join(lines[-25:]) if p.returncode else lines[-1] if lines else "(no output)")
        if p.returncode:
            print(p.stderr[-2000:])
        ok &= p.returncode == 0
    return ok


WORKLOADS = {"paper": "1024,512,256", "light": "64,32"}  # bench/modes_bench.py's


def time_compute(xp, mlp: str, batch_size: int = 256, dim: int = 16, repeat: int = 50,
                 warmup: int = 5, seed: int = 0) -> dict:
    """One worker's compute of bench/modes_bench.py's model (WDL, 13 dense features, 26
    fields, dim ``dim``, MLP ``mlp`` = "1024,512,256", float32, batch ``batch_size``) on
    ``xp`` (cupy, or numpy): median seconds of the ``fwd_bwd`` phase (forward, BCE,
    zero_grad, backward, then a stream sync: what ``train._step`` times) and of the
    ``dense_apply`` phase (Adam over every dense parameter, then a sync). Embedding rows
    are given (the mode's pull is not compute); no Allreduce buckets start in backward."""
    import statistics as st

    from pshybrid.backend import synchronize
    from pshybrid.layers import ParamSpace, bce_with_logits
    from pshybrid.models import build_model
    from pshybrid.optim import Optimizer
    from pshybrid.schema import Schema
    from pshybrid.synthetic import CRITEO_LIKE

    params = ParamSpace()
    model, layout = build_model("wdl", Schema(13, CRITEO_LIKE), dim,
                                tuple(int(x) for x in mlp.split(",")), params, "float32")
    params.build(xp, np.dtype("float32"), seed)
    rng = np.random.default_rng(seed)
    dense = xp.asarray(rng.standard_normal((batch_size, 13)).astype(np.float32))
    emb = xp.asarray((rng.standard_normal((batch_size, 26, layout.table.dim)) * 0.01)
                     .astype(np.float32))
    label = xp.asarray((rng.random(batch_size) < 0.25).astype(np.float32))
    opt = Optimizer("adam", 1e-3)
    state = {k: xp.zeros_like(params.flat) for k in opt.slots}
    step = [0]

    def fwd_bwd():
        _, dz = bce_with_logits(model.forward(dense, emb), label)
        params.zero_grad()
        synchronize(model.backward(dz * (1.0 / batch_size)))

    def dense_apply():
        step[0] += 1
        opt.update(params.flat, params.flat_grad, state, step[0])
        synchronize(params.flat)

    def median_time(fn):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return st.median(times)

    return {"mlp": mlp, "batch_size": batch_size, "embedding_dim": dim, "dtype": "float32",
            "dense_params": int(params.size), "fwd_bwd_seconds": median_time(fwd_bwd),
            "dense_apply_seconds": median_time(dense_apply), "repeat": repeat}


def bench_compute(xp, quick: bool) -> dict:
    """``time_compute`` of each modes_bench workload, printed; the JSON's ``compute``."""
    out = {}
    print("\nworker compute of bench/modes_bench.py's workloads (WDL, batch 256, float32; "
          "median of the timed calls): for bench/scaling.py --compute-from")
    for name, mlp in WORKLOADS.items():
        out[name] = e = time_compute(xp, mlp, repeat=10 if quick else 50)
        print(f"  {name:<6} MLP {mlp:<13} fwd_bwd {e['fwd_bwd_seconds'] * 1e3:8.3f} ms  "
              f"dense_apply {e['dense_apply_seconds'] * 1e3:7.3f} ms  "
              f"({e['dense_params']:,} dense params)")
    return out


def nvrtc_version() -> str:
    try:
        from cupy_backends.cuda.libs import nvrtc

        return ".".join(map(str, nvrtc.getVersion()))
    except Exception as e:  # noqa: BLE001 - reported, and cuda.module() below will fail
        return f"unavailable ({e})"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--speed", action="store_true",
                      help="only time training on GPU workers (step 4, within "
                      f"{gpu_speed.BUDGET}s) and write the JSON")
    only.add_argument("--skip-speed", action="store_true", help="leave out step 4")
    ap.add_argument("--skip-tests", action="store_true", help="leave out step 5 (the GPU "
                    "tests)")
    ap.add_argument("--skip-train", action="store_true", help="leave out step 3 (the "
                    "training runs)")
    only.add_argument("--compute-only", action="store_true",
                      help="only time the workers' compute (step 6) and write the JSON")
    ap.add_argument("--peer", metavar="PATH", default=None,
                    help="a plain PyTorch script of the same model, timed beside step 4 "
                    "(BATCH in its environment; its last line ends 'samples/s N'; none: "
                    "not run)")
    ap.add_argument("--json", default="gpu_check.json",
                    help="write the results here (compute: for bench/scaling.py)")
    args = ap.parse_args(argv)
    check_outputs(ap, args.json)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)

    from pshybrid.backend import cupy_status

    usable, why = cupy_status()
    if not usable:
        print(f"gpu_check: no usable CUDA device: {why}. This check needs a GPU; the install "
              "for a GPU machine is in docs/gpu.md", file=sys.stderr)
        return 2
    set_budget(plan_budget(args))
    hard = budget() + MARGIN  # by construction: 710 s (12 minutes); --speed: 290 s
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.alarm(hard)
    try:
        return _check(args)
    except TimeoutError:
        print(f"\ngpu_check: FAILED: ran past {hard}s (a hang?)")
        return 1
    finally:
        signal.alarm(0)


def speed_on(args) -> bool:
    """Whether step 4 runs: with ``--speed`` alone, and in every check but ``--skip-speed``
    and ``--compute-only``."""
    return args.speed or not (args.skip_speed or args.compute_only)


def plan_budget(args) -> int:
    """Seconds for the check's subprocesses: BUDGET for steps 1-3 and 5, plus step 4's."""
    return (0 if args.speed else BUDGET) + (gpu_speed.BUDGET if speed_on(args) else 0)


def speed_step(mpi: dict, peer: str | None) -> tuple[bool, list[str], dict | None]:
    """Step 4 where MPI can run it: (its runs passed, its missed targets, its JSON)."""
    if not (mpi["lib"] and mpi["mpiexec"]):
        print(f"\ntraining speed (mpiexec -n 1-3): NOT RUN ({mpi['line']})")
        return True, [], None
    return gpu_speed.bench_speed(mpi, peer)


def verdict(ok: bool, missed: list[str], mpi: dict) -> int:
    """The check's last line, and its exit status."""
    print(f"\ngpu_check: {'PASSED' if ok else 'FAILED'} in {time.time() - _T0:.0f}s; speed "
          f"targets (kernels >= {TARGET}x copy; training: step 4): "
          f"{'met' if not missed else 'missed: ' + '; '.join(missed)}"
          + ("" if not mpi["problems"] else f"; MPI: {'; '.join(mpi['problems'])}"))
    return 0 if ok else 1


def _out_of_time(signum, frame):
    raise TimeoutError


def _check(args) -> int:
    import cupy as cp

    from pshybrid import cuda

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"device {dev.id}: {name} (sm_{props['major']}{props['minor']}, "
          f"{props['totalGlobalMem'] / 2**30:.0f} GiB), CuPy {cp.__version__}, "
          f"CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}, driver "
          f"{cp.cuda.runtime.driverGetVersion()}, NVRTC {nvrtc_version()}")
    mpi = mpi_probe()
    print(mpi["line"], flush=True)
    doc = {"device": name, "cuda_aware_mpi": mpi["aware"], "mpi": mpi["line"]}

    def write(**more):
        doc.update(more)
        write_json(args.json, doc)
        print(f"wrote {args.json}")

    if args.compute_only:
        write(compute=bench_compute(cp, args.quick))
        return 0
    if args.speed:
        ok, missed, speed = speed_step(mpi, args.peer)
        write(speed=speed, passed=bool(ok), speed_missed=missed)
        return verdict(ok, missed, mpi)
    t = time.time()
    cuda.module()
    print(f"kernels built (NVRTC) from {[str(p) for p in cuda.source_files()]} in "
          f"{time.time() - t:.1f}s ({len(cuda.NAME_EXPRESSIONS)} kernels)")
    ok = check_kernels(cp)
    missed = bench_kernels(cp, args.quick) if ok else ["not timed: kernels are wrong"]
    if not args.skip_train:
        if mpi["lib"] and mpi["mpiexec"]:
            ok &= bench_training(args.quick, mpi)
        else:
            print(f"\ntraining step (mpiexec -n 2): NOT RUN ({mpi['line']})")
    speed = None
    if speed_on(args):
        good, more, speed = speed_step(mpi, args.peer)
        ok, missed = ok and good, missed + more
    if not args.skip_tests:
        ok &= run_tests(mpi, args.quick)
    write(compute=bench_compute(cp, args.quick), speed=speed, passed=bool(ok),
          speed_missed=missed)
    return verdict(ok, missed, mpi)


if __name__ == "__main__":
    sys.exit(main())
