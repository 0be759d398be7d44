"""Readers for labelled evaluation files, built on `sentemb_jax.data.files.iter_tsv`.

* labelled pairs (TSV): `sentence1  sentence2  label` (MRPC, QNLI, QQP, SICK-E);
* labelled sentences (TSV): `sentence  label` (SentEval MR, CR, SUBJ, MPQA, SST2, TREC);
* re-ranking queries (JSONL), one object per line:
  `{"query": "...", "positive": ["...", ...], "negative": ["...", ...]}`
  (the layout of sentence-transformers' RerankingEvaluator samples; other keys are ignored).

Every error is a `DataError` naming the file and line.
"""
from __future__ import annotations

import json
import os
from typing import Mapping

import numpy as np

from sentemb_jax.data.files import iter_tsv

# Binary pair labels: MRPC/QQP use 1/0; GLUE QNLI's text labels map entailment -> 1 (Trans-Encoder).
from sentemb_jax.errors import DataError

BINARY_PAIR_LABELS = {"1": 1, "0": 0, "entailment": 1, "not_entailment": 0}
SICK_E_LABELS = {"ENTAILMENT": 0, "NEUTRAL": 1, "CONTRADICTION": 2}


def _map_label(path: str, lineno: int, value: str, label_map: Mapping[str, int] | None):
    if label_map is None:
        return value
    if value not in label_map:
        raise DataError(f"{path}:{lineno}: label {value!r} is not one of {sorted(label_map)}")
    return label_map[value]


def read_labelled_pairs(path: str, label_map: Mapping[str, int] | None = BINARY_PAIR_LABELS):
    """(sentence1 list, sentence2 list, labels array) of a `sentence1 sentence2 label` TSV file."""
    s1, s2, labels = [], [], []
    for lineno, row in iter_tsv(path, ("sentence1", "sentence2", "label")):
        labels.append(_map_label(path, lineno, row["label"], label_map))
        s1.append(row["sentence1"])
        s2.append(row["sentence2"])
    return s1, s2, np.asarray(labels)


def read_labelled_sentences(path: str, label_column: str = "label"):
    """(sentences, labels as strings) of a `sentence label` TSV file.

    A row whose sentence is empty is kept as "" (CR has 4 and MPQA 3 such rows, as in SentEval's
    input files; SentEval keeps them as empty samples too).
    """
    sentences, labels = [], []
    for _, row in iter_tsv(path, ("sentence", label_column)):
        sentences.append(row["sentence"])
        labels.append(row[label_column])
    return sentences, labels


def read_reranking_jsonl(path: str) -> list[dict]:
    """[{"query": str, "positive": [str], "negative": [str]}] from a JSONL file (blank lines skipped)."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    samples = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("query"), str):
                raise DataError(f"{path}:{lineno}: expected an object with a string 'query'")
            for key in ("positive", "negative"):
                value = obj.get(key)
                if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                    raise DataError(f"{path}:{lineno}: '{key}' must be a list of strings")
            samples.append({"query": obj["query"], "positive": obj["positive"], "negative": obj["negative"]})
    return samples
