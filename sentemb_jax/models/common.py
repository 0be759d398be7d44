"""Building blocks shared by the T5 and BERT-family Flax modules.

Every parameter is created with t5x logical axis names so that a mesh and a set of
logical axis rules (see `sentemb_jax.partitioning`) decide how it is sharded.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from sentemb_jax import validation

Array = jax.Array
DType = Any

# Added to attention logits of masked keys. Large but finite so that fully padded rows stay finite.
MASK_LOGIT = -1e9


# Eigen's float32 erf (generic_fast_erf_float): odd numerator / even denominator in x^2 on [-4, 4],
# where erf reaches +-1 in float32. Highest power first.
_ERF_NUMERATOR = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                  -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_DENOMINATOR = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
                    -1.42647390514189e-02)


def erf_rational(x: Array) -> Array:
    """erf from plain multiplies, adds and one divide. jax.lax.erf lowers to chlo.erf, which jax now
    serialises as a StableHLO composite that TensorFlow 2.21's XlaCallModule cannot read (our TF
    SavedModel export); as fast as XLA's own erf on CPU."""
    x = jnp.clip(x, -4.0, 4.0)
    x2 = x * x
    numerator = jnp.polyval(jnp.asarray(_ERF_NUMERATOR, x.dtype), x2)  # coefficients in x's dtype: bf16 stays bf16
    return x * numerator / jnp.polyval(jnp.asarray(_ERF_DENOMINATOR, x.dtype), x2)


@jax.custom_jvp
def gelu_erf(x: Array) -> Array:
    """Exact GELU as torch and HF's "gelu" compute it: x/2 (1 + erf(x / sqrt 2)). jax.nn.gelu's exact
    form goes through erfc, which XLA:CPU expands into both of its branches and an exp: 2.5x the time
    of the erf form on [1536, 1536] (EPYC), about 7% of an encode on a Xeon.

    A bfloat16 x is computed in float32 and rounded once, as torch computes its bf16 GELU. In bf16
    XLA:CPU rounds after each of the ~25 operations (two converts each): 27% of a bf16 MiniLM
    encode on 2 cores, against 2.5% for the float32 GELU."""
    wide = _at_least_float32(x)
    return (wide * _normal_cdf(wide)).astype(x.dtype)


def _at_least_float32(x: Array) -> Array:
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _normal_cdf(x: Array) -> Array:
    return 0.5 * (1.0 + erf_rational(x * 0.7071067811865476))


@gelu_erf.defjvp
def _gelu_erf_jvp(primals, tangents):
    """GELU' = cdf(x) + x pdf(x), as torch's backward. Differentiating the erf polynomial instead
    (quotient rule over both polynomials) made a MiniLM train step 1-4% slower than jax.nn.gelu's."""
    (x,), (t,) = primals, tangents
    wide = _at_least_float32(x)
    cdf = _normal_cdf(wide)
    pdf = jnp.exp(-0.5 * wide * wide) * jnp.asarray(0.3989422804014327, wide.dtype)  # 1 / sqrt(2 pi)
    # the slope rounded to t's dtype before the product: what linearize keeps for the backward pass
    # stays one bf16 [tokens, 4h] per layer in bf16 training, not a float32 one
    return (wide * cdf).astype(x.dtype), t * (cdf + wide * pdf).astype(t.dtype)


ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": jax.nn.relu,
    "gelu": gelu_erf,  # HF "gelu" is the exact erf form
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
}


def activation(name: str) -> Callable[[Array], Array]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unsupported activation {name!r}; known: {sorted(ACTIVATIONS)}") from None


class Dropout(nn.Dropout):
    """flax's Dropout (the same module name, so the same masks) under the name scope 'dropout': its
    random bits and masks are named so in the compiled program, which the profile's op classes read
    (benchmarks.profile_table)."""

    def __call__(self, inputs, deterministic: bool | None = None, rng=None):
        with jax.named_scope("dropout"):
            return super().__call__(inputs, deterministic=deterministic, rng=rng)


def constrain_activations(x: Array) -> Array:
    """Shard [batch, length, embed] activations by the logical rules (a no-op without a mesh)."""
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))


def partitioned(init: Callable, axes: Sequence[str | None]) -> Callable:
    return nn.with_logical_partitioning(init, tuple(axes))


