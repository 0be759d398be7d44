"""Training losses: small pure functions on embeddings, computed in float32.

Under `jax.jit` with sharded inputs these see the *global* batch, so in-batch negatives span
every data shard.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

Array = jax.Array
_MASKED = -1e9  # finite, so masked entries times a zero target stay zero (not nan)


def in_batch_softmax_loss(
    anchors: Array,
    positives: Array,
    hard_negatives: Array | None = None,
    temperature: float | Array = 0.05,
    bidirectional: bool = False,
    label_smoothing: float = 0.0,
    duplicates: Array | None = None,
) -> Array:
    """Sentence-T5 eq. 2: softmax over each anchor's positive, the other positives, hard negatives.

    anchors, positives, hard_negatives: [B, D] embeddings (L2-normalised for cosine similarity).
    bidirectional: also classify each positive against all anchors; the two terms are averaged.
    label_smoothing: target mass spread uniformly over the non-masked candidates.
    duplicates: [B, B] bool, True where positives i and j are the same text; such other rows
      are masked out of the candidates (a duplicate of the positive is not a negative).
    Returns the mean loss (a float32 scalar).
    """
    a = anchors.astype(jnp.float32)
    p = positives.astype(jnp.float32)
    candidates = p if hard_negatives is None else jnp.concatenate([p, hard_negatives.astype(jnp.float32)], axis=0)
    batch = a.shape[0]
    valid = jnp.ones((batch, candidates.shape[0]), bool)
    if duplicates is not None:
        valid = valid.at[:, :batch].set(~(duplicates & ~jnp.eye(batch, dtype=bool)))
    forward = _softmax_xent(a @ candidates.T / temperature, valid, label_smoothing)
    if not bidirectional:
        return forward
    backward_valid = valid[:, :batch].T
    backward = _softmax_xent(p @ a.T / temperature, backward_valid, label_smoothing)
    return (forward + backward) / 2


def _softmax_xent(logits: Array, valid: Array, label_smoothing: float) -> Array:
    """Mean cross-entropy where row i's target is column i, over valid columns only."""
    batch, n = logits.shape
    logits = jnp.where(valid, logits, _MASKED)
    onehot = jax.nn.one_hot(jnp.arange(batch), n, dtype=jnp.float32)
    if label_smoothing:
        uniform = valid.astype(jnp.float32) / jnp.sum(valid, axis=1, keepdims=True)
        targets = (1.0 - label_smoothing) * onehot + label_smoothing * uniform
    else:
        targets = onehot
    return jnp.mean(optax.softmax_cross_entropy(logits, targets))
