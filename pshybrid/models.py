"""CTR models built from named parts (TorchRec's words): a sparse arch (embedding lookup,
done by the training mode through the store), a dense arch, an interaction arch and an
over arch. ``docs/models.md`` states every forward pass exactly.

A model sees ``dense: (B, n_dense)`` and ``emb: (B, F, E)``, the pulled rows of the fused
sparse table (``schema.FusedTable``), and returns ``logits: (B,)``. ``backward(dlogits)``
accumulates dense gradients into the ParamSpace and returns ``demb: (B, F, E)``.
"""

from __future__ import annotations


from .backend import array_module
from .errors import ConfigError
from .layers import (MLP, BagPooling, CrossNet, CrossNetV2, DotInteraction, FMInteraction,
                     Linear, ParamSpace)
from .schema import FusedTable, Schema


class CTRModel:
    """Base: subclasses register parameters in ``__init__`` and define forward/backward."""

    wide = 0
    cross_layers = False  # --cross-layers sizes it (DCN)
    bottom_mlp = False  # --bottom-mlp sizes it (DLRM)
    row_rates: dict = {}  # --lr none: the rows' rate by optimizer where not optim.SPARSE_LR's
    # True: forward reads only the fused row's first E columns of emb and backward returns
    # demb shaped like emb, zero past E, so a device may carry rows padded to its vector
    # width (graphs.DeviceStep)
    row_padding = False

    @classmethod
    def counted_params(cls, schema: Schema, dim: int, cross_layers: int) -> int:
        """Dense parameters the memory check counts instead of registering (an absurd
        ``--cross-layers`` must not loop there): built with 0 cross layers, these added."""
        return 0

    @classmethod
    def extra_widths(cls, schema: Schema, dim: int, cross_layers: int) -> int:
        """Floats per batch row of the activations beyond its layers' inputs and outputs
        and the deep input's (forward values; the memory check doubles for gradients)."""
        return 0

    def __init__(self, schema: Schema, dim: int, mlp: tuple[int, ...], params: ParamSpace):
        self.schema, self.dim, self.mlp, self.params = schema, dim, tuple(mlp), params
        self.F, self.Fd = len(schema.cardinalities), schema.n_dense

    def forward(self, dense, emb):  # pragma: no cover - interface
        raise NotImplementedError

    def backward(self, dlogits):  # pragma: no cover - interface
        raise NotImplementedError

    def _deep_input(self, dense, emb):
        """concat(dense, flattened embeddings without wide columns): (B, Fd + F*D)."""
        xp = array_module(dense)
        B = dense.shape[0]
        return xp.concatenate([dense, emb[:, :, :self.dim].reshape(B, self.F * self.dim)], axis=1)

    def _split_deep_grad(self, dx, emb_shape):
        """Inverse of _deep_input for gradients: dx (B, Fd+F*D) -> demb (B, F, E) (wide cols 0)."""
        xp = array_module(dx)
        demb = xp.zeros(emb_shape, dtype=dx.dtype)
        demb[:, :, :self.dim] = dx[:, self.Fd:].reshape(emb_shape[0], self.F, self.dim)
        return demb


class WDL(CTRModel):
    """Wide & Deep: logit = wide(dense) + sum_f w_f[id_f] + deep(concat(dense, emb))."""

    wide = 1
    linear_name = "wide.dense"
    row_padding = True  # reads emb[..., :dim] and emb[..., dim]; demb from zeros(emb.shape)

    def __init__(self, schema, dim, mlp, params):
        super().__init__(schema, dim, mlp, params)
        self.linear = Linear(params, self.linear_name, self.Fd, 1)
        self.deep = MLP(params, "over", [self.Fd + self.F * dim, *mlp, 1], final_activation=False)

    def forward(self, dense, emb):
        self._shape = emb.shape
        return (self.linear.forward(dense)[:, 0] + emb[:, :, self.dim].sum(1)
                + self.deep.forward(self._deep_input(dense, emb))[:, 0])

    def backward(self, dlogits):
        self.linear.backward(dlogits[:, None])
        demb = self._split_deep_grad(self.deep.backward(dlogits[:, None]), self._shape)
        demb[:, :, self.dim] = dlogits[:, None]
        return demb


