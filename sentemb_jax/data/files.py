"""Readers for the TSV files under the data directory (see ../shared/data/README.md).

Format: UTF-8, a header line, TAB-separated fields, no quoting. Every error names the file and
line so a user can fix the data.
"""
from __future__ import annotations

import math
import os
from typing import Iterator, Sequence

import numpy as np

DATA_DIR_ENV = "SENTEMB_DATA_DIR"


class DataError(ValueError):
    """A data file that is missing or malformed; the message names the file and line."""


def default_data_dir() -> str:
    """$SENTEMB_DATA_DIR, else ../shared/data next to the repository (or the current directory)."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return env
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for base in (repo, os.getcwd()):
        candidate = os.path.normpath(os.path.join(base, "..", "shared", "data"))
        if os.path.isdir(candidate):
            return candidate
    return os.path.normpath(os.path.join(repo, "..", "shared", "data"))


def iter_tsv(path: str, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row dict) for each data line; header must contain `columns`."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    with open(path, "rb") as f:
        offset = 0
        header = None
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: invalid UTF-8 at byte offset {offset + e.start}") from None
            offset += len(raw)
            fields = line.rstrip("\n").rstrip("\r").split("\t")
            if header is None:
                header = fields
                missing = [c for c in columns if c not in header]
                if missing:
                    raise DataError(f"{path}:1: header {header} lacks column(s) {missing}")
                continue
            if line.strip() == "":
                continue
            if len(fields) != len(header):
                raise DataError(f"{path}:{lineno}: expected {len(header)} TAB-separated fields, found {len(fields)}")
            yield lineno, dict(zip(header, fields))
        if header is None:
            raise DataError(f"{path}: empty file (no header line)")


def read_sts_pairs(path: str, score_range: tuple[float, float] | None = None):
    """(sentence1 list, sentence2 list, float scores) of an STS TSV file."""
    s1, s2, scores = [], [], []
    for lineno, row in iter_tsv(path, ("sentence1", "sentence2", "score")):
        try:
            score = float(row["score"])
        except ValueError:
            raise DataError(f"{path}:{lineno}: score {row['score']!r} is not a number") from None
        if math.isnan(score) or (score_range and not score_range[0] <= score <= score_range[1]):
            raise DataError(f"{path}:{lineno}: score {score} outside {score_range}")
        s1.append(row["sentence1"])
        s2.append(row["sentence2"])
        scores.append(score)
    return s1, s2, np.asarray(scores, np.float64)
