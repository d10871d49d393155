"""Built-in synthetic CTR stream: Criteo-like fields, Zipf ids, labels from a planted model.

Random access by global row index and deterministic by seed, so any worker can read its
slice of any global batch (``data.BatchPlan``) and a single process reads exactly the same
rows.
Rows are made in blocks of ``BLOCK`` rows; block ``k`` draws from
``numpy.random.default_rng([seed, k])``, in this order: dense ``(BLOCK, n_dense)``
``= log1p(exponential(scale_j))`` with ``scale_j = 10 ** (2 j / (n_dense - 1))``;
``q ~ U[0,1)`` ``(BLOCK, F)``, turned into ids by the inverse CDF of a Zipf law truncated
to each field, ``P(id = i) ∝ (i + 1) ** -zipf`` for ``i < cardinality_f`` (fields of more
than ``EXACT_CDF_MAX`` ids use the continuous power law instead, so no table of that size
is built: ``id = floor((1 - q (1 - (C+1) ** (1-a))) ** (1/(1-a))) - 1``); then
``u ~ U[0,1)`` ``(BLOCK,)``. The planted model is

    logit = bias + sum_f w[offset_f + id_f] + sum_j v_j * (dense_j - mean_j)
    label = 1 if u < sigmoid(logit) else 0

with ``w[r]`` uniform in ``[-field_scale, field_scale)`` from ``initializers.uniform_rows``
(seed, table ``"planted"``, dim 1, ``offset_f`` = sum of the cardinalities before f),
``v_j`` likewise (table ``"planted:dense"``, ``dense_scale``), ``mean_j`` the mean of
``log1p(exponential(scale_j))`` over 4096 draws of ``default_rng([seed, 2**31])``, and
``bias`` (default -1.0: a base rate near 0.3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .initializers import uniform_rows
from .schema import Schema, field_offsets

BLOCK = 512
EXACT_CDF_MAX = 1 << 20
# Criteo Kaggle cardinalities, capped at 100k rows per field for a laptop-sized default.
CRITEO_LIKE = (1460, 583, 100000, 100000, 305, 24, 12517, 633, 3, 93145, 5683, 100000, 3194,
               27, 14992, 100000, 10, 5652, 2173, 4, 100000, 18, 15, 100000, 105, 100000)


@dataclass
class SyntheticCTR:
    seed: int = 0
    n_dense: int = 13
    cardinalities: tuple[int, ...] = CRITEO_LIKE
    zipf: float = 1.1
    field_scale: float = 0.6
    dense_scale: float = 0.4
    bias: float = -1.0
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def schema(self) -> Schema:
        return Schema(self.n_dense, tuple(self.cardinalities))

    def _planted(self):
        if "planted" not in self._cache:
            v = np.empty((self.n_dense, 1))
            uniform_rows(v, np.arange(self.n_dense), self.seed, "planted:dense", self.dense_scale)
            scales = 10.0 ** (2.0 * np.arange(self.n_dense) / max(1, self.n_dense - 1))
            mean = np.log1p(np.random.default_rng([self.seed, 2**31]).exponential(
                scales, size=(4096, self.n_dense))).mean(0)
            cdfs = [np.cumsum(np.arange(1, c + 1, dtype=np.float64) ** -self.zipf)
                    if c <= EXACT_CDF_MAX else c for c in self.cardinalities]
            offsets = field_offsets(self.cardinalities)
            self._cache["planted"] = (v[:, 0], scales, mean, cdfs, offsets)
        return self._cache["planted"]

    def _block(self, k: int):
        hit = self._cache.get(("block", k))
        if hit is not None:
            return hit
        v, scales, mean, cdfs, offsets = self._planted()
        rng = np.random.default_rng([self.seed, k])
        dense = np.log1p(rng.exponential(scales, size=(BLOCK, self.n_dense)))
        q = rng.random((BLOCK, len(self.cardinalities)))
        sparse = np.empty(q.shape, np.int64)
        a1 = 1.0 - self.zipf
        for f, cdf in enumerate(cdfs):
            if isinstance(cdf, int):  # continuous power law on [1, C+1)
                x = (1.0 - q[:, f] * (1.0 - (cdf + 1.0) ** a1)) ** (1.0 / a1)
                sparse[:, f] = np.clip(np.floor(x).astype(np.int64) - 1, 0, cdf - 1)
            else:
                sparse[:, f] = np.minimum(np.searchsorted(cdf, q[:, f] * cdf[-1],
                                                          side="right"), cdf.size - 1)
        w = np.empty((sparse.size, 1))
        uniform_rows(w, (sparse + offsets).ravel(), self.seed, "planted", self.field_scale)
        logit = self.bias + (dense - mean) @ v + w.reshape(sparse.shape).sum(1)
        u = rng.random(BLOCK)
        p = 1.0 / (1.0 + np.exp(-logit))
        out = ((u < p).astype(np.float32), dense.astype(np.float32), sparse, p)
        self._cache = {k2: v2 for k2, v2 in self._cache.items() if k2 == "planted"
                       or k2[1] >= k - 1}  # keep the planted model and the last blocks
        self._cache[("block", k)] = out
        return out

    def rows(self, start: int, stop: int):
        """Rows ``[start, stop)``: label (n,) float32, dense (n, 13) float32,
        sparse (n, 26) int64 per-field ids in [0, cardinality_f)."""
        return self._slice(start, stop)[:3]

    def planted_probability(self, start: int, stop: int) -> np.ndarray:
        """The planted model's click probability of rows ``[start, stop)``: (n,) float64."""
        return self._slice(start, stop)[3]

    def _slice(self, start: int, stop: int):
        parts = [self._block(k) for k in range(start // BLOCK, -(-stop // BLOCK))]
        cat = [np.concatenate(p) for p in zip(*parts)] if parts else None
        off = (start // BLOCK) * BLOCK
        return tuple(c[start - off:stop - off] for c in cat)


def write_synthetic(out: str, rows: int, valid_fraction: float = 0.0,
                    valid_out: str | None = None, chunk: int = 65536, **generator) -> dict:
    """Write ``rows`` rows of ``SyntheticCTR(**generator)`` to ``out`` (the last
    ``round(valid_fraction * rows)`` to ``valid_out``), each file atomically and both
    published together at the end (a failure leaves neither), with the planted model's own
    AUC on that file's rows as attribute ``planted_auc``. Returns {path: (rows, planted_auc)}."""
    from .data import DatasetWriter
    from .metrics import auc

    gen = SyntheticCTR(**generator)
    sch = gen.schema
    n_valid = int(round(valid_fraction * rows))
    parts = [(out, 0, rows - n_valid)] + ([(valid_out, rows - n_valid, rows)] if n_valid else [])
    done, writers = {}, []
    try:
        for path, a, b in parts:
            w = DatasetWriter(path, sch.dense_names, sch.sparse_names)
            writers.append(w)
            labels, probs = [], []
            for s in range(a, b, chunk):
                e = min(b, s + chunk)
                label, dense, sparse = gen.rows(s, e)
                w.append(label, dense, sparse)
                labels.append(label)
                probs.append(gen.planted_probability(s, e))
            planted = auc(np.concatenate(probs), np.concatenate(labels)) if b > a else float("nan")
            w.finish(sch.cardinalities, planted_auc=planted, source="pshybrid prep synthetic",
                     transform=f"SyntheticCTR(seed={gen.seed}, zipf={gen.zipf}) rows [{a}, {b})")
            done[path] = (b - a, planted)
        for w in writers:
            w.publish()
    except BaseException:
        for w in writers:
            w.abort()
        raise
    return done