def accumulated_dot(x: Array, kernel: Array) -> Array:
    """x [..., in] @ kernel [in, out] in their (shared) dtype, accumulated and returned in float32.

    Forward: XLA:CPU runs a bfloat16 product on the CPU's bf16 units (AVX512_BF16 / AMX, through
    YNNPACK) only when its result is float32: a bfloat16 result falls back to float32 kernels, at
    half the speed (MiniLM bf16 padded encode 419 -> 813 sent/s on an AMD EPYC, docs/RESULTS.md).
    TPUs accumulate in float32 anyway. Backward: the products autodiff gives `jnp.dot`, in the
    operands' dtype - differentiating through the float32 result would instead make every
    gradient product float32 x bfloat16 (and its cotangents twice as large). float32 operands
    take `jnp.dot` itself."""
    return jnp.dot(x, kernel) if x.dtype == jnp.float32 else _low_precision_dot(x, kernel)


@jax.custom_vjp
def _low_precision_dot(x: Array, kernel: Array) -> Array:
    return jnp.dot(x, kernel, preferred_element_type=jnp.float32)


def _low_precision_dot_fwd(x: Array, kernel: Array):
    return _low_precision_dot(x, kernel), (x, kernel)


def _low_precision_dot_bwd(residuals, g: Array):
    x, kernel = residuals
    g = g.astype(x.dtype)
    batch = tuple(range(x.ndim - 1))
    return jnp.dot(g, kernel.T), jnp.tensordot(x, g, axes=(batch, batch))


_low_precision_dot.defvjp(_low_precision_dot_fwd, _low_precision_dot_bwd)


def dense_product(x: Array, kernel: Array, bias: Array | None, dtype: DType) -> Array:
    """x @ kernel (+ bias) in `dtype`, with the float32 result only where it pays: on the CPU a
    low-precision product is accumulated and returned in float32 (accumulated_dot: XLA:CPU's bf16
    units need it), the bias added in float32, then rounded once; on GPUs and TPUs, which accumulate
    a bf16 product in float32 inside the matrix unit, the product is returned in bf16 (a bias added
    in float32 within the same fusion) - no float32 [tokens, features] product written and converted
    back per layer. The platform is the one the program is lowered for (lax.platform_dependent: a
    TPU compile from a CPU host gets the TPU form); float32 products are the same everywhere."""
    bias = () if bias is None else (bias,)
    if x.dtype == jnp.float32:
        return _cpu_product(x, kernel, *bias, dtype=dtype)
    return jax.lax.platform_dependent(x, kernel, *bias, cpu=functools.partial(_cpu_product, dtype=dtype),
                                      default=functools.partial(accelerator_product, dtype=dtype))


def _cpu_product(x: Array, kernel: Array, *bias: Array, dtype: DType) -> Array:
    y = accumulated_dot(x, kernel)
    return (y + bias[0].astype(jnp.float32) if bias else y).astype(dtype)


def accelerator_product(x: Array, kernel: Array, *bias: Array, dtype: DType) -> Array:
    """dense_product on a GPU or TPU: the product in the operands' dtype (accumulated in float32 by
    the matrix unit); a bias is added in float32 and the sum rounded once (an elementwise fusion,
    no float32 tensor written), so the bias gradient is a float32 sum over the tokens."""
    y = jnp.dot(x, kernel)
    return (y.astype(jnp.float32) + bias[0].astype(jnp.float32) if bias else y).astype(dtype)


class Dense(nn.Module):
    """A Dense layer whose kernel (and bias) carry logical axis names."""

    features: int
    kernel_axes: tuple[str | None, str | None]
    use_bias: bool = False
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    kernel_init: Callable = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")

    @nn.compact
    def __call__(self, x: Array) -> Array:
        kernel = self.param(
            "kernel", partitioned(self.kernel_init, self.kernel_axes), (x.shape[-1], self.features), self.param_dtype
        )
        bias = None
        if self.use_bias:
            bias = self.param("bias", partitioned(nn.initializers.zeros, self.kernel_axes[-1:]), (self.features,), self.param_dtype)
        # named for the 'dots' remat policy, which keeps these outputs (a name, not the dot primitive:
        # the CPU's product is a custom_vjp, which a dot-matching policy would not see)
        return checkpoint_name(dense_product(x.astype(self.dtype), kernel.astype(self.dtype), bias, self.dtype), "dense")


class Embed(nn.Module):
    """Token (or position) embedding table; `attend` reuses it as an output projection."""

    num_embeddings: int
    features: int
    axes: tuple[str | None, str | None] = ("vocab", "embed")
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    embedding_init: Callable = nn.initializers.normal(stddev=1.0)

    def setup(self):
        self.embedding = self.param(
            "embedding", partitioned(self.embedding_init, self.axes), (self.num_embeddings, self.features), self.param_dtype
        )

    def __call__(self, ids: Array) -> Array:
        return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

    def attend(self, x: Array) -> Array:
        return jnp.dot(x.astype(self.dtype), self.embedding.T.astype(self.dtype))


