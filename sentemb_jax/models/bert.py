"""BERT, RoBERTa and MiniLM (a BERT config) in Flax linen, equal to Hugging Face's PyTorch models."""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sentemb_jax.errors import CheckpointError
from sentemb_jax.models.common import (
    Dense,
    Dropout,
    Embed,
    LayerNorm,
    MultiHeadAttention,
    activation,
    constrain_activations,
    layer_stack,
    padding_bias,
    remat_policy,
    segment_bias,
)
from sentemb_jax.models.family import ConfigFields, Family, SequenceClassifier, strip_base_prefix, token_id

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class BertConfig:
    model_type: str = "bert"  # "bert" or "roberta" (RoBERTa offsets positions by padding_idx + 1)
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    add_pooling_layer: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    scan_layers: bool = False
    remat: bool | str = False  # models.common.REMAT_POLICIES: 'none', 'dots', 'full' (True)
    # None: cuDNN's fused kernel on a GPU in bf16 without attention dropout, else written out
    # (models.common.fused_implementation); 'written_out'; 'xla' / 'cudnn': jax.nn.dot_product_attention's.
    attention_implementation: str | None = None

    def __post_init__(self):
        remat_policy(self.remat, "sentemb_jax.BertConfig")  # a policy named wrong: refused here, not while tracing

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def position_ids_for(cfg: BertConfig, input_ids: Array, positions: Array | None = None) -> Array:
    """Absolute position ids; `positions` (packed rows: 0 at each text's start) override the default."""
    if positions is not None:
        return positions + (cfg.pad_token_id + 1 if cfg.model_type == "roberta" else 0)
    if cfg.model_type == "roberta":
        # RoBERTa: positions count non-padding tokens and start at padding_idx + 1.
        mask = (input_ids != cfg.pad_token_id).astype(jnp.int32)
        return jnp.cumsum(mask, axis=1) * mask + cfg.pad_token_id
    # iota, not arange()[None]: the same ids, and it traces with a symbolic length (ONNX export).
    return jax.lax.broadcasted_iota(jnp.int32, input_ids.shape, 1)


class BertEmbeddings(nn.Module):
    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, token_type_ids, deterministic: bool, positions=None):
        cfg = self.config
        embed = lambda n, axes, name: Embed(  # noqa: E731
            n, cfg.hidden_size, axes, cfg.dtype, cfg.param_dtype, nn.initializers.normal(0.02), name=name
        )
        x = embed(cfg.vocab_size, ("vocab", "embed"), "word_embeddings")(input_ids)
        x = x + embed(cfg.max_position_embeddings, ("abspos_buckets", "embed"), "position_embeddings")(
            position_ids_for(cfg, input_ids, positions)
        )
        x = x + embed(cfg.type_vocab_size, (None, "embed"), "token_type_embeddings")(token_type_ids)
        x = LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, name="layer_norm")(x)
        return Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)


class BertLayer(nn.Module):
    config: BertConfig
    deterministic: bool = True
    collect_hidden: bool = False

    @nn.compact
    def __call__(self, x: Array, bias: Array):
        cfg = self.config
        drop = lambda y: Dropout(cfg.hidden_dropout_prob)(y, deterministic=self.deterministic)  # noqa: E731
        norm = lambda name: LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, name=name)  # noqa: E731
        attn = MultiHeadAttention(
            num_heads=cfg.num_attention_heads,
            head_dim=cfg.head_dim,
            use_bias=True,
            scale_logits=True,
            dropout_rate=cfg.attention_probs_dropout_prob,
            deterministic=self.deterministic,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            implementation=cfg.attention_implementation,
            name="attention",
        )(x, x, bias)
        x = norm("attention_layer_norm")(x + drop(attn))
        h = Dense(cfg.intermediate_size, ("embed", "mlp"), True, cfg.dtype, cfg.param_dtype, name="intermediate")(x)
        h = nn.with_logical_constraint(activation(cfg.hidden_act)(h), ("batch", "length", "mlp"))
        h = Dense(cfg.hidden_size, ("mlp", "embed"), True, cfg.dtype, cfg.param_dtype, name="output")(h)
        x = constrain_activations(norm("output_layer_norm")(x + drop(h)))
        return x, (x if self.collect_hidden else None)


class BertEncoderStack(nn.Module):
    config: BertConfig

    @nn.compact
    def __call__(self, x, bias, deterministic: bool, output_hidden_states: bool):
        cfg = self.config
        run = layer_stack(
            BertLayer, cfg.num_hidden_layers, scan=cfg.scan_layers, remat=cfg.remat,
            collect_hidden=output_hidden_states, layer_kwargs=dict(config=cfg, deterministic=deterministic),
        )
        return run(x, bias)


class Bert(nn.Module):
    """BERT-family encoder. `encode` -> (last_hidden_state, hidden states or None)."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoderStack(cfg)
        if cfg.add_pooling_layer:
            self.pooler = Dense(cfg.hidden_size, (None, "embed"), True, cfg.dtype, cfg.param_dtype)

    def encode(self, input_ids, attention_mask, deterministic: bool = True, output_hidden_states: bool = False, token_type_ids=None,
               segment_ids=None, positions=None):
        """segment_ids / positions: packed rows (sentemb_jax.data.packing); attention stays within a text."""
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        x = constrain_activations(self.embeddings(input_ids, token_type_ids, deterministic, positions))
        bias = padding_bias(attention_mask) if segment_ids is None else segment_bias(segment_ids)
        x_last, hidden = self.encoder(x, bias, deterministic, output_hidden_states)
        if output_hidden_states:
            hidden = (x,) + hidden
        return x_last, hidden

    def pool(self, last_hidden):
        """BERT's pooler (tanh(Dense(CLS))) - only for checkpoints that have one."""
        return jnp.tanh(self.pooler(last_hidden[:, 0]))

    def __call__(self, input_ids, attention_mask, deterministic: bool = True):
        x, _ = self.encode(input_ids, attention_mask, deterministic)
        return self.pool(x) if self.config.add_pooling_layer else x


