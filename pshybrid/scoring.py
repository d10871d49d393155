"""``pshybrid eval CKPT DATA`` and ``pshybrid predict CKPT DATA OUT.h5``: a checkpoint's model
on a dataset file, without training.

Both load the checkpoint as ``--resume`` does (``CKPT``: a checkpoint directory, whose
``latest`` is read, or one ``step-N`` directory; the same checks) into the model its
``meta.json`` describes, with every rank a worker that also holds a shard of the table
(``--placement colocated``: any number of ranks, 1 included), and score the rows as the
training-time evaluation does (``steplog.worker_logits``): batches of ``EVAL_BATCH`` rows
from row 0, worker w taking batches [C*w/W, C*(w+1)/W) of the C. ``eval`` gathers the
logits and labels to worker 0 in row order and reports exact AUC and logloss; ``predict``
writes one score per row (``/score``: sigmoid of the logit, ``/logit``; float64, in row
order) to an HDF5 file, atomically, worker 0 taking each worker's logits in turn (never
every row's at once), and refuses an existing file unless ``overwrite``.
"""

from __future__ import annotations

import gc
import io
import os
from dataclasses import replace

import numpy as np

from . import checkpoint_files, safeio
from .config import TrainConfig
from .errors import InputError, PshybridError
from .files import dataset_paths, open_dataset, taken_in, validate_unscanned
from .metrics import sigmoid
from .preflight import preflight
from .topology import Topology
from .train import TrainResult, score_only, setup, worker_logits
from .transport import abort_on_error, agree


_PREDICT_TAG = 71  # the workers' logits to worker 0 (``_write``)
_WRITE_ROWS = 1 << 16  # predict's rows written at a time
_OUT_ROW_BYTES = 16  # predict's file: a float64 score and logit a row


def _config(ckpt: str, data: str, metrics: str | None) -> TrainConfig:
    """The checkpoint's own config, set to load it and score ``data`` on every rank."""
    step_dir = checkpoint_files.resolve(ckpt)
    meta = checkpoint_files.read_meta(step_dir)
    saved = checkpoint_files.native_config(meta, os.path.join(step_dir, "meta.json"))
    return replace(saved, mode="hybrid", placement="colocated", servers=None, data=data,
                   eval_data=data, resume=step_dir, init_from=None, steps=int(meta["step"]),
                   epochs=None, batch_size=1, metrics=metrics, checkpoint_dir=None,
                   checkpoint_every=0, eval_every=0, keep_last=0, progress="none",
                   replicate_rows=0, device="cpu", prefetch=0)


def _open(path: str, topo, out: str | None, overwrite: bool, ckpt: str):
    """Open and validate ``path`` (each worker scans its share of the rows) and check that
    ``out`` may be written, with one shared verdict."""
    err, data = None, None
    try:
        data = open_dataset(path, labels=out is None)  # one file, a list or a directory
        if data.n_rows == 0:
            raise InputError(f"{path}: holds no rows: nothing to score")
        n, W, w = data.n_rows, topo.n_workers, topo.worker_index
        validate_unscanned(data, n * w // W, n * (w + 1) // W,  # (its run's files: skipped)
                           checkpoint_files.scanned_before(ckpt))
        if out is not None and topo.rank == 0:
            problem = (safeio.check_output(out, "", [("DATA", p) for p in dataset_paths(path)],
                                           [ckpt],
                                           safeio.replaceable("predict", overwrite))
                       or safeio.check_writable_file(out))
            if not problem and (part := taken_in(out, path)):
                problem = (f"lies in DATA's directory {part}, whose *.h5 files are the "
                           "dataset: it would be read as rows the next time; write it "
                           "elsewhere")
            need = _OUT_ROW_BYTES * n + 2**20  # (a full disk found after scoring every row)
            if not problem and (room := safeio.room_problem(
                    safeio.nearest_existing(os.path.dirname(os.path.abspath(out))), need, need)):
                problem = f"cannot be written: {room}"
            if problem:
                raise InputError(problem if problem.startswith(out) else f"{out}: {problem}")
    except PshybridError as e:
        err = e
    try:
        agree(topo.world, err)  # Wire: allgather of each rank's verdict; everyone raises the same
    except PshybridError:
        if data is not None:
            data.close()
        raise
    return data


