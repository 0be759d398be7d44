"""Augmented views for SimCSE / ConGen / SCT / ensembles, as TF ops with stateless seeds.

Each function is pure: the same input and seed (an int32 pair) give the same output, so an
epoch's views are fixed by the pipeline seed and resumption reproduces them exactly.

* `none`: the text unchanged (SimCSE: the two views differ only by dropout).
* `word_deletion`: delete each whitespace word with probability `rate` (at least one word kept).
* `random_crop`: keep one contiguous run of ceil((1 - rate) * words) words.
* `span_masking`: on token ids, replace one contiguous span of ceil(rate * tokens) tokens by a
  mask id ([MASK] for BERT, a sentinel for T5); special tokens are never masked.
* `column:<name>`: a precomputed view read from an extra column (e.g. back-translations).
* `neighbour`: the next sentence of the same file (the previous one for a file's last row): in a
  document-ordered file (Wikipedia sentences) a view that shares the topic but not the words -
  the ensemble paper's pair mode with a neighbouring sentence in place of a round-trip
  translation (positives from the same document, as in DeCLUTR). Unsupervised; meaningless in a
  file whose rows are not in document order.
* `fixed:<augmentation>`: the text augmentation drawn once per sentence (seeded by its row id and
  the view's index, not by the pipeline): the same text in every epoch and run, like a
  precomputed back-translation (SCT's views), so a teacher's embeddings of it can be computed
  once (`fixed_view_texts`) instead of in every step.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from sentemb_jax.data.kinds import FIXED, ID_AUGMENTATIONS, TEXT_AUGMENTATIONS


def _words(text: tf.Tensor) -> tf.Tensor:
    return tf.strings.split(text)


def word_deletion(text: tf.Tensor, rate: float, seed: tf.Tensor) -> tf.Tensor:
    words = _words(text)
    n = tf.size(words)
    keep = tf.random.stateless_uniform([n], seed) >= rate
    # Never delete everything: keep the first word if the draw removed all of them.
    keep = tf.logical_or(keep, tf.logical_and(tf.equal(tf.reduce_sum(tf.cast(keep, tf.int32)), 0), tf.range(n) == 0))
    return tf.strings.reduce_join(tf.boolean_mask(words, keep), separator=" ")


def random_crop(text: tf.Tensor, rate: float, seed: tf.Tensor) -> tf.Tensor:
    words = _words(text)
    n = tf.size(words)
    length = tf.maximum(1, tf.cast(tf.math.ceil((1.0 - rate) * tf.cast(n, tf.float32)), tf.int32))
    length = tf.minimum(length, tf.maximum(n, 1))
    start = tf.random.stateless_uniform([], seed, minval=0, maxval=tf.maximum(n - length, 0) + 1, dtype=tf.int32)
    return tf.strings.reduce_join(words[start : start + length], separator=" ")


def span_masking(ids: tf.Tensor, rate: float, mask_id: int, seed: tf.Tensor, n_prefix: int, n_suffix: int) -> tf.Tensor:
    n = tf.size(ids)
    body = tf.maximum(n - n_prefix - n_suffix, 0)
    span = tf.minimum(tf.cast(tf.math.ceil(rate * tf.cast(body, tf.float32)), tf.int32), body)
    start = n_prefix + tf.random.stateless_uniform([], seed, minval=0, maxval=tf.maximum(body - span, 0) + 1, dtype=tf.int32)
    positions = tf.range(n)
    masked = tf.logical_and(positions >= start, positions < start + span)
    return tf.where(masked, tf.constant(mask_id, ids.dtype), ids)


def apply_text_augmentation(name: str, text: tf.Tensor, rate: float, seed: tf.Tensor) -> tf.Tensor:
    if name in ("none", "span_masking"):  # span masking happens after tokenisation
        return text
    if name == "word_deletion":
        return word_deletion(text, rate, seed)
    if name == "random_crop":
        return random_crop(text, rate, seed)
    raise ValueError(f"unknown augmentation {name!r}; known: {TEXT_AUGMENTATIONS + ID_AUGMENTATIONS} or 'column:<name>'")


def fixed_seed(row_id: tf.Tensor, view_index: int) -> tf.Tensor:
    """The seed of a `fixed:` view: the row and the view's index only."""
    return tf.stack([tf.cast(row_id, tf.int64), tf.constant(view_index + 1, tf.int64)])


def fixed_view_texts(texts: Sequence[str], view: str, rate: float, view_index: int) -> list[str]:
    """Every row's text of a `fixed:` view (row ids 0..N-1 in order): what the pipeline yields."""
    name = view[len(FIXED):]
    ds = tf.data.Dataset.from_tensor_slices((tf.constant(list(texts), tf.string), tf.range(len(texts), dtype=tf.int64)))
    ds = ds.map(lambda t, r: apply_text_augmentation(name, t, rate, fixed_seed(r, view_index)),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return [t.decode("utf-8") for t in np.concatenate([b.numpy() for b in ds.batch(4096)])] if len(texts) else []
