"""``pshybrid export CKPT OUT.h5``: a checkpoint as one plain HDF5 file that any h5py user
can read (``docs/checkpoints.md``): its dense parameters, every table's rows, optimizer
state, by name. Reads through ``checkpoint_files`` (every array's checksum verified)."""

from __future__ import annotations

import json
import os

import numpy as np

from . import safeio
from .checkpoint_files import (TORCH, has_checksums, is_int, native_config, read_meta,
                               read_shards, resolve, row_width)
from .dense_file import read_buffers, read_dense, read_param_steps, read_torch_state
from .errors import InputError, PshybridError
from .optim import SLOTS
from .schema import field_offsets


def _check_out(path: str, out: str, overwrite: bool) -> None:
    """``out`` may be written by an export of checkpoint ``path`` (``safeio.check_output``)
    and can be (a read-only or full file system is said before the checkpoint is read)."""
    if os.path.isdir(out):
        raise PshybridError(f"export: {out} is a directory; give the output file's name")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise PshybridError(f"export: directory {os.path.dirname(out) or parent} of {out} "
                            "does not exist")
    problem = safeio.check_output(out, "export:", [], [path],
                                  safeio.replaceable("export", overwrite))
    if problem:
        raise PshybridError(problem)
    if problem := safeio.check_writable_dir(parent):  # (the temporary beside it, renamed)
        raise PshybridError(f"export: {out}: {problem}")


def _check_sizes(step_dir: str, out: str, table: int, slots: int) -> None:
    """Refuse, before allocating and writing, an export of a ``table`` of bytes with
    ``slots`` slots that does not fit in memory, or on the disk of ``out``."""
    from .limits import available_memory, gib

    need = table * (1 + slots) + table // 8
    mem = available_memory()
    if mem is not None and need > mem:
        raise PshybridError(f"export of {step_dir}: the table ({gib(table)}, {1 + slots} "
                            f"slots) needs {gib(need)} in memory, {gib(mem)} is available")
    dense = os.path.join(step_dir, "dense.h5")
    need += os.path.getsize(dense) if os.path.isfile(dense) else 0
    problem = safeio.room_problem(os.path.dirname(os.path.abspath(out)), need, need)
    if problem:
        raise PshybridError(f"export: {out}: {problem}; nothing written")


def _export_layout(meta: dict, where: str):
    """([(field, its rows, its width D)], row width, column D the linear weight?, dtype,
    sparse and dense optimizer): a native run's fields (``--embedding-dim`` wide, + the
    linear column of a wide model), or a torch run's tables (each its own ``dim``)."""
    cards, names = meta["schema"]["cardinalities"], meta["schema"]["sparse_names"]
    spans = [slice(int(o), int(o) + c) for o, c in zip(field_offsets(cards), cards)]
    if meta.get("front_end") != TORCH:
        cfg = native_config(meta, where)
        D, E = cfg.embedding_dim, row_width(cfg)
        return ([(n, s, D) for n, s in zip(names, spans)], E, E > D, cfg.dtype,
                cfg.sparse_optimizer, cfg.dense_optimizer)
    c = meta["config"]
    tables, E = c.get("tables"), c.get("width")
    ok = (isinstance(tables, list) and is_int(E) and all(isinstance(t, dict) for t in tables)
          and [t.get("name") for t in tables] == names
          and [t.get("rows") for t in tables] == cards
          and all(is_int(t.get("dim")) and 1 <= t["dim"] <= E for t in tables)
          and c.get("dtype") in ("float32", "float64")
          and c.get("sparse_optimizer") in SLOTS and c.get("dense_optimizer") in SLOTS)
    if not ok:
        raise InputError(f"{where}: config of a torch checkpoint must list the schema's tables "
                         "(name, rows, dim <= width), a float dtype and the two optimizers")
    return ([(t["name"], s, t["dim"]) for t, s in zip(tables, spans)], E, False, c["dtype"],
            c["sparse_optimizer"], c["dense_optimizer"])


def export(path: str, out: str, overwrite: bool = False) -> dict:
    """One HDF5 file: /dense/<param>, /embeddings/<field> (cardinality x D),
    /linear/<field> (cardinality,) for models with a per-id linear weight,
    /optimizer/dense/<slot>/<param> (a torch optimizer's other state: <key> for <slot>),
    /optimizer/embeddings/<field>/<slot>; attrs config (JSON), step, field_names (JSON:
    the model's input order) and schema (JSON). Every input is checked first (an
    ``InputError`` naming the file and key); the output goes through a fresh temporary
    beside ``out``, renamed on success and removed on any error, so a refused export leaves
    no file behind. ``out`` passes ``safeio.check_output``: an existing file is replaced only
    with ``overwrite`` and only when an earlier export wrote it."""
    _check_out(path, out, overwrite)
    step_dir = resolve(path)
    meta = read_meta(step_dir)
    fields, E, linear, dtype, sparse_opt, dense_opt = _export_layout(
        meta, os.path.join(step_dir, "meta.json"))
    rows_total, slots = int(sum(meta["schema"]["cardinalities"])), SLOTS[sparse_opt]
    _check_sizes(step_dir, out, rows_total * E * np.dtype(dtype).itemsize, len(slots))
    arrays = {k: np.zeros((rows_total, E), dtype) for k in ("w", *slots)}

    def take(ids, vals):
        for k, v in vals.items():
            arrays[k][ids] = v

    read_shards(step_dir, meta, E, slots, lambda ids: np.ones(ids.shape, bool), take)
    flat, states, params = read_dense(step_dir, SLOTS[dense_opt],
                                      checksums=has_checksums(step_dir, meta))
    buffers = read_buffers(step_dir)  # (a torch model's: a BatchNorm's statistics)
    steps = read_param_steps(step_dir, [p[0] for p in params])  # (a torch model's Adam)
    other = read_torch_state(step_dir, [p[0] for p in params])  # (its momentum buffers, ...)
    table = arrays.pop("w")
    try:
        with safeio.atomic_output(out) as tmp, safeio.h5_file(tmp, "w") as o:
            for pname, off, shape in params:
                n = int(np.prod(shape))
                o[f"dense/{pname}"] = flat[off:off + n].reshape(shape)
                for k, st in states.items():
                    o[f"optimizer/dense/{k}/{pname}"] = st[off:off + n].reshape(shape)
                for k, a in other.get(pname, {}).items():
                    o[f"optimizer/dense/{k}/{pname}"] = a
            for bname, b in buffers.items():
                o[f"buffers/{bname}"] = b
            for fname, rows, D in fields:
                o[f"embeddings/{fname}"] = table[rows, :D]
                if linear:
                    o[f"linear/{fname}"] = table[rows, D]
                for k, st in arrays.items():
                    o[f"optimizer/embeddings/{fname}/{k}"] = st[rows, :E if linear else D]
            o.attrs["config"] = json.dumps(meta["config"])
            o.attrs["step"] = meta["step"]
            if steps:
                o.attrs["param_steps"] = json.dumps(steps)
            o.attrs["field_names"] = json.dumps(meta["schema"]["dense_names"]
                                               + [f[0] for f in fields])
            o.attrs["schema"] = json.dumps(meta["schema"])  # (counts, cardinalities, multi-hot)
            o.attrs[safeio.OUTPUT_ATTR] = "export"
    except (OSError, ValueError, TypeError, RuntimeError) as e:  # RuntimeError: h5py, a full disk
        raise PshybridError(f"export: writing {out}: {e}") from None
    return {"step": meta["step"], "tables": len(fields), "dense_params": len(params)}

