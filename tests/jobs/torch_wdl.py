"""A WDL written in PyTorch, trained with pshybrid.torch; launched by tests/test_torch.py.

Its parameters have the native WDL's names, shapes and forward pass (``pshybrid.models``:
``wide.dense`` and the ``over`` MLP, weights (d_in, d_out), one fused table of width D + 1
whose last column is the per-id linear weight; multi-hot fields pooled by ``--pooling``
over the whole row, as ``models.Pooled``), so it resumes from a native checkpoint.
Each worker writes OUT-<w>.npz: per-step local losses, start and final dense parameters
(flat, in registration order) and start and final tables.
"""

from __future__ import annotations

import argparse
import functools
import itertools
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
    def __init__(self, sch, D, mlp, pooling="sum"):
        super().__init__()
        self.D, self.F, self.F1 = D, len(sch.cardinalities), sch.n_single
        self.wide = torch.nn.Module()
        self.wide.dense = Lin(sch.n_dense, 1)
        sizes = [sch.n_dense + self.F * D, *mlp, 1]
        self.over = torch.nn.ModuleList(Lin(a, b) for a, b in itertools.pairwise(sizes))
        self.emb, self.bag = pt.Embedding("sparse"), pt.EmbeddingBag("sparse", pooling)
        self.offsets = torch.tensor(np.concatenate(([0], np.cumsum(sch.cardinalities)[:-1])))
        self.bag_names = sch.sparse_names[self.F1:]

    def forward(self, dense, sparse, bags=None):
        e = self.emb(sparse + self.offsets[:self.F1])            # (B, F1, D + 1)
        if self.bag_names:                                       # (B, F, D + 1)
            e = torch.cat([e, torch.stack([self.bag(bags[n][0] + self.offsets[self.F1 + k],
                                                    bags[n][1])
                                           for k, n in enumerate(self.bag_names)], 1)], 1)
        x = torch.cat([dense, e[:, :, :self.D].reshape(len(dense), -1)], 1)
        for i, layer in enumerate(self.over):
            x = layer(x)
            if i < len(self.over) - 1:
                x = torch.relu(x)
        return self.wide.dense(dense)[:, 0] + e[:, :, self.D].sum(1) + x[:, 0]


def evaluate(model, path, out):
    """Logits and labels of every row of ``path`` (no gradients: nothing recorded)."""
    import h5py

    with h5py.File(path, "r") as f, torch.no_grad():
        label, dense, sparse = f["label"][...], f["dense"][...], f["sparse"][...]
        z = [model(torch.from_numpy(dense[i:i + 4096]).to(torch.get_default_dtype()),
                   torch.from_numpy(sparse[i:i + 4096])) for i in range(0, len(label), 4096)]
    np.savez(out, logits=torch.cat(z).numpy(), label=label)


def parser():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out")
    p.add_argument("--sparse-opt", default="adagrad")
    p.add_argument("--dense-opt", default="adam")
    p.add_argument("--mode", default="hybrid")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--placement", default="dedicated")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--resume")
    p.add_argument("--checkpoint")
    p.add_argument("--checkpoint-at", type=int, default=-1)
    p.add_argument("--valid", help="worker 0 writes its logits on this file's rows")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--dim", type=int, default=4)
    p.add_argument("--mlp", default="8,6")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--dense-lr", type=float, default=0.05)
    p.add_argument("--float32", action="store_true")
    p.add_argument("--pooling", default="sum")
    return p


def run(a, comm=None, exit_servers=True):
    """Train; a worker returns its results (a server None, with ``exit_servers`` False)."""
    dtype = torch.float32 if a.float32 else torch.float64
    torch.set_default_dtype(dtype)
    torch.manual_seed(1)
    sch = pt.schema(a.data)
    D = a.dim
    colocated = a.placement == "colocated"
    if not pt.init(servers=None if colocated else a.servers, mode=a.mode, seed=3,
                   resume=a.resume, comm=comm, exit_servers=exit_servers, placement=a.placement,
                   tables=[pt.Table("sparse", rows=sum(sch.cardinalities), dim=D + 1,
                                    optimizer=a.sparse_opt, lr=a.lr, dtype=dtype)]):
        return None
    print("after init", flush=True)  # server ranks never get here: they exit 0 in init
    model = WDL(sch, D, [int(x) for x in a.mlp.split(",")], a.pooling)
    make = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD, "adamw": torch.optim.AdamW,
            "adagrad": torch.optim.Adagrad,  # (rmsprop: state beyond the native slots)
            "rmsprop": functools.partial(torch.optim.RMSprop, momentum=0.5, centered=True)
            }[a.dense_opt]
    opt = pt.DistributedOptimizer(make(model.parameters(), lr=a.dense_lr), model,
                                  bucket_mb=1e-6)
    s = session()
    start = (opt.params.flat.copy(), s.mode.full_table())
    losses = []
    steps = a.steps if a.steps > 0 else None
    for batch in pt.batches(a.data, a.batch, steps=steps, epochs=a.epochs,
                            start=pt.steps_done()):  # a resumed run continues
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(batch.dense, batch.sparse, batch.bags), batch.label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if s.step == a.checkpoint_at:
            pt.checkpoint(a.checkpoint)
    opt.sync_params()
    if a.valid and pt.worker_index() == 0:
        evaluate(model, a.valid, f"{a.out}-valid.npz")
    out = {"losses": np.array(losses), "flat0": start[0], "table0": start[1],
           "flat": opt.params.flat.copy(), "table": s.mode.full_table(), "worker": pt.worker_index()}
    pt.shutdown()
    return out


if __name__ == "__main__":
    args = parser().parse_args(sys.argv[1:])
    res = run(args)
    np.savez(f"{args.out}-{res.pop('worker')}.npz", **res)
