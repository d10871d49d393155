#!/usr/bin/env python3
"""mpiexec -n 2 python bench/store_bench.py [--rows 1000000] [--dim 64] [--batch 4096]

Embedding-store benchmark: pull and push throughput of ``EmbeddingStore``
beside its references, measured in the same run on the same rows:
  raw Get / raw Accumulate  mpi4py indexed RMA on the same window, datatype built per step
                            (what the store must do) and prebuilt (pure transfer);
  two-sided                 worker sends ids, server replies with the rows (Send/Recv);
  local gather / memcpy     np.take of the rows and a plain copy of the same bytes.
1 server (the last rank) and N-1 workers; ids are Zipf(a) over the table, deduplicated
by the store. Throughput is MB/s of unique rows moved per worker. Rank 0 prints.
"""

from __future__ import annotations

from pshybrid.threads import apply_thread_limits

apply_thread_limits()  # before NumPy loads its BLAS, as `python -m pshybrid` does

import argparse  # noqa: E402
import sys
from types import SimpleNamespace

import numpy as np
from timing import above, at_least, description, median_time  # noqa: E402  (bench/timing.py)
from mpi4py import MPI

from pshybrid import partition
from pshybrid.store import EmbeddingStore, TableSpec
from pshybrid.topology import Topology
from pshybrid.transport import idle_barrier, rows_type

TAG_REQ, TAG_REP, TAG_STOP = 11, 12, 13


def timeit(fn, warmup: int, repeat: int) -> float:
    return median_time(fn, warmup, repeat, MPI.Wtime)


def parser() -> argparse.ArgumentParser:
    """The flags (``--help``: the docstring's summary line)."""
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--rows", type=at_least(1), default=1_000_000)
    ap.add_argument("--dim", type=at_least(1), default=64)
    ap.add_argument("--batch", type=at_least(1), default=4096)
    ap.add_argument("--zipf", type=above(1), default=1.05)  # (NumPy's Zipf: a > 1)
    ap.add_argument("--warmup", type=at_least(1), default=5)
    ap.add_argument("--repeat", type=at_least(1), default=30)
    return ap


def make_batch(a, topo, store) -> SimpleNamespace:
    """This rank's ids (Zipf over the table), their unique rows, gradients and buffers,
    and the rows' displacements in the server's window (unique, and all B with duplicates)."""
    rng = np.random.default_rng(topo.rank)
    ids = np.minimum(rng.zipf(a.zipf, a.batch) - 1, a.rows - 1).astype(np.int64)
    uniq = np.unique(ids)
    grads = rng.standard_normal((a.batch, a.dim)).astype(np.float32) * 1e-3
    base = store._remote[0]["emb"]["w"]
    return SimpleNamespace(
        ids=ids, uniq=uniq, ubytes=uniq.size * a.dim * 4, grads=grads,
        usums=np.ascontiguousarray(grads[: uniq.size]),
        ubuf=np.empty((uniq.size, a.dim), np.float32),
        disps=base + partition.local_row(uniq, 1) * a.dim * 4,
        all_disps=base + partition.local_row(ids, 1) * a.dim * 4,  # duplicates included
        all_buf=np.empty((a.batch, a.dim), np.float32))


def raw_ops(a, store, srank: int, c):
    """The references: one indexed Get of the unique rows, of all B rows, one indexed
    Accumulate; each builds its datatype per step unless handed a prebuilt one."""
    T = MPI.FLOAT

    def raw_get(prebuilt=None):
        dt = prebuilt or rows_type(T, a.dim, c.disps)
        store.win.Get([c.ubuf, T], srank, [0, 1, dt])  # Wire: one indexed Get from the server
        store.win.Flush(srank)
        if prebuilt is None:
            dt.Free()

    def raw_get_all():
        dt = rows_type(T, a.dim, c.all_disps)
        store.win.Get([c.all_buf, T], srank, [0, 1, dt])  # Wire: one indexed Get of all B rows, no dedup
        store.win.Flush(srank)
        dt.Free()

    def raw_acc(prebuilt=None):
        dt = prebuilt or rows_type(T, a.dim, c.disps)
        store.win.Accumulate([c.usums, T], srank, [0, 1, dt], op=MPI.SUM)  # Wire: one indexed Accumulate
        store.win.Flush(srank)
        if prebuilt is None:
            dt.Free()

    return raw_get, raw_get_all, raw_acc