class DeepFM(WDL):
    """DeepFM: WDL's logit (its wide part is the first-order term) + FM(emb)."""

    linear_name = "fm.dense"
    # FM's pairwise products move the logit by ~(fields x dim) times a row's step: Adagrad's
    # first steps of ~lr each at 0.05 left it 0.010 AUC behind (0.033 at dim 64)
    row_rates = {"adagrad": 0.01}

    def __init__(self, schema, dim, mlp, params):
        super().__init__(schema, dim, mlp, params)
        self.fm = FMInteraction()

    def forward(self, dense, emb):
        return super().forward(dense, emb) + self.fm.forward(emb[:, :, :self.dim])

    def backward(self, dlogits):
        demb = super().backward(dlogits)
        demb[:, :, :self.dim] += self.fm.backward(dlogits)
        return demb


class DCN(CTRModel):
    """Deep & Cross: x0 = concat(dense, emb); logit = out(concat(cross(x0), deep(x0)))."""

    cross_layers = True
    row_padding = True  # reads emb[..., :dim]; demb from zeros(emb.shape)
    cross_net = CrossNet

    @classmethod
    def counted_params(cls, schema, dim, cross_layers):
        """A cross layer's weight and bias, each as wide as the deep input."""
        return 2 * (schema.n_dense + schema.n_sparse * dim) * cross_layers

    @classmethod
    def extra_widths(cls, schema, dim, cross_layers):
        """The cross net's x0, x_l and x_l.w terms, at every layer and its input."""
        return (schema.n_dense + schema.n_sparse * dim) * 3 * (cross_layers + 1)

    def __init__(self, schema, dim, mlp, params, cross_layers: int = 2):
        super().__init__(schema, dim, mlp, params)
        d = self.Fd + self.F * dim
        self.cross = self.cross_net(params, "cross", d, cross_layers)
        self.deep = MLP(params, "deep", [d, *mlp], final_activation=True)
        self.out = Linear(params, "over", d + mlp[-1], 1)

    def forward(self, dense, emb):
        xp = array_module(dense)
        self._shape = emb.shape
        x0 = self._deep_input(dense, emb)
        self._d = x0.shape[1]
        return self.out.forward(xp.concatenate([self.cross.forward(x0), self.deep.forward(x0)],
                                               axis=1))[:, 0]

    def backward(self, dlogits):
        dcat = self.out.backward(dlogits[:, None])
        dx0 = self.cross.backward(dcat[:, :self._d]) + self.deep.backward(dcat[:, self._d:])
        return self._split_deep_grad(dx0, self._shape)


class DCNv2(DCN):
    """DCN-V2 (parallel): DCN with a (d, d) matrix in each cross layer,
    x_{l+1} = x0 * (x_l @ W_l + b_l) + x_l."""

    cross_net = CrossNetV2

    @classmethod
    def counted_params(cls, schema, dim, cross_layers):
        """A cross layer's (d, d) weight and (d,) bias, d the deep input's width."""
        d = schema.n_dense + schema.n_sparse * dim
        return (d * d + d) * cross_layers


