"""Pooling of token states into sentence vectors: small pure functions, computed in float32.

`hidden` is [batch, length, dim]; `mask` is [batch, length] with 1 for real tokens.
Hidden-state tuples follow Hugging Face: index 0 is the embedding output, index i the i-th layer.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def _f32(hidden: Array, mask: Array) -> tuple[Array, Array]:
    return hidden.astype(jnp.float32), mask.astype(jnp.float32)[..., None]


def mean_pooling(hidden: Array, mask: Array) -> Array:
    h, m = _f32(hidden, mask)
    return jnp.sum(h * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)


def mean_sqrt_len_pooling(hidden: Array, mask: Array) -> Array:
    h, m = _f32(hidden, mask)
    return jnp.sum(h * m, axis=1) / jnp.sqrt(jnp.maximum(jnp.sum(m, axis=1), 1e-9))


def first_token_pooling(hidden: Array, mask: Array | None = None) -> Array:
    """[CLS] for BERT-family, the first encoder token for T5 (Sentence-T5 "encoder-first")."""
    return hidden[:, 0].astype(jnp.float32)


def max_pooling(hidden: Array, mask: Array) -> Array:
    h, m = _f32(hidden, mask)
    return jnp.max(jnp.where(m > 0, h, -jnp.inf), axis=1)


def last_token_pooling(hidden: Array, mask: Array) -> Array:
    """The last real token of each row (right padding)."""
    last = jnp.maximum(jnp.sum(mask.astype(jnp.int32), axis=1) - 1, 0)
    return jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0].astype(jnp.float32)


def weighted_mean_pooling(hidden: Array, mask: Array) -> Array:
    """Position-weighted mean (weights 1..L), as sentence-transformers' `weightedmean`."""
    h, m = _f32(hidden, mask)
    w = m * jnp.arange(1, hidden.shape[1] + 1, dtype=jnp.float32)[None, :, None]
    return jnp.sum(h * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1e-9)


def first_last_average_pooling(hidden_states: Sequence[Array], mask: Array, first_layer: int = 1) -> Array:
    """SimCSE `avg_first_last`: mean over tokens of (first layer + last layer) / 2.

    SimCSE's released code uses hidden_states[1] (the first Transformer layer's output);
    pass first_layer=0 for the variant that averages the embedding output instead.
    """
    return mean_pooling((hidden_states[first_layer].astype(jnp.float32) + hidden_states[-1].astype(jnp.float32)) / 2, mask)


def top2_average_pooling(hidden_states: Sequence[Array], mask: Array) -> Array:
    """SimCSE `avg_top2`: mean over tokens of the average of the last two layers."""
    return mean_pooling((hidden_states[-2].astype(jnp.float32) + hidden_states[-1].astype(jnp.float32)) / 2, mask)


def l2_normalize(x: Array, eps: float = 1e-12) -> Array:
    """Unit-length rows in float32 (torch.nn.functional.normalize semantics): x / max(||x||, eps).
    The package's one normaliser; `l2_normalize_host` is the same formula on numpy arrays."""
    x = x.astype(jnp.float32)
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def l2_normalize_host(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """`l2_normalize` on the host, in numpy and in x's own dtype (float64 for scoring, float32 for
    queues): evaluation and ensembles normalise without a trip through XLA."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


# Pooling modes over the last hidden state, by name (sentence-transformers names accepted too).
TOKEN_POOLERS = {
    "mean": mean_pooling,
    "mean_sqrt_len": mean_sqrt_len_pooling,
    "mean_sqrt_len_tokens": mean_sqrt_len_pooling,
    "cls": first_token_pooling,
    "first": first_token_pooling,
    "max": max_pooling,
    "lasttoken": last_token_pooling,
    "last": last_token_pooling,
    "weightedmean": weighted_mean_pooling,
}
# Modes that need every layer's hidden states.
LAYER_POOLERS = {
    "first_last_avg": first_last_average_pooling,
    "top2_avg": top2_average_pooling,
}
# Sentence-T5 encoder-decoder: the model computes it (decoder fed the start token).
ENCDEC_FIRST = "encdec_first"
POOLING_MODES = tuple(TOKEN_POOLERS) + tuple(LAYER_POOLERS) + (ENCDEC_FIRST,)


def check_pooling_modes(modes: Sequence[str]) -> tuple[str, ...]:
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    if not modes:
        raise ValueError("pooling needs at least one mode")
    for m in modes:
        if m not in POOLING_MODES:
            raise ValueError(f"unknown pooling mode {m!r}; choose from {POOLING_MODES}")
    return modes
