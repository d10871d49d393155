"""Checkpoints (DESIGN §8): one directory per step, written atomically; exact resume,
resharding to any server count, and a one-file export.

Layout of ``DIR`` (``--checkpoint-dir``)::

    DIR/latest                 text: the name of the newest complete step directory
    DIR/step-N/meta.json       format_version, step, mode, servers, seed, the resolved
                               config, the dataset schema, shard file names
    DIR/step-N/dense.h5        /flat (P,) dense parameters; /state/<slot> (P,) dense
                               optimizer state; attrs params (JSON: name, offset, shape)
    DIR/step-N/shard-SSSSS.h5  per server s (one file in allreduce mode): /ids (n,) the
                               global rows of the fused table it holds; /w (n, E) their
                               weights; /<slot> (n, E) sparse optimizer state

Writing (collective over the world): worker 0 makes ``DIR/.step-N.tmp``; servers write
their shard, worker 0 ``dense.h5`` and ``meta.json``, each file flushed and fsync'ed;
after everyone is done worker 0 renames the directory to ``step-N`` and only then
replaces ``latest`` (write ``latest.tmp``, fsync, rename). A job killed at any moment
leaves ``latest`` naming a complete checkpoint. Parameters are checked finite first.
Resume reads ``latest`` (or a given ``step-N``); each server takes the rows it owns under
the *current* partition from whichever shard files hold them, in chunks, so a
checkpoint of S servers loads with any S' >= 1 (and in any mode).
"""

from __future__ import annotations

import json
import os
import shutil

import h5py
import numpy as np

from .config import TrainConfig, from_dict, to_dict
from .errors import InputError, PshybridError
from .schema import field_offsets
from .transport import agree

FORMAT_VERSION = 1
MATCH_KEYS = ("model", "embedding_dim", "mlp", "cross_layers", "dtype", "sparse_optimizer",
              "dense_optimizer")
