"""Re-ranking: for each query, rank its positive and negative candidates by model score.

Input: a JSONL file, one query per line (see readers.read_reranking_jsonl):

    {"query": "how do I mount a usb drive", "positive": ["..."], "negative": ["...", "..."]}

Metrics (x 100), averaged over queries, as sentence-transformers' RerankingEvaluator and the USEB
benchmark (AskUbuntu, SciDocs) that SCT reports:
* MAP: mean of scikit-learn's `average_precision_score` over each query's candidates;
* MRR@10: mean of 1 / rank of the first positive when it is in the top 10, else 0.
Queries with no positive or no negative candidate are skipped (and counted), as RerankingEvaluator
does. Bi-encoders score by cosine, cross-encoders by `predict((query, candidate) pairs)`.
"""
from __future__ import annotations

import numpy as np

from sentemb_jax.evaluation.encoding import EmbeddingCache, is_cross_encoder
from sentemb_jax.evaluation.pairs import pair_scores
from sentemb_jax.evaluation.readers import read_reranking_jsonl


def reciprocal_rank_at_k(scores: np.ndarray, labels: np.ndarray, k: int = 10) -> float:
    """1 / rank of the best-ranked positive if within the top k (ties: input order), else 0."""
    ranked = np.asarray(labels)[np.argsort(-np.asarray(scores), kind="stable")][:k]
    hits = np.flatnonzero(ranked)
    return 1.0 / (hits[0] + 1) if hits.size else 0.0


def rerank_metrics(per_query: list[tuple[np.ndarray, np.ndarray]], k: int = 10) -> dict:
    """{"map", "mrr@k"} x 100 from [(scores, 0/1 labels)] per query."""
    from sklearn.metrics import average_precision_score  # lazy: 1.3 s to import, paid by every job otherwise

    return {
        "map": float(np.mean([average_precision_score(y, s) for s, y in per_query]) * 100),
        f"mrr@{k}": float(np.mean([reciprocal_rank_at_k(s, y, k) for s, y in per_query]) * 100),
    }


def evaluate_reranking(model, samples: list[dict], batch_size: int = 64, k: int = 10) -> dict:
    """MAP and MRR@k for samples [{"query", "positive", "negative"}]."""
    usable = [q for q in samples if q["positive"] and q["negative"]]
    if not usable:
        raise ValueError("re-ranking: no query has both a positive and a negative candidate")
    if not is_cross_encoder(model):
        model = model if isinstance(model, EmbeddingCache) else EmbeddingCache(model)
        model.add([s for q in usable for s in [q["query"], *q["positive"], *q["negative"]]], batch_size)
    per_query = []
    for q in usable:
        candidates = q["positive"] + q["negative"]
        scores = pair_scores(model, [q["query"]] * len(candidates), candidates, batch_size)
        per_query.append((scores, np.array([1] * len(q["positive"]) + [0] * len(q["negative"]))))
    return {**rerank_metrics(per_query, k), "queries": len(usable), "skipped": len(samples) - len(usable)}


def evaluate_reranking_file(model, path: str, batch_size: int = 64, k: int = 10) -> dict:
    return evaluate_reranking(model, read_reranking_jsonl(path), batch_size, k)
