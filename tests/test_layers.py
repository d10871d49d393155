"""Dense layers: backward against central finite differences; forward against explicit
loops; ParamSpace against its documented layout and initialisation formula."""

import math
import zlib

import numpy as np
import pytest

from pshybrid.layers import (MLP, BagPooling, CrossNet, DotInteraction, FMInteraction, Linear,
                             ParamSpace, bce_with_logits)

H = 1e-6


def numeric_grad(loss, a):
    """Central differences of the scalar ``loss()`` in every element of ``a`` (perturbed in place)."""
    flat, out = a.reshape(-1), np.empty(a.size)
    assert np.shares_memory(flat, a)
    for k in range(a.size):
        old = flat[k]
        flat[k] = old + H
        up = loss()
        flat[k] = old - H
        down = loss()
        flat[k] = old
        out[k] = (up - down) / (2 * H)
    return out.reshape(a.shape)


def check_backward(layer, x, params=None):
    """backward(g) == d/dx and (accumulated) d/dparams of L = sum(forward(x) * g), by FD."""
    rng = np.random.default_rng(1)
    if params is not None:
        params.flat[:] = rng.standard_normal(params.size)  # non-zero biases too
        before = rng.standard_normal(params.size)
        params.flat_grad[:] = before  # backward must add to it, not overwrite
    g = rng.standard_normal(layer.forward(x).shape)

    def loss():
        return float(np.sum(layer.forward(x) * g))

    layer.forward(x)
    dx = layer.backward(g)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-8)
    if params is not None:
        np.testing.assert_allclose(params.flat_grad - before, numeric_grad(loss, params.flat),
                                   rtol=1e-6, atol=1e-8)


def built(make, seed=0):
    params = ParamSpace()
    layer = make(params)
    params.build(np, np.float64, seed)
    return params, layer


# ---------------------------------------------------------------- ParamSpace

def test_layout_is_contiguous_in_order_and_views_alias():
    params = ParamSpace()
    params.add("a", (2, 3), "uniform", 0.5)
    params.add("b", (4,), "zeros")
    params.add("c", (1, 5), "ones")
    params.build(np, np.float64, 0)
    assert params.names == ["a", "b", "c"] and params.size == 15
    assert [params.offset(n) for n in params.names] == [0, 6, 10]
    assert [params.shape(n) for n in params.names] == [(2, 3), (4,), (1, 5)]
    assert params.flat.shape == params.flat_grad.shape == (15,)
    np.testing.assert_array_equal(params.flat[6:15], [0] * 4 + [1] * 5)
    params.param("b")[...] = 7.0
    params.grad("c")[0, 2] = 3.0
    np.testing.assert_array_equal(params.flat[6:10], 7.0)
    assert params.flat_grad[12] == 3.0 and params.flat_grad.sum() == 3.0
    params.flat[0] = -9.0
    assert params.param("a")[0, 0] == -9.0
    held = params.flat_grad  # e.g. registered with the allreduce: must be zeroed in place
    params.zero_grad()
    assert params.flat_grad is held and not held.any()


def test_init_matches_documented_formula_and_dtype_cast():
    params = ParamSpace()
    params.add("w", (7, 3), "xavier_uniform")
    params.add("v", (5,), "xavier_uniform")
    params.add("u", (4,), "uniform", 0.3)
    params.add("n", (2, 2), "normal", 0.1)
    params.build(np, np.float32, 11)

    def rng(name):
        return np.random.default_rng([11, zlib.crc32(name.encode())])

    expect = {"w": rng("w").uniform(-math.sqrt(6 / 10), math.sqrt(6 / 10), size=(7, 3)),
              "v": rng("v").uniform(-math.sqrt(6 / 6), math.sqrt(6 / 6), size=(5,)),
              "u": rng("u").uniform(-0.3, 0.3, size=(4,)),
              "n": rng("n").standard_normal((2, 2)) * 0.1}
    assert params.flat.dtype == params.flat_grad.dtype == np.float32
    for name, values in expect.items():
        np.testing.assert_array_equal(params.param(name), values.astype(np.float32))