def score(ckpt: str, data: str, comm, out: str | None = None, overwrite: bool = False,
          metrics: str | None = None, stdout=None) -> TrainResult:
    """Collective over ``comm``. ``out`` None: evaluate (worker 0's result has the record in
    ``evals``, printed on ``stdout``); else write the predictions to ``out``."""
    with abort_on_error(comm):
        err, cfg = None, None
        try:
            cfg = _config(ckpt, data, metrics)
        except PshybridError as e:
            err = e
        agree(comm, err)  # Wire: allgather of each rank's verdict; everyone raises the same
        topo = Topology.create(comm, None, need_servers=True, colocated=True)
        try:
            ds = _open(data, topo, out, overwrite, cfg.resume)
            try:
                preflight(cfg, topo, ds, ds, score=True)  # the checkpoint matches the data; memory
                job = setup(cfg, topo, ds, ds, stdout or io.StringIO(), score=True)
                if job.reporter:  # the training run's epoch length and schedule are unknown
                    job.reporter.lr_at = job.reporter.steps_per_epoch = None
                try:
                    return score_only(job, None if out is None else
                                      (lambda j: _write(j, out, cfg.resume)))
                finally:
                    if job.reporter:
                        job.reporter.close_file()
                        job.result.metrics_failed = job.reporter.failed
            finally:
                ds.close()
        finally:
            gc.unfreeze()  # setup froze the start-up objects
            topo.free()


def _write(job, out: str, step_dir: str) -> None:
    """Workers: worker 0 writes ``out`` atomically, taking the other workers' logits one
    worker at a time in row order: it holds its own rows' and one other worker's, never
    every row's."""
    z = worker_logits(job, job.start)[0]  # (its labels freed)
    workers = job.topo.workers
    counts = workers.allgather(z.size)  # Wire: allgather of each worker's row count
    err = None
    if job.topo.worker_index:
        workers.Send(z, 0, _PREDICT_TAG)  # Wire: its logits (8 B a row) to worker 0, in turn
    else:
        err = _write_parts(job, out, step_dir, z, counts)
    agree(workers, err)  # Wire: verdict allgather over the workers


def _write_parts(job, out: str, step_dir: str, z, counts: list[int]) -> PshybridError | None:
    """Worker 0: ``out`` from its logits ``z`` and each other worker's as they come (every
    one taken, even after a failed write, so no worker waits in its send)."""
    workers, taken = job.topo.workers, 1

    def take(w: int):
        part = np.empty(counts[w])
        workers.Recv(part, w, _PREDICT_TAG)  # Wire: worker w's logits; it waits for this
        return part

    try:
        with safeio.atomic_output(out) as tmp, safeio.h5_file(tmp, "w") as f:
            n, at = sum(counts), 0
            score, logit = (f.create_dataset(k, (n,), np.float64) for k in ("score", "logit"))
            for w, c in enumerate(counts):
                part, taken = (z if w == 0 else take(w)), w + 1
                for i in range(0, c, _WRITE_ROWS):  # (sigmoid's temporaries: a chunk's)
                    p = part[i:i + _WRITE_ROWS]
                    score[at + i:at + i + p.size], logit[at + i:at + i + p.size] = sigmoid(p), p
                at += c
            f.attrs["checkpoint"] = os.path.abspath(step_dir)
            f.attrs["step"] = job.start
            f.attrs["data"] = ",".join(map(os.path.abspath, job.data.path.split(",")))
            f.attrs[safeio.OUTPUT_ATTR] = "predict"
        job.result.summary = {"rows": n, "step": job.start}
        return None
    except (OSError, RuntimeError) as e:  # (h5py's close after a failed write: RuntimeError)
        for w in range(taken, len(counts)):
            take(w)
        return PshybridError(f"{out}: cannot write: {e}")
