"""Augmented views of a text (and span masking on ids), in numpy: the TensorFlow-free reader's
augmentations (the seqio route's are TF ops in data.augment; data.kinds names both).

Every function is pure given its generator: a view drawn anew each epoch is seeded by (the run's
seed, the epoch, the row, the view), a `fixed:` view by (the row, the view) alone - so an epoch is
fixed by the seed, a resumed run reproduces it exactly, and a fixed view is the same in every run
(a teacher embeds it once). The draws are numpy's, not TensorFlow's stateless ones: the two routes
delete other words of the same sentence (the same rate, the same distribution).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from sentemb_jax.data.kinds import FIXED, ID_AUGMENTATIONS, TEXT_AUGMENTATIONS

_VIEWS = 0x51E3  # a constant of the seed, so a view's draws are not those of the data order


def word_deletion(text: str, rate: float, rng: np.random.Generator) -> str:
    """Each whitespace word deleted with probability `rate`; at least the first word is kept."""
    words = text.split()
    keep = rng.random(len(words)) >= rate
    if len(words) and not keep.any():
        keep[0] = True
    return " ".join(w for w, k in zip(words, keep) if k)


def random_crop(text: str, rate: float, rng: np.random.Generator) -> str:
    """One contiguous run of ceil((1 - rate) * words) words (at least one)."""
    words = text.split()
    n = len(words)
    length = min(max(1, math.ceil((1.0 - rate) * n)), max(n, 1))
    start = int(rng.integers(0, max(n - length, 0) + 1))
    return " ".join(words[start : start + length])


def span_masking(ids: Sequence[int], rate: float, mask_id: int, rng: np.random.Generator, n_prefix: int,
                 n_suffix: int) -> list[int]:
    """One contiguous span of ceil(rate * body) ids replaced by `mask_id`; special tokens (the first
    n_prefix and last n_suffix ids) never masked."""
    ids = list(ids)
    body = max(len(ids) - n_prefix - n_suffix, 0)
    span = min(math.ceil(rate * body), body)
    start = n_prefix + int(rng.integers(0, max(body - span, 0) + 1))
    for i in range(start, start + span):
        ids[i] = mask_id
    return ids


def apply_text_augmentation(name: str, text: str, rate: float, rng: np.random.Generator) -> str:
    if name in ("none",) + ID_AUGMENTATIONS:  # span masking happens after tokenisation
        return text
    if name == "word_deletion":
        return word_deletion(text, rate, rng)
    if name == "random_crop":
        return random_crop(text, rate, rng)
    raise ValueError(f"unknown augmentation {name!r}; known: {TEXT_AUGMENTATIONS + ID_AUGMENTATIONS}")


def view_rng(seed: int, epoch: int, row: int, view_index: int) -> np.random.Generator:
    """The generator of view `view_index` of row `row` in epoch `epoch` of a run with `seed`."""
    return np.random.default_rng([_VIEWS, int(seed), int(epoch), int(row), int(view_index)])


def fixed_rng(row: int, view_index: int) -> np.random.Generator:
    """The generator of a `fixed:` view: the row and the view's index only (the same in every run)."""
    return np.random.default_rng([_VIEWS, int(row), int(view_index) + 1])


def fixed_view_texts(texts: Sequence[str], view: str, rate: float, view_index: int) -> list[str]:
    """Every row's text of a `fixed:` view (row ids 0..N-1 in order): what the reader yields."""
    name = view[len(FIXED):]
    return [apply_text_augmentation(name, t, rate, fixed_rng(i, view_index)) for i, t in enumerate(texts)]
