"""Sizes are checked before anything is allocated (``pshybrid/limits.py``): every option
that scales memory is named when the ranks of a node cannot fit, and sizes that fit pass."""

import time
from dataclasses import replace

import numpy as np
import pytest

from pshybrid.config import TrainConfig
from pshybrid.errors import ConfigError
from pshybrid.layers import ParamSpace
from pshybrid.limits import available_memory, check_sizes, estimate
from pshybrid.models import MODELS, build_model
from pshybrid.schema import Schema
from pshybrid.synthetic import SyntheticCTR

GiB = 2**30
SCHEMA = SyntheticCTR(seed=0).schema  # 13 dense, 26 sparse fields, 840k ids
BASE = TrainConfig()


def refused(cfg, schema=SCHEMA, W=3, S=1, mem=16 * GiB, **kw) -> str:
    with pytest.raises(ConfigError) as e:
        check_sizes(cfg, schema, W, S, mem, **kw)
    assert e.value.collective
    return str(e.value)


def test_default_command_fits_and_sizes_add_up():
    est = check_sizes(BASE, SCHEMA, 3, 1, 2 * GiB)
    rows = sum(SCHEMA.cardinalities)
    shard = next(p for p in est["server"] if p.what == "shard of the embedding table")
    assert shard.nbytes == rows * 17 * 4 * 2  # (D + linear) x float32 x (w, acc)
    worker = sum(p.nbytes for p in est["worker"])
    assert 1 * 2**20 < worker < 64 * 2**20


@pytest.mark.parametrize("mode", ["hybrid", "ps"])
def test_sgd_with_l2_counts_what_its_servers_receive_and_keep(mode):
    """SGD with ``--l2`` > 0 reads the weights, so it runs on the servers (``modes.sparse``,
    ``modes.dense``: ``Optimizer.needs_weights``), which receive every worker's rows and
    gradient sums each step, as Adagrad's do, and (ps) keep the dense gradients in a "g"
    slot; the check counted neither (it asked whether the optimizer was "sgd"). Oracles:
    the step's rows equal Adagrad's; the dense shard is twice plain SGD's (weights, g)."""
    def server(**kw):
        est = check_sizes(replace(BASE, mode=mode, **kw), SCHEMA, 3, 1, 64 * GiB)
        return {p.what: p.nbytes for p in est["server"]}

    sgd = dict(sparse_optimizer="sgd", dense_optimizer="sgd")
    plain, l2 = server(**sgd), server(**sgd, l2=1e-4)
    step, dense = "rows and gradients of a step", "shard of the dense table"
    assert l2[step] == server(sparse_optimizer="adagrad")[step] > plain[step]
    if mode == "ps":
        assert l2[dense] == 2 * plain[dense] > 0


@pytest.mark.parametrize("kw,needle", [
    (dict(batch_size=99_999_999_999), "--batch-size 99999999999"),
    (dict(embedding_dim=100_000_000), "--embedding-dim 100000000"),
    (dict(mlp=(100_000_000, 100_000_000)), "--mlp 100000000,100000000"),
    (dict(prefetch=10**12), "--prefetch"),
    (dict(cache_rows=10**12, consistency="ssp:2"), "--cache-rows 1000000000000"),
    (dict(model="dcn", cross_layers=10**12), "--cross-layers"),
    (dict(model="dlrm", batch_size=10**9), "--batch-size 1000000000"),
    (dict(mode="ps", mlp=(20_000, 20_000, 20_000)), "--mlp 20000,20000,20000"),
])
def test_each_size_option_is_named(kw, needle):
    t0 = time.time()
    msg = refused(replace(BASE, **kw))
    assert needle in msg and "not enough memory" in msg and "GiB is available" in msg, msg
    assert time.time() - t0 < 5  # counted, never looped over or allocated


def test_table_too_big_names_cardinalities_and_servers():
    big = Schema(2, (2**62, 10))
    msg = refused(BASE, big)
    assert "cardinalities" in msg and "--servers 1" in msg and "more --servers" in msg, msg
    msg = refused(replace(BASE, mode="allreduce", servers=0), big, W=2, S=0)
    assert "cardinalities" in msg and "--mode hybrid" in msg, msg