class RMSNorm(nn.Module):
    """T5 layer norm: scale only, no mean subtraction, no bias; statistics in float32."""

    epsilon: float = 1e-6
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        y = x32 * jax.lax.rsqrt(variance + self.epsilon)
        scale = self.param("scale", partitioned(nn.initializers.ones, ("embed",)), (x.shape[-1],), self.param_dtype)
        return (y * scale.astype(jnp.float32)).astype(self.dtype)


class LayerNorm(nn.Module):
    """BERT layer norm (mean and variance, scale and bias); statistics in float32."""

    epsilon: float = 1e-12
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        variance = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(variance + self.epsilon)
        features = x.shape[-1]
        scale = self.param("scale", partitioned(nn.initializers.ones, ("embed",)), (features,), self.param_dtype)
        bias = self.param("bias", partitioned(nn.initializers.zeros, ("embed",)), (features,), self.param_dtype)
        return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(self.dtype)


@flax.struct.dataclass
class AttentionBias:
    """What a query may see, as jax.nn.dot_product_attention takes it: `bias`, an additive float32
    logit bias broadcastable to [batch, heads, q, k] (T5's relative positions: [1, heads, q, k], no
    batch axis), and `mask`, a boolean [batch or 1, 1, q or 1, k] of the keys a query may attend to.
    Masks are booleans, not a dense float32 bias of -1e9s: a quarter of the bytes, and the form
    fused attention kernels take. `kv_lengths` ([batch] int32) is set where the mask is padding
    only, right padding as tokenizers give it: the fused kernels then take the padding as key
    lengths (cuDNN's padding mask) rather than as a [batch, 1, 1, k] tensor broadcast to a dense
    bias. `a + b` adds the biases and intersects the masks (an array added is a bias); the lengths
    stay only while no other mask joins them."""

    bias: Array | None = None
    mask: Array | None = None
    kv_lengths: Array | None = None

    def __add__(self, other):
        if not isinstance(other, AttentionBias):
            other = AttentionBias(bias=other)
        pick = lambda a, b, join: a if b is None else b if a is None else join(a, b)  # noqa: E731
        kv_lengths = self.kv_lengths if other.mask is None else other.kv_lengths if self.mask is None else None
        return AttentionBias(bias=pick(self.bias, other.bias, jnp.add),
                             mask=pick(self.mask, other.mask, jnp.logical_and), kv_lengths=kv_lengths)

    __radd__ = __add__


def padding_bias(key_mask: Array) -> AttentionBias:
    """[batch, k] mask of valid keys (right padding) -> a [batch, 1, 1, k] boolean mask and the
    [batch] key lengths. A text of no tokens counts one key: its row stays finite, as with the
    written-out form's finite masked logits."""
    lengths = jnp.maximum(jnp.sum(key_mask.astype(jnp.int32), axis=-1), 1)
    return AttentionBias(mask=key_mask[:, None, None, :].astype(bool), kv_lengths=lengths)


def segment_bias(segment_ids: Array) -> AttentionBias:
    """[rows, L] packed segment ids (0 = padding) -> [rows, 1, L, L]: a token sees its own text only."""
    same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] > 0)
    return AttentionBias(mask=same[:, None])


def gather_tokens(x: Array, token_index: Array) -> Array:
    """Packed [rows, L, ...] -> [texts, width, ...]: row-major flat token indices (see data.packing)."""
    return jnp.take(x.reshape((-1,) + x.shape[2:]), token_index, axis=0)


def causal_bias(length: int) -> AttentionBias:
    """[1, 1, length, length] mask forbidding attention to later positions."""
    return AttentionBias(mask=jnp.tril(jnp.ones((length, length), dtype=bool))[None, None])


ATTENTION_IMPLEMENTATIONS = (None, "written_out", "xla", "cudnn")


