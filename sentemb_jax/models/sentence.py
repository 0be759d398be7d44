"""A backbone + pooling + optional projection + L2 norm: the tower of a dual encoder."""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sentemb_jax import pooling as pooling_ops
from sentemb_jax.models import ModelConfig, build_model
from sentemb_jax.models.common import Dense, activation, gather_tokens

Array = jax.Array


class SentenceEmbedder(nn.Module):
    """Sentence embeddings [batch, dim] (float32) from token ids and masks.

    Pooling modes (concatenated in order, like sentence-transformers): see `pooling.POOLING_MODES`;
    `encdec_first` is Sentence-T5's encoder-decoder first token. The projection (Dense, no bias by
    default, logical axes embed -> affinity) and the normalisation run in float32.
    """

    backbone_config: ModelConfig
    pooling: tuple[str, ...] = ("mean",)
    projection_dim: int | None = None
    projection_bias: bool = False
    projection_activation: str | None = None
    normalize: bool = True

    def setup(self):
        self.backbone = build_model(self.backbone_config)
        if self.projection_dim:
            self.projection = Dense(
                self.projection_dim, ("embed", "affinity"), use_bias=self.projection_bias,
                dtype=jnp.float32, param_dtype=jnp.float32,
            )

    def __call__(self, input_ids: Array, attention_mask: Array, deterministic: bool = True,
                 packing: dict | None = None) -> Array:
        """packing: `input_ids` are packed rows and this dict holds `segment_ids`, `positions`
        ([rows, L]), `token_index`, `token_mask` ([texts, width]) - see sentemb_jax.data.packing.
        The result is one embedding per text, equal (eval mode) to the unpacked call."""
        modes = pooling_ops.check_pooling_modes(self.pooling)
        if self.is_initializing():
            # Create every backbone parameter (decoder, LM head) even if this pooling skips them,
            # so the tree matches the checkpoint it came from and exports back to it.
            self.backbone(input_ids, attention_mask)
        need_layers = any(m in pooling_ops.LAYER_POOLERS for m in modes)
        if packing is None:
            last, hidden = self.backbone.encode(input_ids, attention_mask, deterministic, need_layers)
            packed_last, token_index = last, None
        else:
            packed_last, hidden = self.backbone.encode(
                input_ids, packing["segment_ids"] > 0, deterministic, need_layers,
                segment_ids=packing["segment_ids"], positions=packing["positions"])
            token_index, attention_mask = packing["token_index"], packing["token_mask"]
            # Back to [texts, width, dim]: the poolers below are those of the unpacked batch.
            last = gather_tokens(packed_last, token_index)
            hidden = None if hidden is None else tuple(gather_tokens(h, token_index) for h in hidden)
        vectors = []
        for mode in modes:
            if mode in pooling_ops.TOKEN_POOLERS:
                vectors.append(pooling_ops.TOKEN_POOLERS[mode](last, attention_mask))
            elif mode in pooling_ops.LAYER_POOLERS:
                vectors.append(pooling_ops.LAYER_POOLERS[mode](hidden, attention_mask))
            else:
                # Packed: cross-attention keys/values projected on the packed rows, then gathered.
                vectors.append(self.backbone.decode_first_token(packed_last, attention_mask, deterministic, token_index)
                               .astype(jnp.float32))
        x = vectors[0] if len(vectors) == 1 else jnp.concatenate(vectors, axis=-1)
        if self.projection_dim:
            x = self.projection(x)
            if self.projection_activation:
                x = activation(self.projection_activation)(x)
        return pooling_ops.l2_normalize(x) if self.normalize else x


def embedder_param_tree(backbone_params: Any, projection: dict | None = None) -> dict:
    """The SentenceEmbedder param tree from backbone params (and projection params)."""
    tree = {"backbone": backbone_params}
    if projection:
        tree["projection"] = projection
    return tree
