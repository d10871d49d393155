"""PyTorch training-loop habits on ``pt.DistributedOptimizer`` against plain PyTorch with the
global batch in one process (float64; shared by ``tests/test_torch_mpi.py``):

- ``model.zero_grad()`` (``.grad`` set to None) instead of ``opt.zero_grad()``;
- a dense layer that only some workers' batches reach in some steps (a data-dependent
  branch: worker 0 every step, the others every other step), with the Allreduce cut into a
  bucket per parameter;
- with ``sync``: ``opt.synchronize()``, then ``clip_grad_norm_`` of the dense parameters
  (tight enough to bind every step), then ``opt.step()``;
- with ``accum`` > 1: gradient accumulation, each worker's batch in ``accum`` micro-batches
  of B rows (each loss / ``accum``), all but the last backward inside ``opt.no_sync()``;
  the side branch's rows are worker 0's first micro-batch's, so on odd steps that layer
  is reached only inside ``no_sync``;
- with ``unused``: every third step no worker reaches the side branch, and
  ``find_unused_parameters=True`` leaves its ``.grad`` None, so Adam skips it as plain
  PyTorch does (without it, Adam's moments move it).

The model: logit = Linear(4 -> 1)(relu(Linear([dense, emb(ids) flattened]))) + side(dense)
on the rows whose first dense value is positive. Dense: Adam (lr 0.02); table: Adagrad (lr
0.1; torch's with eps 1e-8 and dense gradients, as in ``tests/torch_steplr.py``).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

import pshybrid.torch as pt
from pshybrid.torch.session import session
from torch_steplr import rel

ROWS, D, F, N_DENSE, STEPS, B = 40, 4, 3, 3, 6, 6
LR_DENSE, LR_EMB, CLIP = 0.02, 0.1, 0.05


def global_batches(G: int, unused: bool = False) -> list:
    """The side branch's rows: worker 0's every step, the other workers' on even steps;
    with ``unused``, none on every third step."""
    rng = np.random.default_rng(12)
    out = []
    for t in range(STEPS):
        dense = rng.standard_normal((G, N_DENSE))
        reach = ((np.arange(G) < B) | (t % 2 == 0)) & (not unused or t % 3 != 2)
        dense[:, 0] = np.abs(dense[:, 0]) * np.where(reach, 1, -1)
        out.append((torch.from_numpy(dense), torch.from_numpy(rng.integers(0, ROWS, (G, F))),
                    torch.from_numpy(rng.integers(0, 2, G).astype(np.float64))))
    return out


class Model(torch.nn.Module):
    def __init__(self, emb):
        super().__init__()
        self.emb, self.lin = emb, torch.nn.Linear(N_DENSE + F * D, 4)
        self.out, self.side = torch.nn.Linear(4, 1), torch.nn.Linear(N_DENSE, 1)

    def forward(self, dense, ids):
        h = torch.relu(self.lin(torch.cat([dense, self.emb(ids).flatten(1)], 1)))
        logit = self.out(h)[:, 0]
        mask = dense[:, 0] > 0
        if mask.any():  # (no row: the branch does not run, side gets no gradient here)
            extra = torch.zeros_like(logit)
            extra[mask] = self.side(dense[mask])[:, 0]
            logit = logit + extra
        return logit

    def dense_parameters(self):
        return [p for name, p in self.named_parameters() if not name.startswith("emb.")]


def start(comm, mode: str, servers: int, **opt_args):
    """Workers: (the model, its plain PyTorch twin with the session's table and the same
    dense weights, the ``DistributedOptimizer`` with ``opt_args``); servers: None."""
    torch.set_default_dtype(torch.float64)
    if not pt.init(servers=servers, mode=mode, seed=4, comm=comm, exit_servers=False,
                   tables=[pt.Table("t", rows=ROWS, dim=D, optimizer="adagrad", lr=LR_EMB,
                                    dtype=torch.float64)]):
        return None
    torch.manual_seed(2)
    model, ref = Model(pt.Embedding("t")), Model(torch.nn.Embedding(ROWS, D))
    opt = pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=LR_DENSE), model,
                                  **opt_args)
    with torch.no_grad():
        ref.emb.weight.copy_(torch.from_numpy(session().mode.full_table()))
        for p, q in zip(ref.dense_parameters(), model.dense_parameters()):
            p.copy_(q)
    return model, ref, opt


def run(comm, mode: str, servers: int, sync: bool, accum: int = 1, unused: bool = False,
        staged: bool = False):
    """Every rank: (ok, message); each worker compares its final parameters and losses with
    the native run on the global batch. ``staged``: the optimizer takes its GPU path
    (gradients staged through the host buffer) on these CPU tensors."""
    started = start(comm, mode, servers, find_unused_parameters=unused,
                    bucket_mb=1e-9)  # (rounds up to 1 byte: a bucket per parameter)
    if started is None:
        return True, ""
    model, ref, opt = started
    opt.on_cpu = not staged
    W, w = pt.num_workers(), pt.worker_index()
    gb = global_batches(W * B * accum, unused)
    losses = []
    for b in gb:
        model.zero_grad()
        losses.append(0.0)
        for j in range(accum):  # worker w's micro-batch j: the global rows (w * accum + j) * B
            dense, ids, label = (x[(w * accum + j) * B:][:B] for x in b)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(dense, ids), label) / accum
            with opt.no_sync() if j < accum - 1 else contextlib.nullcontext():
                loss.backward()
            losses[-1] += loss.item()
        if sync:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.dense_parameters(), CLIP)
        opt.step()
    table = session().mode.full_table()
    dense = [p.detach().clone() for p in model.dense_parameters()]
    # Wire: every worker's local losses (their mean is the global batch's loss)
    got = np.mean(session().topo.workers.allgather(losses), axis=0)
    pt.shutdown()
    adam = torch.optim.Adam(ref.dense_parameters(), lr=LR_DENSE)
    adagrad = torch.optim.Adagrad(ref.emb.parameters(), lr=LR_EMB, eps=1e-8)
    want, clipped = [], 0
    for dense_g, ids_g, label_g in gb:
        adam.zero_grad()
        adagrad.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(ref(dense_g, ids_g), label_g)
        loss.backward()
        if sync:
            clipped += float(torch.nn.utils.clip_grad_norm_(ref.dense_parameters(), CLIP)) > CLIP
        adam.step()
        adagrad.step()
        want.append(loss.item())
    errs = {"table": rel(table, ref.emb.weight.detach().numpy()),
            **{f"dense{i}": rel(p.numpy(), q.detach().numpy())
               for i, (p, q) in enumerate(zip(dense, ref.dense_parameters()))}}
    errs["losses"] = rel(got, want)
    if max(errs.values()) > 1e-9:
        return False, f"relative error {errs} > 1e-9"
    if sync and clipped < STEPS:
        return False, f"the clip bound only {clipped} of {STEPS} steps: it tests nothing"
    return True, ""
