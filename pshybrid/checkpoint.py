"""Checkpoints: one directory per step, written atomically; exact resume, resharding to
any server count (``docs/checkpoints.md``; the files and their checks: ``checkpoint_files``).

Writing (collective over the world): worker 0 makes a fresh private directory
``DIR/.step-N.<random>.tmp`` and sends its name to every rank; servers write their shard,
worker 0 ``dense.h5`` and ``meta.json``, each file created exclusively, flushed and
fsync'ed; after everyone is done worker 0 renames the directory to ``step-N`` (never over
anything) and only then replaces ``latest`` (a fresh temporary, fsync, rename). A job
killed at any moment leaves ``latest`` naming a complete checkpoint. Parameters are checked
finite first. The step's evaluation, run after it, replaces its ``meta.json`` as
``latest`` is replaced (``record_evaluation``). Pruning (``--keep-last``) only removes real
step directories older than the one just written, never the one ``latest`` names
(``safeio`` for the file rules).

Resume reads ``latest`` (or a given ``step-N``); each server takes the rows it owns under
the *current* partition from whichever shard files hold them, in chunks, so a checkpoint
of S servers loads with any S' >= 1 (and in any mode).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time

import numpy as np

from . import procenv, safeio
from .checkpoint_files import (FORMAT_VERSION, TEMP_RE, best, check_compatible, has_checksums,
                               list_steps, read_latest, read_meta, resolve, step_bytes)
from .checksums import CRC_ATTR, crc32
from .config import TrainConfig, to_dict
from .dense_file import read_dense
from .errors import InputError, PshybridError
from .optim import SLOTS
from .shard_files import CHUNK_ROWS, read_shards
from .transport import agree


# -- the directory: pruning, leftovers -----------------------------------------------------

def _prune(root: str, keep: int, written: int, kept: tuple | None) -> None:
    """Keep the newest ``keep`` checkpoints up to ``written`` (the one just written and
    named by ``latest``) and the best evaluated (``kept``: ``best``'s (name, AUC) of the
    directory): remove only real ``step-N`` directories with N < ``written``, never the
    one ``latest`` names, never newer ones, never through a link."""
    try:
        protected = {read_latest(root), f"step-{written}"}
    except InputError:
        return  # latest is not ours: remove nothing
    steps = list_steps(root)
    if kept is not None:
        protected.add(kept[0])
    older = sorted((n, p) for n, p in steps.items() if n < written)
    for n, p in older[:max(len(older) - (keep - 1), 0)]:
        if os.path.basename(p) not in protected:
            safeio.remove_tree(p)


def _remove_stale_temps(root: str) -> None:
    """Temporary step directories a killed job left behind (real directories only)."""
    for n in os.listdir(root):
        if TEMP_RE.fullmatch(n):
            safeio.remove_tree(os.path.join(root, n))


# -- writing -------------------------------------------------------------------------------

def _finite(a) -> bool:
    """Whether every value of ``a`` is finite, checked a chunk of rows at a time (a shard's
    whole-size bool array was a temporary the memory check does not count)."""
    return all(np.isfinite(a[i:i + CHUNK_ROWS]).all() for i in range(0, len(a), CHUNK_ROWS))


def _check_finite(step: int, sparse: dict, dense) -> PshybridError | None:
    bad = [k for k, a in sparse.items() if not _finite(a)]
    if dense is not None and not _finite(dense[0]):
        bad.append("dense parameters")
    return PshybridError(f"not finite at step {step}: {', '.join(bad)}; checkpoint not "
                         "written") if bad else None


def _described(cfg) -> dict:
    """meta.json's account of the run: a ``TrainConfig``'s resolved options (``config``) and
    the learning rates they resolve to (``rates``: ``--lr``, ``--dense-lr`` or their
    optimizers' defaults), or what a front end's run says of itself (``cfg.meta()``:
    ``pshybrid.torch``'s ``front_end`` and ``config``)."""
    if hasattr(cfg, "meta"):
        return cfg.meta()
    return {"config": to_dict(cfg), "rates": cfg.rates()}


def _write_ids(f, ids) -> None:
    """A shard's /ids (int64) and its checksum, a chunk at a time: a ``range`` (what the
    strategies give) is made a chunk at a time (an array of a shard's size was a temporary
    the memory check does not count)."""
    d, crc = f.create_dataset("ids", (len(ids),), np.int64), 0
    for i in range(0, len(ids), CHUNK_ROWS):
        part = ids[i:i + CHUNK_ROWS]
        a = (np.arange(part.start, part.stop, part.step, dtype=np.int64)
             if isinstance(part, range) else np.asarray(part, np.int64))
        d[i:i + a.size] = a
        crc = crc32(a, crc)
    d.attrs[CRC_ATTR] = crc


def _write_files(tmp: str, step: int, cfg, topo, params, schema, ids, sparse, dense,
                 data_rows: int | None = None, steps_before: int = 0,
                 evaluation: dict | None = None, scanned: list | None = None) -> None:
    """This rank's files of checkpoint ``step`` in ``tmp``: its shard (holders of sparse
    rows), dense.h5 and meta.json (worker 0, which has ``dense``; ``data_rows``: the rows of
    the run's ``--data``, whose order depends on them; ``steps_before``: the optimizers'
    steps before this run's first, ``Optimizer.steps_before``). Each exclusive, fsync'ed."""
    if ids is not None:
        shard = os.path.join(tmp, f"shard-{max(topo.server_index, 0):05d}.h5")
        with safeio.h5_file(shard, "x") as f:  # exclusive: never over anything
            _write_ids(f, ids)
            for k, a in sparse.items():
                f[k] = a
                f[k].attrs[CRC_ATTR] = crc32(a)
        safeio.fsync_file(shard)
    if dense is None:
        return
    flat, state, more, steps = dense
    dpath = os.path.join(tmp, "dense.h5")
    with safeio.h5_file(dpath, "x") as f:
        for k, a in (("flat", flat), *((f"state/{k}", a) for k, a in state.items()),
                     *more.items()):
            f[k] = a
            f[k].attrs[CRC_ATTR] = crc32(a)
        f.attrs["params"] = json.dumps([(n, params.offset(n), list(params.shape(n)))
                                        for n in params.names])
        if steps:  # (pshybrid.torch's Adam: each parameter's own step count)
            f.attrs["param_steps"] = json.dumps(steps)
    safeio.fsync_file(dpath)
    meta = {"format_version": FORMAT_VERSION, "step": step, "mode": cfg.mode,
            "servers": topo.n_servers, "seed": cfg.seed, **_described(cfg),
            "schema": schema.to_dict(), "checksums": CRC_ATTR,
            "shards": [f"shard-{s:05d}.h5" for s in range(max(topo.n_servers, 1))],
            "cwd": procenv.work_dir()}  # (where relative paths in "config" are from)
    if getattr(cfg, "batch_size", None):  # (a train run's: the rows a step reads, all workers)
        meta["global_batch"] = topo.n_workers * cfg.batch_size
    if data_rows is not None:
        meta["data_rows"] = int(data_rows)
    if steps_before:  # (a run started --init-from: Adam's count goes on from there)
        meta["steps_before"] = int(steps_before)
    if evaluation is not None:
        meta["eval"] = _eval_fields(evaluation)
    if scanned:
        meta["scanned"] = [list(map(int, k)) for k in scanned]
    with open(os.path.join(tmp, "meta.json"), "x") as f:
        f.write(json.dumps(meta, indent=1))
        f.flush()
        os.fsync(f.fileno())


def _make_temp(root: str, step: int, topo, writer_rank: int) -> str:
    """Worker 0 makes the fresh temporary directory; every rank gets its name."""
    err, tmp = None, None
    if topo.rank == writer_rank:
        try:
            os.makedirs(root, exist_ok=True)
            tmp = safeio.make_temp_dir(root, f".step-{step}.")
        except OSError as e:
            err = PshybridError(f"checkpoint directory {root}: {e}")
    agree(topo.world, err)  # Wire: verdict allgather; nobody writes before the directory exists
    return topo.world.bcast(tmp, root=writer_rank)  # Wire: its fresh name, from worker 0


def _failed(root: str, step: int, why: str) -> PshybridError:
    """The one line of a checkpoint that could not be written."""
    try:
        kept = read_latest(root)
    except InputError:
        kept = None
    return PshybridError(f"checkpoint step-{step} not written in {root}: {why}; "
                         + (f"{root}/latest still names {kept}" if kept else
                            "no earlier checkpoint there"))


def _room(tmp: str, root: str, step: int, topo, ids, sparse, dense) -> PshybridError | None:
    """Whether the disk of ``tmp`` has room for every rank's files of this checkpoint (and
    no file exceeds ``ulimit -f``), found before HDF5 writes anything."""
    files = [] if ids is None else [8 * len(ids) + sum(a.nbytes for a in sparse.values())]
    if dense is not None:
        files.append(dense[0].nbytes * (1 + len(dense[1]))  # (+ 1 KiB of HDF5 a dataset)
                     + sum(a.nbytes + 1024 for a in dense[2].values()))
    mine = sum(files) + (1 << 16) * len(files)  # + HDF5 metadata, meta.json (writers only)
    total = topo.world.allreduce(mine)  # Wire: allreduce of one int (bytes); all ranks wait
    problem = safeio.room_problem(tmp, total, max(files, default=0) + (1 << 16))
    return _failed(root, step, problem) if problem else None


def save(root: str, step: int, cfg: TrainConfig, topo, mode, params, schema,
         data_rows: int | None = None, evaluation: dict | None = None,
         scanned: list | None = None) -> str:
    """Write checkpoint ``step`` under ``root`` (collective over ``topo.world``); ``cfg``:
    the run's ``TrainConfig``, or a front end's run (``mode``, ``seed``, ``keep_last`` and
    ``meta()``: ``pshybrid.torch.restore.TorchRun``); ``data_rows``: the rows of a finite
    ``--data`` (a resume on another count reads other rows, ``preflight``); ``evaluation``:
    worker 0's of this step (its ``auc`` and ``logloss`` go into meta.json); ``scanned``:
    the ``scan_keys`` of the data files its run scanned (a resume skips them unchanged). A write
    that fails (a full disk) removes the temporary directory and raises one
    ``PshybridError`` on every rank; ``latest`` keeps naming the previous checkpoint."""
    writer_rank = topo.worker_ranks[0]
    writer = topo.rank == writer_rank
    final = os.path.join(root, f"step-{step}")
    tmp = _make_temp(root, step, topo, writer_rank)
    holds_sparse = topo.is_server or (writer and topo.n_servers == 0)
    ids, sparse = mode.sparse_state() if holds_sparse else (None, {})
    # (flat, {slot: state}, {dense.h5 path: array}, {name: steps}): only pshybrid.torch's
    # model has more arrays (its buffers, its torch optimizer's other state) and
    # per-parameter step counts
    dense = (*mode.dense_state_full(), {}, {})[:4] if writer else None
    try:
        agree(topo.world, _check_finite(step, sparse, dense))  # Wire: verdict allgather
        # Wire: verdict allgather; no rank starts an HDF5 write the disk has no room for
        agree(topo.world, _room(tmp, root, step, topo, ids, sparse, dense))
        err = None
        try:
            _write_files(tmp, step, cfg, topo, params, schema, ids, sparse, dense, data_rows,
                         mode.sparse.opt.steps_before, evaluation, scanned)
        except (OSError, RuntimeError) as e:  # RuntimeError: h5py's, on a full disk
            err = _failed(root, step, str(getattr(e, "strerror", None) or e))
        agree(topo.world, err)  # Wire: every file is on disk before the rename
        err = None
        if writer:
            try:
                safeio.publish_dir(tmp, final)
                safeio.fsync_dir(root)
                safeio.atomic_write_text(os.path.join(root, "latest"), f"step-{step}\n")
            except OSError as e:
                err = _failed(root, step, f"publishing {final}: {e.strerror or e}")
        agree(topo.world, err)  # Wire: verdict allgather; every rank learns a failed rename
    except PshybridError:
        if writer:
            safeio.remove_tree(tmp)  # no partial step directory is left behind
        raise
    if writer:
        _tidy(root, step, cfg.keep_last, evaluation is not None)
        _remove_stale_temps(root)
    return final


def _tidy(root: str, step: int, keep_last: int, evaluated: bool) -> None:
    """Worker 0, after checkpoint ``step`` was written (``evaluated``: or its evaluation
    recorded): ``best`` pointed again, ``--keep-last`` pruning, which keeps the best (every
    step's meta.json read once, for both)."""
    kept = best(list_steps(root)) if evaluated or keep_last else None
    if evaluated:
        _point_best(root, kept)
    if keep_last:
        _prune(root, keep_last, step, kept)


def _eval_fields(evaluation: dict) -> dict:
    """meta.json's ``eval``: the evaluation's AUC and logloss (NaN, an AUC of one class:
    null)."""
    return {k: float(evaluation[k]) if math.isfinite(evaluation[k]) else None
            for k in ("auc", "logloss")}


def record_evaluation(root: str, step: int, evaluation: dict, keep_last: int) -> None:
    """Worker 0, after checkpoint ``step`` was written and then evaluated (the checkpoint
    first: a failed evaluation keeps the steps): its meta.json gets the evaluation, written
    as ``latest`` is, ``best`` is pointed again and ``keep_last`` prunes again (the best
    it kept may be best no more); a failure is a warning."""
    step_dir = os.path.join(root, f"step-{step}")
    try:
        meta = read_meta(step_dir)
        meta["eval"] = _eval_fields(evaluation)
        safeio.atomic_write_text(os.path.join(step_dir, "meta.json"), json.dumps(meta, indent=1))
    except (OSError, PshybridError) as e:
        sys.stderr.write(f"pshybrid: warning: {step_dir}/meta.json: its evaluation not "
                         f"recorded ({getattr(e, 'strerror', None) or e})\n")
        return
    _tidy(root, step, keep_last, True)


def _point_best(root: str, kept: tuple | None) -> None:
    """``root/best`` names the evaluated checkpoint of the highest AUC (``kept``: ``best``'s
    (name, AUC), the one pruning keeps), written as ``latest`` is; one that cannot be is
    removed (never naming another), with a warning."""
    path = os.path.join(root, "best")
    try:
        now = read_latest(root, "best")
    except InputError:  # (a link or another's text there: replaced, never followed)
        now = None
    if kept is None or now == kept[0]:
        return
    try:
        safeio.atomic_write_text(path, f"{kept[0]}\n")
    except OSError as e:
        why = getattr(e, "strerror", None) or e
        sys.stderr.write(f"pshybrid: warning: {path} not updated ({why}): the best "
                         "evaluated checkpoint is named in the run's last line\n")
        with contextlib.suppress(OSError):
            os.unlink(path)  # (a link planted there: the link itself)


# -- loading -------------------------------------------------------------------------------

def load(path: str | None, cfg: TrainConfig, topo, mode, params, schema,
         weights_only: bool = False) -> tuple[int, tuple[int, float] | None]:
    """Load a checkpoint into a freshly built ``mode`` (collective) -> (its step, (its
    files' bytes, the seconds the load took)); (0, None) for no ``path``. With
    ``weights_only`` (scoring: a mode built without optimizer state) the optimizer state is
    checked but not loaded."""
    if not path:
        return 0, None
    err, step, size, t0 = None, 0, 0, time.perf_counter()
    try:
        step_dir = resolve(path)
        meta, size = read_meta(step_dir), step_bytes(step_dir)
        check_compatible(meta, cfg, schema, os.path.join(step_dir, "meta.json"))
        step = int(meta["step"])
        first = topo.rank == topo.worker_ranks[0]
        sums = has_checksums(step_dir, meta, warn=first)
        holders = topo.server_ranks if topo.n_servers else topo.worker_ranks
        if topo.rank in holders:  # holders of sparse rows under this run
            me, n = holders.index(topo.rank), len(holders)  # each checks 1/n of the shards
            read_shards(step_dir, meta, mode.layout.table.dim, SLOTS[cfg.sparse_optimizer],
                        mode.owns, mode.set_sparse_rows, weights_only, lambda i: i % n == me,
                        part=(me, n) if topo.n_servers else None)
        flat, state, _ = read_dense(step_dir, SLOTS[cfg.dense_optimizer], params.size,
                                    checksums=sums and first)
        mode.set_dense_state(flat, {} if weights_only else state)
    except PshybridError as e:
        err = e
    agree(topo.world, err)  # Wire: verdict allgather; nobody pulls before every rank loaded
    return step, (size, time.perf_counter() - t0)