class DLRM(CTRModel):
    """DLRM: z = bottom(dense) (B, D); pairwise dots of [z, emb_1..emb_F];
    logit = top(concat(z, dots))."""

    @classmethod
    def extra_widths(cls, schema, dim, cross_layers):
        """The stacked [z, emb] rows twice and the pairwise dots."""
        n = schema.n_sparse + 1
        return n * dim * 2 + n * (n - 1)

    bottom_mlp = True

    def __init__(self, schema, dim, mlp, params, bottom: tuple[int, ...] = (64,)):
        super().__init__(schema, dim, mlp, params)
        self.bottom = MLP(params, "bottom", [self.Fd, *bottom, dim], final_activation=True)
        self.dot = DotInteraction()
        n = self.F + 1
        self.top = MLP(params, "over", [dim + n * (n - 1) // 2, *mlp, 1], final_activation=False)

    def forward(self, dense, emb):
        xp = array_module(dense)
        z = self.bottom.forward(dense)
        stacked = xp.concatenate([z[:, None, :], emb], axis=1)
        return self.top.forward(xp.concatenate([z, self.dot.forward(stacked)], axis=1))[:, 0]

    def backward(self, dlogits):
        dtop = self.top.backward(dlogits[:, None])
        dstack = self.dot.backward(dtop[:, self.dim:])
        self.bottom.backward(dtop[:, :self.dim] + dstack[:, 0, :])
        return dstack[:, 1:, :]


def checked_demb(demb, emb):
    """A model's ``backward`` result, checked against the rows its forward was given: the
    gradient of ``emb`` has its shape (a (B, F, D) one, the wide column left out, failed in
    the update's reshape, or in the store naming only ``grads``)."""
    if tuple(demb.shape) != tuple(emb.shape):
        raise ConfigError(f"the model's backward returned demb of shape {tuple(demb.shape)}; "
                          f"it must be shaped like the emb its forward was given: "
                          f"{tuple(emb.shape)} (E = --embedding-dim + the model's wide)")
    return demb


class Pooled:
    """A model over a schema with multi-hot fields: the batch's flat embedding rows pooled
    per field (``layers.BagPooling``), then the model. ``forward(dense, emb (n, E), lengths
    (B, K))``; ``backward(dlogits) -> demb (n, E)``, one row per id as pulled."""

    def __init__(self, model: CTRModel, pooling: str):
        self.model, self.pool = model, BagPooling(model.schema.n_single, pooling)
        self.wide = model.wide

    def forward(self, dense, emb, lengths):
        return self.model.forward(dense, self.pool.forward(emb, lengths))

    def backward(self, dlogits):
        return self.pool.backward(self.model.backward(dlogits))


class Registry(dict):
    """Name -> model class. A built-in name cannot be given another class: checkpoints and
    exports name their model, and the commands rebuild the built-in one by that name."""

    def __init__(self, builtin: dict):
        super().__init__(builtin)
        self.builtin = dict(builtin)

    def __setitem__(self, name, cls):
        if name in self.builtin and cls is not self.builtin[name]:
            self._refuse(name)
        if not (isinstance(cls, type) and issubclass(cls, CTRModel)) or cls.wide not in (0, 1):
            raise ConfigError(f"models.MODELS[{name!r}] = {cls!r}: a model is a subclass of "
                              "pshybrid.models.CTRModel with wide = 0 or 1 (docs/models.md)")
        super().__setitem__(name, cls)

    def _refuse(self, name):
        raise ConfigError(f"models.MODELS[{name!r}]: {name!r} is a built-in model; register "
                          "yours under another name")

    def update(self, *args, **kw):  # (dict's own skip __setitem__)
        for name, cls in dict(*args, **kw).items():
            self[name] = cls

    def __ior__(self, other):
        self.update(other)
        return self

    def setdefault(self, name, cls=None):
        if name not in self:
            self[name] = cls
        return self[name]

    def __delitem__(self, name):
        if name in self.builtin:
            self._refuse(name)
        super().__delitem__(name)

    def pop(self, name, *default):
        if name in self.builtin:
            self._refuse(name)
        return super().pop(name, *default)

    def popitem(self):
        raise ConfigError("models.MODELS: the built-in models stay; del MODELS[name] "
                          "removes yours")

    clear = popitem


MODELS = Registry({"wdl": WDL, "deepfm": DeepFM, "dcn": DCN, "dcnv2": DCNv2, "dlrm": DLRM})


def build_model(name: str, schema: Schema, dim: int, mlp, params: ParamSpace, dtype: str,
                cross_layers: int = 2, pooling: str = "sum", bottom_mlp=(64,)):
    """Model ``name`` and its fused sparse table (``FusedTable``); registers the dense
    parameters in ``params``. With multi-hot fields in ``schema``, the model pools them first
    (``Pooled``, by ``pooling``: sum or mean). ``cross_layers``, ``bottom_mlp``: passed to
    a model whose class has them (DCN's, DLRM's ``bottom``)."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}: choose from {sorted(MODELS)}", collective=True)
    cls = MODELS[name]
    kw = {k: v for k, v, has in (("cross_layers", cross_layers, cls.cross_layers),
                                 ("bottom", tuple(bottom_mlp), cls.bottom_mlp)) if has}
    model = MODELS[name](schema, dim, tuple(mlp), params, **kw)
    if schema.multi_hot:
        model = Pooled(model, pooling)
    return model, FusedTable(schema, dim, model.wide, dtype)
