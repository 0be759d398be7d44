"""Pair AUC against scikit-learn, bi- and cross-encoders, the QNLI dev/test split; re-ranking metrics."""
import json

import numpy as np
import pytest
from fake_models import HashEncoder, OverlapCrossEncoder, write_tsv
from sklearn.metrics import average_precision_score, roc_auc_score

from sentemb_jax.errors import DataError
from sentemb_jax.evaluation.encoding import EmbeddingCache, encode_sentences
from sentemb_jax.evaluation.pairs import evaluate_pair_file, evaluate_pair_tasks, pair_auc
from sentemb_jax.evaluation.readers import read_reranking_jsonl
from sentemb_jax.evaluation.reranking import evaluate_reranking, reciprocal_rank_at_k, rerank_metrics
from sentemb_jax.evaluation.sts import MissingDataWarning

WORDS = "a man dog runs plays guitar the park cat sleeps red car".split()


def _pairs(n, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        a = " ".join(rng.choice(WORDS, 4))
        b = " ".join(rng.choice(WORDS, 4))
        rows.append((a, b, int(rng.integers(0, 2))))
    return rows


def _cosine(model, s1, s2):
    u, v = encode_sentences(model, s1), encode_sentences(model, s2)
    return np.sum(u * v, 1) / np.linalg.norm(u, axis=1) / np.linalg.norm(v, axis=1)


def test_pair_auc_is_sklearn_roc_auc():
    rng = np.random.default_rng(0)
    scores, labels = rng.normal(size=200), rng.integers(0, 2, 200)
    assert pair_auc(scores, labels) == pytest.approx(100 * roc_auc_score(labels, scores), abs=1e-12)
    assert pair_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(75.0)  # 3 of 4 pos>neg orderings


@pytest.mark.parametrize("model", [HashEncoder(), OverlapCrossEncoder()], ids=["bi-encoder", "cross-encoder"])
def test_file_auc_matches_sklearn_on_model_scores(tmp_path, model):
    rows = _pairs(120, seed=1)
    path = write_tsv(tmp_path / "pairs.tsv", ["sentence1", "sentence2", "label"], rows)
    s1, s2, y = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    scores = model.predict(list(zip(s1, s2))) if hasattr(model, "predict") else _cosine(model, s1, s2)
    result = evaluate_pair_file(model, path)
    assert result == {"auc": pytest.approx(100 * roc_auc_score(y, scores), abs=1e-9), "pairs": 120}


def test_qnli_first_1000_rows_are_dev_rest_test(tmp_path):
    rows = [(a, b, "entailment" if y else "not_entailment") for a, b, y in _pairs(1100, seed=2)]
    write_tsv(tmp_path / "qnli" / "dev.tsv", ["sentence1", "sentence2", "label"], rows)
    model = OverlapCrossEncoder()
    scores = model.predict([(a, b) for a, b, _ in rows])
    y = np.array([r[2] == "entailment" for r in rows], int)
    with pytest.warns(MissingDataWarning, match="MRPC"):
        result = evaluate_pair_tasks(model, str(tmp_path))
    assert result["QNLI_dev"]["pairs"] == 1000 and result["QNLI"]["pairs"] == 100
    assert result["QNLI_dev"]["auc"] == pytest.approx(100 * roc_auc_score(y[:1000], scores[:1000]))
    assert result["QNLI"]["auc"] == pytest.approx(100 * roc_auc_score(y[1000:], scores[1000:]))
    assert "QQP" not in result


def test_bad_label_names_file_and_line(tmp_path):
    path = write_tsv(tmp_path / "p.tsv", ["sentence1", "sentence2", "label"], [("a", "b", 1), ("c", "d", "yes")])
    with pytest.raises(DataError, match=r"p.tsv:3: label 'yes' is not one of"):
        evaluate_pair_file(HashEncoder(), path)


def test_callable_encoder_and_cache():
    calls = []

    def embed(sentences):
        calls.append(list(sentences))
        return HashEncoder().encode(sentences)

    cache = EmbeddingCache(embed)
    first = cache.encode(["x", "y", "x"])
    again = cache.encode(["y", "z"])
    assert calls == [["x", "y"], ["z"]]
    np.testing.assert_array_equal(first[1], again[0])


# ------------------------------------------------------------------ re-ranking

def test_reciprocal_rank_and_map_by_hand():
    scores, labels = np.array([0.9, 0.8, 0.7, 0.6]), np.array([0, 1, 0, 1])
    assert reciprocal_rank_at_k(scores, labels, k=10) == 0.5
    assert reciprocal_rank_at_k(scores, labels, k=1) == 0.0
    # AP: positives at ranks 2 and 4 -> (1/2 + 2/4) / 2 = 0.5
    metrics = rerank_metrics([(scores, labels), (np.array([0.2, 0.1]), np.array([1, 0]))])
    assert metrics["map"] == pytest.approx(100 * (0.5 + 1.0) / 2)
    assert metrics["mrr@10"] == pytest.approx(100 * (0.5 + 1.0) / 2)
    assert average_precision_score(labels, scores) == pytest.approx(0.5)


def test_reranking_file_with_bi_and_cross_encoder(tmp_path):
    samples = [
        {"query": "a man plays guitar", "positive": ["the man plays a guitar"], "negative": ["a cat sleeps", "red car"]},
        {"query": "cat sleeps", "positive": ["the cat sleeps", "a cat"], "negative": ["man runs"]},
        {"query": "no negatives", "positive": ["x"], "negative": []},
    ]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(s) for s in samples) + "\n\n")
    assert read_reranking_jsonl(str(path)) == samples
    result = evaluate_reranking(OverlapCrossEncoder(), read_reranking_jsonl(str(path)))
    # Overlap scores: q1 -> [3, 1(a), 0] positive first; q2 -> [2, 1, 0] both positives first.
    assert result == {"map": 100.0, "mrr@10": 100.0, "queries": 2, "skipped": 1}
    bi = evaluate_reranking(HashEncoder(), samples)
    assert bi["queries"] == 2 and 0 <= bi["map"] <= 100


def test_reranking_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"query": "q", "positive": ["a"], "negative": ["b"]}\n{"query": "q", "positive": "a"}\n')
    with pytest.raises(DataError, match=r"q.jsonl:2: 'positive' must be a list of strings"):
        read_reranking_jsonl(str(path))
    path.write_text('{"query": "q",\n')
    with pytest.raises(DataError, match=r"q.jsonl:1: not valid JSON"):
        read_reranking_jsonl(str(path))
