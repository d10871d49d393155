"""The job ``pt.init`` starts: topology, the tables fused into one table on the servers (or
on every worker in ``allreduce`` mode), the mode, the step counter, and the servers' loop.

Every ``pt.Table`` is a block of rows of one fused table ``"sparse"`` (``schema.FusedTable``:
table k's row i is fused row ``offsets[k] + i``), as the native models' fields are; its
width is the widest table's ``dim`` (narrower tables use the first ``dim`` columns; the
rest are never read, and their gradients are zero, so they never change). Initialisation
follows the library's rule (``initializers``: seed, the name ``"sparse"``, the fused row,
the fused width).
"""

from __future__ import annotations

import atexit
import copy
import os
import sys
from collections import deque

import torch
from mpi4py import MPI

import pshybrid.torch.preempt as stops
from pshybrid import checkpoint, procenv
from pshybrid.checkpoint_files import check_run_dir, read_meta, resolve
from pshybrid.shard_files import read_shards
from pshybrid.errors import ConfigError, InputError, PshybridError
from pshybrid.layers import ParamSpace
from pshybrid.modes import build_mode
from pshybrid.modes.dense import AllreduceDense
from pshybrid.optim import SLOTS, Optimizer
from pshybrid.registry import DEDICATED, MODES, is_colocated, placement_name
from pshybrid.schema import FusedTable, Schema
from pshybrid.stall import Pulse, Watch
from pshybrid.threads import THREAD_VARS, rank_cores
from pshybrid.topology import Topology
from pshybrid.torch.census import FAILED, arrive, arrived, census, out_of_step
from pshybrid.torch.restore import (DTYPES, TorchRun, checkpoint_form, dense_arrays,
                                    read_groups, read_state, rewrite_meta, state_problem)
from pshybrid.torch.tables import Table, check_init, check_memory, resume_problem
from pshybrid.transport import abort, abort_on_error, agree, same_arguments


class TorchDense(AllreduceDense):
    """``AllreduceDense`` whose update is the torch optimizer's ``step``. ``build_mode`` makes
    it with the mode, on an empty ParamSpace (the model does not exist yet);
    ``DistributedOptimizer`` binds the model's (``use``)."""

    def __init__(self, ctx, opt: Optimizer, bucket_bytes: int):
        super().__init__(ctx, opt, bucket_bytes)
        self.owner = None

    def use(self, owner, params, bucket_bytes: int) -> None:
        """Reduce ``params`` (the model's) and step ``owner`` (the DistributedOptimizer)."""
        self.close()
        self.bind(params, bucket_bytes)
        self.owner = owner

    def start(self, step: int) -> None:
        if not self.owner.synced:  # (``synchronize`` started and completed it)
            super().start(step)

    def reduce_now(self, step: int) -> None:
        """``DistributedOptimizer.synchronize``: start and complete the Allreduce now."""
        super().start(step)
        self.wait()

    def apply(self, step: int) -> None:
        self.owner.apply_dense()

    def state_full(self):
        return dense_arrays(self.owner)