def test_more_servers_on_more_nodes_fit():
    """The table needs ~5 GiB per server at S=1; with 8 servers, one per node, each node
    holds 1/8 of it."""
    schema = Schema(0, (20_000_000,) * 4)
    cfg = replace(BASE, embedding_dim=16)
    msg = refused(cfg, schema, W=2, S=1, mem=4 * GiB)
    assert "shard of the embedding table" in msg and "per server" in msg
    check_sizes(cfg, schema, 8, 8, 4 * GiB, workers_here=1, servers_here=1)


def test_unknown_memory_refuses_nothing():
    check_sizes(replace(BASE, batch_size=10**12), SCHEMA, 1, 1, None)


def test_cuda_workers_keep_dense_and_activations_off_the_host():
    cfg = replace(BASE, mlp=(30_000, 30_000), device="cuda")
    refused(replace(cfg, device="cpu"), mem=8 * GiB)
    check_sizes(cfg, SCHEMA, 3, 1, 8 * GiB)


@pytest.mark.parametrize("model,layer", [("dcn", lambda d: 2 * d),          # w (d,), b (d,)
                                         ("dcnv2", lambda d: d * d + d)])  # W (d, d), b
def test_estimate_counts_dcn_cross_layers_without_registering_them(model, layer):
    e1 = estimate(replace(BASE, model=model, cross_layers=1), SCHEMA, 1, 1)
    e2 = estimate(replace(BASE, model=model, cross_layers=2), SCHEMA, 1, 1)
    dense = [next(p.nbytes for p in e["worker"] if p.what.startswith("dense")) for e in (e1, e2)]
    d = SCHEMA.n_dense + SCHEMA.n_sparse * 16
    assert dense[1] - dense[0] == layer(d) * 4 * (2 + 2)  # a layer's param, grad, m, v
    params = ParamSpace()  # the count == the registered layers' own
    build_model(model, SCHEMA, 16, BASE.mlp, params, "float32", 2)
    counted = MODELS[model].counted_params(SCHEMA, 16, 2)
    assert sum(int(np.prod(params.shape(n))) for n in params.names if n.startswith("cross.")) \
        == counted


def test_estimate_counts_dlrms_bottom_mlp():
    """--bottom-mlp 128,64 over the default 64: the layers Fd -> 128 -> 64 -> D instead of
    Fd -> 64 -> D (weights and biases; param, grad, Adam's m and v, float32)."""
    est = [estimate(replace(BASE, model="dlrm", bottom_mlp=b), SCHEMA, 1, 1)
           for b in ((64,), (128, 64))]
    dense = [next(p.nbytes for p in e["worker"] if p.what.startswith("dense")) for e in est]
    Fd, D = SCHEMA.n_dense, 16
    layers = lambda sizes: sum(a * b + b for a, b in zip(sizes, sizes[1:]))  # noqa: E731
    assert dense[1] - dense[0] == (layers([Fd, 128, 64, D]) - layers([Fd, 64, D])) * 4 * 4
    assert "--bottom-mlp 128,64" in est[1]["worker"][-1].by


def test_available_memory_is_known_here():
    mem = available_memory()
    assert mem is not None and mem > 2**20


def _statvfs_free(monkeypatch, free: int):
    import os

    real = os.statvfs

    class Small:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = 4096, free // 4096

    monkeypatch.setattr(os, "statvfs", lambda p: Small(real(p)))


