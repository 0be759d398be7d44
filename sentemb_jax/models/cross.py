"""A cross-encoder: both sentences of a pair encoded jointly, one relevance logit from a linear head.

BERT-family input is "[CLS] s1 [SEP] s2 [SEP]" with token types 0 / 1 (the tokenizer's pair
template). T5 has no pair template: the pair is one text, `models.t5.PAIR_FORMAT` (T5's GLUE style), and
the encoder states feed the head. The head reads the first token (`first`, BERT's [CLS]) or the
mean over tokens, then dropout and a Dense to one logit. `pooler` is Hugging Face's
*ForSequenceClassification head: the first token through tanh(Dense(hidden)) (BERT's pooler,
RoBERTa's classifier.dense), then dropout and the Dense to one logit; its params are the head's
`pooler` subtree, so a checkpoint of that layout maps onto it exactly.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from sentemb_jax import pooling as pooling_ops
from sentemb_jax.models import ModelConfig, build_model
from sentemb_jax.models.common import Dense, Dropout, gather_tokens, partitioned

Array = jax.Array

CROSS_POOLING = ("first", "mean", "pooler")


class ClassifierHead(nn.Module):
    """params {"kernel" [hidden, 1], "bias" [1]} (+ {"pooler": {"kernel", "bias"}} with `use_pooler`)."""

    hidden: int
    use_pooler: bool = False

    def setup(self):
        init = nn.initializers.normal(0.02)  # Hugging Face's classifier init
        if self.use_pooler:
            self.pooler = Dense(self.hidden, (None, "embed"), True, jnp.float32, jnp.float32, kernel_init=init)
        self.kernel = self.param("kernel", partitioned(init, ("embed", None)), (self.hidden, 1), jnp.float32)
        self.bias = self.param("bias", partitioned(nn.initializers.zeros, (None,)), (1,), jnp.float32)

    def pool(self, x: Array) -> Array:
        """tanh(Dense(x)) with `use_pooler`, else x."""
        return jnp.tanh(self.pooler(x)) if self.use_pooler else x

    def __call__(self, x: Array) -> Array:
        return jnp.dot(x.astype(jnp.float32), self.kernel) + self.bias


class CrossEncoderModule(nn.Module):
    """Logits [batch] (float32) for jointly encoded pairs."""

    backbone_config: ModelConfig
    pooling: str = "first"
    head_dropout: float = 0.1

    def setup(self):
        if self.pooling not in CROSS_POOLING:
            raise ValueError(f"cross-encoder pooling {self.pooling!r}: choose from {CROSS_POOLING}")
        self.backbone = build_model(self.backbone_config)
        self.head = ClassifierHead(self.backbone_config.hidden_size, use_pooler=self.pooling == "pooler")
        self.dropout = Dropout(self.head_dropout)

    def __call__(self, input_ids: Array, attention_mask: Array | None, token_type_ids: Array | None = None,
                 deterministic: bool = True, packing: dict | None = None) -> Array:
        """packing: `input_ids` (and `token_type_ids`) are packed rows of whole pairs and this dict
        holds `segment_ids`, `positions`, `token_index`, `token_mask` (sentemb_jax.data.packing);
        the logits equal (eval mode) those of the padded call."""
        if self.is_initializing():
            self.backbone(input_ids, attention_mask)  # every backbone param, as the checkpoint has them
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        if packing is None:
            last, _ = self.backbone.encode(input_ids, attention_mask, deterministic, False, **types)
        else:
            packed, _ = self.backbone.encode(input_ids, packing["segment_ids"] > 0, deterministic, False, **types,
                                             segment_ids=packing["segment_ids"], positions=packing["positions"])
            last, attention_mask = gather_tokens(packed, packing["token_index"]), packing["token_mask"]
        if self.pooling == "mean":
            pooled = pooling_ops.mean_pooling(last, attention_mask)
        else:
            pooled = self.head.pool(pooling_ops.first_token_pooling(last))
        return self.head(self.dropout(pooled, deterministic=deterministic))[:, 0]
