"""Memory the options ask for, checked before anything is allocated. Pure (no MPI).

``estimate(cfg, schema, n_workers, n_servers)`` adds up the large arrays of one worker and
one server from the options and the data's schema alone (the model's parameters are
counted by registering its layers on a throwaway ``ParamSpace``: nothing is allocated):

- worker: the batches in flight (``--prefetch`` ahead + the current one: labels, dense
  features, ids, fused-table ids), the pulled embedding rows of a batch and their gradient,
  the activations (batch x the widths of every layer, forward values and gradients), the
  dense parameters with their gradient and dense optimizer state, with ``--eval-data``
  its rows' logits and labels (worker 0: every row's, and the exact AUC's sort), and in
  ``allreduce`` mode the whole fused table with its optimizer slots plus the exchanged rows
  of every worker;
- server: its shard of the fused table (``ceil(rows / servers)`` rows of width
  ``--embedding-dim`` + the per-id linear weight) with the sparse optimizer's slots, the
  rows and gradient sums every worker sends it in a step, and in ``ps`` mode its shard of
  the dense table.

``check_sizes`` compares what the ranks of one node need with the memory available there
(``available_memory``: ``MemAvailable``, capped by a cgroup limit) and raises one
``ConfigError`` (``collective``) naming the option to change. The estimate is a lower
bound (interpreter, libraries and temporaries are not counted), so a run it accepts near
the limit can still run out; one it refuses cannot fit.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from . import safeio
from .errors import ConfigError
from .data import EVAL_BATCH
from .metrics import AUC_BYTES_PER_ROW
from .optim import SLOTS, needs_weights
from .registry import DENSE_ROW, MODES


@dataclass(frozen=True)
class Part:
    """``nbytes`` of one kind of array of one rank, what sets it (``by``) and what to change."""

    what: str
    nbytes: int
    by: str
    advice: str


def gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _model_shapes(cfg, schema) -> tuple[int, list[tuple[int, ...]], int]:
    """(dense parameter count, shapes of the registered parameters, width of one fused-table
    row) of the model ``cfg`` asks for. DCN's cross layers are counted, not registered (an
    absurd ``--cross-layers`` must not loop here)."""
    from .layers import ParamSpace
    from .models import MODELS, build_model

    params = ParamSpace()
    model = MODELS.get(cfg.model)  # an unknown name: build_model's error
    build_model(cfg.model, schema, cfg.embedding_dim, cfg.mlp, params, cfg.dtype,
                0 if model and model.cross_layers else cfg.cross_layers,
                bottom_mlp=cfg.bottom_mlp)
    shapes = [params.shape(n) for n in params.names]
    P = params.size + model.counted_params(schema, cfg.embedding_dim, cfg.cross_layers)
    return P, shapes, cfg.embedding_dim + model.wide


def estimate(cfg, schema, n_workers: int, n_servers: int, eval_rows: int = 0) -> dict:
    """{"worker": [Part...], "server": [Part...], "first": [Part...]}: the large arrays of
    one rank of each role ("first": worker 0's beyond a worker's: the evaluation's)."""
    s = 8 if cfg.dtype == "float64" else 4
    B, F, Fd, D = cfg.batch_size, schema.n_sparse, schema.n_dense, cfg.embedding_dim
    W, S = max(n_workers, 1), n_servers
    rows = int(sum(schema.cardinalities))
    P, shapes, E = _model_shapes(cfg, schema)
    dense_slots = len(SLOTS[cfg.dense_optimizer])
    depth = cfg.prefetch if cfg.prefetch is not None else 2
    mlp = ",".join(map(str, cfg.mlp))
    cards = f"the dataset's cardinalities ({rows:,} ids in {F} fields)"
    net = f"--mlp {mlp} on an input of {Fd} + {F} x --embedding-dim {D}"
    cross = _model(cfg).cross_layers
    if cross:
        net += f", --cross-layers {cfg.cross_layers}"
    if _model(cfg).bottom_mlp:
        net += f", --bottom-mlp {','.join(map(str, cfg.bottom_mlp))}"

    widths = _activation_widths(cfg, schema, shapes)
    b_act = max(B, min(EVAL_BATCH, eval_rows)) if eval_rows else B
    batch_in = B * (4 + 4 * Fd + 16 * F + s * (Fd + 1))
    worker = [
        Part("batches in flight", batch_in * (depth + 1),
             f"--batch-size {B} x {depth + 1} (--prefetch {depth} ahead + 1)",
             "lower --batch-size" + (" or --prefetch" if depth > 2 else "")),
        Part("embedding rows of a batch", B * F * (2 * E * s + 24),
             f"--batch-size {B} x {F} fields x --embedding-dim {D}",
             "lower --batch-size or --embedding-dim"),
        Part("activations", b_act * widths * s * 2, f"--batch-size {B} x the layer widths ({net})",
             "lower --batch-size, --mlp or --embedding-dim"
             + (" or --cross-layers" if cross else "")),
        Part("dense parameters and optimizer state", P * s * (2 + dense_slots),
             f"{P:,} parameters: {net}", "lower --mlp or --embedding-dim"
             + (" or --cross-layers" if cross else "")),
    ]
    first = []  # worker 0's beyond a worker's
    if eval_rows:  # a worker's rows' logits and labels (8 B each); worker 0 takes every
        share = 16 * -(-eval_rows // W)  # row's and sorts them for the AUC (peak: 26 B a row)
        by, advice = f"{eval_rows:,} rows of --eval-data", "evaluate on a smaller file"
        worker.append(Part("evaluation logits and labels", share, by, advice))
        first.append(Part("evaluation: every row's logit, label and the AUC's sort (worker 0)",
                          eval_rows * (16 + AUC_BYTES_PER_ROW) - share, by, advice))
    if cfg.replicate_rows:
        hot = min(cfg.replicate_rows, int(sum(schema.cardinalities)))
        slots = len(SLOTS[cfg.sparse_optimizer])
        worker.append(Part("replicated hot rows", hot * E * s * (2 + slots),
                           f"--replicate-rows {cfg.replicate_rows} x --embedding-dim {D}",
                           "lower --replicate-rows"))
    if getattr(cfg, "cache_rows", 0):  # values, id, version, 4 sketch counters (int64)
        worker.append(Part("hot-row cache", cfg.cache_rows * (E * s + 48),
                           f"--cache-rows {cfg.cache_rows} x --embedding-dim {D}",
                           "lower --cache-rows"))
    server = _table_parts(cfg, schema, worker, W, S, E, s, P, cards, net)
    return {"worker": worker, "server": server, "first": first}


def model_size(cfg, schema) -> tuple[int, int]:
    """(dense parameter count, floats per fused-table row) of the model ``cfg`` asks for."""
    P, _, E = _model_shapes(cfg, schema)
    return P, E


def _activation_widths(cfg, schema, shapes) -> int:
    """Floats per batch row of every layer's input and output (forward values; the caller
    doubles for gradients)."""
    F, Fd, D = schema.n_sparse, schema.n_dense, cfg.embedding_dim
    widths = sum(sh[0] + sh[1] for sh in shapes if len(sh) == 2)
    d_in = Fd + F * D
    widths += d_in * 2
    return widths + _model(cfg).extra_widths(schema, D, cfg.cross_layers)


def _model(cfg):
    """The model class ``cfg`` asks for (its widths and parts, ``models.CTRModel``)."""
    from .models import MODELS

    return MODELS[cfg.model]


@dataclass(frozen=True)
class _Job:
    """What sizes the tables' parts: the options, W workers, S servers, E floats a row,
    s bytes a float, P dense parameters, and the words naming them."""

    cfg: object
    rows: int
    F: int
    W: int
    S: int
    E: int
    s: int
    P: int
    cards: str
    net: str


def _table_parts(cfg, schema, worker: list, W: int, S: int, E: int, s: int, P: int,
                 cards: str, net: str) -> list:
    """The tables' parts the mode's catalogue entry names (``ModeSpec.table_parts``): the
    servers' (returned) and the workers' (appended to ``worker``)."""
    j = _Job(cfg, int(sum(schema.cardinalities)), schema.n_sparse, W, S, E, s, P, cards, net)
    server = []
    for role, what in MODES[cfg.mode].table_parts(S):
        (worker if role == "worker" else server).append(TABLE_PARTS[what](j))
    return server


def _whole_table(j: _Job) -> Part:
    slots = len(SLOTS[j.cfg.sparse_optimizer])
    return Part("embedding table", j.rows * j.E * j.s * (1 + slots),
                f"{j.cards} x --embedding-dim {j.cfg.embedding_dim}, all of it on every worker "
                "in --mode allreduce", "lower --embedding-dim, or shard the table over "
                "servers (--mode hybrid --servers S)")


def _exchanged_rows(j: _Job) -> Part:
    B = j.cfg.batch_size
    return Part("exchanged gradient rows", j.W * B * j.F * (j.E * j.s + 8),
                f"--batch-size {B} x {j.W} workers", "lower --batch-size")


def _table_shard(j: _Job) -> Part:
    slots = len(SLOTS[j.cfg.sparse_optimizer])
    return Part("shard of the embedding table",
                math.ceil(j.rows / j.S) * j.E * j.s * (1 + slots),
                f"{j.cards} x --embedding-dim {j.cfg.embedding_dim} over --servers {j.S}",
                "use more --servers (on more nodes) or lower --embedding-dim")


def _step_rows(j: _Job) -> Part:
    """A server-side optimizer receives every worker's rows and gradient sums each step."""
    B = j.cfg.batch_size
    grads = j.E * j.s if needs_weights(j.cfg.sparse_optimizer, j.cfg.l2) else 0
    return Part("rows and gradients of a step", 2 * j.W * B * j.F * (8 + grads),
                f"--batch-size {B} x {j.W} workers", "lower --batch-size")


def _dense_shard(j: _Job) -> Part:
    dense_rows = math.ceil(j.P / DENSE_ROW)
    dense_slots = len(SLOTS[j.cfg.dense_optimizer])
    dslots = (1 + dense_slots) if needs_weights(j.cfg.dense_optimizer, j.cfg.l2) else 0
    return Part("shard of the dense table",
                math.ceil(dense_rows / j.S) * DENSE_ROW * j.s * (1 + dslots),
                f"{j.P:,} parameters ({j.net}) over --servers {j.S}",
                "lower --mlp or --embedding-dim, or use more --servers")


def _pulled_dense(j: _Job) -> Part:
    return Part("pulled dense table", math.ceil(j.P / DENSE_ROW) * DENSE_ROW * j.s,
                f"{j.P:,} parameters: {j.net}", "lower --mlp or --embedding-dim")


TABLE_PARTS = {"embedding table": _whole_table, "exchanged gradient rows": _exchanged_rows,
               "shard of the embedding table": _table_shard,
               "rows and gradients of a step": _step_rows,
               "shard of the dense table": _dense_shard, "pulled dense table": _pulled_dense}


def on_host(cfg, est: dict) -> dict:
    """``est`` without the parts a GPU worker keeps on its device (``--device cuda``: the
    dense parameters and the activations)."""
    if cfg.device != "cuda":
        return est
    gpu = ("activations", "dense parameters and optimizer state")
    return dict(est, worker=[p for p in est["worker"] if p.what not in gpu])


def per_rank(est: dict) -> dict:
    """{"worker": bytes, "server": bytes, "first": bytes}: the parts of one rank of each
    role, summed ("first": worker 0's beyond a worker's)."""
    return {role: sum(p.nbytes for p in est[role]) for role in ("worker", "server", "first")}


def memory_line(cfg, schema, topo, eval_rows: int) -> str:
    """The plan's line on the memory of one worker and one server (a colocated rank holds
    both), as ``check_sizes`` estimates it (``topo``: its roles' counts and placement)."""
    per = per_rank(on_host(cfg, estimate(cfg, schema, topo.n_workers, topo.n_servers,
                                         eval_rows)))
    w, s = gib(per["worker"]), gib(per["server"])
    each = (f"{gib(per['worker'] + per['server'])} per rank (a worker's {w} + a shard's {s})"
            if topo.colocated else f"{w} per worker" + f", {s} per server" * bool(topo.n_servers))
    if per["first"]:
        each += f"; worker 0 {gib(per['first'])} more (the evaluation)"
    return (f"  memory (the large arrays, as checked before step 1"
            f"{'; host only' if cfg.device == 'cuda' else ''}): {each}")


def check_sizes(cfg, schema, n_workers: int, n_servers: int, memory_bytes: int | None,
                workers_here: int | None = None, servers_here: int | None = None,
                eval_rows: int = 0, node: str = "this node", first_here: bool = True) -> dict:
    """Raise ``ConfigError`` (collective) if ``workers_here`` workers and ``servers_here``
    servers (default: the whole job, on one node: ``node`` names it; ``first_here``: worker
    0 among them) need more than ``memory_bytes``; the
    message names the largest part, the options that set it and what to change.
    ``memory_bytes`` None (unknown): nothing is refused. Returns the estimate."""
    est = estimate(cfg, schema, n_workers, n_servers, eval_rows)
    if memory_bytes is None:
        return est
    nw = n_workers if workers_here is None else workers_here
    ns = n_servers if servers_here is None else servers_here
    est = on_host(cfg, est)
    per = per_rank(est)
    need = nw * per["worker"] + ns * per["server"] + first_here * per["first"]
    if need <= memory_bytes:
        return est
    count = {"worker": nw, "server": ns, "first": int(first_here)}
    role, part = max(((r, p) for r in count for p in est[r] if count[r]),
                     key=lambda rp: count[rp[0]] * rp[1].nbytes)
    ranks = " and ".join(f"{n} {r}{'s' if n != 1 else ''}" for r, n in
                         (("worker", nw), ("server", ns)) if n)
    raise ConfigError(
        f"not enough memory: the {ranks} on {node} need{'s' if nw + ns == 1 else ''} at "
        f"least {gib(need)} but "
        f"{gib(memory_bytes)} is available; the largest part is the {part.what}, "
        f"{gib(part.nbytes)}{'' if role == 'first' else f' per {role}'}, set by {part.by}: "
        f"{part.advice}", collective=True)


WINDOW_PARTS = ("shard of the embedding table", "shard of the dense table")  # MPI windows
SHM = "/dev/shm"


def window_bytes(est: dict) -> int:
    """Bytes of one shard holder's MPI windows (``WINDOW_PARTS``)."""
    return sum(p.nbytes for p in est["server"] if p.what in WINDOW_PARTS)


SHM_WAYS_OUT = ("give the job more shared memory (a container: --shm-size), spread the table "
                "over more --servers on more nodes, or lower --embedding-dim")


def check_shared_memory(est: dict, servers_here: int, shared: bool,
                        node: str = "this node") -> None:
    """Raise ``ConfigError`` (collective) if the shards of this node's ``servers_here``
    shard holders, MPI windows that the MPI library maps from files in ``SHM``, do not fit
    its free space (a touch past it is a SIGBUS, with no message: Docker gives 64 MiB), or,
    where the window is shared among the node's ranks (``shared``: one file), the file size
    limit (``ulimit -f``)."""
    total, shm = servers_here * window_bytes(est), SHM
    if not total or not os.path.isdir(shm):
        return
    problem = safeio.room_problem(shm, total, total if shared else 0)
    if problem:
        raise ConfigError(
            f"{shm} on {node} cannot hold the {servers_here} shard"
            f"{'s' * (servers_here != 1)} its ranks hold ({gib(total)}; the MPI library maps "
            f"them from files there): {problem}; {SHM_WAYS_OUT}", collective=True)


def check_address_space(est: dict, worker: bool, server: bool, node_windows: int,
                        first: bool = False) -> None:
    """Raise ``ConfigError`` if this rank's large arrays (a worker's, a server's, both for a
    colocated rank; and the ``node_windows`` bytes of its node's shards, which the MPI
    library maps into every rank there, shared window or not) do not fit what ``ulimit -v``
    leaves this process (its limit less what it maps already; ``first``: worker 0, which
    holds the evaluation's rows); nothing where there is no such limit. A rank checks
    itself: the verdict is agreed by the caller."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    used = _vm_size()
    if limit == resource.RLIM_INFINITY or used is None:
        return
    per = per_rank(est)
    # (a colocated rank's own shard: counted once, below)
    need = per["worker"] * worker + per["server"] * server + per["first"] * first
    need += node_windows - server * window_bytes(est)
    if need > limit - used:
        raise ConfigError(
            f"not enough address space (ulimit -v {limit // 1024}): this "
            f"{'worker' if worker else 'server'} needs about {gib(need)} more, its limit leaves "
            f"{gib(max(0, limit - used))} (it maps {gib(used)} already); raise ulimit -v, "
            "lower --batch-size or --embedding-dim, or use more --servers on more nodes")


def _vm_size() -> int | None:
    """This process's mapped bytes (``VmSize``, what ``ulimit -v`` limits), None if unknown."""
    try:
        return int(safeio.proc_status("VmSize")) * 1024
    except (TypeError, ValueError):  # (none, or not a number)
        return None


def checkpoint_bytes(cfg, schema) -> int:
    """Bytes of one checkpoint, about: the table's rows with their slots and ids, the dense
    parameters with theirs (all shards together)."""
    s = 8 if cfg.dtype == "float64" else 4
    P, E = model_size(cfg, schema)
    return (int(sum(schema.cardinalities)) * (E * s * (1 + len(SLOTS[cfg.sparse_optimizer])) + 8)
            + P * s * (1 + len(SLOTS[cfg.dense_optimizer])))


def largest_checkpoint_file(est: dict, rows: int, n_servers: int) -> int:
    """Bytes of a checkpoint's largest file, about: a shard's rows, slots and ids (in
    allreduce mode the whole table's)."""
    table = [p.nbytes for p in est["server"] if p.what == WINDOW_PARTS[0]] or \
        [p.nbytes for p in est["worker"] if p.what == "embedding table"]
    return max(table, default=0) + 8 * -(-rows // max(n_servers, 1))


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_free() -> int | None:
    """Bytes left under this process's cgroup memory limit (v2, else v1), if there is one."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        lim, use = _read_int(limit), _read_int(usage)
        if lim is not None and use is not None and lim < 2**60:
            return max(lim - use, 0)
    return None


def available_memory() -> int | None:
    """Bytes this node can still give: MemAvailable (/proc/meminfo), else free pages
    (sysconf), capped by a cgroup memory limit; None if none is known."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            avail = None
    cg = _cgroup_free()
    if cg is not None:
        avail = cg if avail is None else min(avail, cg)
    return avail