def test_shards_beyond_the_shared_memory_are_refused_before_they_are_touched(monkeypatch,
                                                                           tmp_path):
    """The servers' windows are files in /dev/shm: 64 MiB (Docker's default) cannot hold a
    node's two 54 MiB shards, nor can a file size limit the one shared window (both were a
    SIGBUS at the first touch past it, no message); allreduce (no windows) passes."""
    import resource

    import pshybrid.limits as limits

    monkeypatch.setattr(limits, "SHM", str(tmp_path))
    est = check_sizes(BASE, SCHEMA, 2, 2, None)  # the default table over 2 servers
    shard = next(p.nbytes for p in est["server"] if p.what == "shard of the embedding table")
    assert 50 * 2**20 < shard < 60 * 2**20
    _statvfs_free(monkeypatch, 64 * 2**20)
    limits.check_shared_memory(est, 1, True)  # one shard fits
    with pytest.raises(ConfigError) as e:
        limits.check_shared_memory(est, 2, False)
    assert e.value.collective and str(e.value).startswith(
        f"{tmp_path} on this node cannot hold the 2 shards its ranks hold (109.0 MiB; the MPI "
        "library maps them from files there): about 109.0 MiB is needed, its disk has 64.0 MiB "
        "free (No space left on device); give the job more shared memory"), e.value
    _statvfs_free(monkeypatch, 2**40)
    monkeypatch.setattr(resource, "getrlimit", lambda r: (
        32 * 2**20 if r == resource.RLIMIT_FSIZE else resource.RLIM_INFINITY,) * 2)
    limits.check_shared_memory(est, 1, False)  # a window of its own: no one file
    with pytest.raises(ConfigError, match=r"exceeds the file size limit \(ulimit -f\) of 32.0 "):
        limits.check_shared_memory(est, 1, True)
    whole = check_sizes(replace(BASE, mode="allreduce"), SCHEMA, 2, 0, None)
    limits.check_shared_memory(whole, 2, True)
    rows = sum(SCHEMA.cardinalities)  # a checkpoint's largest file: a shard, with its ids
    table = next(p.nbytes for p in whole["worker"] if p.what == "embedding table")
    assert limits.largest_checkpoint_file(whole, rows, 0) == table + 8 * rows
    assert limits.largest_checkpoint_file(est, rows, 2) == shard + 8 * -(-rows // 2)


def test_a_run_is_refused_before_step_1_where_its_shards_or_checkpoints_cannot_fit(
        monkeypatch, tmp_path):
    """preflight: the shared-memory check on the node's shard holders (one colocated rank
    here), and a checkpoint's largest file against ``ulimit -f`` (it failed at the first
    checkpoint, the compute lost)."""
    import io
    import resource

    from mpi4py import MPI

    import pshybrid.limits as limits
    from pshybrid.train import train

    cfg = TrainConfig(placement="colocated", steps=2, embedding_dim=4, mlp=(8,),
                      progress="none")
    monkeypatch.setattr(limits, "SHM", str(tmp_path))
    _statvfs_free(monkeypatch, 2**20)
    import socket

    with pytest.raises(ConfigError, match=f"^{tmp_path} on node {socket.gethostname()} cannot "
                       "hold the 1 shard"):  # (its host: every rank prints the first's)
        train(cfg, MPI.COMM_SELF, out=io.StringIO())
    _statvfs_free(monkeypatch, 2**40)
    monkeypatch.setattr(resource, "getrlimit", lambda r: (
        2**20 if r == resource.RLIMIT_FSIZE else resource.RLIM_INFINITY,) * 2)
    monkeypatch.setattr(limits, "SHM", str(tmp_path / "none"))  # (no /dev/shm: not checked)
    ck = tmp_path / "ck"
    with pytest.raises(ConfigError, match=f"^--checkpoint-dir {ck}: its checkpoints cannot be "
                       r"written: a file of about .* exceeds the file size limit \(ulimit -f\)"):
        train(replace(cfg, checkpoint_dir=str(ck)), MPI.COMM_SELF, out=io.StringIO())
    assert not ck.exists()


def test_ulimit_v_is_checked_per_rank_with_the_node_window_it_maps(monkeypatch):
    """``ulimit -v`` caps a process's address space: a rank's own arrays and every shard of
    its node (the MPI library maps the node's windows into each rank, shared or not) must
    fit what the limit leaves (the check before step 1 ignored it: tracebacks at the
    allocation)."""
    import resource

    import pshybrid.limits as limits

    est = check_sizes(replace(BASE, embedding_dim=256), SCHEMA, 1, 1, None)
    per = limits.per_rank(est)
    shard = next(p.nbytes for p in est["server"] if p.what == "shard of the embedding table")
    used = 300 * 2**20
    monkeypatch.setattr(limits, "_vm_size", lambda: used)
    limit = [resource.RLIM_INFINITY]
    monkeypatch.setattr(resource, "getrlimit", lambda r: (
        limit[0] if r == resource.RLIMIT_AS else resource.RLIM_INFINITY,) * 2)
    limits.check_address_space(est, True, False, shard)  # no limit: nothing checked
    limit[0] = used + per["worker"] + shard + 2**20
    limits.check_address_space(est, True, False, shard)   # the worker, with the node's window
    limits.check_address_space(est, False, True, shard)   # the server: its own shard, once
    limit[0] -= 2 * 2**20
    with pytest.raises(ConfigError) as e:
        limits.check_address_space(est, True, False, shard)
    assert str(e.value).startswith(f"not enough address space (ulimit -v {limit[0] // 1024}): "
                                   f"this worker needs about {limits.gib(per['worker'] + shard)}"
                                   " more"), e.value
    limits.check_address_space(est, True, False, 0)  # no shard on its node: its own arrays


def test_an_allocation_that_fails_is_one_line_and_status_2(capsys):
    """(A MemoryError printed a traceback and exited 1.)"""
    from pshybrid.launch import run

    def main(argv):
        raise MemoryError("Unable to allocate 824. MiB for an array")

    assert run(main, []) == 2
    err = capsys.readouterr().err
    assert err.startswith("pshybrid: error: out of memory") and err.endswith(
        ": Unable to allocate 824. MiB for an array: lower --batch-size, --embedding-dim or "
        "--mlp, or spread the table over more --servers on more nodes\n"), err


def test_a_shard_a_server_cannot_allocate_is_out_of_memory_on_every_rank(monkeypatch):
    """Under ``ulimit -v`` a server's MemoryError reached every rank as NumPy's bare words
    ('Unable to allocate 8.00 MiB ...'), without 'out of memory' and what to change."""
    import resource
    from types import SimpleNamespace as NS

    from mpi4py import MPI

    from pshybrid.errors import PshybridError
    from pshybrid.store import EmbeddingStore

    def fail(name):
        raise MemoryError("Unable to allocate 8.00 MiB for an array")

    monkeypatch.setattr(resource, "getrlimit", lambda r: (450000 * 1024,) * 2 if
                        r == resource.RLIMIT_AS else (resource.RLIM_INFINITY,) * 2)
    store = NS(topo=NS(is_server=True, world=MPI.COMM_SELF), _mem=NS(size=0), tables=["t"],
               _init_shard=fail)
    with pytest.raises(PshybridError) as e:
        EmbeddingStore._init_shards(store)
    assert str(e.value) == ("out of memory (ulimit -v 450000): Unable to allocate 8.00 MiB for "
                            "an array: lower --batch-size, --embedding-dim or --mlp, or spread "
                            "the table over more --servers on more nodes")


def test_a_window_refused_under_an_address_space_limit_names_it_first(monkeypatch):
    """MPICH refuses a shared window past ``ulimit -v`` as 'unable to allocate shared
    memory': the line blamed /dev/shm alone (24 GB free)."""
    import resource

    from pshybrid import transport

    for limit, said in ((600000 * 1024, True), (resource.RLIM_INFINITY, False)):
        monkeypatch.setattr(resource, "getrlimit", lambda r, limit=limit: (limit, limit))
        line = transport.window_refused("this rank's window", True)
        assert ("; this process's address-space limit (ulimit -v 600000) may be what is "
                "short: raise it, or lower --batch-size, --embedding-dim or --mlp; if "
                "/dev/shm is short: " in line) == said, line


def test_shared_memory_on_over_several_nodes_is_refused_before_step_1():
    """(It was refused only when the store was built, after the plan and --mode auto's
    probe, without naming the ways out.)"""
    from types import SimpleNamespace as NS

    from pshybrid import preflight

    topo = NS(n_nodes=2, node_of_rank=[0, 1, 1], rank=0, worker_ranks=[0, 1], server_ranks=[2],
              n_workers=2, n_servers=1, is_worker=True, node_names=["a", "b"])
    cfg = replace(BASE, shared_memory="on")
    with pytest.raises(ConfigError, match=r"^--shared-memory on: shared-memory pulls need "
                       r"every rank on one node; this job spans 2 nodes: use --shared-memory "
                       r"auto .* or off$"):
        preflight._check_resources(cfg, topo, SCHEMA, 0, False)
    preflight._check_resources(replace(cfg, shared_memory="auto"), topo, SCHEMA, 0, False)
    preflight._check_resources(replace(cfg, mode="allreduce"), topo, SCHEMA, 0, False)


@pytest.mark.parametrize("library,shared,hint", [
    ("Open MPI v4.1.4, package: Debian", False, "set MPI4PY_RC_THREAD_LEVEL=serialized"),
    ("Open MPI v4.1.4, package: Debian", True, "; if /dev/shm is short: give the job more"),
    ("MPICH Version:      5.0.2", True, "if /dev/shm is short: give the job more shared"),
    ("MPICH Version:      5.0.2", False, "if memory is short: give the job more shared")])
def test_a_window_refused_for_another_reason_than_memory_names_its_way_out(
        monkeypatch, library, shared, hint):
    """Every refusal of the store's window was 'out of memory ... lower --batch-size', also
    Open MPI's over plain TCP (its osc pt2pt refuses windows under MPI_THREAD_MULTIPLE).
    Oracle: the error class decides: ERR_NO_MEM stays a MemoryError, any other is one
    line with the library's words and the hint for that library and window."""
    from types import SimpleNamespace as NS

    from mpi4py import MPI

    from pshybrid import transport
    from pshybrid.errors import PshybridError

    def refuse(cls):
        def allocate(*a, **k):
            raise MPI.Exception(cls)
        return allocate

    for cls, expect in ((MPI.ERR_NO_MEM, MemoryError), (MPI.ERR_WIN, PshybridError)):
        monkeypatch.setattr(transport, "MPI", NS(
            Win=NS(Allocate=refuse(cls), Allocate_shared=refuse(cls)), Exception=MPI.Exception,
            ERR_NO_MEM=MPI.ERR_NO_MEM, THREAD_MULTIPLE=MPI.THREAD_MULTIPLE,
            Query_thread=lambda: MPI.THREAD_MULTIPLE, Get_library_version=lambda: library))
        with pytest.raises(expect) as e:
            transport.allocate_window(3 << 20, None, shared)
        assert "this rank's 3.0 MiB window of the tables' shard (" in str(e.value), e.value
        assert (hint in str(e.value)) == (expect is PshybridError), e.value


def test_only_worker_0_is_charged_every_evaluation_row():
    """Worker 0 gathers every --eval-data row's logit and label and sorts them for the AUC
    (26 B a row); the other workers hold their own rows' (16 B a row over the W). The check
    charged 26 B a row to every worker: 8 workers evaluating 200M rows on a node of 20 GiB
    were refused ('need at least 39.4 GiB'), needing ~8. Oracles: the parts' bytes by the
    rule; that job fits; the node without worker 0 needs worker 0's extra less."""
    from pshybrid.limits import per_rank

    n, W = 200_000_000, 8
    est = check_sizes(BASE, SCHEMA, W, 1, 20 * GiB, eval_rows=n)  # (no refusal)
    ev = {r: sum(p.nbytes for p in parts if p.what.startswith("evaluation"))
          for r, parts in est.items()}
    assert ev == {"worker": 16 * -(-n // W), "server": 0, "first": 26 * n - 16 * -(-n // W)}
    per = per_rank(est)
    need = W * per["worker"] + per["server"]
    with pytest.raises(ConfigError, match="the largest part is the evaluation: every row's"):
        check_sizes(BASE, SCHEMA, W, 1, need + per["first"] - 1, eval_rows=n)
    check_sizes(BASE, SCHEMA, W, 1, need, eval_rows=n, first_here=False)
