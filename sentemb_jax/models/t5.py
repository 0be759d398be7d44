"""T5 v1.0 / v1.1 / mT5 in Flax linen, numerically equal to Hugging Face's PyTorch T5.

The parameter tree follows t5x naming (`shared`, `encoder/layers_i/self_attention/query`, ...),
every parameter carries t5x logical axis names, and layers can be scanned for large models.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sentemb_jax.models.common import (
    Dense,
    Dropout,
    Embed,
    MultiHeadAttention,
    RMSNorm,
    activation,
    causal_bias,
    constrain_activations,
    layer_stack,
    padding_bias,
    partitioned,
    remat_policy,
    segment_bias,
)
from sentemb_jax.models.family import ConfigFields, Family, token_id
from sentemb_jax.pooling import ENCDEC_FIRST

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class T5Config:
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int = 6
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    # The decoder's own rate (None: dropout_rate). ST5-EncDec from random init needs it lower than the
    # encoder's: its sentence embedding is the decoder's final first-token state, dropped at this rate.
    decoder_dropout_rate: float | None = None
    # Dropout of the attention probabilities (None: dropout_rate, as Hugging Face's T5). 0.0 lets a
    # GPU run attention as cuDNN's fused kernel, which has no dropout (docs/scale.md, "GPUs").
    attention_dropout_rate: float | None = None
    # T5 drops the encoder's final states (the decoder's cross-attention memory) and the decoder's
    # final states; False keeps dropout inside the layers only.
    dropout_final_states: bool = True
    layer_norm_epsilon: float = 1e-6
    dense_act_fn: str = "relu"  # v1.0: relu; v1.1 / mT5: gelu_new (gated)
    is_gated_act: bool = False
    tie_word_embeddings: bool = True  # v1.0 ties the LM head to `shared`; v1.1 / mT5 have their own lm_head
    scale_decoder_outputs: bool = True  # v1.0 rescales decoder outputs by d_model**-0.5 before the LM head
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    # Which parts exist: encoder-only checkpoints (T5EncoderModel) have no decoder; T5Model has no LM head.
    has_decoder: bool = True
    has_lm_head: bool = False
    # Execution: activation dtype separate from parameter dtype; scan/remat for large models.
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    scan_layers: bool = False
    remat: bool | str = False  # models.common.REMAT_POLICIES: 'none', 'dots', 'full' (True)
    # None: cuDNN's fused kernel on a GPU in bf16 without attention dropout, else written out
    # (models.common.fused_implementation); 'written_out'; 'xla' / 'cudnn': jax.nn.dot_product_attention's.
    attention_implementation: str | None = None

    def __post_init__(self):
        remat_policy(self.remat, "sentemb_jax.T5Config")  # a policy named wrong: refused here, not while tracing

    @property
    def decoder_dropout(self) -> float:
        return self.dropout_rate if self.decoder_dropout_rate is None else self.decoder_dropout_rate

    @property
    def model_type(self) -> str:
        return "t5"

    @property
    def hidden_size(self) -> int:
        return self.d_model


def relative_position_bucket(relative_position: Array, bidirectional: bool, num_buckets: int, max_distance: int) -> Array:
    """T5's log-spaced relative position buckets (memory_position - query_position)."""
    buckets = jnp.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).astype(relative_position.dtype) * num_buckets
        n = jnp.abs(relative_position)
    else:
        n = -jnp.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # log(0) is masked out by `is_small`; clamp to avoid a -inf cast warning.
    n_float = jnp.maximum(n, 1).astype(jnp.float32)
    large = max_exact + (
        jnp.log(n_float / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).astype(relative_position.dtype)
    large = jnp.minimum(large, num_buckets - 1)
    return buckets + jnp.where(is_small, n, large)


class RelativePositionBias(nn.Module):
    num_buckets: int
    max_distance: int
    num_heads: int
    bidirectional: bool
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, q_len: int, k_len: int) -> Array:
        # iota, not np: lengths may be symbolic (a length-polymorphic SavedModel export); and not
        # jnp.arange()[:, None], which jax2onnx's symbolic lengths do not trace through (ONNX export).
        context = jax.lax.broadcasted_iota(jnp.int32, (q_len, k_len), 0)
        memory = jax.lax.broadcasted_iota(jnp.int32, (q_len, k_len), 1)
        buckets = relative_position_bucket(memory - context, self.bidirectional, self.num_buckets, self.max_distance)
        table = self.param(
            "rel_embedding",
            partitioned(nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"), ("relpos_buckets", "heads")),  # t5x
            (self.num_buckets, self.num_heads),
            self.param_dtype,
        )
        values = jnp.take(table.astype(jnp.float32), buckets, axis=0)  # [q, k, heads]
        return jnp.transpose(values, (2, 0, 1))[None]  # [1, heads, q, k]


class T5MLP(nn.Module):
    config: T5Config
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        dense = lambda features, axes, name: Dense(  # noqa: E731
            features, axes, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name=name
        )
        act = activation(cfg.dense_act_fn)
        if cfg.is_gated_act:
            h = act(dense(cfg.d_ff, ("embed", "mlp"), "wi_0")(x)) * dense(cfg.d_ff, ("embed", "mlp"), "wi_1")(x)
        else:
            h = act(dense(cfg.d_ff, ("embed", "mlp"), "wi")(x))
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        h = Dropout(cfg.dropout_rate)(h, deterministic=self.deterministic)
        return dense(cfg.d_model, ("mlp", "embed"), "wo")(h)


def _attention(cfg: T5Config, deterministic: bool, name: str) -> MultiHeadAttention:
    return MultiHeadAttention(
        num_heads=cfg.num_heads,
        head_dim=cfg.d_kv,
        use_bias=False,
        scale_logits=False,
        dropout_rate=cfg.dropout_rate if cfg.attention_dropout_rate is None else cfg.attention_dropout_rate,
        deterministic=deterministic,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        implementation=cfg.attention_implementation,
        name=name,
    )


class T5EncoderLayer(nn.Module):
    config: T5Config
    deterministic: bool = True
    collect_hidden: bool = False

    @nn.compact
    def __call__(self, x: Array, bias: Array):
        cfg = self.config
        norm = lambda name: RMSNorm(cfg.layer_norm_epsilon, cfg.dtype, cfg.param_dtype, name=name)  # noqa: E731
        drop = lambda y: Dropout(cfg.dropout_rate)(y, deterministic=self.deterministic)  # noqa: E731
        h = norm("pre_attention_layer_norm")(x)
        x = x + drop(_attention(cfg, self.deterministic, "self_attention")(h, h, bias))
        h = norm("pre_mlp_layer_norm")(x)
        x = constrain_activations(x + drop(T5MLP(cfg, self.deterministic, name="mlp")(h)))
        return x, (x if self.collect_hidden else None)


class T5DecoderLayer(nn.Module):
    config: T5Config
    deterministic: bool = True
    collect_hidden: bool = False

    @nn.compact
    def __call__(self, x: Array, self_bias: Array, encoded: Array, cross_bias: Array, kv_index: Array | None = None):
        cfg = self.config
        norm = lambda name: RMSNorm(cfg.layer_norm_epsilon, cfg.dtype, cfg.param_dtype, name=name)  # noqa: E731
        drop = lambda y: Dropout(cfg.dropout_rate)(y, deterministic=self.deterministic)  # noqa: E731
        h = norm("pre_self_attention_layer_norm")(x)
        x = x + drop(_attention(cfg, self.deterministic, "self_attention")(h, h, self_bias))
        h = norm("pre_cross_attention_layer_norm")(x)
        x = x + drop(_attention(cfg, self.deterministic, "encoder_decoder_attention")(h, encoded, cross_bias, kv_index))
        h = norm("pre_mlp_layer_norm")(x)
        x = constrain_activations(x + drop(T5MLP(cfg, self.deterministic, name="mlp")(h)))
        return x, (x if self.collect_hidden else None)


class T5Encoder(nn.Module):
    config: T5Config
    shared: nn.Module

    @nn.compact
    def __call__(self, input_ids: Array, attention_mask: Array, deterministic: bool = True, output_hidden_states: bool = False,
                 segment_ids: Array | None = None):
        cfg = self.config
        x = constrain_activations(self.shared(input_ids))
        x = Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        length = input_ids.shape[1]
        bias = RelativePositionBias(
            cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance, cfg.num_heads, True,
            cfg.param_dtype, name="relpos_bias",
        )(length, length)
        # Packed rows: texts are contiguous, so arange distances are the in-text distances.
        bias = bias + (padding_bias(attention_mask) if segment_ids is None else segment_bias(segment_ids))
        run = layer_stack(
            T5EncoderLayer, cfg.num_layers, scan=cfg.scan_layers, remat=cfg.remat, collect_hidden=output_hidden_states,
            layer_kwargs=dict(config=cfg, deterministic=deterministic),
        )
        embedded = x
        x, hidden = run(x, bias)
        x = RMSNorm(cfg.layer_norm_epsilon, cfg.dtype, cfg.param_dtype, name="encoder_norm")(x)
        x = Dropout(cfg.dropout_rate if cfg.dropout_final_states else 0.0)(x, deterministic=deterministic)
        if output_hidden_states:
            # Like HF: embeddings, then each layer's output, the last one after the final norm.
            hidden = (embedded,) + hidden[:-1] + (x,)
        return x, hidden


class T5Decoder(nn.Module):
    config: T5Config
    shared: nn.Module

    @nn.compact
    def __call__(self, decoder_input_ids, encoded, encoder_mask, decoder_mask=None, deterministic: bool = True,
                 encoded_index=None):
        """encoded_index: `encoded` is packed rows; [batch, width] flat indices of each row's tokens."""
        cfg = dataclasses.replace(self.config, dropout_rate=self.config.decoder_dropout)
        x = constrain_activations(self.shared(decoder_input_ids))
        x = Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        length = decoder_input_ids.shape[1]
        self_bias = RelativePositionBias(
            cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance, cfg.num_heads, False,
            cfg.param_dtype, name="relpos_bias",
        )(length, length) + causal_bias(length)
        if decoder_mask is not None:
            self_bias = self_bias + padding_bias(decoder_mask)
        run = layer_stack(
            T5DecoderLayer, cfg.num_decoder_layers, scan=cfg.scan_layers, remat=cfg.remat, collect_hidden=False,
            layer_kwargs=dict(config=cfg, deterministic=deterministic),
        )
        cross = (encoded, padding_bias(encoder_mask)) + (() if encoded_index is None else (encoded_index,))
        x, _ = run(x, self_bias, *cross)
        x = RMSNorm(cfg.layer_norm_epsilon, cfg.dtype, cfg.param_dtype, name="decoder_norm")(x)
        return Dropout(cfg.dropout_rate if cfg.dropout_final_states else 0.0)(x, deterministic=deterministic)


class T5(nn.Module):
    """T5 encoder(-decoder). `encode` gives encoder states, `decode` decoder states, `__call__` all."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.shared = Embed(cfg.vocab_size, cfg.d_model, ("vocab", "embed"), cfg.dtype, cfg.param_dtype, name="shared")
        self.encoder = T5Encoder(cfg, self.shared)
        if cfg.has_decoder:
            self.decoder = T5Decoder(cfg, self.shared)
            if cfg.has_lm_head and not cfg.tie_word_embeddings:
                self.lm_head = Dense(cfg.vocab_size, ("embed", "vocab"), dtype=jnp.float32, param_dtype=cfg.param_dtype)

    def encode(self, input_ids, attention_mask, deterministic: bool = True, output_hidden_states: bool = False,
               segment_ids=None, positions=None):
        """-> (last_hidden_state [B, L, D], tuple of hidden states or None).

        segment_ids: packed rows (sentemb_jax.data.packing); positions are implied (relative bias)."""
        return self.encoder(input_ids, attention_mask, deterministic, output_hidden_states, segment_ids)

    def decode(self, decoder_input_ids, encoded, encoder_mask, decoder_mask=None, deterministic: bool = True,
               encoded_index=None):
        if not self.config.has_decoder:
            raise ValueError("this T5 has no decoder (it was loaded from an encoder-only checkpoint)")
        return self.decoder(decoder_input_ids, encoded, encoder_mask, decoder_mask, deterministic, encoded_index)

    def decode_first_token(self, encoded, encoder_mask, deterministic: bool = True, encoded_index=None):
        """Sentence-T5 encoder-decoder pooling: the decoder fed only the start token.

        With `encoded_index` ([batch, width]), `encoded` holds packed rows and `encoder_mask` is [batch, width]."""
        batch = encoded.shape[0] if encoded_index is None else encoded_index.shape[0]
        start = jnp.full((batch, 1), self.config.decoder_start_token_id, dtype=jnp.int32)
        return self.decode(start, encoded, encoder_mask, None, deterministic, encoded_index)[:, 0]

    def logits(self, decoder_hidden):
        cfg = self.config
        if cfg.scale_decoder_outputs:
            decoder_hidden = decoder_hidden * (cfg.d_model**-0.5)
        if cfg.tie_word_embeddings:
            return self.shared.attend(decoder_hidden)
        return self.lm_head(decoder_hidden)

    def __call__(self, input_ids, attention_mask, decoder_input_ids=None, deterministic: bool = True):
        encoded, _ = self.encode(input_ids, attention_mask, deterministic)
        if not self.config.has_decoder:
            return encoded
        if decoder_input_ids is None:
            decoder_input_ids = jnp.full((input_ids.shape[0], 1), self.config.decoder_start_token_id, jnp.int32)
        hidden = self.decode(decoder_input_ids, encoded, attention_mask, None, deterministic)
        return self.logits(hidden) if self.config.has_lm_head else hidden


# ---------------------------------------------------------------------------------------------
# The family: Hugging Face's config.json and tensor names (models.family)

PAIR_FORMAT = "sentence1: {} sentence2: {}"  # T5 has no pair template: a pair is one text (its GLUE style)


def config_from_hf(hf: dict, c, names: frozenset) -> T5Config:
    tied = hf.get("tie_word_embeddings", True) is not False
    archs = hf.get("architectures") or []
    return T5Config(
        vocab_size=c.vocab_size, d_model=c.d_model, d_kv=c.d_kv, d_ff=c.d_ff, num_layers=c.num_layers,
        num_decoder_layers=c.num_decoder_layers, num_heads=c.num_heads,
        relative_attention_num_buckets=c.relative_attention_num_buckets,
        relative_attention_max_distance=c.relative_attention_max_distance, dropout_rate=c.dropout_rate,
        layer_norm_epsilon=c.layer_norm_epsilon, dense_act_fn=c.dense_act_fn, is_gated_act=c.is_gated_act,
        # Read from the raw dict: transformers 5 forces T5Config.tie_word_embeddings to True, but
        # v1.1 / mT5 checkpoints say false and carry their own lm_head.weight (and skip the rescale).
        tie_word_embeddings=tied,
        scale_decoder_outputs=bool(hf.get("scale_decoder_outputs", tied)),
        pad_token_id=token_id(c, "pad_token_id", 0),
        eos_token_id=token_id(c, "eos_token_id", 1),
        decoder_start_token_id=token_id(c, "decoder_start_token_id", 0),
        has_decoder=any(n.startswith("decoder.") for n in names) if names else not any("EncoderModel" in a for a in archs),
        has_lm_head=any("ConditionalGeneration" in a for a in archs) if tied else "lm_head.weight" in names,
    )


def hf_config_of(cfg: T5Config) -> dict:
    act = "gelu" if cfg.dense_act_fn == "gelu_new" else cfg.dense_act_fn  # HF: gated-gelu means gelu_new
    return {"model_type": "t5", "architectures": ["T5Model" if cfg.has_decoder else "T5EncoderModel"],
            "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "d_kv": cfg.d_kv, "d_ff": cfg.d_ff,
            "num_layers": cfg.num_layers, "num_decoder_layers": cfg.num_decoder_layers, "num_heads": cfg.num_heads,
            "relative_attention_num_buckets": cfg.relative_attention_num_buckets,
            "relative_attention_max_distance": cfg.relative_attention_max_distance,
            "dropout_rate": cfg.dropout_rate, "layer_norm_epsilon": cfg.layer_norm_epsilon,
            "feed_forward_proj": ("gated-" if cfg.is_gated_act else "") + act,
            "tie_word_embeddings": cfg.tie_word_embeddings, "scale_decoder_outputs": cfg.scale_decoder_outputs,
            "pad_token_id": cfg.pad_token_id, "eos_token_id": cfg.eos_token_id,
            "decoder_start_token_id": cfg.decoder_start_token_id, "is_encoder_decoder": cfg.has_decoder}


def hf_name_map(cfg: T5Config) -> dict:
    m = {"shared.weight": (("shared", "embedding"), False)}

    def attention(hf_prefix: str, ours):
        for hf, our in (("q", "query"), ("k", "key"), ("v", "value"), ("o", "out")):
            m[f"{hf_prefix}.{hf}.weight"] = (ours + (our, "kernel"), True)

    def mlp(hf_prefix: str, ours):
        for n in ("wi_0", "wi_1", "wo") if cfg.is_gated_act else ("wi", "wo"):
            m[f"{hf_prefix}.DenseReluDense.{n}.weight"] = (ours + ("mlp", n, "kernel"), True)

    def norm(hf_name: str, ours):
        m[hf_name] = (ours + ("scale",), False)

    for i in range(cfg.num_layers):
        hf, ours = f"encoder.block.{i}", ("encoder", f"layers_{i}")
        attention(f"{hf}.layer.0.SelfAttention", ours + ("self_attention",))
        norm(f"{hf}.layer.0.layer_norm.weight", ours + ("pre_attention_layer_norm",))
        mlp(f"{hf}.layer.1", ours)
        norm(f"{hf}.layer.1.layer_norm.weight", ours + ("pre_mlp_layer_norm",))
    m["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = (("encoder", "relpos_bias", "rel_embedding"), False)
    norm("encoder.final_layer_norm.weight", ("encoder", "encoder_norm"))
    if cfg.has_decoder:
        for i in range(cfg.num_decoder_layers):
            hf, ours = f"decoder.block.{i}", ("decoder", f"layers_{i}")
            attention(f"{hf}.layer.0.SelfAttention", ours + ("self_attention",))
            norm(f"{hf}.layer.0.layer_norm.weight", ours + ("pre_self_attention_layer_norm",))
            attention(f"{hf}.layer.1.EncDecAttention", ours + ("encoder_decoder_attention",))
            norm(f"{hf}.layer.1.layer_norm.weight", ours + ("pre_cross_attention_layer_norm",))
            mlp(f"{hf}.layer.2", ours)
            norm(f"{hf}.layer.2.layer_norm.weight", ours + ("pre_mlp_layer_norm",))
        m["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = (("decoder", "relpos_bias", "rel_embedding"), False)
        norm("decoder.final_layer_norm.weight", ("decoder", "decoder_norm"))
        if cfg.has_lm_head and not cfg.tie_word_embeddings:
            m["lm_head.weight"] = (("lm_head", "kernel"), True)
    return m


FAMILY = Family(
    name="t5", config_type=T5Config, module_type=T5, model_types=("t5", "mt5"),
    config_from_hf=config_from_hf, hf_config_of=hf_config_of, hf_name_map=hf_name_map, layers_field="num_layers",
    config_fields=ConfigFields(
        sizes=("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
               "relative_attention_num_buckets", "relative_attention_max_distance"),
        token_ids=("pad_token_id", "eos_token_id", "decoder_start_token_id"), dropouts=("dropout_rate",),
        epsilons=("layer_norm_epsilon",)),
    # Tied copies of `shared`; a tied checkpoint's lm_head.weight is `shared` too.
    ignored_tensors=lambda cfg: r"^(encoder|decoder)\.embed_tokens\.weight$" + (r"|^lm_head\.weight$" if cfg.tie_word_embeddings else ""),
    extra_poolings=lambda cfg: (ENCDEC_FIRST,) if cfg.has_decoder else (),
    cross_pooling="first", cross_poolings=("first", "mean"), pair_format=PAIR_FORMAT,
)