def fused_implementation(implementation: str | None, dtype, has_dropout: bool) -> str | None:
    """The jax.nn.dot_product_attention implementation to run, or None for the written-out form.
    None (the default) picks cuDNN's fused kernel when this process's default backend is a GPU, the
    activations are bf16 / fp16 (cuDNN's kernel has no float32) and attention has no dropout (it
    has none either); otherwise written out. The backend is the process's (CUDA only), read while
    tracing: a TPU program compiled ahead of time from a CPU host gets the written-out form, as on a
    TPU; one compiled for TPUs on a GPU host should name attention_implementation='written_out'."""
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r}: want one of {ATTENTION_IMPLEMENTATIONS}")
    if has_dropout or implementation == "written_out":
        return None
    if implementation is None:
        fusable = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and cuda_backend()
        return "cudnn" if fusable else None
    return implementation


def cuda_backend() -> bool:
    """Whether this process's default backend is an NVIDIA GPU's (ROCm's GPUs have no cuDNN)."""
    if jax.default_backend() != "gpu":
        return False
    return "cuda" in str(getattr(jax.devices()[0].client, "platform_version", "")).lower()


def attention(q: Array, k: Array, v: Array, bias: AttentionBias | None, scale: float, dropout: Callable | None,
              implementation: str | None = None) -> Array:
    """[batch, q, heads, d] attention, logits and softmax in float32 whatever the activation dtype.
    implementation 'xla' or 'cudnn' (cuDNN's fused kernel on NVIDIA GPUs): jax.nn.dot_product_attention,
    which has no dropout (a step with attention dropout runs the written-out form); padding goes in
    as key lengths. None (the default): cuDNN's kernel where it applies (fused_implementation:
    a GPU backend, bf16 / fp16, no attention dropout), else written out. 'written_out': q.k in the
    activation dtype, then float32 - the form the TPU compiler builds for every shipped config
    (libtpu 0.0.42 crashes compiling jax.nn's float32-accumulating form for Sentence-T5 large)."""
    with jax.named_scope("attention_core"):  # the profile's op class (benchmarks.profile_table)
        return _attention(q, k, v, bias if bias is not None else AttentionBias(), scale, dropout, implementation)


