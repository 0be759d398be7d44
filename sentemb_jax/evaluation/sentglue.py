"""SentGLUE-style pair tasks (Sentence-T5 §8): each sentence is encoded on its own, a linear head
reads the pair features [u, v, |u-v|, u*v] (frozen embeddings, no fine-tuning).

Which split is used for what (only what `../shared/data` holds; see its README):

| task   | head fitted on               | regularisation chosen on             | reported on (metric)            |
|--------|------------------------------|--------------------------------------|---------------------------------|
| MRPC   | mrpc/train.tsv (4076)        | k-fold CV on train (C 2^-1..2^5)     | mrpc/test.tsv, accuracy and F1  |
| STS-B  | stsb/train.tsv (5749)        | stsb/dev.tsv (Ridge alpha 10^-2..10^3)| stsb/test.tsv, Spearman/Pearson |
| QNLI   | qnli/dev.tsv rows 1-1000     | k-fold CV on those rows (C 2^-1..2^5)| qnli/dev.tsv rows 1001-5463, acc|
| SICK-E | sick/sick_e_train.tsv (4500) | sick/sick_e_trial.tsv (C 2^-2..2^3)  | SICK-E test file (given by path)|
|        |                              | or, without a test file, k-fold CV on train | sick/sick_e_trial.tsv, acc |

MRPC follows SentEval's MRPC (KFoldClassifier) and SICK-E SentEval's SICKEntailment
(SplitClassifier: train / trial / test); STS-B uses a ridge-regression head (a linear head; SentEval
instead fits a 5-way distribution). GLUE QNLI's training set is not in `../shared/data`, so the
head is trained on the first 1000 dev rows (the part Trans-Encoder uses for tuning) and tested on
the rest. Classification heads are scikit-learn logistic regressions (as in transfer.py); every
number is x 100.
"""
from __future__ import annotations

import os
import warnings
from typing import Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from sentemb_jax.data.files import read_sts_pairs
from sentemb_jax.evaluation.encoding import EmbeddingCache
from sentemb_jax.evaluation.pairs import QNLI_DEV_ROWS
from sentemb_jax.evaluation.readers import SICK_E_LABELS, read_labelled_pairs
from sentemb_jax.evaluation.sts import STS_SCORE_RANGE, MissingDataWarning, correlations
from sentemb_jax.evaluation.transfer import (
    DEFAULT_SEED,
    INNER_KFOLD_CS,
    KFOLD_CS,
    fit_logreg,
    kfold_then_test_accuracy,
    split_then_test_accuracy,
)

SENTGLUE_TASKS = ("MRPC", "STSB", "QNLI", "SICKE")
RIDGE_ALPHAS = tuple(10.0**t for t in range(-2, 4))


