"""The model protocols the evaluators accept, and a cache so that each sentence is encoded once.

Bi-encoder protocol
    `model.encode(sentences: list[str], batch_size: int = ..., **kwargs) -> array [n, dim]`.
    `SentenceEncoder` and `sentence_transformers.SentenceTransformer` satisfy it as they are. A plain
    callable `f(sentences) -> array` is accepted too (it is called without `batch_size`).

    MTEB fit: MTEB 1.x's custom-model protocol (`mteb.encoder_interface.Encoder`) calls
    `model.encode(sentences, task_name=..., prompt_type=..., **kwargs)` (plus `batch_size=` from
    `encode_kwargs`) and expects an array [n, dim] back. An `encode` that takes `batch_size` and
    those two keywords, as `SentenceEncoder.encode` does (it raises TypeError for keywords outside
    sentence-transformers' and MTEB's), therefore serves both MTEB and these evaluators without a
    wrapper. MTEB 2 passes a DataLoader of batches instead of a list and reads `mteb_model_meta`:
    wrap the model in `sentemb_jax.evaluation.mteb_adapter.MtebEncoder` (cross-encoders:
    `MtebCrossEncoder`), a module that imports mteb and that only MTEB users import. The
    evaluators here only ever pass `batch_size`.

Cross-encoder protocol
    `model.predict(pairs: list[tuple[str, str]]) -> array [n]` (one relevance score per pair, higher =
    more similar), as `sentence_transformers.CrossEncoder.predict`. A model is treated as a
    cross-encoder when it has `predict` and no `encode`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def is_cross_encoder(model) -> bool:
    return callable(getattr(model, "predict", None)) and not callable(getattr(model, "encode", None))


def encode_sentences(model, sentences: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """float32 [n, dim] embeddings from a bi-encoder (object with `encode`, or a callable)."""
    sentences = list(sentences)
    if callable(getattr(model, "encode", None)):
        emb = model.encode(sentences, batch_size=batch_size)
    elif callable(model) and not is_cross_encoder(model):
        emb = model(sentences)
    else:
        raise TypeError(f"{type(model).__name__} is not a bi-encoder: it needs encode(sentences, batch_size=...) "
                        "or must be a callable sentences -> array")
    emb = np.asarray(emb, dtype=np.float32)
    if emb.ndim != 2 or emb.shape[0] != len(sentences):
        raise ValueError(f"{type(model).__name__}.encode returned shape {emb.shape} for {len(sentences)} sentences; "
                         "expected [n, dim]")
    return emb


def predict_pairs(model, sentences1: Sequence[str], sentences2: Sequence[str]) -> np.ndarray:
    """float64 [n] scores from a cross-encoder's `predict(pairs)`."""
    pairs = list(zip(sentences1, sentences2))
    scores = np.asarray(model.predict(pairs), dtype=np.float64)
    if scores.ndim == 2 and scores.shape[1] == 1:
        scores = scores[:, 0]
    if scores.shape != (len(pairs),):
        raise ValueError(f"{type(model).__name__}.predict returned shape {scores.shape} for {len(pairs)} pairs; "
                         "expected one score per pair")
    return scores


class EmbeddingCache:
    """A bi-encoder that remembers embeddings: sentences already seen are not encoded again.

    Evaluating many tasks with one model shares sentences across tasks (STS-B overlaps STS12-16);
    encoding everything in one call also lets the encoder batch sentences of similar length.
    """

    def __init__(self, model):
        self.model = model
        self._table: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._table)

    def add(self, sentences: Sequence[str], batch_size: int = 64) -> None:
        new = [s for s in dict.fromkeys(sentences) if s not in self._table]
        if new:
            self._table.update(zip(new, encode_sentences(self.model, new, batch_size)))

    def encode(self, sentences: Sequence[str], batch_size: int = 64, **kwargs) -> np.ndarray:
        sentences = list(sentences)
        self.add(sentences, batch_size)
        if not sentences:
            return np.zeros((0, 0), np.float32)
        return np.stack([self._table[s] for s in sentences])