class Session:
    """What ``init`` built (one per process)."""

    def __init__(self, topo: Topology, tables: list[Table], mode_name: str, seed: int):
        self.topo, self.tables, self.seed = topo, {t.name: t for t in tables}, seed
        self.schema = Schema(0, tuple(t.rows for t in tables), (),
                             tuple(t.name for t in tables))
        width = max(t.dim for t in tables)
        self.layout = FusedTable(self.schema, width, 0, DTYPES[tables[0].dtype],
                                 init_scale=tables[0].init_scale)
        self.offsets = {t.name: int(o) for t, o in zip(tables, self.layout.offsets)}
        t0 = tables[0]
        self.sparse_opt = Optimizer(t0.optimizer, t0.lr, beta1=float(t0.betas[0]),
                                    beta2=float(t0.betas[1]), eps=float(t0.eps))
        # the model's ParamSpace is bound to TorchDense by DistributedOptimizer, once made
        self.mode = build_mode(mode_name, topo, self.layout, ParamSpace(), self.sparse_opt,
                               Optimizer("sgd", 0.0), seed, dense=TorchDense)
        self.mode_name = mode_name
        self.step = 0
        self.resume_dir: str | None = None
        self.resume_step: int | None = None
        self.resumed_state: dict = {}  # the checkpoint resumed from: its ``state=``,
        self.resumed_groups: list | None = None  # ... and its param groups' settings
        self.resumed_class: str | None = None  # ... and its torch optimizer's class
        self.roots: set = set()  # the directories this session has written checkpoints in
        self.entries: list = []  # this step's lookups: [ids (n,), Batch, grads or None,
        #   whether the Batch was planned from these ids] (``embedding._Lookup``)
        self.unreached: deque = deque()  # lookups whose graph was freed (``embedding``)
        self.optimizer = None  # the DistributedOptimizer, once made
        self.told_unloaded = False  # a resumed session's lookup before it was (``embedding``)
        self.arrivals = self.user_comm = None  # workers: ``census``'s, ``worker_comm``'s
        self.watch = None  # workers: the time limit on their collective calls (``stall``)
        self.pulse = None  # the servers' watch on the workers' processes (``stall``)
        self.stop = None  # the stop on a signal (``pshybrid.torch.preempt``)
        self.stopped: int | None = None  # the step every worker learned of it
        self.saved: tuple | None = None  # (step, directory, state) of the last checkpoint
        self.at_exit = False  # shutdown run by the interpreter's exit
        self.owns = True  # a stop may end the processes (``pt.init``: comm, exit_servers)
        self.closed = False

    def drop(self, gone) -> None:
        """The step's lookups ``gone(entry)`` names are dropped, their Batches released."""
        kept = []
        for entry in self.entries:
            if gone(entry):
                entry[1].release()
            else:
                kept.append(entry)
        self.entries = kept

    # -- the checkpoint's description of this job (meta.json; export reads it) -----------
    def run(self, dense_optimizer: str = "sgd", dense_lr: float = 0.0, groups: tuple = (),
            torch_optimizer: str = "", state: dict | None = None) -> TorchRun:
        opt = self.optimizer
        return TorchRun(self.mode_name, self.seed, self.topo.n_servers,
                        tuple(self.tables.values()), self.layout.table.dim,
                        self.sparse_opt.lr if opt is None else opt.sparse_lr,
                        dense_optimizer, dense_lr, groups=groups,
                        torch_optimizer=torch_optimizer, state=state,
                        placement=placement_name(self.topo.colocated))


_session: Session | None = None


def session() -> Session:
    if _session is None or _session.closed:
        raise ConfigError("pshybrid.torch: call pt.init(...) first (and not after pt.shutdown())")
    return _session


def _excepthook(comm, prev=None):
    """An uncaught exception on any rank ends the whole job (as the command line does): a
    ``PshybridError`` (a refusal, a bad input) as one line, anything else with its
    traceback."""
    def hook(kind, exc, tb):
        if issubclass(kind, PshybridError):
            where = f" (rank {comm.rank}/{comm.size})" if comm.size > 1 else ""
            sys.stderr.write(f"pshybrid: error{where}: {exc}\n")
            sys.stderr.flush()
        else:
            sys.__excepthook__(kind, exc, tb)
        if comm.size > 1:
            abort(comm, 2 if issubclass(kind, PshybridError) else 1)
    hook.pshybrid_prev = prev  # (what a later pt.init restores: a refused one's hook stays)
    return hook


def init(servers: int | None = None, tables=(), mode: str = "hybrid", seed: int = 0,
         resume: str | None = None, comm=None, exit_servers: bool = True,
         timeout: float | None = 600.0, placement: str = DEDICATED) -> bool:
    """Collective over ``comm`` (default: every rank). Server ranks serve here until the
    workers call ``shutdown`` and then exit the process with status 0 (``exit_servers``
    False: they return False instead, for a program that goes on; workers return True).
    ``servers``: in hybrid, None (one per node) or 1..ranks-1; in allreduce, None or 0.
    ``placement="colocated"`` (hybrid, without ``servers``): no server rank; every rank is
    a worker that holds a shard of the tables and applies its rows' updates.
    A worker inside one collective call (``opt.step()``, ``pt.checkpoint``, ...) for
    ``timeout`` seconds ends the job naming it (None: it waits for good)."""
    global _session
    comm = MPI.COMM_WORLD if comm is None else comm
    procenv.mark_start()  # (the checkpoints' record of where relative paths are from)
    # (a refused pt.init's hook, left for an uncaught refusal: the one before it)
    prev_hook = getattr(sys.excepthook, "pshybrid_prev", sys.excepthook)
    sys.excepthook = _excepthook(comm, prev_hook)
    with abort_on_error(comm):
        if _session is not None and not _session.closed:
            raise ConfigError("pt.init was already called in this process", collective=True)
        tables = list(tables)
        same_arguments(comm, "pt.init", "rank", mode=mode, servers=servers, tables=tables,
                       seed=seed, timeout=timeout, exit_servers=bool(exit_servers),
                       placement=placement)
        S = check_init(tables, mode, servers, placement, seed, timeout, comm.size)
        if not any(v in os.environ for v in THREAD_VARS):  # one pool of this rank's cores
            torch.set_num_threads(max(1, int(rank_cores())))
        topo = Topology.create(comm, S, need_servers=MODES[mode].needs_servers,
                               colocated=is_colocated(placement))
        check_memory(topo, tables)
        s = _session = Session(topo, tables, mode, seed)
        s.prev_hook = prev_hook
        try:
            _begin(s, comm, resume, timeout, exit_servers)
        except PshybridError:  # (on every rank alike, or in one process)
            _abandon(s)
            raise
        if topo.is_worker:
            atexit.register(_shutdown_at_exit)
            return True
        with s.pulse.watching():
            s.mode.serve(s.step, lambda step: _save(s, None, step), s.stop.poll)
        s.mode.finish()
        code = stops.status(s)
        s.pulse.close()
        topo.free()
        s.closed = True
    sys.excepthook = prev_hook
    # stopped by a signal: exits with the workers' status (a session not the whole job's:
    # returns, as with exit_servers=False, and the script ends the job)
    stops.leave(code, ends=exit_servers, returns=not s.owns)
    if exit_servers and code is None:
        sys.exit(0)
    return False


