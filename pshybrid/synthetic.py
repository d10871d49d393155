"""Built-in synthetic CTR stream: Criteo-like fields, Zipf ids, labels from a planted model.

Every value of row ``r`` is a pure function of ``(seed, r)``: any worker generates only its
own rows of any global batch (``batches.BatchPlan``), in one pass straight into its buffers, and one
process reading the global batch gets exactly the same rows, whatever the split.

Generation rule (``F`` sparse fields of cardinalities ``C_f``, ``n_dense`` dense columns,
``K = n_dense + F + 1``; uint64 arithmetic wraps mod 2**64, ``>>`` is a logical shift):

- **Hash.** ``z(r, c)`` for column ``c`` in ``[0, K)`` is ``initializers``' hash of element
  ``(r, c)`` of a table named ``"synthetic"`` of width ``K``::

      x = table_key(seed, "synthetic") + (r * K + c + 1) * 0x9E3779B97F4A7C15
      z = splitmix64_finalizer(x);   u(r, c) = (z >> 11) * 2**-53  in [0, 1)

  Column ``j < n_dense`` is dense column j, ``n_dense + f`` sparse field f, ``K - 1`` the label.
- **Dense** j: ``d_j = log1p(s_j * E)``, ``E = -log(1 - u)`` (``log1p(Exponential(s_j))``,
  by inversion), ``s_j = 10 ** (2 j / max(1, n_dense - 1))``; in float64 with NumPy's
  ``log`` (``1 - u`` is exact), ``log1p(y)`` as ``log(w) - ((w - 1) - y) / w``, ``w = 1 + y``
  (NumPy's ``log1p`` costs twice its ``log`` on CPUs without AVX-512: docs/benchmarks.md);
  delivered as float32.
- **Sparse** f with ``C = C_f <= 2**20``: exact truncated Zipf, ``P(id = i) ∝ (i + 1) ** -zipf``
  for ``i < C``, by Walker alias tables (``alias_table``) drawn with integers only. A draw
  from a table of ``n`` cells by a uint64 ``z``::

      t = (z >> 32) * n + (((z & 0xFFFFFFFF) * n) >> 32)   # floor(z * n / 2**32) < 2**64
      k = t >> 32                   # floor(z * n / 2**64): a uniform cell in [0, n)
      draw = k  if (t & 0xFFFFFFFF) < T[k]  else  A[k]    # entry k stored as A << 32 | T

  Fields of at most ``HEAD = 4096`` ids: one table over ``w_i = (i + 1) ** -zipf``, id = the
  draw by ``z(r, c)``. Larger fields: a head table over ``w_0 .. w_4095`` plus one entry of
  weight ``sum(w_4096 ..)`` (the tail), and a tail table over ``w_4096 .. w_{C-1}``; id = the
  head draw by ``z(r, c)``; if that is 4096 (the tail entry), id = 4096 + the tail draw by
  ``splitmix64_finalizer(z(r, c))``. (The head table stays in cache; only tail draws touch
  the large table.)
  A table over weights ``w`` (n of them, NumPy float64 ``w ** -zipf`` and ``w.sum()``):
  integer weights ``W``: ``x = w * (n * 2**32 / sum(w))``, ``W = floor(x)``, plus 1 for the
  ``n * 2**32 - sum(W)`` largest ``x - W`` (ties: smaller index first); so the table draws
  ``i`` with probability exactly ``W_i / (n 2**32)``, the law rounded to < 2**-32 / n. Then
  Vose's sweep as prefix sums, in int64 (Hübschle-Schneider and Sanders' construction):
  lights ``L`` (``W < 2**32``) and heavies ``H``, each in index order; ``d = 2**32 - W[L]``,
  ``D = cumsum(d)``, ``E = cumsum(W[H] - 2**32)`` (``E[-1] == D[-1]``). Light ``L[i]``:
  ``T = W``, ``A = H[j]``, ``j`` the first index with ``E[j] >= D[i] - d[i]``. Heavy ``H[j]``:
  with ``i`` the first index with ``D[i] > E[j]``, ``T = 2**32 + E[j] - D[i]`` and
  ``A = H[j + 1]``; no such ``i``: ``T = 2**32 - 1``, ``A = H[j]`` (itself: drawn always).
  Fields of more than 2**20 ids use the continuous power law on ``[1, C + 1)`` (no table
  of that size is built): ``q = u(r, c)``, ``x = (1 - q (1 - (C + 1) ** (1 - zipf))) **
  (1 / (1 - zipf))`` (``(C + 1) ** q`` when zipf = 1), ``id = clip(floor(x) - 1, 0, C - 1)``,
  with the C library's ``pow`` (the continuous law, so not exact).
- **Label** from the planted logistic model, summed in this order (float64)::

      logit = bias;  logit += w[offset_f + id_f] for f = 0..F-1
      logit += v_j * (d_j - mean_j) for j = 0..n_dense-1
      p = 1 / (1 + exp(-logit));   label = 1 if u(r, K - 1) < p else 0

  ``w[g]`` is row ``g`` of ``initializers.uniform_rows`` (seed, table ``"planted"``, dim 1,
  scale ``field_scale``), ``offset_f`` the sum of the cardinalities before f; ``v_j`` likewise
  (table ``"planted:dense"``, ``dense_scale``); ``mean_j`` = the mean of ``d_j`` at the 4096
  midpoints ``u = (k + 0.5) / 4096`` (NumPy's mean); ``bias`` default -1.0 (a base rate near 0.3).

The integer and table part, and the arithmetic between the ufuncs, run in numba kernels
(``datakernels``, each with a NumPy twin that gives the same bits); ``log`` and ``exp`` run
as NumPy ufuncs over the batch in both paths.
A re-implementation with another ``log``/``exp``/``pow`` may differ in the last bit of a
float64, which changes a float32 dense value or a label only when it falls on a rounding
boundary (probability ~2**-29 per dense value, ~2**-52 per label).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import datakernels
from .initializers import table_key, uniform_rows
from .schema import Schema, field_offsets

EXACT_CDF_MAX = 1 << 20  # larger fields: continuous power law (no table)
CAP = 1 << 32  # an alias cell's capacity: thresholds are 32-bit
HEAD = 4096  # fields above: a head table of the first HEAD ids + the tail, and a tail table
MEAN_POINTS = 4096
# Criteo Kaggle's cardinalities (its 26 categorical fields), and capped at 100k rows per
# field: the laptop-sized default (``prep synthetic --max-cardinality`` caps the first)
CRITEO_KAGGLE = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
                 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
                 142572)
CRITEO_LIKE = tuple(min(c, 100_000) for c in CRITEO_KAGGLE)


def zipf_alias(C: int, zipf: float) -> np.ndarray:
    """(C,) uint64 alias table of the Zipf law truncated to ``[0, C)`` (one table, no tail)."""
    return alias_table(np.arange(1, C + 1, dtype=np.float64) ** -float(zipf))


def alias_table(w: np.ndarray) -> np.ndarray:
    """(C,) uint64 alias table ``A << 32 | T`` drawing i with probability ``W[i] / (C 2**32)``,
    ``W`` = ``w`` rounded to integers summing to ``C * 2**32`` (the module docstring states
    the construction; integers throughout, so the table is exact for its ``W``)."""
    C = w.size
    assert 0 < C <= 1 << 21, C
    x = w * (C * CAP / w.sum())  # target counts, summing to C * 2**32 (<= 2**53: exact)
    W = np.floor(x).astype(np.int64)
    short = C * CAP - int(W.sum())  # largest remainder: +1 to the `short` largest fractions
    if short:
        frac = (x - W) if short > 0 else (W - x)  # (< 0 only if the float sum rounded up)
        k = abs(short)
        v = np.partition(frac, C - k)[C - k]  # the k-th largest; ties: the smaller ids
        pick = np.concatenate((np.flatnonzero(frac > v), np.flatnonzero(frac == v)))[:k]
        W[pick] += 1 if short > 0 else -1
    T, alias = np.minimum(W, CAP), np.arange(C, dtype=np.int64)
    light = W < CAP
    L, H = np.flatnonzero(light), np.flatnonzero(~light)
    if L.size:  # (then H.size too: the mean is CAP)
        d = CAP - W[L]
        D = np.cumsum(d)
        E = np.cumsum(W[H] - CAP)  # E[-1] == D[-1]
        alias[L] = H[np.searchsorted(E, D - d, side="left")]  # first j: E[j] >= D0[i]
        i = np.searchsorted(D, E, side="right")  # first i: D[i] > E[j]
        out = i < L.size  # heavies that end below CAP: the rest to the next heavy
        T[H[out]] = CAP + E[out] - D[i[out]]
        alias[H[out]] = H[np.flatnonzero(out) + 1]  # (never the last heavy: it ends at CAP)
    full = T >= CAP
    T[full], alias[full] = CAP - 1, np.flatnonzero(full)  # drawn from always: alias itself
    return (alias.astype(np.uint64) << np.uint64(32)) | T.astype(np.uint64)


def alias_counts(table: np.ndarray) -> np.ndarray:
    """The law an alias table draws, in units of 2**-32 / C (test oracle): (C,) int64; the
    probability of i is ``alias_counts(table)[i] / (C * 2**32)``."""
    T = (table & datakernels.LOW32).astype(np.int64)
    A = (table >> np.uint64(32)).astype(np.int64)
    out = T.copy()
    np.add.at(out, A, CAP - T)
    return out


def alias_pmf(table: np.ndarray) -> np.ndarray:
    """The law an alias table draws: (C,) float64 probabilities."""
    return alias_counts(table) / (table.size * float(CAP))


@dataclass
class _Model:
    key: np.uint64
    pkey: np.uint64
    kinds: np.ndarray      # (F,) int64 datakernels.ALIAS / POWER / POWER_ONE
    cards: np.ndarray      # (F,) int64
    tab: np.ndarray        # alias tables, concatenated (uint64)
    start0: np.ndarray     # (F,) int64: field f's (head) table is tab[start0:start0+size0]
    size0: np.ndarray
    start1: np.ndarray     # its tail table (ALIAS_TAIL fields)
    size1: np.ndarray
    p1: np.ndarray         # (F,) float64 power-law parameters
    p2: np.ndarray
    offsets: np.ndarray    # (F,) int64
    neg_scales: np.ndarray  # (n_dense,) -s_j: y = -s_j * log(1 - u)
    v: np.ndarray          # (n_dense,) planted dense weights
    mean: np.ndarray       # (n_dense,) mean_j


def _log1p_parts(ou, neg_scales) -> np.ndarray:
    """``ou`` (nd, n): 1 - u of each dense cell -> ``log(w)`` of ``d = log(w) - corr`` (the
    rule's ``log1p(s_j * E)``); returns ``corr`` (nd, n), its correction."""
    corr = np.empty_like(ou)
    np.log(ou, out=ou)  # log(1 - u) = -E
    datakernels.log1p_args(ou, neg_scales, corr)  # w = 1 + s_j E and the correction
    np.log(ou, out=ou)
    return corr


def _dense(ou, neg_scales):
    """The rule's dense values d (nd, n) float64 of the cells whose 1 - u is ``ou``."""
    corr = _log1p_parts(ou, neg_scales)
    return ou - corr


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

    def _model(self) -> _Model:
        m = self._cache.get("model")
        if m is None:
            nd, cards = self.n_dense, np.asarray(self.cardinalities, np.int64)
            F, a = cards.size, float(self.zipf)
            v = np.empty((nd, 1))
            uniform_rows(v, np.arange(nd), self.seed, "planted:dense", self.dense_scale)
            scales = 10.0 ** (2.0 * np.arange(nd) / max(1, nd - 1))
            mid = (np.arange(MEAN_POINTS) + 0.5) / MEAN_POINTS
            mean = _dense(np.repeat(1.0 - mid[None], nd, 0), -scales).mean(1)
            kinds, p1, p2 = np.zeros(F, np.int64), np.zeros(F), np.zeros(F)
            start0, size0, start1, size1 = (np.zeros(F, np.int64) for _ in range(4))
            tabs, at = [], 0
            for f, C in enumerate(cards.tolist()):
                if C <= EXACT_CDF_MAX:
                    w = np.arange(1, C + 1, dtype=np.float64) ** -a
                    if C <= HEAD:
                        kinds[f] = datakernels.ALIAS
                        parts = [w]
                    else:
                        kinds[f] = datakernels.ALIAS_TAIL
                        parts = [np.append(w[:HEAD], w[HEAD:].sum()), w[HEAD:]]
                    starts, sizes = (start0, start1), (size0, size1)
                    for k, part in enumerate(parts):
                        starts[k][f], sizes[k][f] = at, part.size
                        tabs.append(alias_table(part))
                        at += part.size
                elif a != 1.0:
                    kinds[f] = datakernels.POWER
                    p1[f], p2[f] = 1.0 - (C + 1.0) ** (1.0 - a), 1.0 / (1.0 - a)
                else:
                    kinds[f], p1[f] = datakernels.POWER_ONE, C + 1.0
            tab = np.concatenate(tabs) if tabs else np.zeros(0, np.uint64)
            m = _Model(table_key(self.seed, "synthetic"), table_key(self.seed, "planted"),
                       kinds, cards, tab, start0, size0, start1, size1, p1, p2,
                       field_offsets(cards), -scales, v[:, 0], mean)
            self._cache["model"] = m
        return m

    def fill(self, start: int, label, dense, ids, fused: bool = False):
        """Generate rows ``[start, start + n)`` into the given buffers: label (n,) float32,
        dense (n, n_dense) float32, ids (n, F) int64 (C-contiguous): per-field ids, or with
        ``fused`` the fused-table rows ``offset_f + id``. Returns the planted click
        probability (n,) float64."""
        m = self._model()
        n = ids.shape[0]
        assert ids.dtype == np.int64 and ids.flags.c_contiguous and ids.shape[1] == m.cards.size
        ou = np.empty((self.n_dense, n))  # 1 - u, column by column
        logit, ulab = np.empty(n), np.empty(n)
        datakernels.synth_rows(int(start), m.key, self.n_dense, m.kinds, m.cards, m.tab,
                               m.start0, m.size0, m.start1, m.size1, m.p1, m.p2, m.pkey,
                               float(self.field_scale),
                               m.offsets, bool(fused), float(self.bias), ou, ids, logit, ulab)
        corr = _log1p_parts(ou, m.neg_scales)
        datakernels.synth_logit(ou, corr, m.v, m.mean, logit, dense)  # -logit, dense = d.T
        np.exp(logit, out=logit)  # p = 1 / (1 + exp(-logit)), in place
        datakernels.synth_labels(logit, ulab, label)
        return logit

    def rows(self, start: int, stop: int):
        """Rows ``[start, stop)``: label (n,) float32, dense (n, n_dense) float32,
        sparse (n, F) int64 per-field ids in [0, cardinality_f)."""
        return self._rows(start, stop)[:3]

    def planted_probability(self, start: int, stop: int) -> np.ndarray:
        """The planted model's click probability of rows ``[start, stop)``: (n,) float64."""
        return self._rows(start, stop)[3]

    def _rows(self, start, stop):
        n = max(0, stop - start)
        label = np.empty(n, np.float32)
        dense = np.empty((n, self.n_dense), np.float32)
        ids = np.empty((n, len(self.cardinalities)), np.int64)
        p = self.fill(start, label, dense, ids)
        return label, dense, ids, p


def write_synthetic(out: str, rows: int, valid_fraction: float = 0.0,
                    valid_out: str | None = None, attrs=None, chunk: int = 65536,
                    **generator) -> dict:
    """Write ``rows`` rows of ``SyntheticCTR(**generator)`` to ``out`` (the last
    ``round(valid_fraction * rows)`` to ``valid_out``), each file atomically and both
    published together at the end (a failure leaves neither), with the planted model's own
    AUC on that file's rows as attribute ``planted_auc`` (and ``attrs``). Returns {path:
    (rows, planted_auc)}."""
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
            # every row's planted probability and label, filled in place (9 B a row; the
            # exact AUC's temporaries, metrics.AUC_BYTES_PER_ROW, come on top)
            probs, labels = np.empty(b - a), np.empty(b - a, bool)
            for s in range(a, b, chunk):
                label, dense, sparse, p = gen._rows(s, min(b, s + chunk))
                w.append(label, dense, sparse)
                labels[s - a:s - a + p.size], probs[s - a:s - a + p.size] = label > 0.5, p
            planted = auc(probs, labels) if b > a else float("nan")
            del probs, labels
            w.finish(sch.cardinalities, planted_auc=planted, source="pshybrid prep synthetic",
                     transform=f"SyntheticCTR(seed={gen.seed}, zipf={gen.zipf}) rows [{a}, {b})",
                     **(attrs or {}))
            done[path] = (b - a, planted)
        for w in writers:
            w.publish()
    except BaseException:
        for w in writers:
            w.abort()
        raise
    return done
