"""Resuming ``DistributedOptimizer`` from a checkpoint's dense.h5: the model's parameters
by name, the torch optimizer's state (Adam's moments and each parameter's own step count)
and the model's buffers."""

from __future__ import annotations

import sys

import torch

from pshybrid.checkpoint_files import read_buffers, read_dense, read_param_steps
from pshybrid.errors import InputError


def load_dense(opt, step_dir: str) -> None:
    """``opt``'s model parameters, torch optimizer state and buffers from ``step_dir``'s
    dense.h5, by name (a parameter the checkpoint lacks, or of another shape, refused)."""
    _, keys = opt._kind()
    flat, state, entries = read_dense(step_dir, tuple(keys), None)
    where = {n: (o, tuple(shape)) for n, o, shape in entries}
    for n, p in opt.named:
        if n not in where or where[n][1] != tuple(p.shape):
            got = where[n][1] if n in where else "missing"
            raise InputError(f"{step_dir}/dense.h5: parameter {n!r} is {got}, the model's "
                             f"is {tuple(p.shape)}")
    steps = read_param_steps(step_dir, where) or {}  # (none kept: the run's step for each)
    with torch.no_grad():
        for n, p in opt.named:
            o, k = where[n][0], p.numel()
            p.copy_(torch.from_numpy(flat[o:o + k].astype(opt.params.flat.dtype))
                    .reshape(p.shape))
            t = steps.get(n, opt.s.step)
            if keys and t:  # (a parameter never stepped has no state, as in PyTorch)
                st = opt.opt.state[p]
                st["step"] = torch.tensor(float(t))
                for slot, key in keys.items():
                    st[key] = torch.from_numpy(state[slot][o:o + k].astype(
                        opt.params.flat.dtype)).reshape(p.shape).to(p.device)
    _load_buffers(opt, step_dir)


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
