"""Optimizers, written once for dense buffers and sparse rows alike (xp arrays).

``update(w, g, state, step)`` updates ``w`` in place from gradient ``g`` (same shape)
with state arrays ``state[slot]`` (same shape, zero-initialised) at 1-based ``step``:

    sgd      w -= lr * g
    adagrad  a += g*g;                      w -= lr * g / (sqrt(a) + eps)
    adam     m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
             w -= lr * (m / (1 - b1**step)) / (sqrt(v / (1 - b2**step)) + eps)
             (computed as m / (sqrt(v) * (1 / sqrt(1-b2**step)) + eps) * (lr / (1-b1**step)),
             in place with one scratch buffer: equal up to float rounding)

Dense parameters pass the whole flat buffer. Sparse tables pass the gathered rows a step
touched (the union over all workers) and scatter them back: *lazy* updates, so rows no
worker touched keep their weights and state unchanged (for Adam: their moments do not
decay), and ``step`` is the global step for bias correction (TensorFlow's LazyAdam).
Adam's ``step`` in the formulas is ``steps_before + step``: a run started from another's
state (``--init-from``) goes on counting that run's steps (its learning-rate schedule does
not: ``lr_at(step)``).

L2 (``l2`` = lambda > 0) is coupled: every formula above sees ``g + lambda * w`` (``w``
before the step) in place of ``g``: on the dense buffer every step, on sparse rows only
the rows the step touched.

Flush to zero: after each step, Adam's ``m`` and ``v`` values whose magnitude is below the
smallest normal number ``np.finfo(dtype).tiny`` (1.2e-38 in float32) are set to 0; with L2,
every weight and optimizer state value below ``sqrt(np.finfo(dtype).tiny)`` (1.1e-19).
Where the gradient is 0 (a dead ReLU unit's weights) Adam's moments shrink geometrically
(``m`` by ``beta1`` a step: from 1e-4 subnormal in float32 after ~750 steps, where it stays,
``0.9`` times the smallest subnormal rounding back to it), and L2 alone shrinks such
weights likewise; subnormal numbers the CPU computes many times slower than normal ones
(docs/benchmarks.md). A moment below ``tiny`` changes no update (``m / eps``, ``sqrt(v)``
beside ``eps``: below 1e-29); with L2, below ``sqrt(tiny)`` a value cannot matter beside
any normal-sized term (float32 epsilon 1.2e-7), and a product of two values above it is
normal.
The learning rate of step ``s`` is ``lr * schedule.factor(s)``
(``Schedule``; the same factor for dense and sparse updates, on workers and servers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import kernels, pool
from .backend import array_module
from .errors import ConfigError

_ROW0 = np.zeros(1, np.int64)  # the one row of a dense buffer seen as (1, n)
SLOTS = {"sgd": (), "adagrad": ("acc",), "adam": ("m", "v")}
# Optimizers with fused kernels (numba ``row_kernel``, CUDA ``kernels/fused.cu``); another
# one registered in SLOTS runs its array form (``Optimizer._update_xp``) everywhere. Named
# here, not taken from SLOTS: a kind added to SLOTS must not ask for kernels it has not got.
FUSED = frozenset(("sgd", "adagrad", "adam"))


def needs_weights(kind: str, l2: float) -> bool:
    """The update reads the weights it changes (a state, or L2): it cannot be a blind
    ``-lr * g`` push, and must see each touched row once (the union over workers): it runs
    where the rows live, the servers, which receive the rows' gradient sums."""
    return kind != "sgd" or l2 > 0


# The embedding rows' learning rate where none is given (``--lr none``): Adam's steps are
# ~lr whatever the gradient's size, so the rate that suits Adagrad's rows (0.05) is far too
# large for it; plain SGD's steps are lr times the gradient of the batch's mean loss, which
# a row seen once in a batch of b gets as ~1/b of a sample's, so it needs a larger rate
# (docs/benchmarks.md, "Design measurements behind the code")
SPARSE_LR = {"sgd": 0.5, "adagrad": 0.05, "adam": 0.001}
# The dense parameters' rate where none is given (``--dense-lr none``): 0.001 suits Adam,
# and left plain SGD's MLP far behind; 0.05 made DCN's cross layers diverge
DENSE_LR = {"adam": 0.001, "sgd": 0.01}
SCHEDULES = ("constant", "warmup-linear", "cosine")


