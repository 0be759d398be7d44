"""SentGLUE-style pair tasks: feature layout, heads, and which split feeds what (on a small fake data folder)."""
import numpy as np
import pytest
from fake_models import HashEncoder, write_tsv

from sentemb_jax.evaluation.sentglue import evaluate_sentglue, pair_features, ridge_dev_then_test
from sentemb_jax.evaluation.sts import MissingDataWarning


def test_pair_features_are_u_v_absdiff_product():
    u, v = np.array([[1.0, -2.0]]), np.array([[3.0, 4.0]])
    np.testing.assert_array_equal(pair_features(u, v), [[1, -2, 3, 4, 2, 6, 3, -8]])


def test_ridge_head_recovers_a_linear_target():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 5))
    y = X @ np.array([1.0, -2.0, 0.5, 0.0, 3.0])
    result = ridge_dev_then_test(X[:200], y[:200], X[200:250], y[200:250], X[250:], y[250:])
    assert result["spearman"] > 99.9 and result["alpha"] == 0.01


def _rows(n, seed, labels):
    rng = np.random.default_rng(seed)
    words = "a man dog runs plays guitar the park cat sleeps red car".split()
    return [(" ".join(rng.choice(words, 3)), " ".join(rng.choice(words, 3)), labels[i % len(labels)]) for i in range(n)]


@pytest.fixture
def small_data(tmp_path):
    pair = ["sentence1", "sentence2", "label"]
    write_tsv(tmp_path / "mrpc" / "train.tsv", pair, _rows(60, 0, [0, 1]))
    write_tsv(tmp_path / "mrpc" / "test.tsv", pair, _rows(30, 1, [0, 1]))
    for i, split in enumerate(("train", "dev", "test")):
        write_tsv(tmp_path / "stsb" / f"{split}.tsv", ["sentence1", "sentence2", "score"], _rows(40, 2 + i, [0, 1.5, 3, 4.5, 5]))
    write_tsv(tmp_path / "qnli" / "dev.tsv", pair, _rows(1030, 5, ["entailment", "not_entailment"]))
    write_tsv(tmp_path / "sick" / "sick_e_train.tsv", pair, _rows(60, 6, ["ENTAILMENT", "NEUTRAL", "CONTRADICTION"]))
    write_tsv(tmp_path / "sick" / "sick_e_trial.tsv", pair, _rows(30, 7, ["ENTAILMENT", "NEUTRAL", "CONTRADICTION"]))
    return tmp_path


def test_splits_and_result_layout(small_data):
    results = evaluate_sentglue(HashEncoder(), str(small_data), k=3, seed=1)
    assert set(results) == {"MRPC", "STSB", "QNLI", "SICKE", "avg"}
    assert results["QNLI"]["train"] == "qnli/dev.tsv[:1000]" and results["QNLI"]["test"] == "qnli/dev.tsv[1000:]"
    assert results["SICKE"]["test"].startswith("sick/sick_e_trial.tsv")
    assert results["STSB"]["dev"] == "stsb/dev.tsv" and results["STSB"]["score"] == results["STSB"]["spearman"]
    for task in ("MRPC", "QNLI", "SICKE"):
        assert 0 <= results[task]["acc"] <= 100 and results[task]["score"] == results[task]["acc"]
    assert 0 <= results["MRPC"]["f1"] <= 100
    assert results["avg"] == pytest.approx(np.mean([results[t]["score"] for t in ("MRPC", "STSB", "QNLI", "SICKE")]))
    assert evaluate_sentglue(HashEncoder(), str(small_data), k=3, seed=1) == results  # deterministic


def test_sicke_test_file_by_path_and_absent_task(small_data):
    test = write_tsv(small_data / "elsewhere" / "sick_e_test.tsv", ["sentence1", "sentence2", "label"],
                     _rows(30, 9, ["ENTAILMENT", "NEUTRAL", "CONTRADICTION"]))
    (small_data / "mrpc" / "test.tsv").unlink()
    with pytest.warns(MissingDataWarning, match="SentGLUE task omitted: MRPC"):
        results = evaluate_sentglue(HashEncoder(), str(small_data), tasks=("MRPC", "SICKE"), k=3, sicke_test_path=test)
    assert set(results) == {"SICKE", "avg"}
    assert results["SICKE"]["test"] == test and results["SICKE"]["dev"] == "sick/sick_e_trial.tsv"
