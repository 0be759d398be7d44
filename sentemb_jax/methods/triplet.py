"""Triplet margin loss (sentence-transformers' TripletLoss, cosine distance): a loss-only method.

    python -m sentemb_jax.main --gin_file=gin/runs/minilm_nli.gin --gin.MODEL_DIR="'/tmp/triplet'" \
        --gin.sentemb_jax.ContrastiveConfig.loss=@sentemb_jax.triplet_margin_loss

The whole method is this function: the train loop embeds the config's sides (anchor, positive,
hard negative) and minimises it (docs/ARCHITECTURE.md, "A new method").
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import gin
from sentemb_jax.pooling import l2_normalize


@gin.configurable(module="sentemb_jax", denylist=["embeddings", "batch", "params", "cfg"])
def triplet_margin_loss(embeddings: dict[str, jax.Array], batch: dict, params, cfg, margin: float = 0.5) -> jax.Array:
    """mean(max(d(a, p) - d(a, n) + margin, 0)), d = 1 - cosine; needs ContrastiveConfig.negative."""
    if not cfg.negative:
        raise ValueError("triplet_margin_loss needs a hard negative: set ContrastiveConfig.negative")
    a, p, n = (l2_normalize(embeddings[s]) for s in (cfg.anchor, cfg.positive, cfg.negative))
    distance = lambda x, y: 1.0 - jnp.sum(x * y, axis=-1)  # noqa: E731
    return jnp.mean(jnp.maximum(distance(a, p) - distance(a, n) + margin, 0.0))
