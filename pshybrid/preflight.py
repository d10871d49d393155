"""Checks before step 1 that need the data's schema but nothing allocated yet, with one
shared verdict (``transport.agree``), so a run is refused in seconds instead of failing
after its steps ran, or being killed for memory:

- ``--eval-data`` holds at least one row;
- ``--resume``: the checkpoint resolves, its meta.json is sound and matches this run
  (model, sizes, optimizers, data fields);
- ``--checkpoint-dir``: no checkpoints this run could lose track of
  (``checkpoint_files.check_run_dir``), and writable on every rank (each one writes there);
  then held by this job alone for the whole run (``lock_checkpoint_dir``);
- ``--metrics``: writable on the reporting rank (worker 0, the only one writing it), and
  not a file the run reads, a checkpoint's file or a non-regular file; an existing file
  only if it is a ``--metrics`` file of pshybrid (the run appends to it);
- ``--tensorboard``: tensorboardX importable, the directory writable (worker 0);
- memory: what this node's ranks need (``limits.check_sizes``) fits its available memory.

``preflight`` returns True when a resumed run has nothing to do (its checkpoint is already
at or past the last step): it printed one line saying so, and the caller returns.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from . import checkpoint_files, dirlock, limits, safeio, tboard
from .batches import BatchPlan, global_batch
from .data import SHUFFLE_BLOCK
from .errors import ConfigError, InputError, PshybridError
from .files import dataset_paths, open_dataset
from .preempt import launcher_grace
from .report import counted, metrics_problem
from .topology import SHARED_MEMORY, roles_per_node, shared_window
from .transport import agree, same_arguments


def total_steps(cfg, n_rows: int | None, n_workers: int) -> int:
    """The step training ends at: ``--steps``, or ``--epochs`` x steps per epoch."""
    per_epoch = BatchPlan(n_rows, global_batch(cfg, n_workers), cfg.shuffle,
                          cfg.seed).steps_per_epoch if cfg.epochs else None
    return cfg.steps if per_epoch is None else cfg.epochs * per_epoch


def run_inputs(cfg, score: bool = False) -> list[tuple[str, str]]:
    """``(option, path)`` of every file a run reads: the files of ``--data`` and
    ``--eval-data`` (comma lists, directories' ``*.h5``; ``score``: eval's DATA, both);
    the checkpoint's own files are guarded as a checkpoint directory
    (``safeio.checkpoint_holding``)."""
    named = []
    given = (("DATA", cfg.data),) if score else (("--data", cfg.data),
                                                 ("--eval-data", cfg.eval_data))
    for option, spec in given:
        if spec:
            try:
                named += [(option, p) for p in dataset_paths(spec)]
            except PshybridError:
                named.append((option, spec))
    return named


def check_outputs(cfg, writer: bool, score: bool = False) -> None:
    """This rank's outputs can be written: ``--checkpoint-dir`` (every rank writes there;
    created later if missing) and, on the ``writer`` (worker 0), ``--metrics`` (never an
    input, a file in a checkpoint directory or a non-regular file; an existing file only
    when it is a ``--metrics`` file of pshybrid, appended to; ``score``: of eval, whose
    DATA is the input). Raises ConfigError naming the option; nothing is created or
    changed."""
    if cfg.checkpoint_dir:
        problem = safeio.check_writable_dir(cfg.checkpoint_dir, checkpoint_files.DEEPEST)
        if problem:
            raise ConfigError(f"--checkpoint-dir: {problem}")
    ckdirs = [d for d in (cfg.checkpoint_dir, cfg.resume, cfg.init_from) if d]
    if cfg.metrics and writer:
        link = os.path.islink(cfg.metrics)  # (appended to with O_NOFOLLOW: it would fail late)
        problem = (f"--metrics {cfg.metrics} is a symbolic link: lines are appended to the "
                   "file itself, never through a link; give the file it names" if link else
                   safeio.check_output(cfg.metrics, "--metrics", run_inputs(cfg, score), ckdirs,
                                       existing=metrics_problem)
                   or safeio.check_writable_file(cfg.metrics))
        if problem:
            raise ConfigError(problem if problem.startswith("--metrics") else
                              f"--metrics: {problem}")
    if cfg.tensorboard and writer:
        tboard.check()
        ck = safeio.checkpoint_holding(os.path.join(cfg.tensorboard, "events"), ckdirs)
        problem = (f"{cfg.tensorboard} lies inside the checkpoint directory {ck}: write "
                   "outputs elsewhere" if ck else safeio.check_writable_dir(cfg.tensorboard))
        if problem:
            raise ConfigError(f"--tensorboard: {problem}")


def lock_checkpoint_dir(cfg, topo, out, held: list) -> None:
    """Hold ``--checkpoint-dir`` for this job (``dirlock.DirLock``, appended to ``held``, whose
    ``close`` releases it): the checkpoint writer (worker 0) takes it, every rank learns the
    verdict. A stale lock taken over is named in one line on ``out``; a launcher that kills
    the ranks too soon after a SIGTERM for a checkpoint, in a note on stderr."""
    err, notice = None, None
    if topo.rank == topo.worker_ranks[0]:
        grace = launcher_grace(os.environ)
        if grace:
            sys.stderr.write(f"pshybrid: note: {grace}\n")
        lock = dirlock.DirLock(cfg.checkpoint_dir)
        try:
            notice = lock.acquire()
            held.append(lock)
        except OSError as e:
            err = ConfigError(f"--checkpoint-dir: {e}" if isinstance(e, FileExistsError) else
                              f"--checkpoint-dir {cfg.checkpoint_dir}: cannot lock: "
                              f"{e.strerror or e}")
        if notice and out is not None:
            out.write(notice + "\n")
            out.flush()
    agree(topo.world, err)  # Wire: verdict allgather; nobody trains unless worker 0 holds it


def _check_resources(cfg, topo, schema, eval_rows: int, score: bool) -> None:
    """This rank's node: memory, /dev/shm for its shards; this rank: ``ulimit -v``; a
    checkpoint: the free disk under ``--checkpoint-dir`` (again at each write), its largest
    file: ``ulimit -f``."""
    workers, servers = roles_per_node(topo.node_of_rank, topo.worker_ranks,
                                      topo.server_ranks)[topo.node_of_rank[topo.rank]]
    node = f"node {topo.node_names[topo.node_of_rank[topo.rank]]}"  # (others print rank 0's)
    here = topo.node_of_rank[topo.rank]
    first_here = topo.node_of_rank[topo.worker_ranks[0]] == here  # (worker 0: every eval row)
    est = limits.check_sizes(cfg.stateless() if score else cfg, schema, topo.n_workers,
                             topo.n_servers, limits.available_memory(), workers, servers,
                             eval_rows, node, first_here)
    shared = limits.window_bytes(est) > 0 and shared_window(SHARED_MEMORY[cfg.shared_memory],
                                                           topo.n_nodes)  # (no windows: no)
    limits.check_shared_memory(est, servers, shared, node)
    limits.check_address_space(est, topo.is_worker, topo.rank in topo.server_ranks,
                               servers * limits.window_bytes(est),
                               topo.rank == topo.worker_ranks[0])
    if cfg.checkpoint_dir and not score:  # (one checkpoint at least: else none is ever kept)
        problem = safeio.room_problem(safeio.nearest_existing(cfg.checkpoint_dir),
                                      limits.checkpoint_bytes(cfg, schema),
                                      limits.largest_checkpoint_file(
                                          est, int(sum(schema.cardinalities)), topo.n_servers))
        if problem:
            raise ConfigError(f"--checkpoint-dir {cfg.checkpoint_dir}: its checkpoints "
                              f"cannot be written: {problem}")


_ELSEWHERE = "so the rows read next and the steps --epochs counts are not where it stopped"


def _resume_warnings(cfg, topo, meta, step_dir, start, n_rows, out) -> None:
    """Worker 0: what a resume reads other than where the checkpoint stopped."""
    was, G = meta.get("global_batch"), global_batch(cfg, topo.n_workers)
    if was not in (None, G):
        out.write(f"resume: warning: {step_dir} was trained with a global batch of {was:,}, "
                  f"this run's is {G:,} ({counted(topo.n_workers, 'worker')} x --batch-size "
                  f"{cfg.batch_size}): step {start} goes on at batch {start} of {G:,} rows, "
                  f"{_ELSEWHERE}; a global batch of {was:,} continues on the same rows\n")
    rows = meta.get("data_rows")  # (the order depends on the row count: with --shuffle, the
    #                                 blocks; else only an epoch's steps, n_rows // G)
    if rows not in (None, n_rows) and n_rows is not None and (
            cfg.shuffle or rows // G != n_rows // G):
        spe = max(1, n_rows // G)  # (steps an epoch: where step ``start`` enters the data)
        out.write(f"resume: warning: {step_dir} was trained on --data of {rows:,} rows, this "
                  f"run's has {n_rows:,}: step {start} goes on in the order of {n_rows:,} rows, "
                  f"at batch {start % spe:,} of epoch {start // spe:,} ({spe:,} steps an "
                  f"epoch), {_ELSEWHERE}; --data of {rows:,} rows continues on the same rows\n")
    older = was is None and "front_end" not in meta  # (a train run's, before global_batch)
    if older and cfg.shuffle and n_rows and n_rows % SHUFFLE_BLOCK:
        out.write(f"resume: warning: {step_dir} was written by an earlier pshybrid, whose "
                  f"shuffle kept the last, partial block of --data's {n_rows:,} rows last in "
                  "every epoch: the rest of this epoch reads the rows in this version's "
                  "order, so some of them twice and others not\n")
    out.flush()


def _check_run(cfg, schema, writer: bool, score: bool = False, until: int | None = None):
    """The resume point (``--resume``: readable, of this model), the checkpoint directory
    (one history) and the outputs (``check_outputs``) -> (step_dir, meta, start step).
    A resume already at ``until`` (the last step) writes no checkpoint: its directory is
    not checked (read-only, full or held by a job: ``nothing to do`` all the same)."""
    step_dir, meta, start = None, {}, 0
    if cfg.resume or cfg.init_from:
        step_dir = checkpoint_files.resolve(cfg.resume or cfg.init_from)
        meta = checkpoint_files.read_meta(step_dir)
        checkpoint_files.check_compatible(meta, cfg, schema, os.path.join(step_dir, "meta.json"))
        start = meta["step"] if cfg.resume else 0  # (--init-from: a new run, at step 0)
        if until is not None and start >= until:
            cfg = dataclasses.replace(cfg, checkpoint_dir=None)
    if cfg.checkpoint_dir:
        try:
            checkpoint_files.check_run_dir(cfg.checkpoint_dir, cfg.resume and step_dir, start)
        except InputError as e:
            if cfg.init_from and checkpoint_files.holds(cfg.checkpoint_dir, step_dir):
                raise InputError(f"--checkpoint-dir {cfg.checkpoint_dir} already holds "
                                 f"checkpoints: those of the run --init-from {cfg.init_from} "
                                 "starts from; a new run writes its own (step-1 on): choose "
                                 "another directory") from None
            if cfg.init_from:  # (its own run's, requeued by hand: --resume alone goes on)
                raise InputError(f"{e} (--resume in place of --init-from: a run started "
                                 "from a checkpoint goes on from its own)") from None
            if not cfg.resume or cfg.checkpoint_dir != meta.get("config", {}).get(
                    "checkpoint_dir"):
                raise
            raise InputError(f"{e} ({step_dir}/meta.json names it: a resume saves where "
                             "its checkpoint's run did; --checkpoint-dir none saves "
                             "nothing)") from None
    check_outputs(cfg, writer, score)
    return step_dir, meta, start


def before_probe(cfg, comm, schema, n_rows: int | None = None) -> int:
    """Collective: ``--mode auto``'s probe and trials take seconds to minutes, so what the
    check before step 1 would refuse of the resume point, the checkpoint directory, the
    outputs and ``--eval-data`` (it opens) is refused before them, with one verdict (rank 0
    is worker 0 in every placement). -> the step the run starts at (``--resume``'s).
    ``n_rows``: ``--data``'s, for ``--epochs``' steps (a resume past the most any choice
    makes, one worker's, writes no checkpoint: as ``preflight``'s)."""
    err, start = None, 0
    try:
        until = total_steps(cfg, n_rows, 1) if n_rows is not None or not cfg.epochs else None
        start = _check_run(cfg, schema, comm.rank == 0, until=until)[2]
        if cfg.eval_data:
            open_dataset(cfg.eval_data).close()
    except PshybridError as e:
        err = e
    agree(comm, err)  # Wire: allgather of each rank's verdict; everyone raises the same
    return start


def _same_data(topo, data, evdata) -> None:
    """Collective: every rank reads the same data (``train`` checked the options first): a
    path on node-local disks whose files differ between nodes made ranks count other steps
    and wait for good, or train on what they each read."""
    for option, d in (("--data", data), ("--eval-data", evdata)):
        path = getattr(d, "path", None)
        if d is not None:  # (a Python dataset= without a path: named by its class)
            same_arguments(topo.world, path or f"dataset {type(d).__name__}", "rank",
                           f"every rank reads the same {option} (files that differ between "
                           "nodes?)" if path else "every rank's dataset= is the same",
                           fields=d.schema, rows=getattr(d, "n_rows", None))


def preflight(cfg, topo, data, evdata=None, out=None, collect: bool = False,
              score: bool = False) -> bool:
    """Run the checks above on every rank (collective: one verdict); True when a resumed
    run has nothing left to do and ``collect`` is False (the Python API's ``collect=True``
    still loads the checkpoint and returns its parameters). ``score``: the memory of a
    scoring run, which keeps no optimizer state (``train.setup(score=True)``)."""
    err, start, step_dir, meta, idle = None, 0, None, {}, False
    steps = total_steps(cfg, getattr(data, "n_rows", None), topo.n_workers)
    _same_data(topo, data, evdata)
    try:
        if evdata is not None and getattr(evdata, "n_rows", 1) == 0:
            raise InputError(f"{evdata.path}: --eval-data holds no rows: nothing to evaluate")
        step_dir, meta, start = _check_run(cfg, data.schema, topo.rank == topo.worker_ranks[0],
                                           score, None if collect else steps)
        idle = bool(cfg.resume) and start >= steps and not collect  # (nothing written)
        _check_resources(dataclasses.replace(cfg, checkpoint_dir=None) if idle else cfg, topo,
                         data.schema, getattr(evdata, "n_rows", 0), score)
    except PshybridError as e:
        err = e
    agree(topo.world, err)  # Wire: allgather of each rank's verdict; everyone raises the same
    if cfg.resume and not (score or idle) and topo.rank == topo.worker_ranks[0] and out:
        _resume_warnings(cfg, topo, meta, step_dir, start, getattr(data, "n_rows", None), out)
    if idle:  # (every rank's: agree raised on all, or none)
        if topo.rank == topo.worker_ranks[0] and out is not None:
            until = (f"--epochs {cfg.epochs} ({steps} steps)" if cfg.epochs
                     else f"--steps {steps}")
            then = ("evaluating it on --eval-data" if evdata is not None
                    else "no step run, nothing written")
            out.write(f"nothing to do: {step_dir} is already at step {start} >= {until}; "
                      f"{then}\n")
            out.flush()
        return True
    return False