def test_xavier_bounds():
    params = ParamSpace()
    params.add("w", (30, 20), "xavier_uniform")
    params.add("v", (200,), "xavier_uniform")
    params.build(np, np.float64, 0)
    for name, a in [("w", math.sqrt(6 / 50)), ("v", math.sqrt(6 / 201))]:
        m = np.abs(params.param(name)).max()
        assert 0.9 * a < m <= a, (name, m, a)


def test_init_is_deterministic_and_independent_of_other_params():
    def values(seed, before=()):
        params = ParamSpace()
        for name in before:
            params.add(name, (3, 3), "normal", 1.0)
        params.add("w", (4, 5), "xavier_uniform")
        params.build(np, np.float64, seed)
        return params.param("w").copy()

    np.testing.assert_array_equal(values(5), values(5))
    np.testing.assert_array_equal(values(5), values(5, before=["x", "y"]))
    assert not np.isclose(values(5), values(6)).any()


def test_duplicate_name_and_unknown_init_raise():
    params = ParamSpace()
    params.add("w", (2,), "zeros")
    with pytest.raises(ValueError, match="'w'"):
        params.add("w", (3,), "ones")
    with pytest.raises(ValueError, match="glorot"):
        params.add("v", (3,), "glorot")


# ---------------------------------------------------------------- gradients by FD

def test_linear_grads():
    params, layer = built(lambda params: Linear(params, "fc", 4, 3))
    assert params.names == ["fc.weight", "fc.bias"] and params.shape("fc.weight") == (4, 3)
    assert not params.param("fc.bias").any()
    x = np.random.default_rng(2).standard_normal((5, 4))
    y = layer.forward(x)
    np.testing.assert_allclose(y, x @ params.param("fc.weight") + params.param("fc.bias"))
    check_backward(layer, x, params)


def test_linear_relu_grads():
    """Linear with ReLU: max(x @ W + b, 0), and its gradients by finite differences."""
    params, layer = built(lambda params: Linear(params, "fc", 4, 6, relu=True))
    x = np.random.default_rng(3).standard_normal((5, 4))
    check_backward(layer, x, params)  # (sets random weights and biases)
    pre = x @ params.param("fc.weight") + params.param("fc.bias")
    assert (pre > 0).any() and (pre < 0).any() and np.abs(pre).min() > 1e-4  # off the kink
    np.testing.assert_array_equal(layer.forward(x), np.where(pre > 0, pre, 0.0))


@pytest.mark.parametrize("final_activation", [True, False])
def test_mlp_grads(final_activation):
    params, mlp = built(lambda params: MLP(params, "dense", [4, 6, 3], final_activation))
    assert params.names == ["dense.0.weight", "dense.0.bias", "dense.1.weight", "dense.1.bias"]
    assert mlp.out_dim == 3
    x = np.random.default_rng(4).standard_normal((5, 4))
    params.flat[:] = np.random.default_rng(1).standard_normal(params.size)
    w0, b0, w1, b1 = (params.param(n) for n in params.names)
    out = np.maximum(x @ w0 + b0, 0) @ w1 + b1
    np.testing.assert_allclose(mlp.forward(x), np.maximum(out, 0) if final_activation else out)
    check_backward(mlp, x, params)


def test_fm_equals_pairwise_sum_and_grads():
    e = np.random.default_rng(5).standard_normal((3, 4, 5))
    pairs = [[e[b, i] @ e[b, j] for i in range(4) for j in range(i + 1, 4)] for b in range(3)]
    np.testing.assert_allclose(FMInteraction().forward(e), np.sum(pairs, axis=1))
    check_backward(FMInteraction(), e)


def test_crossnet_grads():
    params, net = built(lambda params: CrossNet(params, "cross", 4, 2))
    assert params.names == ["cross.0.weight", "cross.0.bias", "cross.1.weight", "cross.1.bias"]
    x0 = np.random.default_rng(6).standard_normal((3, 4))
    params.flat[:] = np.random.default_rng(1).standard_normal(params.size)
    x = x0
    for l in range(2):
        x = x0 * (x @ params.param(f"cross.{l}.weight"))[:, None] + params.param(f"cross.{l}.bias") + x
    np.testing.assert_allclose(net.forward(x0), x)
    check_backward(net, x0, params)