def _begin(s: Session, comm, resume, timeout, exit_servers) -> None:
    """``pt.init``'s session: its watches, its catcher of signals, the checkpoint resumed;
    the workers' communicators and the store's ready."""
    topo = s.topo
    s.pulse = Pulse(topo, timeout, "pt.init(timeout=...)")
    # a stop on a signal ends the processes only where they are all the job's and end
    s.owns = bool(exit_servers) and MPI.Comm.Compare(comm, MPI.COMM_WORLD) in (
        MPI.IDENT, MPI.CONGRUENT)
    stops.start(s)  # SIGTERM, SIGUSR1 from here on (a large table loads for a while)
    if resume is not None:
        s.step, step_dir = _load_sparse(s, resume)
        s.resume_step, s.resume_dir = s.step, step_dir if topo.is_worker else None
    if topo.is_worker:
        s.arrivals = topo.workers.Dup()  # (``census``'s own)
        s.user_comm = topo.workers.Dup()  # (``worker_comm``: the script's own)
        judge = (lambda name, step: out_of_step(s, name, step)) if (
            MPI.Query_thread() == MPI.THREAD_MULTIPLE) else None  # (it probes: its thread)
        s.watch = Watch(comm, f"rank {comm.rank}/{comm.size}, worker {topo.worker_index}",
                        timeout, pulse=s.pulse, judge=judge)
        s.mode.ready()


def _abandon(s: Session) -> None:
    """A ``pt.init`` refused after its session began: what it made is freed (collective,
    as it was made), so that the process (a notebook's, a test's) can call it again."""
    s.closed = True
    if s.watch is not None:
        s.watch.close()
    if s.mode.store is not None:
        s.mode.store.close()  # Wire: see EmbeddingStore.close (the window freed)
    if s.pulse is not None:
        s.pulse.free()
    for c in (s.arrivals, s.user_comm):
        if c is not None:
            c.Free()
    s.topo.free()
    # (pshybrid's excepthook stays, as for a refusal before the session: left uncaught, the
    #   refusal is one line and ends the job; caught, the process goes on)
    stops.leave(None, returns=True)  # (the signals' handlers back)


def _load_sparse(s: Session, path: str) -> tuple[int, str | None]:
    """Every rank: the checkpoint's step and directory (``resolve``d once, by rank 0: a
    ``latest`` or ``best`` another process rewrites meanwhile names one step for every
    rank); servers load their rows of the fused table."""
    err, step, step_dir = None, 0, None
    try:
        step_dir = resolve(path) if s.topo.world.rank == 0 else None
    except PshybridError as e:
        err = e
    # Wire: bcast of rank 0's step directory (None where it failed: its error is agreed below)
    step_dir = s.topo.world.bcast(step_dir, root=0)
    try:
        if step_dir is not None:
            step = _load_step(s, step_dir)
    except PshybridError as e:
        err = e
    agree(s.topo.world, err)  # Wire: verdict allgather; nobody pulls before all loaded
    return step, step_dir


