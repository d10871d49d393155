"""Dense layers with hand-written backward passes, on one flat parameter buffer.

``ParamSpace`` holds every dense parameter of a model in one flat buffer ``flat`` (P,)
and every gradient in one flat buffer ``flat_grad`` (P,), in registration order, each
parameter contiguous; layers hold only names and look up views (``params.param(name)``,
``params.grad(name)``), so a fused Allreduce of ``flat_grad`` copies nothing.

Initialisation of parameter ``name`` under ``seed`` depends on those values alone:

    rng            = numpy.random.default_rng([seed, crc32(name)])
    zeros / ones   : 0 / 1
    xavier_uniform : rng.uniform(-a, a, size=shape), a = sqrt(6 / (fan_in + fan_out)),
                     (fan_in, fan_out) = shape for 2-D, (n, 1) for 1-D shape (n,)
    uniform        : rng.uniform(-scale, scale, size=shape)
    normal         : rng.standard_normal(shape) * scale

drawn in float64, then cast to the buffer's dtype.

Layers cache in ``forward`` what ``backward`` needs; ``backward(dy)`` returns the input
gradient and accumulates (+=) into the parameter gradients (the trainer zeroes them), then
calls ``params.grads_ready(names)`` for the parameters it has finished (a layer runs once per
backward pass), so the dense Allreduce can start on them during the rest of backward.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from .backend import array_module
from .errors import ConfigError
from .kernels import scatter_add

INITS = ("zeros", "ones", "xavier_uniform", "uniform", "normal")


def _init_values(name: str, shape: tuple[int, ...], init: str, scale: float,
                 seed: int) -> np.ndarray:
    """The documented initial values of one parameter: (*shape) float64."""
    if init == "zeros":
        return np.zeros(shape)
    if init == "ones":
        return np.ones(shape)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if init == "xavier_uniform":
        assert len(shape) in (1, 2), (name, shape)
        fan_in, fan_out = shape if len(shape) == 2 else (shape[0], 1)
        a = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-a, a, size=shape)
    if init == "uniform":
        return rng.uniform(-scale, scale, size=shape)
    return rng.standard_normal(shape) * scale


class ParamSpace:
    """All dense parameters of a model in one flat buffer, their gradients in another."""

    def __init__(self):
        self._specs: dict[str, tuple[tuple[int, ...], str, float]] = {}
        self._offsets: dict[str, int] = {}
        self.size = 0
        self.flat = None
        self.flat_grad = None
        self.on_grads_ready = None  # callback(names) of the running mode, if any

    def add(self, name: str, shape: tuple[int, ...], init: str, scale: float = 0.0) -> None:
        """Register parameter ``name`` of ``shape`` (before ``build``)."""
        assert self.flat is None, f"add({name!r}) after build"
        if name in self._specs:
            raise ValueError(f"parameter {name!r} is already registered")
        if init not in INITS:
            raise ValueError(f"parameter {name!r}: init {init!r} is not one of {INITS}")
        shape = tuple(int(s) for s in shape)
        self._specs[name] = (shape, init, float(scale))
        self._offsets[name] = self.size
        self.size += math.prod(shape)

    def build(self, xp, dtype, seed: int) -> None:
        """Allocate ``flat`` (P,) and zeroed ``flat_grad`` (P,) in ``xp``/``dtype``; initialise."""
        self.flat = xp.zeros(self.size, dtype=dtype)
        self.flat_grad = xp.zeros(self.size, dtype=dtype)
        for name, (shape, init, scale) in self._specs.items():
            values = _init_values(name, shape, init, scale, seed).astype(dtype).ravel()
            o = self._offsets[name]
            self.flat[o:o + values.size] = xp.asarray(values)

    @property
    def names(self) -> list[str]:
        """Parameter names in registration (= buffer) order."""
        return list(self._specs)

    def offset(self, name: str) -> int:
        """First element of ``name`` in ``flat`` / ``flat_grad``."""
        return self._offsets[name]

    def shape(self, name: str) -> tuple[int, ...]:
        """Registered shape of ``name``."""
        return self._specs[name][0]

    def _view(self, buf, name: str):
        assert buf is not None, "ParamSpace.build() has not been called"
        o, shape = self._offsets[name], self._specs[name][0]
        return buf[o:o + math.prod(shape)].reshape(shape)

    def param(self, name: str):
        """View of parameter ``name`` into ``flat``: (*shape)."""
        return self._view(self.flat, name)

    def grad(self, name: str):
        """View of the gradient of ``name`` into ``flat_grad``: (*shape)."""
        return self._view(self.flat_grad, name)

    def zero_grad(self) -> None:
        """Set every gradient to zero."""
        self.flat_grad[...] = 0

    def grads_ready(self, *names: str) -> None:
        """Layers call this once ``names``' gradients are final for this backward pass, so
        a mode can start reducing them while the rest of backward runs (``on_grads_ready``)."""
        if self.on_grads_ready is not None:
            self.on_grads_ready(names)


class Linear:
    """y = x @ W + b, then max(y, 0) with ``relu``; x: (B, d_in), W: (d_in, d_out), b:
    (d_out,) -> y: (B, d_out). On CuPy arrays the bias and the ReLU are one kernel after the
    GEMM, the ReLU's gradient one kernel, and dW accumulates in the GEMM (``cuda``); on
    NumPy they are the expressions below (ReLU: ``y * (y > 0)``, its gradient ``dy * (y >
    0)``: the twins)."""

    def __init__(self, params: ParamSpace, name: str, d_in: int, d_out: int,
                 relu: bool = False):
        self.params, self.w, self.b = params, f"{name}.weight", f"{name}.bias"
        self.relu = relu
        params.add(self.w, (d_in, d_out), "xavier_uniform")
        params.add(self.b, (d_out,), "zeros")

    def forward(self, x):
        """x: (B, d_in) -> (B, d_out)."""
        self.x = x
        w, b = self.params.param(self.w), self.params.param(self.b)
        if array_module(x) is not np:
            from . import cuda

            self.y = cuda.bias_act(x @ w, b, self.relu)  # in place on the GEMM's output
            return self.y
        y = x @ w + b
        if self.relu:
            self.mask = y > 0
            y = y * self.mask
        return y

    def backward(self, dy):
        """dy: (B, d_out) -> dx: (B, d_in); dW += x^T dy, db += sum_B dy (of the ReLU's
        gradient, with ``relu``)."""
        gw, gb = self.params.grad(self.w), self.params.grad(self.b)
        if array_module(dy) is not np:
            from . import cuda

            if self.relu:
                dy = cuda.relu_grad(dy, self.y)
            cuda.gemm_acc(self.x, dy, gw)
        else:
            if self.relu:
                dy = dy * self.mask
            gw += self.x.T @ dy
        gb += dy.sum(axis=0)
        self.params.grads_ready(self.w, self.b)
        return dy @ self.params.param(self.w).T


class MLP:
    """Linear layers ``{name}.{i}`` over consecutive ``sizes``, ReLU after each (but the
    last when ``final_activation`` is False); x: (B, sizes[0]) -> (B, sizes[-1])."""

    def __init__(self, params: ParamSpace, name: str, sizes: list[int],
                 final_activation: bool = True):
        assert len(sizes) >= 2, sizes
        self.out_dim = sizes[-1]
        self.layers = []
        for i, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            relu = final_activation or i < len(sizes) - 2
            self.layers.append(Linear(params, f"{name}.{i}", d_in, d_out, relu))

    def forward(self, x):
        """x: (B, sizes[0]) -> (B, sizes[-1])."""
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def backward(self, dy):
        """dy: (B, sizes[-1]) -> dx: (B, sizes[0])."""
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy


def bce_with_logits(z, y, scale: float = 1.0):
    """Binary cross-entropy of logits z: (B,) against labels y: (B,) -> (losses (B,), dz (B,)),
    dz the gradient times ``scale`` (the loss's mean over a global batch: 1 / its size).
    CuPy arrays: one fused kernel (``cuda.bce``); these expressions are its twin."""
    xp = array_module(z, y)
    if z.shape != y.shape:  # (a model's forward returning (B, 1): broadcast to (B, B) below)
        raise ConfigError(f"the model's forward returned logits of shape {tuple(z.shape)}; "
                          f"it must return one logit per row: shape {tuple(y.shape)}")
    if xp is not np:
        from . import cuda

        return cuda.bce(z, y, scale)
    e = xp.exp(-xp.abs(z))  # once, for the loss and the sigmoid (no overflow either way)
    loss = xp.maximum(z, 0) - z * y + xp.log1p(e)
    s = 1.0 / (1.0 + e)
    dz = xp.where(z >= 0, s, e * s) - y  # sigmoid(z) - y
    return loss, dz if scale == 1.0 else dz * scale


class FMInteraction:
    """Factorisation-machine second-order term: e: (B, F, D) -> y: (B,) = sum_{i<j} <e_i, e_j>."""

    def forward(self, e):
        """e: (B, F, D) -> (B,) = 0.5 * sum_d[(sum_f e)^2 - sum_f e^2]."""
        self.e, self.s = e, e.sum(axis=1)
        return 0.5 * ((self.s * self.s).sum(axis=1) - (e * e).sum(axis=(1, 2)))

    def backward(self, dy):
        """dy: (B,) -> de: (B, F, D) = dy * (sum_f e - e)."""
        return dy[:, None, None] * (self.s[:, None, :] - self.e)


class CrossNet:
    """DCN cross layers x_{l+1} = x_0 * (x_l @ w_l)[:, None] + b_l + x_l; x0: (B, d) -> (B, d)."""

    @staticmethod
    def weight_shape(d: int) -> tuple[int, ...]:
        return (d,)

    def __init__(self, params: ParamSpace, name: str, d: int, n_layers: int):
        self.params = params
        self.names = [(f"{name}.{l}.weight", f"{name}.{l}.bias") for l in range(n_layers)]
        for w, b in self.names:
            params.add(w, self.weight_shape(d), "xavier_uniform")
            params.add(b, (d,), "zeros")

    def forward(self, x0):
        """x0: (B, d) -> x_L: (B, d)."""
        self.xs, self.us = [x0], []
        for w, b in self.names:
            x = self.xs[-1]
            u = x @ self.params.param(w)
            self.us.append(u)
            self.xs.append(x0 * u[:, None] + self.params.param(b) + x)
        return self.xs[-1]

    def backward(self, dy):
        """dy: (B, d) -> dx0: (B, d), summed over the x_0 term of every layer and the x_l chain."""
        x0, dx0 = self.xs[0], 0
        for (w, b), x, u in reversed(list(zip(self.names, self.xs, self.us))):
            gw, gb = self.params.grad(w), self.params.grad(b)
            du = (dy * x0).sum(axis=1)
            gb += dy.sum(axis=0)
            gw += x.T @ du
            dx0 = dx0 + dy * u[:, None]
            dy = dy + du[:, None] * self.params.param(w)
            self.params.grads_ready(w, b)
        return dx0 + dy


class CrossNetV2(CrossNet):
    """DCN-V2 cross layers x_{l+1} = x_0 * (x_l @ W_l + b_l) + x_l, ``W_l`` (d, d) stored
    (in, out) as ``Linear``'s; x0: (B, d) -> (B, d)."""

    @staticmethod
    def weight_shape(d: int) -> tuple[int, ...]:
        return (d, d)

    def forward(self, x0):
        """x0: (B, d) -> x_L: (B, d)."""
        self.xs, self.us = [x0], []
        for w, b in self.names:
            x = self.xs[-1]
            u = x @ self.params.param(w) + self.params.param(b)
            self.us.append(u)
            self.xs.append(x0 * u + x)
        return self.xs[-1]

    def backward(self, dy):
        """dy: (B, d) -> dx0: (B, d), summed over the x_0 term of every layer and the x_l chain."""
        x0, dx0 = self.xs[0], 0
        for (w, b), x, u in reversed(list(zip(self.names, self.xs, self.us))):
            gw, gb = self.params.grad(w), self.params.grad(b)
            du = dy * x0
            gb += du.sum(axis=0)
            gw += x.T @ du
            dx0 = dx0 + dy * u
            dy = dy + du @ self.params.param(w).T
            self.params.grads_ready(w, b)
        return dx0 + dy


class DotInteraction:
    """DLRM pairwise dots: z: (B, n, D) -> (B, n(n-1)/2), z_i . z_j for (i, j) in
    tril_indices(n, k=-1) order."""

    def forward(self, z):
        """z: (B, n, D) -> (B, n(n-1)/2)."""
        xp = array_module(z)
        self.z = z
        if getattr(self, "n", None) != (z.shape[1], xp):  # made once: no work in a step
            self.n = (z.shape[1], xp)                      # (a CUDA graph captures none)
            self.i, self.j = xp.tril_indices(z.shape[1], k=-1)
        return (z @ z.transpose(0, 2, 1))[:, self.i, self.j]

    def backward(self, dy):
        """dy: (B, n(n-1)/2) -> dz: (B, n, D)."""
        xp = array_module(dy)
        b, n, _ = self.z.shape
        dg = xp.zeros((b, n, n), dtype=dy.dtype)
        dg[:, self.i, self.j] = dy
        return (dg + dg.transpose(0, 2, 1)) @ self.z


class BagPooling:
    """Multi-hot fields pooled (TorchRec's EmbeddingBag): ``emb`` (n, E), the rows of a
    batch's flat ids (``batches.read_ids``: the ``B * n_single`` single-hot rows row by row,
    then each multi-hot field's rows of every row), and ``lengths`` (B, K) host int64 (>= 1)
    -> ``out`` (B, n_single + K, E): the single-hot rows as they are, then per multi-hot
    field the sum (``mode="sum"``) or the mean (``"mean"``) of the row's rows, added in
    their order. No parameters."""

    def __init__(self, n_single: int, mode: str = "sum"):
        assert mode in ("sum", "mean"), mode
        self.n_single, self.mode = n_single, mode

    def forward(self, emb, lengths):
        """emb: (n, E), lengths: (B, K) -> (B, n_single + K, E)."""
        xp = array_module(emb)
        B, K = lengths.shape
        E, head = emb.shape[1], B * self.n_single
        self.lens = np.ascontiguousarray(lengths.T).ravel()        # field-major: (K*B,)
        self.starts = head + np.cumsum(self.lens) - self.lens
        # Each bag summed left to right, so a row's sum never depends on the other rows of
        # the batch (W workers x b == 1 x W*b). CPU: one scatter-add in input order (one
        # pass, where the loop below makes one per position of the longest bag); a device:
        # one gather-add per position in a bag (its scatter kernel adds in no fixed order).
        if xp is np:
            pooled = scatter_add(np.repeat(np.arange(self.lens.size), self.lens), emb[head:],
                                 self.lens.size)
        else:
            pooled = emb[xp.asarray(self.starts)] if K else emb[:0]
            for j in range(1, int(self.lens.max(initial=0))):
                sel = np.flatnonzero(self.lens > j)
                pooled[xp.asarray(sel)] += emb[xp.asarray(self.starts[sel] + j)]
        if self.mode == "mean":
            pooled = pooled / xp.asarray(self.lens, emb.dtype)[:, None]
        pooled = pooled.reshape(K, B, E).transpose(1, 0, 2)
        return xp.concatenate([emb[:head].reshape(B, self.n_single, E), pooled], axis=1)

    def backward(self, dy):
        """dy: (B, n_single + K, E) -> demb: (n, E)."""
        xp = array_module(dy)
        B, _, E = dy.shape
        dp = dy[:, self.n_single:].transpose(1, 0, 2).reshape(-1, E)   # (K*B, E)
        if self.mode == "mean":
            dp = dp / xp.asarray(self.lens, dy.dtype)[:, None]
        rep = dp[xp.asarray(np.repeat(np.arange(self.lens.size), self.lens))]  # each id's
        return xp.concatenate([dy[:, :self.n_single].reshape(B * self.n_single, E), rep])
