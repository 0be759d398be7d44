"""models.common.accumulated_dot, the product of every Dense layer: forward accumulated and returned
in float32 (what XLA:CPU needs to run bfloat16 products on the CPU's bf16 units), gradients those
autodiff gives `jnp.dot`, computed in the operands' dtype."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sentemb_jax.models.common import Dense, accumulated_dot

rng = np.random.default_rng(0)
X = rng.normal(size=(2, 5, 8)).astype(np.float32)
W = rng.normal(size=(8, 3)).astype(np.float32)


def _loss(product, dtype):
    return lambda x, w: jnp.sum(jnp.sin(product(x, w).astype(dtype).astype(jnp.float32)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_forward_is_the_float32_accumulated_product(dtype):
    x, w = jnp.asarray(X, dtype), jnp.asarray(W, dtype)
    y = accumulated_dot(x, w)
    assert y.dtype == jnp.float32 and y.shape == (2, 5, 3)
    # the same (rounded) operands multiplied in float64: float32 accumulation error only
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gradients_equal_jnp_dots_in_the_operands_dtype(dtype):
    x, w = jnp.asarray(X, dtype), jnp.asarray(W, dtype)
    got = jax.grad(_loss(accumulated_dot, dtype), argnums=(0, 1))(x, w)
    want = jax.grad(_loss(jnp.dot, dtype), argnums=(0, 1))(x, w)
    for g, v in zip(got, want, strict=True):
        assert g.dtype == v.dtype == dtype
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(v, np.float32))
    # no gradient product mixes a float32 cotangent with bfloat16 operands (what differentiating
    # through the float32 result would give)
    grad_jaxpr = jax.make_jaxpr(jax.grad(_loss(accumulated_dot, dtype), argnums=(0, 1)))(x, w).jaxpr
    dots = [e for e in grad_jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == (3 if dtype == jnp.float32 else 2)  # float32: jnp.dot itself, its forward product inline
    assert all(v.aval.dtype == dtype for e in dots for v in e.invars)


def test_bfloat16_dense_adds_the_bias_before_rounding():
    """Dense(bf16): the float32 product plus the float32 bias, rounded to bfloat16 at the end: within
    half a bfloat16 step (2^-8 relative) of the exact result on the same operands."""
    dense = Dense(3, ("embed", "mlp"), use_bias=True, dtype=jnp.bfloat16)
    params = {"kernel": W, "bias": rng.normal(size=(3,)).astype(np.float32)}
    y = dense.apply({"params": params}, jnp.asarray(X, jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    x16, w16 = (np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64) for a in (X, W))
    exact = x16 @ w16 + params["bias"]  # the float32 bias (param_dtype) is added as it is
    assert np.all(np.abs(np.asarray(y, np.float64) - exact) <= 2.0 ** -8 * np.abs(exact) + 1e-6)
