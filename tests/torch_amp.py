"""``torch.amp.GradScaler`` on ``pt.DistributedOptimizer`` against plain PyTorch with the
global batch in one process (float64; shared by ``tests/test_torch_mpi.py``): the model,
batches and optimizers of ``tests/torch_habits.py``, the loop::

    scaler.scale(loss).backward()
    opt.synchronize(scaler)
    scaler.unscale_(opt); clip_grad_norm_(dense parameters)   # (with ``clip``)
    scaler.step(opt); scaler.update()

A row of the last worker's batch holds an infinite dense value at step 2: its dense
gradients are not finite there (its table gradients are), so every worker's scaler must
skip the whole step and halve its scale, and the scale grows after 2 good steps. The
twin skips both its optimizers where any gradient is not finite: one optimizer's rule
(``DistributedOptimizer`` is one; a scaler over two steps each on its own gradients). Without
``synchronize(scaler)`` the tables were trained on gradients 2**10 times too large.
"""

from __future__ import annotations

import pytest
import torch

import pshybrid.torch as pt
from pshybrid.torch.session import session
from torch_habits import B, CLIP, LR_DENSE, LR_EMB, STEPS, global_batches, start
from torch_steplr import rel

SCALER = dict(init_scale=2.0 ** 10, growth_interval=2, growth_factor=4.0, backoff_factor=0.5)
BAD_STEP = 2


def cpu_scaler(**kw):
    """A GradScaler on CPU tensors; before any collective call, so that every rank skips
    alike where this torch has none (torch < 2.3: ``torch.cuda.amp.GradScaler`` alone)."""
    if not hasattr(torch.amp, "GradScaler"):
        pytest.skip("torch.amp.GradScaler('cpu') needs torch >= 2.3")
    return torch.amp.GradScaler("cpu", **kw)


def batches(W: int) -> list:
    gb = global_batches(W * B)
    gb[BAD_STEP][0][W * B - 1, 1] = float("inf")  # the last worker's last row
    return gb


def run(comm, mode: str, servers: int, clip: bool):
    """Every rank: (ok, message)."""
    scaler, twin = cpu_scaler(**SCALER), cpu_scaler(**SCALER)
    started = start(comm, mode, servers)
    if started is None:
        return True, ""
    model, ref, opt = started
    W, w = pt.num_workers(), pt.worker_index()
    gb, scales = batches(W), []
    for dense, ids, label in [tuple(x[w * B:(w + 1) * B] for x in b) for b in gb]:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, ids), label)
        scaler.scale(loss).backward()
        opt.synchronize(scaler)
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.dense_parameters(), CLIP)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    table, steps = session().mode.full_table(), pt.steps_done()
    dense = [p.detach().clone() for p in model.dense_parameters()]
    pt.shutdown()
    adam = torch.optim.Adam(ref.dense_parameters(), lr=LR_DENSE)
    adagrad = torch.optim.Adagrad(ref.emb.parameters(), lr=LR_EMB, eps=1e-8)
    want = []
    for dense_g, ids_g, label_g in gb:
        adam.zero_grad()
        adagrad.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(ref(dense_g, ids_g), label_g)
        twin.scale(loss).backward()
        twin.unscale_(adam)
        twin.unscale_(adagrad)
        if clip:
            torch.nn.utils.clip_grad_norm_(ref.dense_parameters(), CLIP)
        if all(p.grad.isfinite().all() for p in ref.parameters()):  # (one optimizer's rule)
            twin.step(adam)
            twin.step(adagrad)
        twin.update()
        want.append(twin.get_scale())
    errs = {"table": rel(table, ref.emb.weight.detach().numpy()),
            **{f"dense{i}": rel(p.numpy(), q.detach().numpy())
               for i, (p, q) in enumerate(zip(dense, ref.dense_parameters()))}}
    if max(errs.values()) > 1e-9 or scales != want or steps != STEPS - 1:
        return False, f"relative error {errs}, scales {scales} (want {want}), {steps} steps"
    return True, ""
