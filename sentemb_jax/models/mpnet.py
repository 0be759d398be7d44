"""MPNet (sentence-transformers' all-mpnet-base-v2) in Flax linen, equal to Hugging Face's PyTorch
`MPNetModel`: BERT's post-norm layers (models.bert.BertLayer), RoBERTa's absolute positions
(starting after padding_idx + 1), no token types, and a T5-style bidirectional relative-position
bias computed once and added to every layer's attention logits."""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sentemb_jax.models.bert import Bert, BertLayer, dense_names, norm_names
from sentemb_jax.models.common import (
    Dense,
    Dropout,
    Embed,
    LayerNorm,
    layer_stack,
    remat_policy,
)
from sentemb_jax.models.family import ConfigFields, Family, SequenceClassifier, strip_base_prefix, token_id
from sentemb_jax.models.t5 import RelativePositionBias

Array = jax.Array

# transformers' MPNet: positions count from its padding index 1 whatever pad_token_id says, and the
# relative buckets are always 32 over a maximum distance of 128 (compute_position_bias's defaults).
PADDING_IDX = 1
RELATIVE_BUCKETS = 32
RELATIVE_MAX_DISTANCE = 128


@dataclasses.dataclass(frozen=True)
class MPNetConfig:
    vocab_size: int = 30527
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 514
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1
    relative_attention_num_buckets: int = RELATIVE_BUCKETS
    add_pooling_layer: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    scan_layers: bool = False
    remat: bool | str = False  # models.common.REMAT_POLICIES
    attention_implementation: str | None = None  # as BertConfig's

    def __post_init__(self):
        remat_policy(self.remat, "sentemb_jax.MPNetConfig")

    @property
    def model_type(self) -> str:
        return "mpnet"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def position_ids_for(input_ids: Array, positions: Array | None = None) -> Array:
    """RoBERTa-style ids: non-padding tokens count from PADDING_IDX + 1, padding gets PADDING_IDX;
    `positions` (packed rows: 0 at each text's start) override."""
    if positions is not None:
        return positions + PADDING_IDX + 1
    mask = (input_ids != PADDING_IDX).astype(jnp.int32)
    return jnp.cumsum(mask, axis=1) * mask + PADDING_IDX


class MPNetEmbeddings(nn.Module):
    config: MPNetConfig

    @nn.compact
    def __call__(self, input_ids, token_type_ids, deterministic: bool, positions=None):
        """token_type_ids: taken as BERT's embeddings take them, and unused (MPNet has none)."""
        cfg = self.config
        embed = lambda n, axes, name: Embed(  # noqa: E731
            n, cfg.hidden_size, axes, cfg.dtype, cfg.param_dtype, nn.initializers.normal(0.02), name=name
        )
        x = embed(cfg.vocab_size, ("vocab", "embed"), "word_embeddings")(input_ids)
        x = x + embed(cfg.max_position_embeddings, ("abspos_buckets", "embed"), "position_embeddings")(
            position_ids_for(input_ids, positions)
        )
        x = LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, name="layer_norm")(x)
        return Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)


class MPNetEncoderStack(nn.Module):
    config: MPNetConfig

    @nn.compact
    def __call__(self, x, bias, deterministic: bool, output_hidden_states: bool):
        cfg = self.config
        length = x.shape[1]
        # Packed rows hold whole texts end to end, so distances along the row are in-text distances.
        relative = RelativePositionBias(cfg.relative_attention_num_buckets, RELATIVE_MAX_DISTANCE, cfg.num_attention_heads,
                                        True, cfg.param_dtype, name="relpos_bias")(length, length)
        run = layer_stack(
            BertLayer, cfg.num_hidden_layers, scan=cfg.scan_layers, remat=cfg.remat,
            collect_hidden=output_hidden_states, layer_kwargs=dict(config=cfg, deterministic=deterministic),
        )
        return run(x, relative + bias)


class MPNet(Bert):
    """MPNet encoder: BERT's encode / pool / __call__ (`encode` -> (last_hidden_state, hidden states
    or None)) over MPNet's embeddings and its encoder stack with the relative bias."""

    config: MPNetConfig

    def setup(self):
        cfg = self.config
        self.embeddings = MPNetEmbeddings(cfg)
        self.encoder = MPNetEncoderStack(cfg)
        if cfg.add_pooling_layer:
            self.pooler = Dense(cfg.hidden_size, (None, "embed"), True, cfg.dtype, cfg.param_dtype)


