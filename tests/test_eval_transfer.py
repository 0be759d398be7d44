"""SentEval transfer: SentEval's sample order, empty lines kept, determinism, MiniLM on MR (10-fold)."""
import os

import numpy as np
import pytest

from sentemb_jax.evaluation.encoding import EmbeddingCache
from sentemb_jax.evaluation.readers import read_labelled_sentences
from sentemb_jax.evaluation.transfer import (
    evaluate_transfer_task,
    inner_kfold_accuracy,
    kfold_then_test_accuracy,
    senteval_order,
    split_then_test_accuracy,
)


def test_senteval_order_sorts_by_token_count_then_label_stably():
    sentences = ["b c d", "x y", "", "p q", "k"]
    labels = ["1", "1", "0", "0", "1"]
    ordered, y = senteval_order(sentences, labels)
    assert ordered == ["", "k", "p q", "x y", "b c d"]
    assert y.tolist() == ["0", "1", "0", "1", "1"]


@pytest.mark.parametrize("task, rows, empty", [("CR", 3775, 4), ("MPQA", 10606, 3), ("MR", 10662, 0)])
def test_empty_lines_are_kept_as_in_senteval(data_dir, task, rows, empty):
    sentences, labels = read_labelled_sentences(os.path.join(data_dir, "senteval_transfer", f"{task}.tsv"))
    assert len(sentences) == len(labels) == rows
    assert sum(s.strip() == "" for s in sentences) == empty


def _blobs(n=300, dim=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    X = rng.normal(size=(n, dim)) + 1.5 * np.eye(classes, dim)[y]
    return X, y


def test_classifiers_are_deterministic_for_a_seed():
    X, y = _blobs()
    first = inner_kfold_accuracy(X, y, k=5, seed=7)
    assert inner_kfold_accuracy(X, y, k=5, seed=7) == first
    assert inner_kfold_accuracy(X, y, k=5, seed=8)["fold_acc"] != first["fold_acc"]  # other folds
    assert 60 < first["acc"] <= 100 and len(first["fold_acc"]) == 5
    assert kfold_then_test_accuracy(X[:200], y[:200], X[200:], y[200:], k=5, seed=3) == \
        kfold_then_test_accuracy(X[:200], y[:200], X[200:], y[200:], k=5, seed=3)
    split = split_then_test_accuracy(X[:200], y[:200], X[200:250], y[200:250], X[250:], y[250:], seed=3)
    assert split["C"] in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0) and 60 < split["acc"] <= 100


@pytest.fixture(scope="module")
def minilm_cache(minilm_dir):
    from sentemb_jax.encoder import SentenceEncoder

    return EmbeddingCache(SentenceEncoder.from_pretrained(minilm_dir))


def test_minilm_mr_10fold_accuracy(minilm_cache, data_dir):
    """MR: outer stratified 10-fold as in SentEval, seed 1111; C chosen by an inner 5-fold (SentEval
    uses 10) to halve this test's time. docs/RESULTS.md has the full protocol's number (inner 10-fold)."""
    result = evaluate_transfer_task(minilm_cache, data_dir, "MR", k=10, seed=1111, inner_k=5)
    assert result["samples"] == {"all": 10662}
    assert len(result["fold_acc"]) == 10
    assert result["acc"] >= 75.0  # the sanity bound
    # regression pin, not an independent reference: our own output for all-MiniLM-L6-v2, first
    # recorded in commit da45a55 ("Evaluation suite: ...") by this very call
    # (evaluate_transfer_task(MiniLM, data_dir, "MR", k=10, seed=1111, inner_k=5); run with
    # `pytest tests/test_eval_transfer.py -k mr_10fold`). An outside reference would have to
    # re-implement SentEval's nested-CV classifier protocol here (the same sklearn calls); the
    # embeddings themselves are compared with sentence-transformers' in tests/test_minilm.py.
    assert result["acc"] == pytest.approx(76.56, abs=0.3)  # regression pin (commit da45a55)