def _load_step(s: Session, step_dir: str) -> int:
    """``_load_sparse`` of one step directory: its checks, state and rows; its step."""
    meta = read_meta(step_dir)
    where = f"{step_dir}/meta.json"
    if problem := resume_problem(meta, s.tables.values()):
        raise InputError(f"{where}: {problem}")
    cards = meta["schema"]["cardinalities"]
    if sum(cards) != s.layout.table.rows:  # (a native run's fields, or the same tables)
        raise InputError(f"{where}: schema cardinalities {cards} sum to {sum(cards)} fused "
                         f"rows, the tables have {s.layout.table.rows}")
    saved = meta["config"].get("sparse_optimizer")
    if saved != s.sparse_opt.kind:
        raise InputError(f"{where}: config sparse_optimizer is {saved!r}, the tables use "
                         f"{s.sparse_opt.kind!r}")
    # (a run started --init-from: Adam's count goes on from its state's steps)
    s.mode.sparse.set_rule(steps_before=meta.get("steps_before", 0))
    s.resumed_state, s.resumed_groups = read_state(meta, where), read_groups(meta, where)
    s.resumed_class = meta["config"].get("torch_optimizer")
    if s.topo.is_server or s.topo.n_servers == 0:
        read_shards(step_dir, meta, s.layout.table.dim, SLOTS[s.sparse_opt.kind],
                    s.mode.owns, s.mode.set_sparse_rows,
                    part=(s.topo.server_index, s.topo.n_servers) if s.topo.is_server
                    else None)
    return int(meta["step"])


def _save(s: Session, root: str | None, step: int, state: dict | None = None,
          form: tuple | None = None) -> str:
    """Collective over the world (servers join from their loop): checkpoint ``step``;
    ``form``: the workers' ``checkpoint_form`` (servers: None; worker 0 writes meta.json)."""
    topo = s.topo
    # Wire: worker 0 tells every rank the directory (servers learn it only here)
    root = topo.world.bcast(root, root=topo.worker_ranks[0])
    run = s.run(*form, state) if form is not None else s.run()
    opt = s.optimizer
    params = opt.params if opt is not None else s.mode.dense.params
    written = checkpoint.save(root, step, run, topo, s.mode, params, s.schema)
    s.saved = (step, root, copy.deepcopy(state))  # (the caller may change its dict later)
    return written


def checkpoint_to(root: str, state: dict | None = None) -> str:
    """Workers, collectively: write checkpoint ``step-N`` (N: steps done) under ``root``,
    worker 0's ``state`` (JSON) in its meta.json."""
    s = session()
    with abort_on_error(s.topo.world):
        if s.optimizer is None:
            raise ConfigError("pt.checkpoint: make the pt.DistributedOptimizer first (the "
                              "checkpoint holds the model's dense parameters)", collective=True)
        form = checkpoint_form(s.optimizer)  # refused here, before the servers are asked
        census(s, "pt.checkpoint", s.step)
        problem = None if s.topo.worker_index else "state must be a dict" if not isinstance(
            state, (dict, type(None))) else state_problem(state)  # (worker 0's is kept)
        # Wire: allgather of the verdicts: worker 0's refusal reaches every worker
        agree(s.topo.workers, ConfigError(f"pt.checkpoint: {problem}") if problem else None)
        if _check_root(s, str(root)):  # this session wrote this step there: nothing trained
            return _restate(s, os.path.join(str(root), f"step-{s.step}"), state, form)
        s.optimizer.sync_params()
        s.mode.request_checkpoint(s.step)
        return _save(s, str(root), s.step, state, form)


def _restate(s: Session, step_dir: str, state: dict | None, form: tuple) -> str:
    """Workers, collectively: a second ``pt.checkpoint`` of this session at one step (a
    periodic one, then the stop's) writes the rows and parameters no second time (nothing
    trained), but meta.json's description of the run anew where it changed (worker 0,
    atomically): the groups' settings (a scheduler stepped since), ``state`` (None: the
    first's kept)."""
    keep = copy.deepcopy(state) if state is not None else s.saved[2]
    err = None
    if s.topo.worker_index == 0:
        try:
            rewrite_meta(step_dir, s.run(*form, keep).meta())
        except (OSError, PshybridError) as e:
            err = InputError(f"pt.checkpoint: {step_dir}/meta.json: {e}")
    agree(s.topo.workers, err)  # Wire: worker 0's verdict reaches every worker
    s.saved = (*s.saved[:2], keep)
    return step_dir