# ---------------------------------------------------------------------------------------------
# The family: Hugging Face's config.json and tensor names (models.family)

BASE_PREFIXES = ("mpnet.",)


def config_from_hf(hf: dict, c, names: frozenset) -> MPNetConfig:
    return MPNetConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size, hidden_act=c.hidden_act,
        hidden_dropout_prob=c.hidden_dropout_prob, attention_probs_dropout_prob=c.attention_probs_dropout_prob,
        max_position_embeddings=c.max_position_embeddings, layer_norm_eps=c.layer_norm_eps,
        pad_token_id=token_id(c, "pad_token_id", PADDING_IDX),
        relative_attention_num_buckets=c.relative_attention_num_buckets,
        add_pooling_layer=any(strip_base_prefix(n, BASE_PREFIXES).startswith("pooler.") for n in names),
    )


HF_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
             "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "layer_norm_eps",
             "pad_token_id", "relative_attention_num_buckets")


def hf_config_of(cfg: MPNetConfig) -> dict:
    return {"model_type": "mpnet", "architectures": ["MPNetModel"], **{f: getattr(cfg, f) for f in HF_FIELDS}}


def hf_name_map(cfg: MPNetConfig) -> dict:
    m: dict = {}
    for table in ("word_embeddings", "position_embeddings"):
        m[f"embeddings.{table}.weight"] = (("embeddings", table, "embedding"), False)
    norm_names(m, "embeddings.LayerNorm", ("embeddings", "layer_norm"))
    for i in range(cfg.num_hidden_layers):
        hf, ours = f"encoder.layer.{i}", ("encoder", f"layers_{i}")
        for part, our in (("q", "query"), ("k", "key"), ("v", "value"), ("o", "out")):
            dense_names(m, f"{hf}.attention.attn.{part}", ours + ("attention", our))
        norm_names(m, f"{hf}.attention.LayerNorm", ours + ("attention_layer_norm",))
        dense_names(m, f"{hf}.intermediate.dense", ours + ("intermediate",))
        dense_names(m, f"{hf}.output.dense", ours + ("output",))
        norm_names(m, f"{hf}.output.LayerNorm", ours + ("output_layer_norm",))
    m["encoder.relative_attention_bias.weight"] = (("encoder", "relpos_bias", "rel_embedding"), False)
    if cfg.add_pooling_layer:
        dense_names(m, "pooler.dense", ("pooler",))
    return m


def _consistency(hf: dict) -> list[str]:
    buckets = hf.get("relative_attention_num_buckets", RELATIVE_BUCKETS)
    if buckets != RELATIVE_BUCKETS:  # transformers would index its table with 32 buckets anyway
        return [f"relative_attention_num_buckets must be {RELATIVE_BUCKETS} (transformers' MPNet computes "
                f"{RELATIVE_BUCKETS} buckets whatever the config says), got {buckets!r}"]
    return []


FAMILY = Family(
    name="mpnet", config_type=MPNetConfig, module_type=MPNet, model_types=("mpnet",),
    config_from_hf=config_from_hf, hf_config_of=hf_config_of, hf_name_map=hf_name_map, layers_field="num_hidden_layers",
    config_fields=ConfigFields(
        sizes=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "max_position_embeddings"),
        token_ids=("pad_token_id",), dropouts=("hidden_dropout_prob", "attention_probs_dropout_prob"),
        epsilons=("layer_norm_eps",), divisible=("hidden_size", "num_attention_heads"), check=_consistency),
    position_limit=lambda cfg: cfg.max_position_embeddings - (PADDING_IDX + 1), base_prefixes=BASE_PREFIXES,
    ignored_tensors=lambda cfg: r"^embeddings\.position_ids$", head_tensors=r"^(lm_head|classifier|qa_outputs)\.",
    sequence_classifiers={
        "mpnet": SequenceClassifier("MPNetForSequenceClassification", "mpnet.", "classifier.dense", "classifier.out_proj"),
    },
)
