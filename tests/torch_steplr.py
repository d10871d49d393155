"""StepLR on ``pt.DistributedOptimizer`` against plain PyTorch (``torch.nn.Embedding``, the same
torch optimizers, one StepLR each; float64, the global batch in one process): shared by
``tests/test_torch_api.py`` (one process) and ``tests/test_torch_mpi.py`` (W workers).

The model: logit = Linear([dense, emb(ids) flattened]); BCE, each worker's mean over its
local batch. Dense: Adam (lr 0.02); table: Adagrad (lr 0.1; torch's with eps 1e-8 and
dense gradients: untouched rows get zero gradients and do not move, as the lazy rows do).
StepLR(step_size=2, gamma=0.5) over 5 steps: the rates change at steps 2 and 4.
"""

from __future__ import annotations

import numpy as np
import torch

import pshybrid.torch as pt
from pshybrid.torch.session import session

ROWS, D, F, N_DENSE, STEPS, B = 40, 4, 3, 3, 5, 6
LR_DENSE, LR_EMB = 0.02, 0.1


def global_batches(G: int):
    rng = np.random.default_rng(11)
    return [(torch.from_numpy(rng.standard_normal((G, N_DENSE))),
             torch.from_numpy(rng.integers(0, ROWS, (G, F))),
             torch.from_numpy(rng.integers(0, 2, G).astype(np.float64))) for _ in range(STEPS)]


class Model(torch.nn.Module):
    def __init__(self, emb):
        super().__init__()
        self.emb, self.lin = emb, torch.nn.Linear(N_DENSE + F * D, 1)

    def forward(self, dense, ids):
        return self.lin(torch.cat([dense, self.emb(ids).flatten(1)], 1))[:, 0]


def train(model, opts: list, scheds: list, batches) -> list[float]:
    """Per-step losses; each step every optimizer steps, then every scheduler."""
    losses = []
    for dense, ids, label in batches:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, ids), label)
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()
        for s in scheds:
            s.step()
        losses.append(loss.item())
    return losses


def run(comm, mode: str, servers: int):
    """Every rank: (ok, message, (its losses, the native run's) or None on a server); each
    worker compares its final parameters with the native run on the global batch."""
    torch.set_default_dtype(torch.float64)
    if not pt.init(servers=servers, mode=mode, seed=4, comm=comm, exit_servers=False,
                   tables=[pt.Table("t", rows=ROWS, dim=D, optimizer="adagrad", lr=LR_EMB,
                                    dtype=torch.float64)]):
        return True, "", None
    torch.manual_seed(2)
    model = Model(pt.Embedding("t"))
    opt = pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=LR_DENSE), model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    W, w = pt.num_workers(), pt.worker_index()
    table0 = session().mode.full_table().copy()
    ref = Model(torch.nn.Embedding(ROWS, D))
    with torch.no_grad():
        ref.emb.weight.copy_(torch.from_numpy(table0))
        ref.lin.load_state_dict(model.lin.state_dict())
    gb = global_batches(W * B)
    losses = train(model, [opt], [sched], [tuple(x[w * B:(w + 1) * B] for x in b) for b in gb])
    table = session().mode.full_table()
    dense = [p.detach().clone() for p in model.lin.parameters()]
    lrs = [g["lr"] for g in opt.param_groups]
    pt.shutdown()
    ref_opts = [torch.optim.Adam(ref.lin.parameters(), lr=LR_DENSE),
                torch.optim.Adagrad(ref.emb.parameters(), lr=LR_EMB, eps=1e-8)]
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in ref_opts]
    want = train(ref, ref_opts, scheds, gb)
    return check(comm, losses, want, table, ref, dense, lrs, table0)


def rel(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def check(comm, losses, want, table, ref, dense, lrs, table0):
    errs = {"table": rel(table, ref.emb.weight.detach().numpy()),
            **{f"dense{i}": rel(p.numpy(), q.detach().numpy())
               for i, (p, q) in enumerate(zip(dense, ref.lin.parameters()))}}
    ok, msg = True, ""
    if max(errs.values()) > 1e-9:
        ok, msg = False, f"relative error {errs} > 1e-9"
    elif lrs != [LR_DENSE / 4, LR_EMB / 4]:
        ok, msg = False, f"learning rates {lrs} after {STEPS} steps"
    elif rel(table0, table) < 1e-3:
        ok, msg = False, "training barely moved the table"
    return ok, msg, (losses, want)
