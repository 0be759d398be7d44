"""STS: cosine similarity of the two sentences' embeddings against gold scores (Spearman x 100)."""
from __future__ import annotations

import numpy as np
from scipy import stats


def unique_encode(model, sentences: list[str], batch_size: int = 64) -> dict[str, np.ndarray]:
    """Encode each distinct sentence once; `model` is anything with encode(list, batch_size=)."""
    unique = list(dict.fromkeys(sentences))
    emb = np.asarray(model.encode(unique, batch_size=batch_size), dtype=np.float32)
    return dict(zip(unique, emb))


def cosine_scores(model, sentences1: list[str], sentences2: list[str], batch_size: int = 64) -> np.ndarray:
    table = unique_encode(model, list(sentences1) + list(sentences2), batch_size)
    a = np.stack([table[s] for s in sentences1]).astype(np.float64)
    b = np.stack([table[s] for s in sentences2]).astype(np.float64)
    a /= np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b /= np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return np.sum(a * b, axis=1)


def correlations(scores: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson correlation, both x 100."""
    return {
        "spearman": float(stats.spearmanr(scores, gold).statistic * 100),
        "pearson": float(stats.pearsonr(scores, gold).statistic * 100),
    }


def evaluate_sts_pairs(model, sentences1, sentences2, gold, batch_size: int = 64) -> dict[str, float]:
    return correlations(cosine_scores(model, sentences1, sentences2, batch_size), np.asarray(gold))
