"""SentEval transfer tasks: logistic regression on frozen sentence embeddings (accuracy x 100).

Follows SentEval's scikit-learn path (`usepytorch=False`, senteval/tools/validation.py):

* MR, CR, SUBJ, MPQA (no official split): `InnerKFoldClassifier` - outer stratified k-fold
  (k = 10, as in SentEval's `kfold=10` runs); in each outer training part an inner stratified
  k-fold picks C from 2^-2 .. 2^3 (mean inner accuracy, rounded to 2 decimals, first maximum);
  the refit with that C is scored on the outer test fold; reported: mean over outer folds.
* SST2 (train / dev / test files): `SplitClassifier` - fit on train for each C in 2^-2 .. 2^3,
  pick C on dev, report test accuracy of that fit.
* TREC (train / test): `KFoldClassifier` - stratified k-fold CV on train picks C from 2^-1 .. 2^5,
  refit on all of train, report test accuracy (6 coarse classes).

Like SentEval, samples are first sorted by (number of whitespace tokens, label), stably, so that
with the same seed the folds are SentEval's folds for the same input order. The 4 empty lines of
CR and 3 of MPQA are kept as empty sentences "" (SentEval keeps them as empty token lists, and
the SimCSE batcher encodes them as the empty string), so the sample counts match SentEval's.

Differences from SentEval, on purpose: scikit-learn's current default solver (lbfgs, max_iter
raised to 1000; multinomial for TREC) instead of the liblinear/one-vs-rest default of the
scikit-learn 0.19 that SentEval ran on; one seed (`seed`, default SentEval's 1111) drives both
the folds and the classifier. Results are deterministic for a seed.
"""
from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from sentemb_jax.evaluation.encoding import EmbeddingCache
from sentemb_jax.evaluation.readers import read_labelled_sentences
from sentemb_jax.evaluation.sts import MissingDataWarning

if TYPE_CHECKING:
    from sklearn.linear_model import LogisticRegression

CV_TASKS = ("MR", "CR", "SUBJ", "MPQA")
TRANSFER_TASKS = CV_TASKS + ("SST2", "TREC")
INNER_KFOLD_CS = tuple(2.0**t for t in range(-2, 4))  # SentEval InnerKFoldClassifier / SplitClassifier
KFOLD_CS = tuple(2.0**t for t in range(-1, 6))  # SentEval KFoldClassifier
DEFAULT_SEED = 1111


def fit_logreg(X: np.ndarray, y: np.ndarray, C: float, seed: int) -> "LogisticRegression":
    from sklearn.linear_model import LogisticRegression  # lazy: 1.3 s to import, paid by every job otherwise

    # One BLAS thread: these fits are small, extra threads only add overhead on a shared CPU.
    with threadpool_limits(1):
        return LogisticRegression(C=C, max_iter=1000, random_state=seed).fit(X, y)


def accuracy(clf: "LogisticRegression", X: np.ndarray, y: np.ndarray) -> float:
    with threadpool_limits(1):
        return float(clf.score(X, y) * 100)


def _stratified_kfold(k: int, seed: int):
    from sklearn.model_selection import StratifiedKFold  # lazy: 1.3 s to import, paid by every job otherwise

    return StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)


def senteval_order(sentences: Sequence[str], labels: Sequence) -> tuple[list[str], np.ndarray]:
    """Samples sorted like SentEval: by (whitespace token count, label), stable."""
    order = sorted(range(len(sentences)), key=lambda i: (len(sentences[i].split()), labels[i]))
    return [sentences[i] for i in order], np.asarray([labels[i] for i in order])


def cv_select_C(X: np.ndarray, y: np.ndarray, Cs: Sequence[float], k: int, seed: int) -> tuple[float, float]:
    """(best C, its mean k-fold accuracy rounded to 2 decimals as SentEval does)."""
    folds = list(_stratified_kfold(k, seed).split(X, y))
    scores = [round(float(np.mean([accuracy(fit_logreg(X[tr], y[tr], C, seed), X[te], y[te]) for tr, te in folds])), 2)
              for C in Cs]
    best = int(np.argmax(scores))
    return Cs[best], scores[best]


