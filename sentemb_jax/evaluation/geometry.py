"""Alignment and uniformity (Wang & Isola 2020) of L2-normalised embeddings; lower is better for both.

    align   = E_{(x, y) positive} ||f(x) - f(y)||^2               (alpha = 2)
    uniform = log E_{x != y} exp(-2 ||f(x) - f(y)||^2)            (t = 2)

As in Sentence-T5 (Fig. 4) and SimCSE, on STS-B test: positives are the pairs with gold score > 4,
uniformity is over all distinct sentences of the test set (every unordered pair once).
"""
from __future__ import annotations

import numpy as np
from scipy.spatial.distance import pdist
from scipy.special import logsumexp

from sentemb_jax.evaluation.encoding import EmbeddingCache
from sentemb_jax.pooling import l2_normalize_host

POSITIVE_THRESHOLD = 4.0


def _normalize(x: np.ndarray) -> np.ndarray:
    return l2_normalize_host(np.asarray(x, np.float64))


def alignment(x: np.ndarray, y: np.ndarray, alpha: float = 2.0) -> float:
    """Mean ||x_i - y_i||^alpha over the rows (positive pairs) after L2 normalisation."""
    return float(np.mean(np.linalg.norm(_normalize(x) - _normalize(y), axis=1) ** alpha))


def uniformity(x: np.ndarray, t: float = 2.0) -> float:
    """log of the mean over unordered pairs i < j of exp(-t ||x_i - x_j||^2), after L2 normalisation."""
    sq = pdist(_normalize(x), "sqeuclidean")
    return float(logsumexp(-t * sq) - np.log(len(sq)))


def alignment_uniformity(model, sentences1, sentences2, gold, threshold: float = POSITIVE_THRESHOLD,
                         batch_size: int = 64) -> dict:
    """{"alignment", "uniformity", "positive_pairs", "sentences"} for a bi-encoder on scored pairs."""
    cache = model if isinstance(model, EmbeddingCache) else EmbeddingCache(model)
    positive = np.asarray(gold) > threshold
    s1 = [s for s, p in zip(sentences1, positive) if p]
    s2 = [s for s, p in zip(sentences2, positive) if p]
    unique = list(dict.fromkeys(list(sentences1) + list(sentences2)))
    return {
        "alignment": alignment(cache.encode(s1, batch_size=batch_size), cache.encode(s2, batch_size=batch_size)),
        "uniformity": uniformity(cache.encode(unique, batch_size=batch_size)),
        "positive_pairs": int(positive.sum()),
        "sentences": len(unique),
    }