@dataclass(frozen=True)
class Schedule:
    """The learning-rate factor of 1-based step ``s`` with ``K`` = ``warmup_steps`` and ``T``
    = ``total_steps``: ``s / K`` while ``s <= K``; after it, with ``p = (s - K - 1) / (T - K)``
    (0 at the first step after the warm-up, clipped to [0, 1]): ``constant`` 1,
    ``warmup-linear`` ``1 - p``, ``cosine`` ``(1 + cos(pi * p)) / 2``."""

    kind: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 0

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ConfigError(f"unknown learning-rate schedule {self.kind!r}: choose from "
                              f"{', '.join(SCHEDULES)}", collective=True)

    def factor(self, step: int) -> float:
        K, T = self.warmup_steps, self.total_steps
        if K and step <= K:
            return step / K
        if self.kind == "constant" or T <= K:
            return 1.0
        p = min(max((step - K - 1) / (T - K), 0.0), 1.0)
        return 1.0 - p if self.kind == "warmup-linear" else 0.5 * (1.0 + math.cos(math.pi * p))


@dataclass(frozen=True)
class Optimizer:
    kind: str
    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    l2: float = 0.0
    schedule: Schedule = Schedule()
    steps_before: int = 0  # the steps the state saw before step 1 (Adam's count goes on)

    def __post_init__(self):
        if self.kind not in SLOTS:
            raise ConfigError(f"unknown optimizer {self.kind!r}: choose from {sorted(SLOTS)}",
                              collective=True)

    @property
    def slots(self) -> tuple[str, ...]:
        """Names of the state arrays this optimizer keeps beside each weight."""
        return SLOTS[self.kind]

    @property
    def needs_weights(self) -> bool:
        return needs_weights(self.kind, self.l2)

    def lr_at(self, step: int) -> float:
        """The learning rate of 1-based ``step``."""
        return self.lr * self.schedule.factor(step)

    def update(self, w, g, state: dict, step: int) -> None:
        """w, g, state[*]: same shape; updated in place. step: 1-based. On contiguous
        NumPy arrays the fused numba kernel does it in one pass over a (1, n) view; on CuPy
        arrays (contiguous, one dtype) the fused CUDA kernel (``cuda.dense_update``)."""
        if array_module(w) is not np and self.kind in FUSED:  # a GPU worker's: one kernel
            from . import cuda

            cuda.dense_update(self.kind, w, g, [state[k] for k in self.slots],
                              self.scalars(w.dtype.type, step))
        elif not self._fused(w, _ROW0, g, state, step, consume=False, whole=True):
            self._update_xp(w, g, state, step)

    def _update_xp(self, w, g, state: dict, step: int) -> None:
        """The array-expression form (NumPy or CuPy): the oracle of the fused kernels."""
        xp, lr = array_module(w), self.lr_at(step)
        if self.l2:
            g = g + self.l2 * w
        if self.kind == "sgd":
            w -= lr * g
        elif self.kind == "adagrad":
            acc = state["acc"]
            acc += g * g
            w -= lr * g / (xp.sqrt(acc) + self.eps)
        elif self.kind != "adam":
            raise ConfigError(f"optimizer {self.kind!r} has no rule in Optimizer._update_xp",
                              collective=True)
        else:
            m, v = state["m"], state["v"]
            m *= self.beta1
            m += (1 - self.beta1) * g
            g2 = g * g  # the one scratch buffer; reused below
            g2 *= 1 - self.beta2
            v *= self.beta2
            v += g2
            den = xp.sqrt(v, out=g2)
            t = self.steps_before + step
            den *= 1 / math.sqrt(1 - self.beta2 ** t)
            den += self.eps
            upd = xp.divide(m, den, out=den)
            upd *= lr / (1 - self.beta1 ** t)
            w -= upd
        tiny = self.flush_bound(w.dtype.type)  # flush to zero (module docstring):
        for a in ([w, *(state[k] for k in self.slots)] if self.l2 else  # with L2 all,
                  [state["m"], state["v"]] if self.kind == "adam" else []):  # else Adam's
            a[xp.abs(a) < tiny] = 0

    def update_rows(self, w, rows, g, state: dict, step: int, threads: int = 1) -> None:
        """Lazy sparse update of ``w[rows]`` (w: (N, D), rows: (U,) unique, g: (U, D));
        ``state[slot]``: (N, D) arrays updated at the same rows. On NumPy arrays a fused
        numba kernel does it in one pass (same operations in the same order), on up to
        ``threads`` threads (chunks of ``rows``; the same bits as one thread)."""
        if self._fused(w, rows, g, state, step, consume=False, threads=threads):
            return
        W = w[rows]
        S = {k: state[k][rows] for k in self.slots}
        self._update_xp(W, g, S, step)
        w[rows] = W
        for k in self.slots:
            state[k][rows] = S[k]

    def apply_slot(self, w, g, state: dict, step: int, rows=None, threads: int = 1) -> None:
        """Servers: update ``w`` from a gradient-sum slot ``g`` (same shape as ``w``) and
        zero what was used: rows ``rows`` of (N, D) arrays lazily, or (``rows`` None)
        everything. Fused into one pass on NumPy arrays, on up to ``threads`` threads."""
        if rows is None:
            if not self._fused(w, _ROW0, g, state, step, consume=True, whole=True,
                               threads=threads):
                self._update_xp(w, g, state, step)
                g[...] = 0
        elif not self._fused(w, rows, g, state, step, consume=True, threads=threads):
            self.update_rows(w, rows, g[rows], state, step)
            g[rows] = 0

    def _fused(self, w, rows, g, state, step, consume: bool, whole: bool = False,
               threads: int = 1) -> bool:
        """Run the numba row kernel when every array is a contiguous NumPy array of one
        dtype (``whole``: any shape, seen as one row (1, n)); False: not applicable.
        ``threads`` > 1: on contiguous chunks of ``rows`` (or of the whole buffer's values)
        at once (``pool``); the rows are distinct, so the bits are those of one thread."""
        arrays = [w, g] + [state[k] for k in self.slots]
        if not (self.kind in FUSED and kernels.numba_active()
                and all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays)
                and len({a.dtype for a in arrays}) == 1 and (whole or w.ndim == g.ndim == 2)):
            return False
        kernel = self._kernel(w.dtype.type, step, consume)
        if whole:  # flat views (the arrays are contiguous), cut into (1, b - a) pieces
            flat = [a.reshape(-1) for a in [w, g] + [state[k] for k in self.slots]]
            pool.run(lambda a, b: kernel(*(x[a:b].reshape(1, -1) for x in flat), _ROW0),
                     pool.spans(flat[0].size, threads, pool.MIN_VALUES_PER_THREAD))
            return True
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        S = [state[k] for k in self.slots]
        if consume:  # g is shaped like w: every chunk reads its own rows of it
            pool.run(lambda a, b: kernel(w, g, *S, rows[a:b]),
                     pool.spans(rows.size, threads, pool.MIN_ROWS_PER_THREAD))
        else:
            pool.run(lambda a, b: kernel(w, g[a:b], *S, rows[a:b]),
                     pool.spans(rows.size, threads, pool.MIN_ROWS_PER_THREAD))
        return True

    def flush_bound(self, f):
        """In dtype ``f``: the magnitude below which the flushed values become 0 (module
        docstring): ``sqrt(finfo.tiny)`` with L2 (every weight and state value), else
        ``finfo.tiny`` (Adam's moments)."""
        tiny = np.finfo(f).tiny
        return f(math.sqrt(tiny)) if self.l2 else f(tiny)

    def scalars(self, f, step: int) -> tuple:
        """Step ``step``'s scalars of the fused kernels, in dtype ``f`` (as NumPy's weak
        Python scalars are), in their argument order: sgd (lr, l2, tiny), adagrad (lr, eps,
        l2, tiny), adam (b1, 1 - b1, b2, 1 - b2, 1 / sqrt(1 - b2**step), eps,
        lr / (1 - b1**step), l2, tiny); ``tiny``: ``flush_bound``."""
        lr, l2, tiny = f(self.lr_at(step)), f(self.l2), self.flush_bound(f)
        if self.kind == "sgd":
            return lr, l2, tiny
        if self.kind == "adagrad":
            return lr, f(self.eps), l2, tiny
        if self.kind != "adam":
            raise ValueError(f"optimizer {self.kind!r} has no fused kernels (optim.FUSED)")
        t = self.steps_before + step
        return (f(self.beta1), f(1 - self.beta1), f(self.beta2), f(1 - self.beta2),
                f(1 / math.sqrt(1 - self.beta2 ** t)), f(self.eps),
                f(self.lr_at(step) / (1 - self.beta1 ** t)), l2, tiny)

    def _kernel(self, f, step: int, consume: bool):
        """``row_kernel`` of this optimizer with step ``step``'s scalars (``scalars``)."""
        return row_kernel(self.kind, self.scalars(f, step), consume)


def row_kernel(kind: str, scalars: tuple, consume: bool):
    """``kernel(w, g, *state (in ``SLOTS[kind]`` order), rows)``: the numba row kernel of
    optimizer ``kind`` with ``scalars`` (``Optimizer.scalars``) bound."""
    if kind == "sgd":
        return lambda w, g, rows: kernels._nb_sgd_rows(w, rows, g, consume, *scalars)
    if kind == "adagrad":
        return lambda w, g, acc, rows: kernels._nb_adagrad_rows(w, acc, rows, g, consume,
                                                                *scalars)
    if kind != "adam":
        raise ValueError(f"optimizer {kind!r} has no fused row kernel (optim.FUSED)")
    return lambda w, g, m, v, rows: kernels._nb_adam_rows(w, m, v, rows, g, consume, *scalars)
