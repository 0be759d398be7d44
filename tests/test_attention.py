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


def test_padding_goes_to_the_fused_kernels_as_key_lengths_while_no_other_mask_joins():
    p = padding()
    np.testing.assert_array_equal(np.asarray(p.kv_lengths), [7, 4, 2])
    np.testing.assert_array_equal(np.asarray((relpos() + p).kv_lengths), [7, 4, 2])  # a bias keeps them
    assert (p + segments()).kv_lengths is None and (common.causal_bias(7) + p).kv_lengths is None
    empty = common.padding_bias(jnp.array([[1] * 7, [0] * 7, [1] * 3 + [0] * 4]))
    np.testing.assert_array_equal(np.asarray(empty.kv_lengths), [7, 1, 3])  # a text of no tokens: one key
    q, k, v = qkv(jnp.float32)
    with jax.default_matmul_precision("highest"):
        fused = common.attention(q, k, v, empty, 1.0, dropout=None, implementation="xla")
        written = common.attention(q, k, v, empty, 1.0, dropout=None, implementation="written_out")
    assert bool(jnp.all(jnp.isfinite(fused)))
    for row in (0, 2):  # rows with tokens: the same attention (the empty row is padding either way)
        np.testing.assert_allclose(np.asarray(fused[row]), np.asarray(written[row]), atol=2e-6, rtol=0)


def test_the_default_picks_cudnn_only_on_a_gpu_in_half_precision_without_dropout(monkeypatch):
    pick = common.fused_implementation
    assert jax.default_backend() == "cpu" and pick(None, jnp.bfloat16, False) is None  # CPU: written out
    assert pick("xla", jnp.float32, False) == "xla" and pick("written_out", jnp.bfloat16, False) is None
    assert pick("cudnn", jnp.bfloat16, True) is None  # jax.nn's function has no dropout
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert pick(None, jnp.bfloat16, False) is None  # a GPU backend that is not CUDA's (ROCm): no cuDNN
    monkeypatch.setattr(common, "cuda_backend", lambda: True)
    assert pick(None, jnp.bfloat16, False) == pick(None, jnp.float16, False) == "cudnn"
    assert pick(None, jnp.float32, False) is None and pick(None, jnp.bfloat16, True) is None
    with pytest.raises(ValueError, match="attention implementation 'flash'"):
        pick("flash", jnp.bfloat16, False)


def test_t5_attention_dropout_has_its_own_rate():
    from sentemb_jax.models import T5Config
    from sentemb_jax.models.t5 import _attention

    assert _attention(T5Config(dropout_rate=0.1), False, "a").dropout_rate == 0.1  # as Hugging Face's T5
    assert _attention(T5Config(dropout_rate=0.1, attention_dropout_rate=0.0), False, "a").dropout_rate == 0.0