def inner_kfold_accuracy(X: np.ndarray, y: np.ndarray, k: int = 10, seed: int = DEFAULT_SEED,
                         Cs: Sequence[float] = INNER_KFOLD_CS, inner_k: int | None = None) -> dict:
    """SentEval InnerKFoldClassifier: {"acc", "devacc", "fold_acc", "fold_C"} (x 100)."""
    outer = _stratified_kfold(k, seed)
    fold_acc, fold_dev, fold_C = [], [], []
    for tr, te in outer.split(X, y):
        C, dev = cv_select_C(X[tr], y[tr], Cs, inner_k or k, seed)
        fold_acc.append(round(accuracy(fit_logreg(X[tr], y[tr], C, seed), X[te], y[te]), 2))
        fold_dev.append(dev)
        fold_C.append(C)
    return {"acc": round(float(np.mean(fold_acc)), 2), "devacc": round(float(np.mean(fold_dev)), 2),
            "fold_acc": fold_acc, "fold_C": fold_C}


def kfold_then_test_accuracy(X_train, y_train, X_test, y_test, k: int = 10, seed: int = DEFAULT_SEED,
                             Cs: Sequence[float] = KFOLD_CS) -> dict:
    """SentEval KFoldClassifier: C by k-fold CV on train, refit on train, test accuracy."""
    C, dev = cv_select_C(X_train, y_train, Cs, k, seed)
    clf = fit_logreg(X_train, y_train, C, seed)
    return {"acc": round(accuracy(clf, X_test, y_test), 2), "devacc": dev, "C": C}


def split_then_test_accuracy(X_train, y_train, X_dev, y_dev, X_test, y_test, seed: int = DEFAULT_SEED,
                             Cs: Sequence[float] = INNER_KFOLD_CS) -> dict:
    """SentEval SplitClassifier: C by dev accuracy of a fit on train, test accuracy of that fit."""
    fits = [fit_logreg(X_train, y_train, C, seed) for C in Cs]
    dev = [round(accuracy(clf, X_dev, y_dev), 2) for clf in fits]
    best = int(np.argmax(dev))
    return {"acc": round(accuracy(fits[best], X_test, y_test), 2), "devacc": dev[best], "C": Cs[best]}


def _embed(cache: EmbeddingCache, sentences: list[str], batch_size: int) -> np.ndarray:
    return cache.encode(sentences, batch_size=batch_size).astype(np.float64)


def transfer_task_files(data_dir: str, task: str) -> dict[str, str]:
    base = os.path.join(data_dir, "senteval_transfer")
    if task in CV_TASKS:
        return {"all": os.path.join(base, f"{task}.tsv")}
    if task == "SST2":
        return {split: os.path.join(base, f"SST2_{split}.tsv") for split in ("train", "dev", "test")}
    if task == "TREC":
        return {split: os.path.join(base, f"TREC_{split}.tsv") for split in ("train", "test")}
    raise ValueError(f"unknown transfer task {task!r}; known: {TRANSFER_TASKS}")


def evaluate_transfer_task(model, data_dir: str, task: str, k: int = 10, seed: int = DEFAULT_SEED,
                           batch_size: int = 64, inner_k: int | None = None) -> dict:
    """One SentEval task's accuracy dict (see module doc for the protocol of each task)."""
    files = transfer_task_files(data_dir, task)
    cache = model if isinstance(model, EmbeddingCache) else EmbeddingCache(model)
    splits = {}
    for split, path in files.items():
        sentences, labels = senteval_order(*read_labelled_sentences(path))
        splits[split] = (_embed(cache, sentences, batch_size), labels)
    if task in CV_TASKS:
        X, y = splits["all"]
        result = inner_kfold_accuracy(X, y, k=k, seed=seed, inner_k=inner_k)
    elif task == "SST2":
        result = split_then_test_accuracy(*splits["train"], *splits["dev"], *splits["test"], seed=seed)
    else:
        result = kfold_then_test_accuracy(*splits["train"], *splits["test"], k=k, seed=seed)
    result["samples"] = {split: int(len(y)) for split, (_, y) in splits.items()}
    return result


def evaluate_transfer(model, data_dir: str, tasks: Sequence[str] = TRANSFER_TASKS, k: int = 10,
                      seed: int = DEFAULT_SEED, batch_size: int = 64) -> dict:
    """{task: result} for the given SentEval tasks; tasks with absent files are skipped with a warning."""
    cache = model if isinstance(model, EmbeddingCache) else EmbeddingCache(model)
    results = {}
    for task in tasks:
        absent = [p for p in transfer_task_files(data_dir, task).values() if not os.path.isfile(p)]
        if absent:
            warnings.warn(f"transfer task omitted: {task}: {absent[0]} absent", MissingDataWarning, stacklevel=2)
            continue
        results[task] = evaluate_transfer_task(cache, data_dir, task, k=k, seed=seed, batch_size=batch_size)
    if results:
        results["avg"] = round(float(np.mean([r["acc"] for r in results.values()])), 2)
    return results
