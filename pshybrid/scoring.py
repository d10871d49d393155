"""``pshybrid eval CKPT DATA`` and ``pshybrid predict CKPT DATA OUT.h5``: a checkpoint's model
on a dataset file, without training.

Both load the checkpoint as ``--resume`` does (``CKPT``: a checkpoint directory, whose
``latest`` is read, or one ``step-N`` directory; the same checks) into the model its
``meta.json`` describes, with every rank a worker that also holds a shard of the table
(``--placement colocated``: any number of ranks, 1 included), and score the rows as the
training-time evaluation does (``steplog.score_rows``): batches of ``EVAL_BATCH`` rows from
row 0, worker w taking batches [C*w/W, C*(w+1)/W) of the C; the logits are gathered to
worker 0 in row order. ``eval`` reports exact AUC and logloss; ``predict``
writes one score per row (``/score``: sigmoid of the logit, ``/logit``; float64, in row
order) to an HDF5 file, atomically, and refuses an existing file unless ``overwrite``.
"""

from __future__ import annotations

import gc
import io
import os
from dataclasses import replace


from . import checkpoint_files, safeio
from .config import TrainConfig
from .errors import InputError, PshybridError
from .files import dataset_paths, open_dataset, taken_in
from .metrics import sigmoid
from .preflight import preflight
from .topology import Topology
from .train import TrainResult, score_only, score_rows, setup
from .transport import abort_on_error, agree


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
        data.validate(n * w // W, n * (w + 1) // W)
        if out is not None and topo.rank == 0:
            problem = (safeio.check_output(out, "", [("DATA", p) for p in dataset_paths(path)],
                                           [ckpt],
                                           safeio.replaceable("predict", overwrite))
                       or safeio.check_writable_file(out))
            if not problem and (part := taken_in(out, path)):
                problem = (f"lies in DATA's directory {part}, whose *.h5 files are the "
                           "dataset: it would be read as rows the next time; write it "
                           "elsewhere")
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
    """Workers: gather the logits to worker 0, which writes ``out`` atomically."""
    z, _ = score_rows(job, job.start)
    err = None
    if z is not None:
        try:
            with safeio.atomic_output(out) as tmp, safeio.h5_file(tmp, "w") as f:
                f["score"] = sigmoid(z)
                f["logit"] = z
                f.attrs["checkpoint"] = os.path.abspath(step_dir)
                f.attrs["step"] = job.start
                f.attrs["data"] = ",".join(map(os.path.abspath, job.data.path.split(",")))
                f.attrs[safeio.OUTPUT_ATTR] = "predict"
            job.result.summary = {"rows": int(z.size), "step": job.start}
        except OSError as e:
            err = PshybridError(f"{out}: cannot write: {e}")
    agree(job.topo.workers, err)  # Wire: verdict allgather over the workers
