#!/usr/bin/env python3
# python bench/scale_bench.py [--rows 100000000] [--small-rows 1000000] [--steps 50]
"""Scale benchmark: WDL with ONE sparse field of 100M rows x dim 16 (+1 linear column,
float32: 6.8 GB) on 2 servers + 1 worker trains 50 steps on this machine; the same job with
a 1M-row field beside it. Prints the worker's and the servers' peak RSS, the table
start-up time (servers initialise their shards in parallel) and samples/s. Each run is its
own `mpiexec -n 3` (peak RSS is per process lifetime). Sparse SGD keeps no optimizer state
on the servers (Adagrad would add 6.8 GB per slot).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading

from timing import at_least, description  # bench/timing.py (a sibling: python bench/X.py)

HERE = os.path.dirname(os.path.abspath(__file__))


def one_run(rows: int, steps: int) -> None:
    import io

    from mpi4py import MPI

    from pshybrid.config import TrainConfig
    from pshybrid.synthetic import SyntheticCTR
    from pshybrid.threads import apply_thread_limits
    from pshybrid.train import train

    apply_thread_limits()
    data = SyntheticCTR(seed=0, cardinalities=(rows,))
    cfg = TrainConfig(model="wdl", servers=2, steps=steps, log_every=steps,
                      sparse_optimizer="sgd", dense_optimizer="adam")

    def status():
        fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
        return {k: int(fields[k].split()[0]) / 1024 for k in ("RssAnon", "RssShmem")}

    # The worker's own (anonymous) pages, sampled every 5 ms: its peak RSS also counts the
    # servers' table pages its reads mapped (shared memory, within one node), which grow
    # with the table although the worker holds none of it.
    peak_anon, done = [0.0], threading.Event()

    def sample():
        while not done.wait(0.005):
            peak_anon[0] = max(peak_anon[0], status()["RssAnon"])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    res = train(cfg, MPI.COMM_WORLD, dataset=data, out=io.StringIO())
    done.set()
    sampler.join()
    if res.summary:  # the reporter is the worker: its private vs shared-memory pages now
        print("RESULT " + json.dumps({**{k: res.summary[k] for k in
                                         ("samples_per_s", "startup_seconds", "peak_rss_mb")},
                                      **status(), "peak_anon_mb": peak_anon[0]}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--rows", type=at_least(1), default=100_000_000)
    ap.add_argument("--small-rows", type=at_least(1), default=1_000_000)
    ap.add_argument("--steps", type=at_least(1), default=50)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        one_run(a.one, a.steps)
        return 0
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    out = {}
    for rows in (a.small_rows, a.rows):
        p = subprocess.run([mpiexec, "-n", "3", sys.executable, __file__, "--one", str(rows),
                            "--steps", str(a.steps)], capture_output=True, text=True,
                           timeout=1800, cwd=tempfile.gettempdir())
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode or not line:
            print(p.stdout, p.stderr)
            return 1
        out[rows] = json.loads(line[0][7:])
    small, big = out[a.small_rows], out[a.rows]
    gb = a.rows * 17 * 4 / 1e9
    print(f"scale benchmark: WDL, one field, dim 16 (+1 linear), float32, 2 servers + 1 worker, "
          f"{a.steps} steps, sparse SGD")
    print(f"{'rows':>12}{'table GB':>10}{'startup s':>11}{'samples/s':>11}"
          f"{'worker peak: RSS':>18}{'private':>9}{'server peak RSS':>17}  (MB)")
    for rows, r in out.items():
        print(f"{rows:>12,}{rows * 17 * 4 / 1e9:>10.2f}{r['startup_seconds']:>11.1f}"
              f"{r['samples_per_s']:>11,.0f}{r['peak_rss_mb']['worker']:>18,.0f}"
              f"{r['peak_anon_mb']:>9,.0f}{r['peak_rss_mb']['server']:>17,.0f}")
    ratio = big["peak_rss_mb"]["worker"] / small["peak_rss_mb"]["worker"]
    private = big["peak_anon_mb"] / small["peak_anon_mb"]
    print(f"worker peak private (anonymous) memory, {a.rows:,} vs {a.small_rows:,} rows: "
          f"{private:.3f}x (target <= 1.10); peak RSS {ratio:.3f}x (it also counts the "
          f"servers' table pages the worker's reads mapped: shared memory on one node); "
          f"table {gb:.1f} GB over 2 servers")
    return 0


if __name__ == "__main__":
    from pshybrid.launch import run

    sys.exit(run(main))  # (Ctrl-C: one line and status 130, not a traceback)