def _check_root(s: Session, root: str) -> bool:
    """Workers, collectively: ``root`` may take checkpoint ``step-N`` now: as a run's
    ``--checkpoint-dir`` (``check_run_dir``: one history per directory) the first time this
    session writes there, and never a step it already holds, unless this session wrote it
    (a periodic checkpoint, then the stop's at the same step): True then."""
    err, real = None, os.path.realpath(root)
    again = s.saved is not None and s.saved[0] == s.step and \
        os.path.realpath(s.saved[1]) == real
    try:
        if real not in s.roots:
            check_run_dir(root, s.resume_dir, s.resume_step, "pt.checkpoint:",
                          "pt.init(resume=...) of")
        if not again and os.path.lexists(os.path.join(root, f"step-{s.step}")):
            raise InputError(f"pt.checkpoint: {root} already holds step-{s.step} (no step "
                             "since it was written)")
    except PshybridError as e:
        err = e
    agree(s.topo.workers, err)  # Wire: allgather of each worker's verdict; all raise alike
    s.roots.add(real)
    return again


SHUTDOWN_WAIT_S = 30.0  # shutdown during an exception: how long the other workers may take
def _all_here(s: Session) -> bool:
    """Shutdown during an exception: whether every worker calls it (all handled the same
    exception, a Ctrl-C: maybe a step apart) within ``SHUTDOWN_WAIT_S``, or half of
    ``pt.init``'s timeout if less (a worker waiting in a step for this one would end the job
    at the timeout, naming itself: this exception is what the job ends with)."""
    limit = s.watch.timeout
    try:
        return census(s, "pt.shutdown()", FAILED,
                      SHUTDOWN_WAIT_S if limit is None else min(SHUTDOWN_WAIT_S, limit / 2))
    except ConfigError:  # (another is in another call)
        return False


def shutdown() -> None:
    """Workers, collectively: stop the servers (they exit; colocated: every rank's shard
    is freed), free the store. Called while an exception propagates or is handled (a
    ``finally:``, an ``except:``), the other workers need not come: unless every one
    reaches ``shutdown`` within ``_all_here``'s wait, that exception ends the whole job, as
    an uncaught one does."""
    s = _session
    if s is None or s.closed:
        return
    kind, exc, tb = sys.exc_info()
    if exc is not None and not _all_here(s):
        _excepthook(s.topo.world)(kind, exc, tb)  # one line or the traceback; the abort
    with abort_on_error(s.topo.world), s.watch.inside("pt.shutdown()", s.step, ends=False):
        # (posted first, completed after the servers are told: a worker in another call
        #   learns at once from its own census; one in a step, from the servers)
        arrival = arrive(s, "pt.shutdown()", s.step) if exc is None else None
        s.closed = True
        for entry in s.entries:
            entry[1].release()
        s.entries = []
        if s.optimizer is not None:
            s.optimizer.close()
        s.mode.finish()
        arrived(s, arrival, ends=False)
        code = stops.status(s)
        s.pulse.close()
        s.arrivals.Free()
        s.user_comm.Free()
        s.topo.free()
    s.watch.close()
    sys.excepthook = s.prev_hook
    stops.leave(code, ends=s.at_exit, at_exit=s.at_exit, returns=not s.owns)  # stopped: exits


def _shutdown_at_exit() -> None:
    if _session is not None:
        _session.at_exit = True
    shutdown()


def stop_requested() -> bool:
    """Whether a rank caught SIGTERM or SIGUSR1 and every worker learned it at the same
    ``opt.step()`` (``pshybrid.torch.preempt``; on a returned server: the run stopped)."""
    if _session is None:
        raise ConfigError("pshybrid.torch: call pt.init(...) first")
    return _session.stopped is not None


def resumed_state() -> dict:
    """The ``state`` that ``pt.checkpoint`` stored in the checkpoint ``pt.init(resume=...)``
    loaded (``{}``: none, or a fresh run)."""
    return copy.deepcopy(session().resumed_state)


def steps_done() -> int:
    """``opt.step()`` calls so far (after ``pt.init(resume=...)``, counted from the
    checkpoint's step): ``pt.batches(..., start=pt.steps_done())`` continues a resumed run."""
    return session().step


def worker_index() -> int:
    return session().topo.worker_index


def num_workers() -> int:
    return session().topo.n_workers


def worker_comm() -> MPI.Comm:
    """The workers' own communicator for the script's collectives (a global AUC, a barrier),
    valid until ``pt.shutdown()``: ``MPI.COMM_WORLD`` holds any server ranks, which serve
    inside ``pt.init`` and never join a collective of the script's (colocated: the same
    ranks as the world, on a communicator of their own)."""
    return session().user_comm