def time_rma(a, store, srank: int, c, results: dict) -> None:
    """A worker: the store's pull, plan and push (RMA path, then the same-node one) beside
    the raw indexed Get and Accumulate, a local gather and memcpy; into ``results``."""
    raw_get, raw_get_all, raw_acc = raw_ops(a, store, srank, c)
    ids, grads = c.ids, c.grads
    pre = rows_type(MPI.FLOAT, a.dim, c.disps)
    views = store._views
    store._views = None  # the RMA path first
    results["store pull"] = timeit(lambda: store.pull("emb", ids), a.warmup, a.repeat)
    results["store plan (dedup, groups, type)"] = timeit(
        lambda: store.plan("emb", ids).free(), a.warmup, a.repeat)
    ahead = store.plan("emb", ids)  # training makes it on the data thread, a step ahead
    results["store pull, plan made ahead"] = timeit(lambda: store.pull("emb", ahead),
                                                    a.warmup, a.repeat)
    results["raw Get, all B ids (no dedup)"] = timeit(raw_get_all, a.warmup, a.repeat)
    if not np.array_equal(c.all_buf, store.pull("emb", ids)):
        raise SystemExit("raw Get of all ids disagrees with store.pull")
    results["raw Get (type per step)"] = timeit(raw_get, a.warmup, a.repeat)
    results["raw Get (prebuilt type)"] = timeit(lambda: raw_get(pre), a.warmup, a.repeat)
    results["store push"] = timeit(lambda: store.push("emb", ids, grads, scale=0.0),
                                   a.warmup, a.repeat)
    results["store push, the pull's plan"] = timeit(
        lambda: store.push("emb", ahead, grads, scale=0.0), a.warmup, a.repeat)
    ahead.free()
    if views is not None:
        store._views = views
        if not np.array_equal(store.pull("emb", ids), c.all_buf):
            raise SystemExit("same-node pull disagrees with the RMA pull")
        results["store pull, same-node shm path"] = timeit(lambda: store.pull("emb", ids),
                                                           a.warmup, a.repeat)
    results["raw Accumulate (type per step)"] = timeit(raw_acc, a.warmup, a.repeat)
    results["raw Accumulate (prebuilt)"] = timeit(lambda: raw_acc(pre), a.warmup, a.repeat)
    pre.Free()
    local = np.random.default_rng(1).standard_normal((a.rows, a.dim)).astype(np.float32)
    results["local gather (np.take)"] = timeit(lambda: np.take(local, c.uniq, axis=0),
                                               a.warmup, a.repeat)
    src = local[: c.uniq.size].copy()
    results["memcpy"] = timeit(lambda: np.copyto(c.ubuf, src), a.warmup, a.repeat)


def two_sided(a, topo, store, srank: int, c, results: dict) -> None:
    """Request/reply: Wire: ids (8 B/row) to the server, rows (4·dim B/row) back. The
    server answers until every worker said stop; a worker times its round trips."""
    if topo.is_server:
        shard = store.shard("emb")
        stopped, st = 0, MPI.Status()
        while stopped < topo.n_workers:
            req = topo.world.irecv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
            while True:
                done, msg = req.test(status=st)
                if done:
                    break
            if st.tag == TAG_STOP:
                stopped += 1
                continue
            topo.world.Send([np.take(shard, msg, axis=0), MPI.FLOAT], st.source, TAG_REP)
    else:
        def round_trip():
            topo.world.send(c.uniq, srank, TAG_REQ)
            topo.world.Recv([c.ubuf, MPI.FLOAT], srank, TAG_REP)
        results["two-sided request/reply"] = timeit(round_trip, a.warmup, a.repeat)
        topo.world.send(None, srank, TAG_STOP)


def report(a, topo, c, results: dict, init_s: float) -> None:
    """Rank 0: every operation's median and MB/s, then the store against its references."""
    mb = c.ubytes / 1e6  # MB/s counts unique rows moved, for every line
    print(f"store benchmark: table {a.rows} x {a.dim} float32 "
          f"({a.rows * a.dim * 4 / 1e6:.0f} MB), {a.batch} Zipf({a.zipf}) ids -> "
          f"{c.uniq.size} unique rows ({mb:.2f} MB) per step; 1 server, "
          f"{topo.n_workers} worker(s), {topo.size} ranks on {topo.n_nodes} node(s); "
          f"table init {init_s:.2f}s")
    print(f"{'operation':<36}{'median ms':>10}{'MB/s':>10}")
    for k, v in results.items():
        print(f"{k:<36}{v * 1e3:>10.3f}{mb / v:>10.0f}")
    g = results["raw Get (type per step)"] / results["store pull"]
    p = results["raw Accumulate (type per step)"] / results["store push"]
    print(f"pull / raw indexed Get of unique rows (per-step type) = {g:.2f}x   (target >= 0.80)")
    g2 = results["raw Get (type per step)"] / results["store pull, plan made ahead"]
    print(f"pull with the plan made ahead (training's critical path) / raw indexed Get "
          f"= {g2:.2f}x")
    n = results["raw Get, all B ids (no dedup)"] / results["store pull"]
    print(f"pull / raw indexed Get of all {a.batch} ids (no dedup) = {n:.2f}x")
    print(f"push / raw indexed Accumulate (per-step type) = {p:.2f}x")
    print(f"pull / two-sided request-reply = "
          f"{results['two-sided request/reply'] / results['store pull']:.2f}x")
    if "store pull, same-node shm path" in results:
        sh = results["store pull, same-node shm path"]
        print(f"same-node shm pull / RMA store pull = {results['store pull'] / sh:.2f}x faster; "
              f"/ raw indexed Get of unique rows = {results['raw Get (type per step)'] / sh:.2f}x")


def main(argv=None) -> int:
    """Build the store, time the RMA path, then two-sided, then rank 0 reports."""
    ap = parser()
    a = ap.parse_args(argv)
    if MPI.COMM_WORLD.size < 2:  # (was training's advice on --servers and --mode)
        ap.error("one server and one worker at least: launch 2 ranks (mpiexec -n 2)")
    topo = Topology.create(MPI.COMM_WORLD, 1)
    spec = TableSpec("emb", a.rows, a.dim, "float32")
    t0 = MPI.Wtime()
    store = EmbeddingStore(topo, [spec], seed=0)
    init_s = MPI.Wtime() - t0
    srank = topo.server_ranks[0]
    results: dict[str, float] = {}
    c = make_batch(a, topo, store)
    if not topo.is_server:
        time_rma(a, store, srank, c, results)
    # Wire: everyone waits here until the RMA phase is over (servers sleep politely).
    idle_barrier(topo.world)
    two_sided(a, topo, store, srank, c, results)
    store.close()
    if topo.rank == 0:
        report(a, topo, c, results, init_s)
    topo.free()
    return 0

if __name__ == "__main__":
    from pshybrid.launch import run

    sys.exit(run(main))  # an error on one rank ends the whole job, never a hang
