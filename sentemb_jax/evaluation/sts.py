"""STS: cosine similarity of the two sentences' embeddings against gold scores (Spearman x 100).

The 7-task table (`evaluate_sts_tasks`), in the papers' column order:
STS12 STS13 STS14 STS15 STS16 STS-B SICK-R Avg.

* STS12-16: test sets, one TSV per subset under `<data>/sts12-16/STS1X/`. A year's score depends
  on how the subsets are combined (`aggregation`):
  - `all` (default; SentEval's `all` as used by SimCSE and most papers): concatenate the year's
    subsets and compute one correlation;
  - `mean`: unweighted mean of the per-subset correlations;
  - `wmean`: mean of the per-subset correlations weighted by the number of pairs.
* STS-B: `<data>/stsb/test.tsv` (0-5). SICK-R: a test file given by path (1-5; `../shared/data`
  holds only SICK train/trial, so callers pass the path).
* A task whose data is absent is left out and named in a `MissingDataWarning`; `Avg` is then the
  mean over the tasks present (and `missing` lists the others).
"""
from __future__ import annotations

import dataclasses
import os
import warnings

import numpy as np
from scipy import stats

from sentemb_jax.data.files import read_sts_pairs
from sentemb_jax.errors import UndefinedScoreError
from sentemb_jax.evaluation.encoding import EmbeddingCache, encode_sentences
from sentemb_jax.pooling import l2_normalize_host

STS_YEARS = ("STS12", "STS13", "STS14", "STS15", "STS16")
# Subsets as in SentEval (STS13 without SMT, which is not redistributable).
STS_SUBSETS = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
STS_TASKS = STS_YEARS + ("STSB", "SICKR")
TASK_LABELS = {"STSB": "STS-B", "SICKR": "SICK-R"}  # column headers in tables and plots
AGGREGATIONS = ("all", "mean", "wmean")
STS_SCORE_RANGE = (0.0, 5.0)
SICK_SCORE_RANGE = (1.0, 5.0)


class MissingDataWarning(UserWarning):
    """An evaluation task was skipped because its data files are absent."""


def unique_encode(model, sentences: list[str], batch_size: int = 64) -> dict[str, np.ndarray]:
    """Encode each distinct sentence once; `model` is a bi-encoder (see encoding.py)."""
    unique = list(dict.fromkeys(sentences))
    return dict(zip(unique, encode_sentences(model, unique, batch_size)))


def cosine_scores(model, sentences1: list[str], sentences2: list[str], batch_size: int = 64) -> np.ndarray:
    table = unique_encode(model, list(sentences1) + list(sentences2), batch_size)
    a = np.stack([table[s] for s in sentences1]).astype(np.float64)
    b = np.stack([table[s] for s in sentences2]).astype(np.float64)
    return np.sum(l2_normalize_host(a) * l2_normalize_host(b), axis=1)


def check_scorable(gold, name: str = "scores") -> None:
    """UndefinedScoreError when no correlation with `gold` can be defined, whatever the model."""
    gold = np.asarray(gold, dtype=np.float64).reshape(-1)
    if len(gold) < 2:
        raise UndefinedScoreError(f"{name}: correlation undefined: {len(gold)} pair(s) to score "
                                  "(an empty split?); it needs at least 2")
    if not np.all(np.isfinite(gold)):
        raise UndefinedScoreError(f"{name}: correlation undefined: {int(np.sum(~np.isfinite(gold)))} gold score(s) "
                                  "are NaN / inf")
    if np.all(gold == gold[0]):
        raise UndefinedScoreError(f"{name}: correlation undefined: every one of the {len(gold)} gold scores is "
                                  f"{gold[0]:g} (constant gold scores have no ranking to correlate with)")


def check_predictions(scores, name: str = "scores") -> None:
    """UndefinedScoreError when the model's scores are NaN / inf or all equal (no ranking)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    bad = ~np.isfinite(scores)
    if bad.any():
        raise UndefinedScoreError(f"{name}: score undefined: {int(bad.sum())} of the {len(scores)} model scores "
                                  "are NaN / inf (NaN embeddings?)")
    if len(scores) and np.all(scores == scores[0]):
        raise UndefinedScoreError(f"{name}: score undefined: the model gives all {len(scores)} pairs the same score "
                                  f"({scores[0]:.6g}); constant predictions have no ranking (a collapsed model?)")


def correlations(scores: np.ndarray, gold: np.ndarray, name: str = "scores") -> dict[str, float]:
    """Spearman and Pearson correlation, both x 100; UndefinedScoreError (with the reason) when
    either is undefined: fewer than 2 pairs, constant gold or model scores, NaN scores."""
    check_scorable(gold, name)
    check_predictions(scores, name)
    return {
        "spearman": float(stats.spearmanr(scores, gold).statistic * 100),
        "pearson": float(stats.pearsonr(scores, gold).statistic * 100),
    }


def evaluate_sts_pairs(model, sentences1, sentences2, gold, batch_size: int = 64, name: str = "STS pairs") -> dict[str, float]:
    check_scorable(gold, name)  # before encoding: an empty split or constant gold scores
    return correlations(cosine_scores(model, sentences1, sentences2, batch_size), np.asarray(gold), name)


class StsbEvaluator:
    """An STS-B split (DATA_DIR/stsb/{split}.tsv, gold scores 0-5) read once; calling it with any
    encoder gives Spearman / Pearson x 100 (`primary_metric`: spearman). The one owner of STS-B
    split scoring: the train loop's dev score, the evaluate_stsb job and the ensemble's weights."""

    primary_metric = "spearman"

    def __init__(self, data_dir: str, split: str = "dev", batch_size: int = 64):
        self.path = os.path.join(data_dir, "stsb", f"{split}.tsv")
        self.split, self.batch_size = split, batch_size
        self.s1, self.s2, self.gold = read_sts_pairs(self.path, score_range=(0.0, 5.0))

    def __call__(self, model) -> dict:
        scores = evaluate_sts_pairs(model, self.s1, self.s2, self.gold, batch_size=self.batch_size,
                                    name=f"STS-B {self.split} ({self.path})")
        return {**scores, "split": self.split, "pairs": len(self.gold)}


@dataclasses.dataclass
class ScoredPairs:
    """Model scores next to gold scores for one file (an STS subset, STS-B test, SICK-R test)."""

    name: str
    scores: np.ndarray
    gold: np.ndarray

    def correlations(self) -> dict[str, float]:
        return correlations(self.scores, self.gold, self.name)


def aggregate(subsets: list[ScoredPairs], aggregation: str = "all") -> dict[str, float]:
    """One year's Spearman/Pearson (x 100) from its subsets: `all`, `mean` or `wmean` (module doc)."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if aggregation == "all":
        return correlations(np.concatenate([s.scores for s in subsets]), np.concatenate([s.gold for s in subsets]),
                            "+".join(s.name for s in subsets))
    per_subset = [s.correlations() for s in subsets]
    weights = [len(s.gold) for s in subsets] if aggregation == "wmean" else None
    return {key: float(np.average([c[key] for c in per_subset], weights=weights)) for key in ("spearman", "pearson")}


