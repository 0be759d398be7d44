"""Triplet margin loss (sentence-transformers' TripletLoss, cosine distance): a loss-only method.

    python -m sentemb_jax.main --gin_file=gin/models/minilm_l6.gin --gin_file=gin/runs/minilm_nli.gin \
        --gin.MODEL_DIR="'/tmp/triplet'" --gin.METHOD="@sentemb_jax.Triplet()"

The whole method is its loss: the contrastive step embeds the sides (anchor, positive, hard
negative) with dropout, chunks, packing and the mesh, and minimises it (docs/ARCHITECTURE.md).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sentemb_jax import validation as v
from sentemb_jax.methods.contrastive import Contrastive
from sentemb_jax.pooling import l2_normalize


@dataclasses.dataclass
class Triplet(Contrastive):
    """mean(max(d(a, p) - d(a, n) + margin, 0)), d = 1 - cosine."""

    negative: str | None = "negative"
    margin: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        v.require_number(self.margin, "sentemb_jax.Triplet", "margin", 0)
        if not self.negative:
            v.fail(self.negative, "sentemb_jax.Triplet", "negative", "needs a hard negative side (e.g. 'negative')")

    def loss(self, embeddings: dict[str, jax.Array], batch: dict, params) -> jax.Array:
        a, p, n = (l2_normalize(embeddings[s]) for s in (self.anchor, self.positive, self.negative))
        distance = lambda x, y: 1.0 - jnp.sum(x * y, axis=-1)  # noqa: E731
        return jnp.mean(jnp.maximum(distance(a, p) - distance(a, n) + self.margin, 0.0))
