"""Pooling functions against direct numpy computations."""
import jax.numpy as jnp
import numpy as np
import pytest

from sentemb_jax import pooling as P

rng = np.random.default_rng(0)
H = rng.normal(size=(3, 5, 4)).astype(np.float32)
M = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], np.int32)


def _mean(h, m):
    return np.stack([h[i, : m[i].sum()].mean(0) for i in range(len(h))])


def test_mean_and_sqrt_len():
    np.testing.assert_allclose(P.mean_pooling(H, M), _mean(H, M), rtol=1e-6, atol=1e-6)
    want = np.stack([H[i, : M[i].sum()].sum(0) / np.sqrt(M[i].sum()) for i in range(3)])
    np.testing.assert_allclose(P.mean_sqrt_len_pooling(H, M), want, rtol=1e-6, atol=1e-6)


def test_first_max_last_weighted():
    np.testing.assert_array_equal(P.first_token_pooling(H, M), H[:, 0])
    np.testing.assert_array_equal(P.max_pooling(H, M), np.stack([H[i, : M[i].sum()].max(0) for i in range(3)]))
    np.testing.assert_array_equal(P.last_token_pooling(H, M), np.stack([H[i, M[i].sum() - 1] for i in range(3)]))
    want = np.stack([(H[i, : M[i].sum()] * np.arange(1, M[i].sum() + 1)[:, None]).sum(0) / np.arange(1, M[i].sum() + 1).sum()
                     for i in range(3)])
    np.testing.assert_allclose(P.weighted_mean_pooling(H, M), want, rtol=1e-6, atol=1e-6)


def test_layer_averages():
    layers = [rng.normal(size=H.shape).astype(np.float32) for _ in range(4)]
    np.testing.assert_allclose(P.first_last_average_pooling(layers, M), _mean((layers[1] + layers[3]) / 2, M), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(P.first_last_average_pooling(layers, M, first_layer=0), _mean((layers[0] + layers[3]) / 2, M), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(P.top2_average_pooling(layers, M), _mean((layers[2] + layers[3]) / 2, M), rtol=1e-5, atol=1e-6)


def test_padding_values_do_not_leak():
    H2 = H.copy()
    H2[M == 0] = 1e6
    for f in (P.mean_pooling, P.max_pooling, P.last_token_pooling, P.weighted_mean_pooling, P.mean_sqrt_len_pooling):
        np.testing.assert_allclose(f(H2, M), f(H, M), rtol=1e-6)


def test_bfloat16_inputs_pool_in_float32():
    out = P.mean_pooling(jnp.asarray(H, jnp.bfloat16), M)
    assert out.dtype == jnp.float32


def test_l2_normalize():
    x = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    np.testing.assert_allclose(P.l2_normalize(x), [[0.6, 0.8], [0.0, 0.0]])


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown pooling mode 'avg'"):
        P.check_pooling_modes(["avg"])
