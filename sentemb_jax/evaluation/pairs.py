"""Pair classification by ranking: ROC AUC (x 100) of a model's pair scores against binary labels.

The Trans-Encoder protocol (Liu et al. 2022, following Li et al. 2020): no training; a bi-encoder
scores a pair by the cosine of the two embeddings, a cross-encoder by `predict(pairs)`; AUC from
scikit-learn's `roc_auc_score`.

* MRPC: `<data>/mrpc/test.tsv` (1725 pairs, 1 = paraphrase).
* QNLI: GLUE QNLI dev (`<data>/qnli/dev.tsv`, 1 = entailment); its first 1000 rows (file order) are
  the dev part and the remaining 4463 the test part, as in Trans-Encoder. `QNLI` is the test part.
* QQP: only when a file is given (`sentence1 sentence2 label`, 1 = duplicate), scored as a whole.
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from sentemb_jax.errors import UndefinedScoreError
from sentemb_jax.evaluation.encoding import is_cross_encoder, predict_pairs
from sentemb_jax.evaluation.readers import read_labelled_pairs
from sentemb_jax.evaluation.sts import MissingDataWarning, cosine_scores

QNLI_DEV_ROWS = 1000


def pair_scores(model, sentences1, sentences2, batch_size: int = 64) -> np.ndarray:
    """Cosine of the embeddings for a bi-encoder; `predict(pairs)` for a cross-encoder."""
    if is_cross_encoder(model):
        return predict_pairs(model, sentences1, sentences2)
    return cosine_scores(model, sentences1, sentences2, batch_size)



class AveragedPairScores:
    """A model whose pair score is the mean of several models' (bi-encoders: cosine; cross-encoders:
    `predict`) - the Trans-Encoder's mutual ensemble at evaluation. An ensemble that averages
    *embeddings* (and so also encodes) is `methods.ensemble.EnsembleEncoder`."""

    def __init__(self, models):
        self.models = models

    def predict(self, pairs):
        a, b = [p[0] for p in pairs], [p[1] for p in pairs]
        return np.mean([pair_scores(m, a, b) for m in self.models], axis=0)


def pair_auc(scores, labels, name: str = "pairs") -> float:
    """ROC AUC x 100 (labels 1 = positive); UndefinedScoreError (with the reason) when it is not
    defined: no pairs, one class only, NaN / inf scores."""
    labels, scores = np.asarray(labels), np.asarray(scores, dtype=np.float64)
    if len(labels) == 0:
        raise UndefinedScoreError(f"{name}: AUC undefined: no pairs to score (an empty split?)")
    classes = np.unique(labels)
    if len(classes) < 2:
        raise UndefinedScoreError(f"{name}: AUC undefined: every one of the {len(labels)} labels is {classes[0].item()!r} "
                                  "(it needs both classes, 0 and 1)")
    bad = ~np.isfinite(scores)
    if bad.any():
        raise UndefinedScoreError(f"{name}: AUC undefined: {int(bad.sum())} of the {len(scores)} model scores are "
                                  "NaN / inf (NaN embeddings?)")
    from sklearn.metrics import roc_auc_score  # lazy: 1.3 s to import, paid by every job otherwise

    return float(roc_auc_score(labels, scores) * 100)


def evaluate_pair_file(model, path: str, rows: slice = slice(None), batch_size: int = 64) -> dict:
    """{"auc": x100, "pairs": n} for the rows `rows` of a labelled-pairs file."""
    s1, s2, labels = read_labelled_pairs(path)
    s1, s2, labels = s1[rows], s2[rows], labels[rows]
    where = path if rows == slice(None) else f"{path} rows [{rows.start or 0}:{'' if rows.stop is None else rows.stop}]"
    if len(labels) == 0 or len(set(labels)) < 2:
        pair_auc([], labels, where)  # undefined whatever the model: said before encoding
    return {"auc": pair_auc(pair_scores(model, s1, s2, batch_size), labels, where), "pairs": len(labels)}


def pair_task_files(data_dir: str, qqp_path: str | None = None) -> dict[str, tuple[str, slice]]:
    """{task: (file, rows)} of the pair tasks (QQP only when a file is given)."""
    tasks = {
        "MRPC": (os.path.join(data_dir, "mrpc", "test.tsv"), slice(None)),
        "QNLI_dev": (os.path.join(data_dir, "qnli", "dev.tsv"), slice(None, QNLI_DEV_ROWS)),
        "QNLI": (os.path.join(data_dir, "qnli", "dev.tsv"), slice(QNLI_DEV_ROWS, None)),
    }
    if qqp_path:
        tasks["QQP"] = (qqp_path, slice(None))
    return tasks


def evaluate_pair_tasks(model, data_dir: str, qqp_path: str | None = None, batch_size: int = 64) -> dict:
    """{"MRPC": {...}, "QNLI": {...}, "QNLI_dev": {...}, ["QQP": {...}]}; absent files are skipped with a warning."""
    results = {}
    for name, (path, rows) in pair_task_files(data_dir, qqp_path).items():
        if not os.path.isfile(path):
            warnings.warn(f"pair task omitted: {name}: {path} absent", MissingDataWarning, stacklevel=2)
            continue
        results[name] = evaluate_pair_file(model, path, rows, batch_size)
    return results