_CHUNK = 1 << 18


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text(path: str, text: str) -> None:
    """Atomically replace ``path`` with ``text``."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(root: str, step: int, cfg: TrainConfig, topo, mode, ps, schema) -> str:
    """Write checkpoint ``step`` under ``root`` (collective over ``topo.world``)."""
    writer = topo.rank == topo.worker_ranks[0]
    tmp, final = os.path.join(root, f".step-{step}.tmp"), os.path.join(root, f"step-{step}")
    err = None
    if writer:
        try:
            os.makedirs(root, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            os.mkdir(tmp)
        except OSError as e:
            err = PshybridError(f"checkpoint directory {root}: {e}")
    agree(topo.world, err)  # Wire: verdict allgather; nobody writes before the directory exists

    holds_sparse = topo.is_server or (writer and topo.n_servers == 0)
    ids, sparse = mode.sparse_state() if holds_sparse else (None, {})
    dense = mode.dense_state_full() if not topo.is_server else None
    bad = [k for k, a in sparse.items() if not np.isfinite(a).all()]
    if dense is not None and not np.isfinite(dense[0]).all():
        bad.append("dense parameters")
    agree(topo.world, PshybridError(f"not finite at step {step}: {', '.join(bad)}; checkpoint "
                                    "not written") if bad else None)  # Wire: verdict allgather

    err = None
    try:
        if holds_sparse:
            shard = os.path.join(tmp, f"shard-{max(topo.server_index, 0):05d}.h5")
            with h5py.File(shard, "w") as f:
                f["ids"] = ids
                for k, a in sparse.items():
                    f[k] = a
            _fsync_file(shard)
        if writer:
            flat, state = dense
            with h5py.File(os.path.join(tmp, "dense.h5"), "w") as f:
                f["flat"] = flat
                for k, a in state.items():
                    f[f"state/{k}"] = a
                f.attrs["params"] = json.dumps([(n, ps.offset(n), list(ps.shape(n)))
                                                for n in ps.names])
            _fsync_file(os.path.join(tmp, "dense.h5"))
            meta = {"format_version": FORMAT_VERSION, "step": step, "mode": cfg.mode,
                    "servers": topo.n_servers, "seed": cfg.seed, "config": to_dict(cfg),
                    "schema": schema.to_dict(),
                    "shards": [f"shard-{s:05d}.h5" for s in range(max(topo.n_servers, 1))]}
            _write_text(os.path.join(tmp, "meta.json"), json.dumps(meta, indent=1))
    except OSError as e:
        err = PshybridError(f"writing checkpoint {tmp}: {e}")
    agree(topo.world, err)  # Wire: every file is on disk before the rename
    if writer:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_file(root)
        _write_text(os.path.join(root, "latest"), f"step-{step}\n")
        if cfg.keep_last:
            _prune(root, cfg.keep_last)
    return final


def _prune(root: str, keep: int) -> None:
    steps = sorted(int(d[5:]) for d in os.listdir(root)
                   if d.startswith("step-") and d[5:].isdigit())
    for s in steps[:-keep]:
        shutil.rmtree(os.path.join(root, f"step-{s}"), ignore_errors=True)


def resolve(path: str) -> str:
    """The step directory named by ``path``: a checkpoint root (its ``latest``) or a
    ``step-N`` directory."""
    if os.path.isfile(os.path.join(path, "latest")):
        name = open(os.path.join(path, "latest")).read().strip()
        step_dir = os.path.join(path, name)
        if not os.path.isfile(os.path.join(step_dir, "meta.json")):
            raise InputError(f"{path}/latest names {name!r}, which is not a complete checkpoint")
        return step_dir
    if os.path.isfile(os.path.join(path, "meta.json")):
        return path
    raise InputError(f"{path}: not a checkpoint (no 'latest' file and no meta.json)")


def read_meta(step_dir: str) -> dict:
    path = os.path.join(step_dir, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: unreadable checkpoint metadata ({e})") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{path}: format_version {meta.get('format_version')} is not "
                         f"{FORMAT_VERSION}")
    return meta


def check_compatible(meta: dict, cfg: TrainConfig, schema, where: str) -> None:
    """Refuse a checkpoint whose model does not match the requested one, naming the key."""
    saved = from_dict(TrainConfig, meta["config"], where)
    for key in MATCH_KEYS:
        if getattr(saved, key) != getattr(cfg, key):
            raise InputError(f"{where}: checkpoint has {key} = {getattr(saved, key)!r} but this "
                             f"run asks for {getattr(cfg, key)!r}")
    if tuple(meta["schema"]["cardinalities"]) != tuple(schema.cardinalities) or \
            meta["schema"]["n_dense"] != schema.n_dense:
        raise InputError(f"{where}: checkpoint was trained on other fields or cardinalities "
                         f"than this run's data")


def _h5(path: str):
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise InputError(f"{path}: unreadable checkpoint file ({e})") from None


def load(path: str, cfg: TrainConfig, topo, mode, ps, schema) -> int:
    """Load a checkpoint into a freshly built ``mode`` (collective); returns its step."""
    err, step = None, 0
    try:
        step_dir = resolve(path)
        meta = read_meta(step_dir)
        check_compatible(meta, cfg, schema, os.path.join(step_dir, "meta.json"))
        step = int(meta["step"])
        if topo.is_server or topo.n_servers == 0:  # holders of sparse rows under this run
            rows_total = int(sum(schema.cardinalities))
            seen = 0
            for name in meta["shards"]:
                fpath = os.path.join(step_dir, name)
                with _h5(fpath) as f:
                    try:
                        n = f["ids"].shape[0]
                        slots = [k for k in f if k != "ids"]
                        for a in range(0, n, _CHUNK):
                            ids = f["ids"][a:a + _CHUNK]
                            mine = mode.owns(ids)
                            if mine.any():
                                sel = np.flatnonzero(mine)
                                mode.set_sparse_rows(ids[sel], {k: f[k][a:a + _CHUNK][sel]
                                                                for k in slots})
                                seen += sel.size
                    except (KeyError, OSError, ValueError, IndexError) as e:
                        raise InputError(f"{fpath}: corrupt or truncated shard ({e})") from None
            want = int(mode.owns(np.arange(rows_total, dtype=np.int64)).sum())
            if seen != want:
                raise InputError(f"{step_dir}: shards hold {seen} of this rank's {want} rows")
        fpath = os.path.join(step_dir, "dense.h5")
        with _h5(fpath) as f:
            try:
                flat = f["flat"][...]
                state = {k: f[f"state/{k}"][...] for k in f.get("state", {})}
            except (KeyError, OSError) as e:
                raise InputError(f"{fpath}: corrupt or truncated ({e})") from None
        if flat.shape != (ps.size,):
            raise InputError(f"{fpath}: {flat.size} dense parameters, the model has {ps.size}")
        mode.set_dense_state(flat, state)
    except PshybridError as e:
        err = e
    agree(topo.world, err)  # Wire: verdict allgather; nobody pulls before every rank loaded
    return step


def export(path: str, out: str) -> dict:
    """One HDF5 file: /dense/<param>, /embeddings/<field> (cardinality x D),
    /linear/<field> (cardinality,) for models with a per-id linear weight,
    /optimizer/dense/<slot>/<param>, /optimizer/embeddings/<field>/<slot>; attrs config
    (JSON) and step. Written atomically. Returns a summary."""
    step_dir = resolve(path)
    meta = read_meta(step_dir)
    cfg = from_dict(TrainConfig, meta["config"], os.path.join(step_dir, "meta.json"))
    cards = meta["schema"]["cardinalities"]
    names = meta["schema"]["sparse_names"]
    offsets = field_offsets(cards)
    rows_total, D = int(sum(cards)), cfg.embedding_dim
    table, slots = None, {}
    for name in meta["shards"]:
        fpath = os.path.join(step_dir, name)
        with _h5(fpath) as f:
            ids = f["ids"][...]
            for k in f:
                if k == "ids":
                    continue
                arr = f[k][...]
                dst = slots.setdefault(k, np.zeros((rows_total, arr.shape[1]), arr.dtype))
                dst[ids] = arr
    table = slots.pop("w")
    tmp = out + ".tmp"
    with _h5(os.path.join(step_dir, "dense.h5")) as f, h5py.File(tmp, "w") as o:
        flat = f["flat"][...]
        params = json.loads(f.attrs["params"])
        states = {k: f[f"state/{k}"][...] for k in f.get("state", {})}
        for pname, off, shape in params:
            n = int(np.prod(shape))
            o[f"dense/{pname}"] = flat[off:off + n].reshape(shape)
            for k, st in states.items():
                o[f"optimizer/dense/{k}/{pname}"] = st[off:off + n].reshape(shape)
        for f_i, fname in enumerate(names):
            rows = slice(offsets[f_i], offsets[f_i] + cards[f_i])
            o[f"embeddings/{fname}"] = table[rows, :D]
            if table.shape[1] > D:
                o[f"linear/{fname}"] = table[rows, D]
            for k, st in slots.items():
                o[f"optimizer/embeddings/{fname}/{k}"] = st[rows]
        o.attrs["config"] = json.dumps(meta["config"])
        o.attrs["step"] = meta["step"]
        o.attrs["field_names"] = json.dumps(meta["schema"]["dense_names"] + names)
    os.replace(tmp, out)
    return {"step": meta["step"], "tables": len(names), "dense_params": len(params)}
