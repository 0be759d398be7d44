"""STS evaluator: the three STS12-16 aggregations on a constructed year, missing-data omission."""
import numpy as np
import pytest
from fake_models import CosineByName, write_tsv

from sentemb_jax.errors import DataError
from sentemb_jax.evaluation.report import sts_table
from sentemb_jax.evaluation.sts import MissingDataWarning, ScoredPairs, aggregate, evaluate_sts_tasks

# A constructed STS13 (its three subset names) where cosine = the number after "c=" (CosineByName).
SUBSETS = {
    "FNWN": ([0.9, 0.5, 0.1], [5, 3, 1]),  # ranks agree: rho = 1
    "headlines": ([0.8, 0.6, 0.4, 0.2], [0.5, 2, 4, 3.5]),  # d = (3, 1, -2, -2): rho = 1 - 6*18/(4*15) = -0.8
    "OnWN": ([0.3, 0.7, 0.95], [2.5, 1.5, 4.5]),  # d = (-1, 1, 0): rho = 1 - 6*2/(3*8) = 0.5
}
PER_SUBSET = [1.0, -0.8, 0.5]
SIZES = [3, 4, 3]
# 'all': ranks of the 10 concatenated cosines and gold scores (all distinct), by hand.
ALL_SCORE_RANKS = np.array([9, 5, 1, 8, 6, 4, 2, 3, 7, 10])
ALL_GOLD_RANKS = np.array([10, 6, 2, 1, 4, 8, 7, 5, 3, 9])
EXPECTED = {
    "all": 100 * (1 - 6 * np.sum((ALL_SCORE_RANKS - ALL_GOLD_RANKS) ** 2) / (10 * (10**2 - 1))),  # 28.4848...
    "mean": 100 * np.mean(PER_SUBSET),  # 23.333...
    "wmean": 100 * np.average(PER_SUBSET, weights=SIZES),  # 13.0
}


@pytest.fixture
def sts13_only(tmp_path):
    for name, (cosines, gold) in SUBSETS.items():
        write_tsv(tmp_path / "sts12-16" / "STS13" / f"{name}.tsv", ["sentence1", "sentence2", "score"],
                  [("anchor", f"c={c}", g) for c, g in zip(cosines, gold)])
    return str(tmp_path)


def test_expected_numbers_differ():
    assert EXPECTED["all"] == pytest.approx(28.484848, abs=1e-5)
    assert EXPECTED["mean"] == pytest.approx(23.333333, abs=1e-5)
    assert EXPECTED["wmean"] == pytest.approx(13.0, abs=1e-9)


@pytest.mark.parametrize("aggregation", ["all", "mean", "wmean"])
def test_aggregations_through_the_evaluator(sts13_only, aggregation):
    with pytest.warns(MissingDataWarning):
        report = evaluate_sts_tasks(CosineByName(), sts13_only, aggregation=aggregation)
    assert report.spearman["STS13"] == pytest.approx(EXPECTED[aggregation], abs=1e-9)
    assert report.aggregation == aggregation
    subsets = report.subsets["STS13"]
    assert [subsets[n]["spearman"] for n in SUBSETS] == pytest.approx([100 * r for r in PER_SUBSET])
    assert [subsets[n]["pairs"] for n in SUBSETS] == SIZES


def test_aggregate_on_scored_pairs_and_bad_mode():
    subsets = [ScoredPairs(n, np.array(c), np.array(g, float)) for n, (c, g) in SUBSETS.items()]
    assert aggregate(subsets, "wmean")["spearman"] == pytest.approx(13.0)
    with pytest.raises(ValueError, match="aggregation must be one of"):
        aggregate(subsets, "median")


def test_absent_tasks_are_omitted_and_named_in_warnings(sts13_only):
    model = CosineByName()
    with pytest.warns(MissingDataWarning) as record:
        report = evaluate_sts_tasks(model, sts13_only)
    messages = " ".join(str(w.message) for w in record)
    for task in ("STS12", "STS14", "STS15", "STS16", "STSB", "SICKR"):
        assert f"STS task omitted: {task}" in messages
    assert "SICKR_TEST_PATH" in messages
    assert report.missing == ["STS12", "STS14", "STS15", "STS16", "STSB", "SICKR"]
    assert set(report.spearman) == {"STS13", "avg"}
    assert report.spearman["avg"] == report.spearman["STS13"]
    assert model.calls == 1  # every sentence of every task encoded in one call
    table = sts_table(report.to_json(), "fake")
    assert table.splitlines()[0] == "| Model | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg |"
    assert table.splitlines()[2] == "| fake | – | 28.48 | – | – | – | – | – | 28.48 |"


def test_partial_year_is_omitted(sts13_only, tmp_path):
    (tmp_path / "sts12-16" / "STS13" / "OnWN.tsv").unlink()
    with pytest.warns(MissingDataWarning) as record:
        report = evaluate_sts_tasks(CosineByName(), sts13_only)
    assert any("STS13: 1 of 3 subset files absent" in str(w.message) for w in record)
    assert report.spearman == {}


def test_malformed_score_names_file_and_line(sts13_only, tmp_path):
    bad = tmp_path / "sts12-16" / "STS13" / "FNWN.tsv"
    bad.write_text("sentence1\tsentence2\tscore\nanchor\tc=0.5\t3\nanchor\tc=0.1\tfive\n")
    with pytest.warns(MissingDataWarning), pytest.raises(DataError, match=r"FNWN.tsv:3: score 'five' is not a number"):
        evaluate_sts_tasks(CosineByName(), sts13_only)
