"""A WDL written in PyTorch, trained with pshybrid.torch; launched by tests/test_torch.py.

Its parameters have the native WDL's names, shapes and forward pass (``pshybrid.models``:
``wide.dense`` and the ``over`` MLP, weights (d_in, d_out), one fused table of width D + 1
whose last column is the per-id linear weight), so it resumes from a native checkpoint.
Each worker writes OUT-<w>.npz: per-step local losses, start and final dense parameters
(flat, in registration order) and start and final tables.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

import pshybrid.torch as pt
from pshybrid.torch.session import session


class Lin(torch.nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        a = (6.0 / (d_in + d_out)) ** 0.5
        self.weight = torch.nn.Parameter(torch.empty(d_in, d_out).uniform_(-a, a))
        self.bias = torch.nn.Parameter(torch.zeros(d_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class WDL(torch.nn.Module):
    def __init__(self, sch, D, mlp):
        super().__init__()
        self.D, self.F = D, len(sch.cardinalities)
        self.wide = torch.nn.Module()
        self.wide.dense = Lin(sch.n_dense, 1)
        sizes = [sch.n_dense + self.F * D, *mlp, 1]
        self.over = torch.nn.ModuleList(Lin(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.emb = pt.Embedding("sparse")
        self.offsets = torch.tensor(np.concatenate(([0], np.cumsum(sch.cardinalities)[:-1])))

    def forward(self, dense, sparse):
        e = self.emb(sparse + self.offsets)                       # (B, F, D + 1)
        x = torch.cat([dense, e[:, :, :self.D].reshape(len(dense), -1)], 1)
        for i, layer in enumerate(self.over):
            x = layer(x)
            if i < len(self.over) - 1:
                x = torch.relu(x)
        return self.wide.dense(dense)[:, 0] + e[:, :, self.D].sum(1) + x[:, 0]


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sparse-opt", default="adagrad")
    p.add_argument("--dense-opt", default="adam")
    p.add_argument("--mode", default="hybrid")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--resume")
    p.add_argument("--checkpoint")
    p.add_argument("--checkpoint-at", type=int, default=-1)
    a = p.parse_args(argv)
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1)
    sch = pt.schema(a.data)
    D = 4
    pt.init(servers=a.servers, mode=a.mode, seed=3, resume=a.resume,
            tables=[pt.Table("sparse", rows=sum(sch.cardinalities), dim=D + 1,
                             optimizer=a.sparse_opt, lr=0.2, dtype=torch.float64)])
    print("after init", flush=True)  # server ranks never get here: they exit 0 in init
    model = WDL(sch, D, (8, 6))
    make = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[a.dense_opt]
    opt = pt.DistributedOptimizer(make(model.parameters(), lr=0.05), model, bucket_mb=1e-6)
    s = session()
    start = (opt.ps.flat.copy(), s.mode.full_table())
    losses = []
    for batch in pt.batches(a.data, a.batch, steps=a.steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(batch.dense, batch.sparse), batch.label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if s.step == a.checkpoint_at:
            pt.checkpoint(a.checkpoint)
    opt.sync_params()
    np.savez(f"{a.out}-{pt.worker_index()}.npz", losses=np.array(losses), flat0=start[0],
             table0=start[1], flat=opt.ps.flat, table=s.mode.full_table(),
             names=np.array(opt.ps.names))
    pt.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
