"""A torch run's checkpoints: what meta.json says of the run (``TorchRun``, the ``state``
kept with it), and resuming ``DistributedOptimizer`` from dense.h5: the model's parameters
by name, the torch optimizer's state (the native slots' moments with each parameter's own
step count, any other state tensor as it is) and the model's buffers."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch

from pshybrid.checkpoint_files import read_meta
from pshybrid.dense_file import (TORCH_STATE, read_buffers, read_dense, read_param_steps,
                                 read_torch_state)
from pshybrid.errors import ConfigError, InputError
from pshybrid.safeio import atomic_write_text

DTYPES = {torch.float32: "float32", torch.float64: "float64"}


@dataclass(frozen=True)
class TorchRun:
    """What a torch checkpoint says of the run that wrote it: ``checkpoint.save`` reads
    ``mode``, ``seed``, ``keep_last`` and ``meta()`` (meta.json's ``front_end`` and
    ``config``: the tables, the fused width, the mode, the optimizers and their rates of the
    moment; ``docs/checkpoints.md``)."""

    mode: str
    seed: int
    servers: int
    tables: tuple
    width: int
    lr: float               # the embeddings' rate now (a scheduler may have changed it)
    dense_optimizer: str
    dense_lr: float
    keep_last: int = 0
    groups: tuple = ()  # each param group's settings (``group_settings``)
    torch_optimizer: str = ""  # the torch class (AdamW's slots are "adam"'s)
    state: dict | None = None  # ``pt.checkpoint``'s ``state=``: meta.json's ``user_state``
    placement: str = "dedicated"  # (colocated: ``servers`` counts every rank)

    def meta(self) -> dict:
        t0 = self.tables[0]
        tables = [{"name": t.name, "rows": t.rows, "dim": t.dim, "optimizer": t.optimizer,
                   "lr": t.lr, "dtype": DTYPES[t.dtype], "init_scale": t.init_scale,
                   "betas": [float(b) for b in t.betas], "eps": float(t.eps)}
                  for t in self.tables]
        meta = {"front_end": "torch", "config": {
            "tables": tables, "width": self.width, "dtype": DTYPES[t0.dtype],
            "sparse_optimizer": t0.optimizer, "lr": self.lr,
            "dense_optimizer": self.dense_optimizer, "dense_lr": self.dense_lr,
            "mode": self.mode, "servers": self.servers, "placement": self.placement,
            "seed": self.seed}}
        if self.groups:
            meta["config"]["param_groups"] = list(self.groups)
        if self.torch_optimizer:
            meta["config"]["torch_optimizer"] = self.torch_optimizer
        if self.state is not None:
            meta["user_state"] = self.state
        return meta


# torch optimizer -> (the checkpoint's dense_optimizer: the layout of dense.h5's /state, as a
# native run's; {slot: the torch state key it holds}). Every other state tensor, of these
# classes or any other, is kept as it is under /torch_state/<parameter>/<key>.
_ADAM = ("adam", {"m": "exp_avg", "v": "exp_avg_sq"})
SLOTTED = {torch.optim.SGD: ("sgd", {}), torch.optim.Adam: _ADAM,
           torch.optim.AdamW: _ADAM, torch.optim.Adagrad: ("adagrad", {"acc": "sum"})}
NO_CHECKPOINT = ("pt.checkpoint will refuse it, so a stop on SIGTERM / SIGUSR1 can write no "
                 "checkpoint")


def dense_kind(opt) -> tuple[str, dict]:
    """``SLOTTED``'s entry for the torch optimizer of ``opt`` (a DistributedOptimizer); any
    other class: ("sgd", {}), no slots (its whole state under /torch_state)."""
    return SLOTTED.get(type(opt.opt), ("sgd", {}))


def _unkept(opt) -> str | None:
    """The first entry of the torch optimizer's state a checkpoint cannot hold, in words,
    else None: one not kept for a parameter of the model (a step count of its own), one
    that is not a dense tensor (a number, a list), or whose key is no HDF5 name."""
    names = {id(p): n for n, p in opt.named}
    for p, st in opt.opt.state.items():
        if id(p) not in names:
            return (f"its state holds an entry for {type(p).__name__} {str(p)[:40]!r}, not a "
                    "parameter of the model")
        for key, v in st.items():
            where = f"its state {key!r} of parameter {names[id(p)]!r}"
            if not isinstance(key, str) or key in ("", ".") or "/" in key:
                return f"{where}: the key is not a name (a string without '/', not '' or '.')"
            if not isinstance(v, torch.Tensor) or v.layout != torch.strided:
                what = type(v).__name__ if not isinstance(v, torch.Tensor) else v.layout
                return f"{where} is a {what}, not a dense tensor"
    return None


def checkpoint_form(opt) -> tuple:
    """(the checkpoint's dense_optimizer, its lr, every param group's settings, the torch
    class's name) of ``opt``, else ``ConfigError``: state a checkpoint cannot hold."""
    name, _ = dense_kind(opt)
    problem = _unkept(opt)
    if problem:  # (every worker's state is the same: the same verdict on each)
        raise ConfigError(f"pt.checkpoint: torch.optim.{type(opt.opt).__name__} has no "
                          f"checkpoint form: {problem}", collective=True)
    return (name, float(opt.opt.param_groups[0]["lr"]), group_settings(opt.param_groups),
            type(opt.opt).__name__)


def warn_inner_scheduler(s, torch_optimizer) -> None:
    """Worker 0, making the session's first DistributedOptimizer: a learning-rate scheduler
    made on the torch optimizer before it was wrapped (its groups hold ``initial_lr``)
    schedules the dense parameters only; the tables' rate (the DistributedOptimizer's last
    group) stays where it started, and nothing said so."""
    if s.optimizer is None and s.topo.worker_index == 0 and any(
            "initial_lr" in g for g in torch_optimizer.param_groups):
        sys.stderr.write("pshybrid: warning: DistributedOptimizer: the torch optimizer has a "
                         "learning-rate scheduler: it schedules the dense parameters only, "
                         "not the tables' rate; make the scheduler on the "
                         "DistributedOptimizer (docs/torch.md)\n")


def warn_no_checkpoint(opt) -> None:
    """Worker 0 warns, after ``opt``'s first step (the torch optimizer's state exists then),
    of state ``pt.checkpoint`` refuses (found out at the first checkpoint, the run's
    compute was lost with it)."""
    try:
        checkpoint_form(opt)
    except ConfigError as e:
        if opt.s.topo.worker_index == 0:
            why = str(e).removeprefix("pt.checkpoint: ")
            sys.stderr.write(f"pshybrid: warning: DistributedOptimizer: {why}: "
                             f"{NO_CHECKPOINT}\n")


def _host(v: torch.Tensor) -> np.ndarray:
    """A state tensor as a host array of its own (a dtype NumPy lacks, bfloat16: as
    float32, which it then loads back as)."""
    v = v.detach().cpu()
    try:
        return v.numpy().copy()
    except TypeError:  # (a dtype NumPy lacks)
        return v.float().numpy()


def dense_arrays(opt) -> tuple:
    """(flat (P,), {slot: (P,)}, {dense.h5 path: array}, {name: step count}): ``opt``'s
    dense parameters and torch optimizer state for a checkpoint. The slots hold the state
    keys of the native layout (zero where a parameter has no state yet), their step counts
    each parameter's own; ``torch_state/<name>/<key>`` every other state tensor, as it is;
    ``buffers/<name>`` the model's buffers."""
    _, keys = dense_kind(opt)
    opt.sync_params()
    flat = opt.params.flat
    slots, arrays, steps = {slot: np.zeros_like(flat) for slot in keys}, {}, {}
    by_key = {key: slot for slot, key in keys.items()}
    for n, p in opt.named:
        st, o = opt.opt.state.get(p, {}), opt.params.offset(n)
        if keys:
            steps[n] = int(st.get("step", 0))
        for key, v in st.items():
            if key in by_key:
                slots[by_key[key]][o:o + p.numel()] = v.detach().cpu().reshape(-1).numpy()
            elif not (keys and key == "step"):
                arrays[f"{TORCH_STATE}/{n}/{key}"] = _host(v)
    for n, b in opt._buffers().items():
        arrays[f"buffers/{n}"] = b.detach().cpu().numpy().copy()
    return flat.copy(), slots, arrays, steps


def _placed(group: dict, p, key: str, value: torch.Tensor) -> torch.Tensor:
    """``value`` as it was saved, on the parameter's device ("step": float32 there with
    ``fused`` or ``capturable``, else on the host, as torch keeps it). (torch's own
    ``load_state_dict`` casts floating state to the parameter's dtype: a float32 entry of a
    float64 model, NAdam's ``mu_product``, would not continue the run exactly.)"""
    if key == "step":
        fused = group.get("fused") or group.get("capturable")
        return value.to(dtype=torch.float32, device=p.device) if fused else value
    return value.to(device=p.device)


def load_dense(opt, step_dir: str) -> None:
    """``opt``'s model parameters, torch optimizer state and buffers from ``step_dir``'s
    dense.h5, by name (a parameter the checkpoint lacks, or of another shape, refused)."""
    _, keys = dense_kind(opt)
    saved, now = opt.s.resumed_class, type(opt.opt).__name__
    if saved is not None and saved != now:  # (AdamW and Adam: the same slots, other steps)
        raise InputError(f"{step_dir}/meta.json: the checkpoint's dense optimizer is "
                         f"torch.optim.{saved}, this one torch.optim.{now}: resume with "
                         f"{saved} (its state and settings are {saved}'s)")
    flat, state, entries = read_dense(step_dir, tuple(keys), None)
    where = {n: (o, tuple(shape)) for n, o, shape in entries}
    for n, p in opt.named:
        if n not in where or where[n][1] != tuple(p.shape):
            got = where[n][1] if n in where else "missing"
            raise InputError(f"{step_dir}/dense.h5: parameter {n!r} is {got}, the model's "
                             f"is {tuple(p.shape)}")
    steps = read_param_steps(step_dir, where) or {}  # (none kept: the run's step for each)
    other = read_torch_state(step_dir, where)
    group_of = {id(p): g for g in opt.opt.param_groups for p in g["params"]}
    with torch.no_grad():
        for n, p in opt.named:
            o, k = where[n][0], p.numel()
            p.copy_(torch.from_numpy(flat[o:o + k].astype(opt.params.flat.dtype))
                    .reshape(p.shape))
            st = {key: torch.from_numpy(v) for key, v in other.get(n, {}).items()}
            t = steps.get(n, opt.s.mode.sparse.opt.steps_before + opt.s.step)
            if keys and t:  # (a parameter never stepped has no state, as in PyTorch)
                st["step"] = torch.tensor(float(t))
                st.update({key: torch.from_numpy(state[slot][o:o + k].copy()).reshape(p.shape)
                           for slot, key in keys.items()})
            for key, v in st.items() if id(p) in group_of else ():  # (the optimizer's own)
                opt.opt.state[p][key] = _placed(group_of[id(p)], p, key, v)
    _load_buffers(opt, step_dir)
    _load_groups(opt, step_dir)
    for n, p in opt.named:  # (a native checkpoint's, or an older one's, Adam kept no maxima)
        st = opt.opt.state.get(p, {})
        if "exp_avg_sq" in st and "max_exp_avg_sq" not in st and group_of[id(p)].get("amsgrad"):
            raise InputError(f"{step_dir}/dense.h5: parameter {n!r} has no amsgrad maxima "
                             "(max_exp_avg_sq: a checkpoint of Adam without amsgrad, native or "
                             "older): resume with amsgrad=False")


def group_settings(groups) -> tuple:
    """Each param group's settings with JSON values (all but its parameters: ``lr``,
    ``betas``, a scheduler's ``initial_lr``, ...): the checkpoint's ``param_groups``."""
    return tuple({k: list(v) if isinstance(v, tuple) else v for k, v in g.items()
                  if k != "params" and state_problem(v) is None} for g in groups)


def read_groups(meta: dict, where: str) -> list | None:
    """A checkpoint's ``config.param_groups`` (None where it has none: a native or older
    one), checked to be a list of objects."""
    saved = meta["config"].get("param_groups")
    if saved is not None and (not isinstance(saved, list) or
                              not all(isinstance(g, dict) for g in saved)):
        raise InputError(f"{where}: config param_groups is not a list of objects")
    return saved


def _load_groups(opt, step_dir: str) -> None:
    """Each param group's settings as the checkpoint's step had them (``pt.init`` read
    them: ``read_groups``), as torch's ``load_state_dict`` restores them (kept in
    ``opt.kept_settings`` for ``opt.restore_settings()``: a scheduler's constructor resets
    them); a checkpoint without them (native, older) leaves the code's."""
    saved = opt.s.resumed_groups
    if saved is None:
        return
    if len(saved) != len(opt.param_groups):
        raise InputError(f"{step_dir}/meta.json: config param_groups: the checkpoint's torch "
                         f"optimizer had {len(saved) - 1} param group(s), this one has "
                         f"{len(opt.param_groups) - 1}")
    opt.kept_settings = saved
    apply_settings(opt.param_groups, saved)


def apply_settings(groups, saved: list) -> None:
    """``saved``'s settings into ``groups`` (tuples where the group has a tuple)."""
    for group, kept in zip(groups, saved):
        for k, v in kept.items():
            if k in group or k == "initial_lr":
                group[k] = tuple(v) if isinstance(group.get(k), tuple) else v


def settings_drift(groups, saved: list) -> str | None:
    """The first setting of ``groups`` that differs from ``saved``'s, in words, or None."""
    for i, (group, kept) in enumerate(zip(groups, saved)):
        for k, v in kept.items():
            now = group.get(k)
            if k in group and (list(now) if isinstance(now, tuple) else now) != v:
                return f"param group {i}'s {k} is {now!r} where the checkpoint's was {v!r}"
    return None


def _load_buffers(opt, step_dir: str) -> None:
    """The model's buffers from the checkpoint (one that holds none, a native one or
    one written before they were kept, leaves them as they are)."""
    saved, mine = read_buffers(step_dir), opt._buffers()
    if mine and not saved and opt.s.topo.worker_index == 0:
        names = ", ".join(list(mine)[:3]) + (", ..." if len(mine) > 3 else "")
        sys.stderr.write(f"pshybrid: warning: {step_dir}/dense.h5 holds none of the "
                         f"model's {len(mine)} buffers ({names}): a checkpoint written "
                         "before they were kept, or a native one; they keep the values "
                         "the model has now (a BatchNorm's running statistics start "
                         "over)\n")
    for n, b in mine.items() if saved else ():
        if n not in saved or saved[n].shape != tuple(b.shape):
            got = saved[n].shape if n in saved else "missing"
            raise InputError(f"{step_dir}/dense.h5: buffer {n!r} is {got}, the model's is "
                             f"{tuple(b.shape)}")
        with torch.no_grad():
            b.copy_(torch.from_numpy(saved[n]))


def state_problem(value, where: str = "state") -> str | None:
    """What keeps ``pt.checkpoint``'s ``state`` from meta.json (JSON: None, booleans,
    numbers, strings, lists and tuples, dicts with string keys), naming the first place,
    else None. Tuples come back as lists (``load_state_dict`` of torch's lr schedulers
    takes either)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return None
    if isinstance(value, (list, tuple)):
        return next((p for i, v in enumerate(value) if (p := state_problem(v, f"{where}[{i}]"))),
                    None)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{where}: key {k!r} is not a string (JSON keys are)"
            if p := state_problem(v, f"{where}[{k!r}]"):
                return p
        return None
    return (f"{where} is a {type(value).__name__}, not JSON (None, booleans, numbers, strings, "
            "lists, dicts with string keys)")


def rewrite_meta(step_dir: str, run: dict) -> None:
    """meta.json of ``step_dir`` with ``run``'s keys (``TorchRun.meta()``) in place of its
    own, replaced atomically where that changes it."""
    meta = read_meta(step_dir)
    new = dict(meta, **run)
    if new != meta:
        atomic_write_text(os.path.join(step_dir, "meta.json"), json.dumps(new, indent=1))


def read_state(meta: dict, where: str) -> dict:
    """A checkpoint's ``user_state`` (``{}`` where it has none), checked to be an object."""
    state = meta.get("user_state", {})
    if not isinstance(state, dict):
        raise InputError(f"{where}: user_state is a {type(state).__name__}, not an object")
    return state
