"""Checkpoint directories and files, without MPI: step names, ``latest``, the metadata,
the rules for a run's directory (``docs/checkpoints.md``; ``checkpoint`` writes and loads
them; ``shard_files`` and ``dense_file`` read and check the shards and ``dense.h5``).

Layout of ``DIR`` (``--checkpoint-dir``)::

    DIR/latest                 text: the name of the newest complete step directory
    DIR/step-N/meta.json       format_version, step, mode, servers, seed, the resolved
                               config, the dataset schema, shard file names
    DIR/step-N/dense.h5        /flat (P,) dense parameters; /state/<slot> (P,) dense
                               optimizer state; attrs params (JSON: name, offset, shape);
                               pshybrid.torch: /buffers/<name> the model's buffers,
                               /torch_state/<name>/<key> its optimizer's other state
    DIR/step-N/shard-SSSSS.h5  per server s (one file in allreduce mode): /ids (n,) the
                               global rows of the fused table it holds; /w (n, E) their
                               weights; /<slot> (n, E) sparse optimizer state

Before step 1 (``check_run_dir``): a fresh run refuses a directory that already holds
checkpoints, and a resumed run refuses one holding steps newer than its resume point.
Names read back (``latest``, shard names) must match their patterns: nothing outside the
directory is ever read. Load and export check every shard (keys, shapes, ids in range and
each row exactly once, finite values) and ``dense.h5``.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys

from . import dirlock, safeio
from .checksums import CRC_ATTR
from .config import TrainConfig, from_dict
from .errors import ConfigError, InputError, PshybridError
from .models import MODELS
from .schema import Schema, names_problem

FORMAT_VERSION = 1
TORCH = "torch"  # meta.json's front_end of a pshybrid.torch checkpoint
MATCH_KEYS = ("model", "embedding_dim", "mlp", "cross_layers", "bottom_mlp", "dtype",
              "sparse_optimizer", "dense_optimizer")
STEP_RE = safeio.STEP_RE
SHARD_RE = re.compile(r"shard-[0-9]{5,}\.h5")
TEMP_RE = re.compile(r"\.step-[0-9]+\.(?:[A-Za-z0-9_]+\.)?tmp")  # ours, and the old fixed name
# The longest path a checkpoint writes in its directory: a shard in a step's temporary
# directory (``.step-N.<mkdtemp's 8 characters>.tmp``, N of up to 20 digits).
DEEPEST = os.path.join(f".step-{'9' * 20}.{'x' * 8}.tmp", "shard-00000.h5")
def list_steps(root: str) -> dict[int, str]:
    """{N: path} of every entry ``step-N`` in ``root`` (of any kind); {} if there is none."""
    try:
        names = os.listdir(root)
    except OSError:
        return {}
    return {int(m.group(1)): os.path.join(root, n)
            for n in names if (m := STEP_RE.fullmatch(n))}


POINTERS = ("latest", "best")  # files of a checkpoint root naming one of its steps


def read_latest(root: str, pointer: str = "latest") -> str | None:
    """The step directory name ``root/latest`` (or ``root/best``, ``POINTERS``) holds
    (``step-N``), None if there is none. A link, a non-regular file or other text is an
    InputError: the name is read without following links and must match ``step-N``, so it
    stays inside ``root``."""
    path = os.path.join(root, pointer)
    if not os.path.lexists(path):
        return None
    try:
        name = safeio.read_small_text(path, 256).strip()
    except (OSError, ValueError) as e:
        why = "a symbolic link" if os.path.islink(path) else f"unreadable ({e})"
        raise InputError(f"{path} is {why}: not followed; a checkpoint directory's "
                         f"'{pointer}' is a regular file written by pshybrid") from None
    if not STEP_RE.fullmatch(name):
        raise InputError(f"{path} holds {name[:60]!r}, not a step directory name (step-N)")
    return name


def _describe(root: str) -> str:
    try:
        latest = read_latest(root)
    except InputError:
        return "its 'latest' is not pshybrid's"
    if latest:
        return f"latest: {latest}"
    steps = list_steps(root)
    return f"newest: step-{max(steps)}" if steps else "a 'latest' file"


def check_run_dir(root: str, resume_dir: str | None, resume_step: int | None,
                  option: str = "--checkpoint-dir", resume: str = "--resume") -> None:
    """Refuse, before step 1, a ``--checkpoint-dir`` whose checkpoints this run could lose
    track of: a fresh run (or one resumed from elsewhere) into a directory that already
    holds a ``latest`` or ``step-N``; a run resumed from ``root/step-R`` while ``root``
    holds a step newer than R (its checkpoints would interleave with the older history and
    ``--keep-last`` could remove them); a ``latest`` that is a link or not pshybrid's; a
    directory inside another checkpoint directory, or a step directory itself (its
    ``latest`` would then name the checkpoint that ``--resume``, ``eval`` and ``export`` of
    the outer one load). ``option``, ``resume``: how the messages name the directory and
    the way to resume (the Python API's words)."""
    outer = safeio.checkpoint_holding(root)
    if outer is not None or os.path.isfile(os.path.join(root, "meta.json")):
        raise InputError(f"{option} {root} lies inside the checkpoint directory "
                         f"{outer or root}: choose a directory of its own")
    steps = list_steps(root)
    has_latest = os.path.lexists(os.path.join(root, "latest"))
    if not steps and not has_latest:
        return
    busy = dirlock.in_use(root)  # (a running job's checkpoints: its lock says why, first)
    if busy:
        raise ConfigError(f"{option.rstrip(':')}: {busy}")
    if not (resume_dir is not None and holds(root, resume_dir)):
        point = _resume_point(root, steps)
        go_on = f"continue them with {resume} {point}, or " if point else ""
        raise InputError(f"{option} {root} already holds checkpoints ({_describe(root)}): "
                         f"{go_on}choose another directory")
    read_latest(root)  # a planted link or foreign 'latest' is refused, not replaced
    newer = sorted(n for n in steps if n > resume_step)
    if newer:
        point = _resume_point(root, steps)
        latest = " (its latest)" if point == root else ""
        go_on = (f"Resume from {point}{latest}, choose another directory," if point
                 else "Choose another directory")
        raise InputError(f"{option} {root} holds step-{newer[-1]}, newer than the resume "
                         f"point step-{resume_step}: a run from there would write a second "
                         f"history into the same directory. {go_on} or move the newer step "
                         "directories away")


def holds(root: str, step_dir: str) -> bool:
    """``root`` is the directory that holds the checkpoint ``step_dir``."""
    try:
        return os.path.samefile(os.path.dirname(os.path.realpath(step_dir)), root)
    except OSError:
        return False


def _resume_point(root: str, steps: dict[int, str]) -> str | None:
    """What a resume can continue ``root``'s checkpoints from (``steps``: its step-N
    entries), for a refusal's advice: its newest step-N when that is a directory whose
    meta.json reads and ``latest`` (if any) is pshybrid's (``check_run_dir`` refuses any
    other, and a resume from an older step), as ``root`` where ``latest`` names it; else
    None."""
    newest = steps[max(steps)] if steps else None
    try:
        latest = read_latest(root)
        if newest is None or not safeio.is_real_dir(newest):
            return None
        read_meta(newest)
    except InputError:
        return None
    return root if latest == os.path.basename(newest) else newest


def resolve(path: str) -> str:
    """The step directory named by ``path``: a ``step-N`` directory (its ``meta.json``), a
    checkpoint root (its ``latest``) or one of its ``POINTERS`` (``ck/best``)."""
    if os.path.isfile(os.path.join(path, "meta.json")):
        return path
    norm = os.path.normpath(path)
    parent, name = os.path.split(norm)
    if name in POINTERS and os.path.lexists(norm) and not os.path.isdir(norm):
        root, pointer = parent or ".", name
        named = read_latest(root, pointer)
    else:
        root, pointer = path, "latest"
        named = read_latest(path) if os.path.isdir(path) else None
    if named is not None:
        step_dir = os.path.join(root, named)
        if not (safeio.is_real_dir(step_dir)
                and os.path.isfile(os.path.join(step_dir, "meta.json"))):
            raise InputError(f"{root}/{pointer} names {named!r}, which is not a complete "
                             "checkpoint directory")
        return step_dir
    if not os.path.lexists(path):
        if name == "best" and os.path.lexists(os.path.join(parent or ".", "latest")):
            raise InputError(f"{path}: no evaluated checkpoint in {parent or '.'} (train writes "
                             "best at a checkpoint of a step --eval-data evaluated)")
        raise InputError(f"{path}: no such checkpoint directory")
    if os.path.isfile(path) and safeio.output_kind(path) == "export":
        raise InputError(f"{path}: an export written by pshybrid export, not a checkpoint: "
                         "this command takes a checkpoint directory (--checkpoint-dir) or "
                         "one of its step-N directories")
    steps = [d for _, d in sorted(list_steps(path).items())
             if os.path.isfile(os.path.join(d, "meta.json"))]
    hint = (f"; it holds {', '.join(os.path.basename(d) for d in steps[-3:])} (name one: "
            f"{steps[-1]})" if steps else "")
    raise InputError(f"{path}: not a checkpoint (no 'latest' file and no meta.json){hint}")


def step_bytes(step_dir: str) -> int:
    """The size of the files of checkpoint ``step_dir``."""
    return sum(e.stat().st_size for e in os.scandir(step_dir) if e.is_file())


def bad_key(path: str, key: str, what: str) -> InputError:
    return InputError(f"{path}: {key} {what}")


def is_int(v) -> bool:
    return type(v) is int


def scanned_before(path: str | None) -> frozenset:
    """The ``scan_keys`` of the data files the run of checkpoint ``path`` (``--resume``,
    ``--init-from``) scanned, from its meta.json (empty where it has none, or it cannot be
    read: ``preflight`` names that)."""
    try:
        keys = read_meta(resolve(path)).get("scanned", []) if path else []
    except PshybridError:
        return frozenset()
    return frozenset(tuple(k) for k in keys if isinstance(k, list) and len(k) == 3
                     and all(is_int(v) for v in k))


def read_meta(step_dir: str) -> dict:
    """meta.json, with every field pshybrid reads checked (types, the step, shard names
    that stay inside ``step_dir``, the schema)."""
    path = os.path.join(step_dir, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: unreadable checkpoint metadata ({e})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: not a JSON object")
    if meta.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{path}: format_version {meta.get('format_version')} is not "
                         f"{FORMAT_VERSION}")
    step = meta.get("step")
    if not is_int(step) or step < 0:
        raise bad_key(path, "step", f"must be an integer >= 0, got {step!r}")
    m = STEP_RE.fullmatch(os.path.basename(os.path.normpath(step_dir)))
    if m and int(m.group(1)) != step:
        raise bad_key(path, "step", f"is {step} but the directory is {os.path.basename(step_dir)}")
    before = meta.get("steps_before", 0)
    if not is_int(before) or before < 0:
        raise bad_key(path, "steps_before", f"must be an integer >= 0, got {before!r}")
    if not isinstance(meta.get("config"), dict):
        raise bad_key(path, "config", "is missing or not an object")
    shards = meta.get("shards")
    if (not isinstance(shards, list) or not shards or len(set(map(str, shards))) != len(shards)
            or not all(isinstance(n, str) and SHARD_RE.fullmatch(n) for n in shards)):
        raise bad_key(path, "shards", "must be a non-empty list of distinct names shard-SSSSS.h5, "
                      f"got {str(shards)[:80]}")
    sc = meta.get("schema")
    ok = isinstance(sc, dict) and is_int(sc.get("n_dense")) and sc["n_dense"] >= 0
    cards, names = (sc.get("cardinalities"), sc.get("sparse_names")) if ok else (None, None)
    dnames = sc.get("dense_names") if ok else None
    ok = (ok and isinstance(cards, list) and all(is_int(c) and c >= 1 for c in cards)
          and sum(cards) < 2**63 and isinstance(names, list) and len(names) == len(cards)
          and isinstance(dnames, list) and len(dnames) == sc["n_dense"]
          and names_problem(dnames, names) is None)
    if not ok:
        raise bad_key(path, "schema", "must hold n_dense, dense_names, cardinalities (integers "
                      ">= 1) and as many distinct sparse_names (no '/', not '.', '..' or empty)")
    return meta


def steps_before(cfg) -> int:
    """The optimizer steps the state a run starts from has seen (``Optimizer.steps_before``,
    meta.json's ``steps_before``): ``--resume``'s checkpoint's; ``--init-from``'s plus its
    step (a new run's step 1 is the state's next); else 0."""
    path = cfg.resume or cfg.init_from
    if not path:
        return 0
    meta = read_meta(resolve(path))
    return meta.get("steps_before", 0) + (meta["step"] if cfg.init_from else 0)


def best(steps: dict[int, str]) -> tuple[str, float] | None:
    """(name, AUC) of the checkpoint among ``steps`` ({N: step-N directory}) whose meta.json
    records the highest evaluation AUC (the newest of equals), or None."""
    scored = []
    for n, path in steps.items():
        try:
            auc = read_meta(path).get("eval", {}).get("auc")
        except (InputError, AttributeError):  # (unreadable, or not pshybrid's: not a candidate)
            continue
        if isinstance(auc, float) and math.isfinite(auc):
            scored.append((auc, n, os.path.basename(path)))
    auc, _, name = max(scored) if scored else (None, None, None)
    return None if name is None else (name, auc)


def resumed_options(path: str) -> tuple[dict | None, str, str | None]:
    """``(options, source, cwd)``: the training options stored in the checkpoint ``path``
    names (its root's ``latest``, or a step directory), without ``resume``, for ``--resume``
    to start from, and the directory its run was started in (None: not stored);
    ``(None, reason, None)`` when it has none that train can read (preflight then says what
    is wrong with the checkpoint, on every rank)."""
    try:
        step_dir = resolve(path)
        meta = read_meta(step_dir)
        native_config(meta, step_dir)  # a torch run's checkpoint, a foreign key: no base
        options = {k: v for k, v in meta["config"].items() if k != "resume"}
    except PshybridError as e:
        return None, str(e), None
    if "rates" not in meta:
        options = _rates_as_written(options)
    cwd = meta.get("cwd")
    return options, os.path.join(step_dir, "meta.json"), cwd if isinstance(cwd, str) else None


# A checkpoint without "rates" was written while --lr none meant 0.05 for sgd and adagrad and
# 0.001 for adam (every model), --dense-lr none meant --lr, and --dense-lr defaulted to 0.001
_OLD_LR = {"sgd": 0.05, "adagrad": 0.05, "adam": 0.001}


def _rates_as_written(options: dict) -> dict:
    """The options of a checkpoint written without ``rates``, with the rates its run trained
    at where they may have changed meaning since (``--lr none``, ``--dense-lr none`` or
    absent), so that a resume goes on at them."""
    out, none = dict(options), (None, "none")
    rows = (_OLD_LR.get(options.get("sparse_optimizer", "adagrad"))
            if options.get("lr") in none else options.get("lr"))
    if options.get("lr") in none and rows is not None:
        out["lr"] = rows
    if "dense_lr" not in options:
        out["dense_lr"] = 0.001
    elif options["dense_lr"] in none and rows is not None:
        out["dense_lr"] = rows
    return out


def native_config(meta: dict, where: str) -> TrainConfig:
    """The ``TrainConfig`` a ``train`` checkpoint was written with; a ``pshybrid.torch`` one
    has none (its model is the user's code): one line says so."""
    if meta.get("front_end") == TORCH:
        raise InputError(f"{where}: written by pshybrid.torch: its model is your PyTorch code, "
                         "so train, eval and predict cannot rebuild it; score or continue it "
                         "with that code and pt.init(resume=...), or read it with "
                         "pshybrid export")
    model = meta["config"].get("model") if isinstance(meta["config"], dict) else None
    if isinstance(model, str) and model not in MODELS:
        raise InputError(f"{where}: model {model!r} is not one of this process's models "
                         f"({', '.join(MODELS)}): a model registered from Python "
                         "(pshybrid.models.MODELS) is trained, evaluated, scored and exported "
                         "from Python after registering it again (train, scoring.score, "
                         "export.export)")
    return from_dict(TrainConfig, meta["config"], where)


def check_compatible(meta: dict, cfg: TrainConfig, schema, where: str) -> None:
    """Refuse a checkpoint whose model does not match the requested one, naming the key."""
    saved = native_config(meta, where)
    for key in MATCH_KEYS:  # (--cross-layers, --bottom-mlp: only where the model has them)
        if key in ("cross_layers", "bottom_mlp") and not getattr(MODELS[cfg.model], key):
            continue
        if getattr(saved, key) != getattr(cfg, key):
            raise InputError(f"{where}: checkpoint has {key} = {getattr(saved, key)!r} but this "
                             f"run asks for {getattr(cfg, key)!r}")
    why = Schema.from_dict(meta["schema"]).difference(schema, "the checkpoint", "the data",
                                                      names=False)
    if why is not None:
        raise InputError(f"{where}: checkpoint was trained on other fields than this run's "
                         f"data: {why}")


# what h5py raises reading a damaged file: RuntimeError where its internal structure is hit
# ("wrong B-tree signature", "bad heap free list"), the others where a value or a key is
DAMAGE = (KeyError, OSError, ValueError, IndexError, TypeError, RuntimeError)


def open_h5(path: str):
    try:
        return safeio.h5_file(path)
    except OSError as e:
        raise InputError(f"{path}: unreadable checkpoint file ({e})") from None


def row_width(cfg: TrainConfig) -> int:
    """Columns of a fused-table row: the embedding and the per-id linear weight, if any."""
    return cfg.embedding_dim + MODELS[cfg.model].wide


def has_checksums(step_dir: str, meta: dict, warn: bool = True) -> bool:
    """Whether the checkpoint has checksums (``meta["checksums"]``); one written before
    them is loaded unverified, with one line on stderr (``warn``)."""
    if meta.get("checksums") == CRC_ATTR:
        return True
    if warn:
        sys.stderr.write(f"pshybrid: warning: {step_dir}: no checksums (written by an older "
                         "pshybrid): loaded without verifying them\n")
        sys.stderr.flush()
    return False