def sts_task_files(data_dir: str, sickr_test_path: str | None = None) -> tuple[dict[str, list[str]], list[str]]:
    """({task: [file paths]} for the tasks whose files all exist, [messages for the tasks left out])."""
    files, missing = {}, []
    for year in STS_YEARS:
        paths = [os.path.join(data_dir, "sts12-16", year, f"{sub}.tsv") for sub in STS_SUBSETS[year]]
        absent = [p for p in paths if not os.path.isfile(p)]
        if absent:
            missing.append(f"{year}: {len(absent)} of {len(paths)} subset files absent (first: {absent[0]})")
        else:
            files[year] = paths
    stsb = os.path.join(data_dir, "stsb", "test.tsv")
    if os.path.isfile(stsb):
        files["STSB"] = [stsb]
    else:
        missing.append(f"STSB: {stsb} absent")
    if not sickr_test_path:
        missing.append("SICKR: no SICK-R test file given (SICKR_TEST_PATH)")
    elif os.path.isfile(sickr_test_path):
        files["SICKR"] = [sickr_test_path]
    else:
        missing.append(f"SICKR: {sickr_test_path} absent")
    return files, missing


@dataclasses.dataclass
class StsReport:
    """Table scores plus the scored pairs behind them (for plots and further analysis)."""

    aggregation: str
    spearman: dict[str, float]  # task -> x100, plus "avg"
    pearson: dict[str, float]
    subsets: dict[str, dict[str, dict[str, float]]]  # year -> subset -> {spearman, pearson, pairs}
    pairs: dict[str, int]
    missing: list[str]
    scored: dict[str, list[ScoredPairs]]

    def to_json(self) -> dict:
        return {"sts": self.spearman, "sts_pearson": self.pearson, "aggregation": self.aggregation,
                "sts_subsets": self.subsets, "sts_pairs": self.pairs, "sts_missing": self.missing}


def evaluate_sts_tasks(model, data_dir: str, sickr_test_path: str | None = None, aggregation: str = "all",
                       batch_size: int = 64) -> StsReport:
    """The 7-task STS table for a bi-encoder (module doc); absent tasks are skipped with a warning."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    files, missing = sts_task_files(data_dir, sickr_test_path)
    for message in missing:
        warnings.warn(f"STS task omitted: {message}", MissingDataWarning, stacklevel=2)
    data = {task: [(path, read_sts_pairs(path, SICK_SCORE_RANGE if task == "SICKR" else STS_SCORE_RANGE))
                   for path in paths] for task, paths in files.items()}
    cache = model if isinstance(model, EmbeddingCache) else EmbeddingCache(model)
    # One encode call for every sentence of every task: fewer, fuller, length-sorted batches.
    cache.add([s for pairs in data.values() for _, (s1, s2, _) in pairs for s in s1 + s2], batch_size)
    spearman, pearson, subsets, counts, scored = {}, {}, {}, {}, {}
    for task in STS_TASKS:
        if task not in data:
            continue
        scored[task] = [ScoredPairs(os.path.basename(path)[: -len(".tsv")], cosine_scores(cache, s1, s2, batch_size), gold)
                        for path, (s1, s2, gold) in data[task]]
        result = aggregate(scored[task], aggregation) if task in STS_YEARS else scored[task][0].correlations()
        spearman[task], pearson[task] = result["spearman"], result["pearson"]
        counts[task] = int(sum(len(s.gold) for s in scored[task]))
        if task in STS_YEARS:
            subsets[task] = {s.name: {**s.correlations(), "pairs": len(s.gold)} for s in scored[task]}
    if spearman:
        spearman["avg"] = float(np.mean(list(spearman.values())))
        pearson["avg"] = float(np.mean(list(pearson.values())))
    return StsReport(aggregation, spearman, pearson, subsets, counts, [m.split(":")[0] for m in missing], scored)
