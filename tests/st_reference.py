"""Reference numbers computed outside our stack: sentence-transformers' own `SentenceTransformer`
embeddings of the shipped all-MiniLM-L6-v2, the TSV read with the standard csv module, and the
statistics from scipy / numpy. Tests compare a job's reported number with these instead of with a
number copied from the job's own earlier output."""
from __future__ import annotations

import csv
import functools

import numpy as np
from scipy.stats import spearmanr


def read_scored_pairs(path: str) -> tuple[list[str], list[str], np.ndarray]:
    """(sentence1, sentence2, score) columns of a header + tab-separated, unquoted file."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence1"] for r in rows], [r["sentence2"] for r in rows], np.array([float(r["score"]) for r in rows])


@functools.lru_cache(maxsize=1)
def _model(model_dir: str):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_dir, device="cpu")


def st_encode(model_dir: str, sentences: list[str]) -> np.ndarray:
    """sentence-transformers' embeddings (float64; all-MiniLM-L6-v2 ends in Normalize: unit rows)."""
    return _model(model_dir).encode(list(sentences), batch_size=64, convert_to_numpy=True).astype(np.float64)


def cosine_spearman_x100(a: np.ndarray, b: np.ndarray, gold: np.ndarray) -> float:
    cos = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float(spearmanr(cos, gold).statistic * 100)


def alignment_uniformity(a: np.ndarray, b: np.ndarray, gold: np.ndarray, unique: np.ndarray,
                         threshold: float = 4.0) -> tuple[float, float]:
    """Wang & Isola (2020) as SimCSE / Sentence-T5 report it on STS-B test: alignment = mean squared
    distance of the unit embeddings of the pairs with gold > threshold; uniformity = log of the mean
    of exp(-2 d^2) over every unordered pair of distinct sentences (`unique`: their embeddings)."""
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    pos = gold > threshold
    align = float(np.mean(np.sum((unit(a[pos]) - unit(b[pos])) ** 2, 1)))
    u = unit(unique)
    sq = np.maximum(2.0 - 2.0 * (u @ u.T), 0.0)[np.triu_indices(len(u), k=1)]
    m = (-2.0 * sq).max()
    return align, float(m + np.log(np.mean(np.exp(-2.0 * sq - m))))