def test_dot_interaction_equals_loop_and_grads():
    z = np.random.default_rng(7).standard_normal((2, 4, 3))
    i, j = np.tril_indices(4, k=-1)
    loop = [[z[b, i[k]] @ z[b, j[k]] for k in range(6)] for b in range(2)]
    out = DotInteraction().forward(z)
    assert out.shape == (2, 6) and all(i > j)
    np.testing.assert_allclose(out, loop)
    check_backward(DotInteraction(), z)


# ---------------------------------------------------------------- loss

def test_bce_matches_naive_formula_and_fd():
    rng = np.random.default_rng(8)
    z = rng.uniform(-8, 8, 20)
    y = np.concatenate([rng.integers(0, 2, 15), rng.uniform(0, 1, 5)])  # soft labels too
    p = 1 / (1 + np.exp(-z))
    loss, dz = bce_with_logits(z, y)
    np.testing.assert_allclose(loss, -y * np.log(p) - (1 - y) * np.log(1 - p), rtol=1e-10)
    np.testing.assert_allclose(dz, p - y, rtol=1e-10, atol=1e-14)
    fd = (bce_with_logits(z + H, y)[0] - bce_with_logits(z - H, y)[0]) / (2 * H)
    np.testing.assert_allclose(dz, fd, rtol=1e-6, atol=1e-8)


def test_bce_extreme_logits_are_exact_without_fp_errors():
    z = np.array([1000.0, 1000.0, -1000.0, -1000.0])
    y = np.array([1.0, 0.0, 0.0, 1.0])
    with np.errstate(all="raise", under="ignore"):  # exp(-1000) -> 0 is the right answer
        loss, dz = bce_with_logits(z, y)
    np.testing.assert_array_equal(loss, [0.0, 1000.0, 0.0, 1000.0])
    np.testing.assert_array_equal(dz, [0.0, 1.0, 0.0, -1.0])


# ---------------------------------------------------------------- multi-hot pooling

def bags_batch(B=5, n_single=2, K=3, E=4, seed=0):
    """Flat rows of a batch (the single-hot rows row by row, then each multi-hot field's
    rows of every row) and the lengths (B, K), 1..4 ids a bag."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, (B, K))
    emb = rng.standard_normal((B * n_single + int(lengths.sum()), E))
    return emb, lengths


def pooled_reference(emb, lengths, n_single, mode):
    """The documented pooling, with explicit loops: (B, n_single + K, E)."""
    B, K = lengths.shape
    out = np.zeros((B, n_single + K, emb.shape[1]))
    out[:, :n_single] = emb[:B * n_single].reshape(B, n_single, emb.shape[1])
    pos = B * n_single
    for k in range(K):
        for b in range(B):
            n = int(lengths[b, k])
            acc = np.zeros(emb.shape[1])
            for j in range(n):
                acc = acc + emb[pos + j]
            out[b, n_single + k] = acc / n if mode == "mean" else acc
            pos += n
    return out


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("n_single", [0, 2])
def test_bag_pooling_matches_loops(mode, n_single):
    emb, lengths = bags_batch(n_single=n_single)
    got = BagPooling(n_single, mode).forward(emb, lengths)
    np.testing.assert_array_equal(got, pooled_reference(emb, lengths, n_single, mode))


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_bag_pooling_backward_finite_differences(mode):
    emb, lengths = bags_batch(B=3, K=2, E=3, seed=2)
    pool = BagPooling(2, mode)

    class Layer:
        def forward(self, x):
            return pool.forward(x, lengths)

        def backward(self, dy):
            return pool.backward(dy)

    check_backward(Layer(), emb)


def test_logits_of_another_shape_than_the_labels_are_refused():
    """A model's forward returning (B, 1) broadcast against the labels (B,) to a (B, B) loss
    deep inside NumPy; now one error naming both shapes."""
    from pshybrid.errors import ConfigError

    with pytest.raises(ConfigError, match=r"returned logits of shape \(4, 1\); it must return "
                       r"one logit per row: shape \(4,\)"):
        bce_with_logits(np.zeros((4, 1)), np.zeros(4))
