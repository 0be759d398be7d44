"""models.common.gelu_erf, our exact GELU ("gelu" in HF configs: BERT, MiniLM): torch's formula
x/2 (1 + erf(x/sqrt 2)) rather than jax.nn.gelu's erfc form, which XLA:CPU computes with an exp and
both erfc branches (2.5x the time; issue 33)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from sentemb_jax.models.common import activation, gelu_erf

X = np.concatenate([np.linspace(-12.0, 12.0, 240_001), [0.0, -0.0]]).astype(np.float32)


def test_values_and_gradients_match_torch_and_jax_exact_gelu():
    ours = np.asarray(jax.jit(gelu_erf)(X))
    theirs = torch.nn.functional.gelu(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(ours, np.asarray(jax.nn.gelu(X, approximate=False)), rtol=2e-6, atol=2e-6)
    assert ours[-1] == 0.0 and ours[-2] == 0.0 and ours[240_000] == 12.0
    grad = np.asarray(jax.jit(jax.grad(lambda x: gelu_erf(x).sum()))(X))
    t = torch.from_numpy(X).requires_grad_()
    torch.nn.functional.gelu(t).sum().backward()
    np.testing.assert_allclose(grad, t.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_it_is_the_gelu_activation_and_keeps_the_input_dtype():
    assert activation("gelu") is gelu_erf
    assert gelu_erf(jnp.ones(3, jnp.bfloat16)).dtype == jnp.bfloat16


def test_xla_computes_it_without_exp():
    """The speed comes from the erf polynomial alone; the erfc form XLA expands with an exp."""
    hlo = lambda f: jax.jit(f).lower(jnp.ones((8, 16))).compile().as_text()  # noqa: E731
    assert " exponential(" not in hlo(gelu_erf)
    assert " exponential(" in hlo(lambda x: jax.nn.gelu(x, approximate=False))
