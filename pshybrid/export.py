"""``pshybrid export CKPT OUT.h5``: a checkpoint as one plain HDF5 file that any h5py user
can read (``docs/checkpoints.md``): its dense parameters, every table's rows, optimizer
state, by name. Reads through ``checkpoint_files`` (every array's checksum verified); the
tables go through a block of rows at a time, so its memory does not grow with them."""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np

from . import partition, safeio
from .checkpoint_files import (DAMAGE, TORCH, has_checksums, is_int, native_config, open_h5,
                               read_meta, resolve, row_width)
from .checksums import CRC_ATTR, Sums
from .dense_file import read_buffers, read_dense, read_param_steps, read_torch_state
from .errors import InputError, PshybridError
from .optim import SLOTS
from .schema import field_offsets
from .shard_files import CHUNK_ROWS, check_finite, damaged, read_shards, shard_layout

BLOCK_BYTES = 64 << 20  # the table's rows (every slot) an export holds at a time


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


def _check_sizes(step_dir: str, out: str, table: int, slots: int, whole: str) -> None:
    """Refuse, before allocating and writing, an export of a ``table`` of bytes with
    ``slots`` slots that does not fit on the disk of ``out``, or, assembled in memory
    (``whole``: why), in the memory available."""
    from .limits import available_memory, gib

    need = table * (1 + slots)
    mem = available_memory()
    if whole and mem is not None and need + table // 8 > mem:
        raise PshybridError(f"export of {step_dir}: the table ({gib(table)}, {1 + slots} "
                            f"slots) is assembled in memory ({whole}, where training writes "
                            f"shard s of n with the rows s, s + n, ... in order), which "
                            f"needs {gib(need + table // 8)}, {gib(mem)} is available")
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


def _in_order(step_dir: str, meta: dict, E: int, slots: tuple[str, ...]):
    """([(shard file, its ``Sums``)], "") where shard s of n holds the rows s, s + n,
    s + 2n, ... in order, as training writes them (the ids read, their checksums taken, the
    files' layout checked); else (None, where one does not): ``read_shards`` then checks
    the shards and assembles the table whole."""
    total, names = int(sum(meta["schema"]["cardinalities"])), meta["shards"]
    found, n = [], len(names)
    for s, name in enumerate(names):
        fpath = os.path.join(step_dir, name)
        sums = Sums(fpath, meta.get("checksums") == CRC_ATTR)
        with open_h5(fpath) as f:
            try:
                rows, want = shard_layout(fpath, f, E, slots), partition.shard_rows(total, n, s)
                if rows != want:
                    return None, f"{fpath} holds {rows:,} rows, not {want:,}"
                for a in range(0, rows, CHUNK_ROWS):
                    raw = f["ids"][a:a + CHUNK_ROWS]
                    sums.add("ids", raw)
                    off = np.flatnonzero(raw != s + n * np.arange(a, a + raw.size))
                    if off.size:
                        i = a + int(off[0])
                        return None, f"{fpath}: /ids[{i}] = {raw[off[0]]}, not {s + n * i}"
            except DAMAGE as e:
                raise damaged(fpath, e) from None
        found.append((fpath, sums))
    return found, ""


def _blocks(shards, total: int, E: int, dtype, slots: tuple[str, ...]):
    """Yield (first row, {slot: the fused table's rows from it}) over the whole table, a
    block of about ``BLOCK_BYTES`` at a time, each block's rows from every shard's next
    rows (each file read once, in order; values checked finite, checksums taken and, at
    the end, checked)."""
    n, item = len(shards), np.dtype(dtype).itemsize
    rows = max(n, BLOCK_BYTES // (E * item * (1 + len(slots))) // n * n)
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open_h5(p)) for p, _ in shards]
        for a in range(0, total, rows):
            b = min(total, a + rows)
            block = {k: np.empty((b - a, E), dtype) for k in ("w", *slots)}
            for s, ((fpath, sums), f) in enumerate(zip(shards, files)):
                ka, kb = a // n, (b - s + n - 1) // n  # its rows s + n*k in [a, b)
                for k, dst in block.items():
                    try:
                        v = f[k][ka:kb]
                    except DAMAGE as e:
                        raise damaged(fpath, e) from None
                    sums.add(k, v)
                    check_finite(fpath, k, v, lambda i: (ka + i, s + n * (ka + i)))
                    dst[s::n] = v
            yield a, block
        for (fpath, sums), f in zip(shards, files):
            sums.read(f)
            sums.check()