def pair_features(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[u, v, |u-v|, u*v] per pair: [n, 4 * dim]."""
    return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)


def _features(cache: EmbeddingCache, s1: Sequence[str], s2: Sequence[str], batch_size: int) -> np.ndarray:
    u = cache.encode(s1, batch_size=batch_size).astype(np.float64)
    v = cache.encode(s2, batch_size=batch_size).astype(np.float64)
    return pair_features(u, v)


def ridge_dev_then_test(X_train, y_train, X_dev, y_dev, X_test, y_test, alphas: Sequence[float] = RIDGE_ALPHAS) -> dict:
    """Ridge head: alpha by dev Spearman, then test Spearman/Pearson (x 100) of that fit."""
    from sklearn.linear_model import Ridge  # lazy: 1.3 s to import, paid by every job otherwise

    with threadpool_limits(1):
        fits = [Ridge(alpha=a).fit(X_train, y_train) for a in alphas]
        dev = [correlations(f.predict(X_dev), y_dev, f"ridge head (alpha={a}) on dev")["spearman"]
               for a, f in zip(alphas, fits)]
        best = int(np.argmax(dev))
        test = correlations(fits[best].predict(X_test), y_test, f"ridge head (alpha={alphas[best]}) on test")
    return {**test, "dev_spearman": dev[best], "alpha": alphas[best]}


def _binary_f1(X_train, y_train, X_test, y_test, C: float, seed: int) -> float:
    from sklearn.metrics import f1_score  # lazy: 1.3 s to import, paid by every job otherwise

    clf = fit_logreg(X_train, y_train, C, seed)
    with threadpool_limits(1):
        return float(f1_score(y_test, clf.predict(X_test)) * 100)


def _mrpc(cache, data_dir, k, seed, batch_size, **_) -> dict:
    tr = read_labelled_pairs(os.path.join(data_dir, "mrpc", "train.tsv"))
    te = read_labelled_pairs(os.path.join(data_dir, "mrpc", "test.tsv"))
    X_tr, X_te = _features(cache, tr[0], tr[1], batch_size), _features(cache, te[0], te[1], batch_size)
    result = kfold_then_test_accuracy(X_tr, tr[2], X_te, te[2], k=k, seed=seed, Cs=KFOLD_CS)
    result["f1"] = _binary_f1(X_tr, tr[2], X_te, te[2], result["C"], seed)
    result.update(train="mrpc/train.tsv", test="mrpc/test.tsv", metric="accuracy")
    return result


def _stsb(cache, data_dir, batch_size, **_) -> dict:
    splits = {s: read_sts_pairs(os.path.join(data_dir, "stsb", f"{s}.tsv"), STS_SCORE_RANGE) for s in ("train", "dev", "test")}
    args = []
    for s in ("train", "dev", "test"):
        s1, s2, gold = splits[s]
        args += [_features(cache, s1, s2, batch_size), gold]
    result = ridge_dev_then_test(*args)
    result.update(train="stsb/train.tsv", dev="stsb/dev.tsv", test="stsb/test.tsv", metric="spearman")
    return result


def _qnli(cache, data_dir, k, seed, batch_size, **_) -> dict:
    s1, s2, y = read_labelled_pairs(os.path.join(data_dir, "qnli", "dev.tsv"))
    X = _features(cache, s1, s2, batch_size)
    n = QNLI_DEV_ROWS
    result = kfold_then_test_accuracy(X[:n], y[:n], X[n:], y[n:], k=k, seed=seed, Cs=KFOLD_CS)
    result.update(train=f"qnli/dev.tsv[:{n}]", test=f"qnli/dev.tsv[{n}:]", metric="accuracy")
    return result


def _sicke(cache, data_dir, k, seed, batch_size, sicke_test_path=None, **_) -> dict:
    read = lambda p: read_labelled_pairs(p, SICK_E_LABELS)  # noqa: E731
    tr = read(os.path.join(data_dir, "sick", "sick_e_train.tsv"))
    trial = read(os.path.join(data_dir, "sick", "sick_e_trial.tsv"))
    X_tr, X_trial = _features(cache, tr[0], tr[1], batch_size), _features(cache, trial[0], trial[1], batch_size)
    if sicke_test_path:
        te = read(sicke_test_path)
        X_te = _features(cache, te[0], te[1], batch_size)
        result = split_then_test_accuracy(X_tr, tr[2], X_trial, trial[2], X_te, te[2], seed=seed, Cs=INNER_KFOLD_CS)
        result.update(train="sick/sick_e_train.tsv", dev="sick/sick_e_trial.tsv", test=sicke_test_path)
    else:
        result = kfold_then_test_accuracy(X_tr, tr[2], X_trial, trial[2], k=k, seed=seed, Cs=KFOLD_CS)
        result.update(train="sick/sick_e_train.tsv", test="sick/sick_e_trial.tsv (no test file given)")
    result["metric"] = "accuracy"
    return result


_TASKS = {"MRPC": (_mrpc, ("mrpc/train.tsv", "mrpc/test.tsv")),
          "STSB": (_stsb, ("stsb/train.tsv", "stsb/dev.tsv", "stsb/test.tsv")),
          "QNLI": (_qnli, ("qnli/dev.tsv",)),
          "SICKE": (_sicke, ("sick/sick_e_train.tsv", "sick/sick_e_trial.tsv"))}


def sentglue_task_files(data_dir: str, task: str) -> list[str]:
    """The files a SentGLUE task reads under data_dir (a SICK-E test file given by path comes on top)."""
    if task not in _TASKS:
        raise ValueError(f"unknown SentGLUE task {task!r}; known: {SENTGLUE_TASKS}")
    return [os.path.join(data_dir, p) for p in _TASKS[task][1]]


def evaluate_sentglue(model, data_dir: str, tasks: Sequence[str] = SENTGLUE_TASKS, k: int = 10,
                      seed: int = DEFAULT_SEED, batch_size: int = 64, sicke_test_path: str | None = None) -> dict:
    """{task: result} (see the module doc); `score` of each is its headline number (x 100)."""
    cache = model if isinstance(model, EmbeddingCache) else EmbeddingCache(model)
    results = {}
    for task in tasks:
        absent = [p for p in sentglue_task_files(data_dir, task) if not os.path.isfile(p)]
        run = _TASKS[task][0]
        if absent:
            warnings.warn(f"SentGLUE task omitted: {task}: {absent[0]} absent", MissingDataWarning, stacklevel=2)
            continue
        result = run(cache, data_dir, k=k, seed=seed, batch_size=batch_size, sicke_test_path=sicke_test_path)
        result["score"] = result["spearman"] if task == "STSB" else result["acc"]
        results[task] = result
    if results:
        results["avg"] = float(np.mean([r["score"] for r in results.values()]))
    return results