def _attention(q: Array, k: Array, v: Array, bias: AttentionBias, scale: float, dropout: Callable | None,
               implementation: str | None) -> Array:
    implementation = fused_implementation(implementation, q.dtype, dropout is not None)
    if implementation is not None:
        padding_only = bias.kv_lengths is not None
        logit_bias = None if bias.bias is None else bias.bias.astype(q.dtype)  # cuDNN takes q's dtype
        return jax.nn.dot_product_attention(q, k, v, bias=logit_bias, mask=None if padding_only else bias.mask, scale=scale,
                                            key_value_seq_lengths=bias.kv_lengths if padding_only else None,
                                            implementation=implementation)
    # heads-major before the dots: each einsum's batch axes (b, h) lead in both operands, so the
    # transposes are made once, next to the projections, not inside every dot's forward and backward
    # (compiled CPU program of a 2-layer T5 gradient: 41 -> 37 layout changes, 2.05 -> 1.79 MB written;
    # tests/test_accelerator_lowering.py). The fused kernels take [batch, length, heads, dim] as is.
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    # matmuls, not einsums: the ONNX export turns these into MatMul (an einsum of this form became
    # ONNX Einsum, which ONNX Runtime's int8 quantisation leaves in float32)
    logits = jnp.matmul(q, jnp.swapaxes(k, -1, -2)).astype(jnp.float32) * scale
    if bias.bias is not None:
        logits = logits + bias.bias
    if bias.mask is not None:
        logits = jnp.where(bias.mask, logits, MASK_LOGIT)
    weights = jax.nn.softmax(logits, axis=-1)
    if dropout is not None:
        weights = dropout(weights)
    return jnp.matmul(weights.astype(v.dtype), v).transpose(0, 2, 1, 3)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate q/k/v/o projections (T5 and BERT layouts).

    `scale_logits` divides by sqrt(head_dim) (BERT); T5 folds that scale into its initialisation.
    Logits and softmax run in float32 whatever the activation dtype (`attention`).
    """

    num_heads: int
    head_dim: int
    use_bias: bool = False
    scale_logits: bool = False
    dropout_rate: float = 0.0
    deterministic: bool = True
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    out_features: int | None = None
    implementation: str | None = None  # ATTENTION_IMPLEMENTATIONS: None picks (fused_implementation)

    @nn.compact
    def __call__(self, inputs_q: Array, inputs_kv: Array, bias: AttentionBias | None,
                 kv_index: Array | None = None) -> Array:
        """kv_index: keys/values come from packed rows `inputs_kv`, gathered per query row (after
        the projections, so they run over the packed tokens only)."""
        inner = self.num_heads * self.head_dim
        dense = lambda features, axes, name, init=Dense.kernel_init: Dense(  # noqa: E731
            features, axes, use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype, name=name,
            kernel_init=init,
        )
        batch, q_len = inputs_q.shape[:2]
        # Without logit scaling (T5) the 1/sqrt(head_dim) lives in the query's initialisation, as in
        # t5x; otherwise random-init logits are sqrt(head_dim) times too large (peaked attention).
        query_init = Dense.kernel_init if self.scale_logits else _scaled(Dense.kernel_init, self.head_dim ** -0.5)
        q = dense(inner, ("embed", "joined_kv"), "query", query_init)(inputs_q).reshape(batch, q_len, self.num_heads, self.head_dim)
        kv_shape = inputs_kv.shape[:2] + (self.num_heads, self.head_dim)
        k = dense(inner, ("embed", "joined_kv"), "key")(inputs_kv).reshape(kv_shape)
        v = dense(inner, ("embed", "joined_kv"), "value")(inputs_kv).reshape(kv_shape)
        if kv_index is not None:
            k, v = gather_tokens(k, kv_index), gather_tokens(v, kv_index)
        q = nn.with_logical_constraint(q, ("batch", "length", "heads", "kv"))
        k = nn.with_logical_constraint(k, ("batch", "length", "heads", "kv"))
        v = nn.with_logical_constraint(v, ("batch", "length", "heads", "kv"))
        scale = self.head_dim ** -0.5 if self.scale_logits else 1.0
        dropout = None
        if self.dropout_rate > 0 and not self.deterministic:
            dropout = lambda w: Dropout(self.dropout_rate)(w, deterministic=False)  # noqa: E731
        out = attention(q, k, v, bias, scale, dropout, self.implementation).reshape(batch, q_len, inner)
        return dense(self.out_features or inputs_q.shape[-1], ("joined_kv", "embed"), "out")(out)


def _scaled(init: Callable, factor: float) -> Callable:
    return lambda *args, **kwargs: init(*args, **kwargs) * factor


# What a layer keeps for its backward pass (the config's `remat`): 'none' keeps every activation
# (no recompute); 'dots' keeps the outputs of the layer's weight matmuls (projections, MLP) and
# recomputes the rest - norms, activations, attention's batched dots and softmax, the [batch,
# heads, q, k] tensors that grow with length squared (MaxText's 'minimal'); 'full' keeps only the
# layer's input and recomputes the whole layer (a third more FLOPs). The cheapest that fits the
# device's memory is chosen from the compiler's figure: benchmarks.remat_choice.
REMAT_POLICIES = ("none", "dots", "full")
_SAVED = {"dots": jax.checkpoint_policies.save_only_these_names("dense"), "full": None}


def remat_policy(remat: bool | str, api: str = "layer_stack") -> str:
    """The policy a config's `remat` names: 'none' / 'dots' / 'full'; False and True (older
    configs) mean 'none' and 'full'. Another value is a ConfigError naming `api`.remat."""
    if isinstance(remat, bool):
        return "full" if remat else "none"
    validation.require_choice(remat, REMAT_POLICIES, api, "remat")
    return remat


def layer_stack(
    layer_cls: type[nn.Module],
    num_layers: int,
    *,
    scan: bool,
    remat: bool | str,
    collect_hidden: bool,
    layer_kwargs: dict,
    parent_name: str = "layers",
):
    """Return fn(x, *broadcast_args) -> (x, hidden_states or None) running `num_layers` layers.

    With `scan`, parameters are stacked on a leading `layers` axis (one compiled layer, fast
    compiles for 24-layer 11B models); otherwise layers are named `layers_0`, `layers_1`, ...
    Layer modules take (x, *args) and return (x, x_out_or_None).
    """
    cls = layer_cls
    policy = remat_policy(remat)
    if policy != "none":
        cls = nn.remat(cls, prevent_cse=not scan, policy=_SAVED[policy])

    def run(x, *args):
        if scan:
            scanned = nn.scan(
                cls,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast,) * len(args),
                length=num_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, stacked = scanned(collect_hidden=collect_hidden, name=parent_name, **layer_kwargs)(x, *args)
            hidden = tuple(stacked[i] for i in range(num_layers)) if collect_hidden else None
            return x, hidden
        hidden = []
        for i in range(num_layers):
            x, _ = cls(collect_hidden=False, name=f"{parent_name}_{i}", **layer_kwargs)(x, *args)
            hidden.append(x)
        return x, (tuple(hidden) if collect_hidden else None)

    return run