def _whole(step_dir: str, meta: dict, total: int, E: int, dtype, slots: tuple[str, ...]):
    """[(0, {slot: the whole fused table})], assembled in memory from shards in any order
    (every one read and checked first)."""
    arrays = {k: np.zeros((total, E), dtype) for k in ("w", *slots)}

    def take(ids, vals):
        for k, v in vals.items():
            arrays[k][ids] = v

    read_shards(step_dir, meta, E, slots, lambda ids: np.ones(ids.shape, bool), take)
    return [(0, arrays)]


def _write_tables(o, blocks, fields, E: int, linear: bool, dtype, slots) -> None:
    """/embeddings, /linear and /optimizer/embeddings of each field, from the blocks."""
    out = []
    for fname, span, D in fields:
        c, to = span.stop - span.start, {}
        to["w"] = [(o.create_dataset(f"embeddings/{fname}", (c, D), dtype), slice(0, D))]
        if linear:
            to["w"].append((o.create_dataset(f"linear/{fname}", (c,), dtype), D))
        for k in slots:
            width = E if linear else D
            to[k] = [(o.create_dataset(f"optimizer/embeddings/{fname}/{k}", (c, width),
                                       dtype), slice(0, width))]
        out.append((span, to))
    for a, block in blocks:
        b = a + len(block["w"])
        for span, to in out:
            lo, hi = max(a, span.start), min(b, span.stop)
            if lo >= hi:
                continue
            for k, targets in to.items():
                for dset, cols in targets:
                    dset[lo - span.start:hi - span.start] = block[k][lo - a:hi - a, cols]


def export(path: str, out: str, overwrite: bool = False) -> dict:
    """One HDF5 file: /dense/<param>, /embeddings/<field> (cardinality x D),
    /linear/<field> (cardinality,) for models with a per-id linear weight,
    /optimizer/dense/<slot>/<param> (a torch optimizer's other state: <key> for <slot>),
    /optimizer/embeddings/<field>/<slot>; attrs config (JSON), step, field_names (JSON:
    the model's input order) and schema (JSON). Every input is checked (an ``InputError``
    naming the file and key); the output goes through a fresh temporary beside ``out``,
    renamed on success and removed on any error, so a refused export leaves no file
    behind. ``out`` passes ``safeio.check_output``: an existing file is replaced only with
    ``overwrite`` and only when an earlier export wrote it. Shards in training's row order
    stream through a block at a time; others are assembled in memory."""
    _check_out(path, out, overwrite)
    step_dir = resolve(path)
    meta = read_meta(step_dir)
    fields, E, linear, dtype, sparse_opt, dense_opt = _export_layout(
        meta, os.path.join(step_dir, "meta.json"))
    total, slots = int(sum(meta["schema"]["cardinalities"])), SLOTS[sparse_opt]
    shards, whole = _in_order(step_dir, meta, E, slots)
    _check_sizes(step_dir, out, total * E * np.dtype(dtype).itemsize, len(slots), whole)
    blocks = (_whole(step_dir, meta, total, E, dtype, slots) if shards is None
              else _blocks(shards, total, E, dtype, slots))  # (read while writing)
    flat, states, params = read_dense(step_dir, SLOTS[dense_opt],
                                      checksums=has_checksums(step_dir, meta))
    buffers = read_buffers(step_dir)  # (a torch model's: a BatchNorm's statistics)
    steps = read_param_steps(step_dir, [p[0] for p in params])  # (a torch model's Adam)
    other = read_torch_state(step_dir, [p[0] for p in params])  # (its momentum buffers, ...)
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
            _write_tables(o, blocks, fields, E, linear, dtype, slots)
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
