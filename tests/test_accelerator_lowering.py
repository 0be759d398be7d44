"""The train program as each platform gets it (lax.platform_dependent, lowered without the device):
a bf16 Dense returns its product in float32 on the CPU only (XLA:CPU's bf16 units need it); on GPUs
and TPUs the product stays bf16 (the matrix unit accumulates in float32 inside), so the program has
no float32 [tokens, features] tensor per layer and its converts."""
from __future__ import annotations

import re
from collections import Counter

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sentemb_jax.benchmarks import hlo
from sentemb_jax.models import T5Config, common
from sentemb_jax.models.common import accelerator_product
from sentemb_jax.models.sentence import SentenceEmbedder

TYPE = re.compile(r"x(bf16|f32)>")
DENSE_PER_LAYER = 4 + 2  # q, k, v, o; wi, wo (T5 1.0, ungated)


def _ops(text: str, op: str) -> Counter:
    """(operand dtypes..., result dtype) of every `op` in a StableHLO module."""
    return Counter(tuple(TYPE.findall(line.split(":")[-1])) for line in text.splitlines() if f"stablehlo.{op} " in line)


@pytest.fixture(scope="module")
def lowered():
    cfg = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=1, num_heads=4,
                   relative_attention_num_buckets=8, dropout_rate=0.0, dtype="bfloat16")
    module = SentenceEmbedder(cfg, pooling=("mean",))
    ids = jnp.ones((4, 8), jnp.int32)
    params = nn.meta.unbox(module.init(jax.random.PRNGKey(0), ids, ids)["params"])
    traced = jax.jit(jax.grad(lambda p: jnp.sum(module.apply({"params": p}, ids, ids)))).trace(params)
    return {p: traced.lower(lowering_platforms=(p,)).as_text() for p in ("cpu", "cuda", "tpu")}


def test_cpu_products_return_float32_and_accelerator_products_stay_bf16(lowered):
    dense = 2 * DENSE_PER_LAYER
    cpu, gpu, tpu = (_ops(lowered[p], "dot_general") for p in ("cpu", "cuda", "tpu"))
    assert cpu[("bf16", "bf16", "f32")] == dense  # each Dense's forward product
    assert gpu == tpu and gpu[("bf16", "bf16", "f32")] == 0
    assert sum(gpu.values()) == sum(cpu.values())  # the same products, only their result dtype moved


def test_accelerator_programs_drop_two_converts_per_dense(lowered):
    """Per Dense, the CPU form rounds the float32 product to bf16 (forward) and the cotangent to the
    operands' dtype (backward), and widens the bias and the cotangent: 2 + 1 converts that the
    accelerator form does not have."""
    dense = 2 * DENSE_PER_LAYER
    cpu, gpu, tpu = (_ops(lowered[p], "convert") for p in ("cpu", "cuda", "tpu"))
    assert gpu == tpu
    assert cpu[("f32", "bf16")] - gpu[("f32", "bf16")] == 2 * dense
    assert cpu[("bf16", "f32")] - gpu[("bf16", "f32")] == dense


def test_the_accelerator_product_is_the_bf16_rounding_of_the_exact_one():
    rng = np.random.default_rng(0)
    x, w, b = (jnp.asarray(rng.normal(size=s), jnp.bfloat16) for s in ((5, 64), (64, 16), (16,)))
    y = accelerator_product(x, w, b, dtype=jnp.bfloat16)
    assert y.dtype == jnp.bfloat16
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64) + np.asarray(b, np.float64)
    # the product rounded to bf16, the bias added in float32, the sum rounded: two roundings of 2^-8
    assert np.all(np.abs(np.asarray(y, np.float64) - exact) <= 2 * 2.0 ** -8 * (np.abs(exact) + np.abs(np.asarray(b))) + 1e-6)
    # the bias gradient is a float32 sum over the rows (the bias added in float32)
    jaxpr = jax.make_jaxpr(jax.grad(lambda b: accelerator_product(x, w, b, dtype=jnp.bfloat16).astype(jnp.float32).sum()))(
        b.astype(jnp.float32))
    sums = [e for e in jaxpr.eqns if e.primitive.name == "reduce_sum"]
    assert sums and all(e.invars[0].aval.dtype == jnp.float32 for e in sums)


def _length_major_attention(q, k, v, bias, scale, dropout, implementation):
    """The written-out attention as it was: each einsum over [batch, length, heads, dim] operands."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * scale
    if bias.bias is not None:
        logits = logits + bias.bias
    if bias.mask is not None:
        logits = jnp.where(bias.mask, logits, common.MASK_LOGIT)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1).astype(v.dtype), v)


def _t5_gradient_program():
    cfg = T5Config(vocab_size=64, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=1, num_heads=4,
                   relative_attention_num_buckets=8, dropout_rate=0.0, dtype="bfloat16")
    module = SentenceEmbedder(cfg, pooling=("mean",))
    ids = jnp.asarray(np.random.default_rng(0).integers(1, 64, (8, 32)), jnp.int32)
    params = nn.meta.unbox(module.init(jax.random.PRNGKey(0), ids, ids)["params"])
    return jax.jit(jax.grad(lambda p: jnp.sum(module.apply({"params": p}, ids, ids).astype(jnp.float32)))), params


def test_heads_major_attention_moves_less_data_around_its_dots(monkeypatch):
    """The written-out attention puts q, k and v heads-major before its dots (batch axes leading in
    both operands): the compiled CPU program of a 2-layer bf16 T5 gradient writes fewer layout
    changes to memory than the length-major einsums did (41 -> 37, 2.05 -> 1.79 MB as measured),
    with the same gradients. The TPU compiler absorbs either layout (tests/test_tpu_compile.py)."""
    grad, params = _t5_gradient_program()
    heads_major = grad.lower(params).compile()
    with monkeypatch.context() as m:
        m.setattr(common, "_attention", lambda q, k, v, bias, scale, dropout, impl: _length_major_attention(
            q, k, v, bias, scale, dropout, impl))
        length_major = _t5_gradient_program()[0].lower(params).compile()  # a new function: traced anew
    new, old = (hlo.layout_moves(c.as_text()) for c in (heads_major, length_major))
    assert new["count"] < old["count"] and new["bytes"] <= 0.9 * old["bytes"], (new, old)
    for a, b in zip(jax.tree_util.tree_leaves(heads_major(params)), jax.tree_util.tree_leaves(length_major(params))):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)  # bf16 sums in another order: a rounding apart
        assert np.max(np.abs(a - b)) <= 2.0 ** -7 * np.max(np.abs(b)) + 1e-6
