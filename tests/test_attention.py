"""Attention with boolean masks - jax.nn.dot_product_attention ('xla' / 'cudnn') and the written-out
default - equals the attention it replaced (einsum, a dense float32 bias of -1e9 for masked keys,
float32 softmax, einsum) for padding masks, packed segments, T5's relative-position bias with
padding and with a causal mask, in float32 and bfloat16; so does the dropout path at rate 0."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sentemb_jax.models import common


def reference(q, k, v, bias_f32, scale):
    """The attention before jax.nn.dot_product_attention: the mask as a dense float32 bias."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q * jnp.asarray(scale, q.dtype), k).astype(jnp.float32)
    if bias_f32 is not None:
        logits = logits + bias_f32
    weights = jax.nn.softmax(logits, axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def dense(bias: common.AttentionBias):
    """The same masks as the old dense float32 bias (0 where allowed, -1e9 elsewhere)."""
    out = 0.0
    if bias.bias is not None:
        out = out + bias.bias
    if bias.mask is not None:
        out = out + jnp.where(bias.mask, 0.0, common.MASK_LOGIT)
    return jnp.asarray(out, jnp.float32)


def qkv(dtype, batch=3, length=7, heads=2, dim=8, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    return [jax.random.normal(k, (batch, length, heads, dim)).astype(dtype) for k in keys]


def padding():
    return common.padding_bias(jnp.array([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5]))


def segments():
    return common.segment_bias(jnp.array([[1, 1, 1, 2, 2, 0, 0], [1, 2, 2, 2, 3, 3, 3], [1] * 7]))


def relpos():
    return jax.random.normal(jax.random.PRNGKey(9), (1, 2, 7, 7))


CASES = {
    "bert_padding": (padding, 8 ** -0.5),
    "bert_packed_segments": (segments, 8 ** -0.5),
    "t5_relpos_padding": (lambda: relpos() + padding(), 1.0),
    "t5_relpos_segments": (lambda: relpos() + segments(), 1.0),
    "t5_decoder_relpos_causal_padding": (lambda: relpos() + common.causal_bias(7) + padding(), 1.0),
}


@pytest.mark.parametrize("dtype,atol", [(jnp.float32, 2e-6), (jnp.bfloat16, 3e-2)], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES)
def test_dot_product_attention_equals_the_dense_bias_attention(case, dtype, atol):
    make, scale = CASES[case]
    bias = make()
    q, k, v = qkv(dtype)
    with jax.default_matmul_precision("highest"):
        library = common.attention(q, k, v, bias, scale, dropout=None, implementation="xla")  # jax.nn's
        written_out = common.attention(q, k, v, bias, scale, dropout=None)  # the default
        with_dropout = common.attention(q, k, v, bias, scale, dropout=lambda w: w)  # dropout's path at rate 0
        old = reference(q, k, v, dense(bias), scale)
    assert library.dtype == written_out.dtype == old.dtype == dtype
    for new in (library, written_out, with_dropout):
        np.testing.assert_allclose(np.asarray(new, np.float32), np.asarray(old, np.float32), atol=atol, rtol=0)


def test_masks_are_booleans_and_combine_by_intersection():
    """No dense float32 -1e9 tensors: padding [B,1,1,K] and segments [R,1,L,L] are boolean; a bias
    plus masks adds the biases and intersects the masks."""
    p, s = padding(), segments()
    assert p.mask.dtype == s.mask.dtype == jnp.bool_ and p.bias is None and s.bias is None
    assert p.mask.shape == (3, 1, 1, 7) and s.mask.shape == (3, 1, 7, 7)
    both = relpos() + p + s
    assert both.bias.shape == (1, 2, 7, 7)
    np.testing.assert_array_equal(np.asarray(both.mask), np.asarray(p.mask) & np.asarray(s.mask))