# ---------------------------------------------------------------------------------------------
# The family: Hugging Face's config.json and tensor names (models.family)

ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")
BASE_PREFIXES = ("bert.", "roberta.")


def config_from_hf(hf: dict, c, names: frozenset) -> BertConfig:
    pet = hf.get("position_embedding_type", "absolute")
    if pet != "absolute":
        raise CheckpointError(f"position_embedding_type={pet!r} is not supported (only 'absolute')")
    return BertConfig(
        model_type="bert" if hf.get("model_type") == "bert" else "roberta", vocab_size=c.vocab_size,
        hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size, hidden_act=c.hidden_act, hidden_dropout_prob=c.hidden_dropout_prob,
        attention_probs_dropout_prob=c.attention_probs_dropout_prob, max_position_embeddings=c.max_position_embeddings,
        type_vocab_size=c.type_vocab_size, layer_norm_eps=c.layer_norm_eps, pad_token_id=token_id(c, "pad_token_id", 0),
        add_pooling_layer=any(strip_base_prefix(n, BASE_PREFIXES).startswith("pooler.") for n in names),
    )


HF_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
             "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
             "layer_norm_eps", "pad_token_id")


def hf_config_of(cfg: BertConfig) -> dict:
    return {"model_type": cfg.model_type, "architectures": ["BertModel" if cfg.model_type == "bert" else "RobertaModel"],
            **{f: getattr(cfg, f) for f in HF_FIELDS}}


def dense_names(m: dict, hf: str, ours: tuple) -> None:
    """A torch Linear (weight [out, in], bias) onto a Dense (kernel [in, out], bias)."""
    m[f"{hf}.weight"] = (ours + ("kernel",), True)
    m[f"{hf}.bias"] = (ours + ("bias",), False)


def norm_names(m: dict, hf: str, ours: tuple) -> None:
    m[f"{hf}.weight"] = (ours + ("scale",), False)
    m[f"{hf}.bias"] = (ours + ("bias",), False)


def hf_name_map(cfg: BertConfig) -> dict:
    m: dict = {}
    for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        m[f"embeddings.{table}.weight"] = (("embeddings", table, "embedding"), False)
    norm_names(m, "embeddings.LayerNorm", ("embeddings", "layer_norm"))
    for i in range(cfg.num_hidden_layers):
        hf, ours = f"encoder.layer.{i}", ("encoder", f"layers_{i}")
        for part in ("query", "key", "value"):
            dense_names(m, f"{hf}.attention.self.{part}", ours + ("attention", part))
        dense_names(m, f"{hf}.attention.output.dense", ours + ("attention", "out"))
        norm_names(m, f"{hf}.attention.output.LayerNorm", ours + ("attention_layer_norm",))
        dense_names(m, f"{hf}.intermediate.dense", ours + ("intermediate",))
        dense_names(m, f"{hf}.output.dense", ours + ("output",))
        norm_names(m, f"{hf}.output.LayerNorm", ours + ("output_layer_norm",))
    if cfg.add_pooling_layer:
        dense_names(m, "pooler.dense", ("pooler",))
    return m


def position_limit(cfg: BertConfig) -> int:
    """Learned positions; RoBERTa's start after padding_idx + 1."""
    return cfg.max_position_embeddings - (cfg.pad_token_id + 1 if cfg.model_type == "roberta" else 0)


# Task heads of *ForMaskedLM / *ForSequenceClassification ... checkpoints: not part of the encoder.
HEAD_TENSORS = r"^(cls|lm_head|classifier|qa_outputs)\."

FAMILY = Family(
    name="bert", config_type=BertConfig, module_type=Bert, model_types=("bert",) + ROBERTA_TYPES,
    config_from_hf=config_from_hf, hf_config_of=hf_config_of, hf_name_map=hf_name_map, layers_field="num_hidden_layers",
    config_fields=ConfigFields(
        sizes=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "max_position_embeddings", "type_vocab_size"),
        token_ids=("pad_token_id",), dropouts=("hidden_dropout_prob", "attention_probs_dropout_prob"),
        epsilons=("layer_norm_eps",), divisible=("hidden_size", "num_attention_heads")),
    position_limit=position_limit, base_prefixes=BASE_PREFIXES,
    ignored_tensors=lambda cfg: r"^embeddings\.position_ids$", head_tensors=HEAD_TENSORS,
    sequence_classifiers={
        "bert": SequenceClassifier("BertForSequenceClassification", "bert.", "bert.pooler.dense", "classifier",
                                   head_from_pooler=True),
        **{t: SequenceClassifier(f"{n}ForSequenceClassification", "roberta.", "classifier.dense", "classifier.out_proj")
           for t, n in (("roberta", "Roberta"), ("xlm-roberta", "XLMRoberta"), ("camembert", "Camembert"))},
    },
)
