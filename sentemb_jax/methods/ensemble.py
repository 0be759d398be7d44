"""Ensemble distillation of augmented SimCSE submodels (the round-trip-translation ensemble paper).

    python -m sentemb_jax.main --gin_file=gin/ensemble_distill.gin --gin.MODEL_DIR="'/tmp/ensemble'"

1. K SimCSE submodels, one `train` job each (gin scopes sub1, sub2, ...), differing by their views
   (round-trip translations from extra columns: `column:<name>` in either of the paper's modes -
   both views the translation, or the sentence paired with its translation - else our
   augmentations) and seeds; optional cleaning of the training sentences (DataConfig.clean)
   and extra unlabelled sentences (a split may list several files).
2. The ensemble f_T(x) = sum_k a_k f_k(x) (eq. 2) of the submodels' L2-normalised embeddings,
   each with its own pooling; a = uniform, or softmax of the submodels' STS-B dev scores / T.
   `EnsembleEncoder` encodes like a SentenceEncoder, so it evaluates and teaches like one.
3. The student (same size as one submodel) distilled from the ensemble's cached embeddings of the
   original sentences: lambda InfoNCE(student, teacher; tau 0.3) + (1 - lambda) MAE (eq. 3-4),
   lambda 0.1 (methods.queue_distill.EnsembleStudent; MSE / KL / SmoothL1 for Table 4).
"""
from __future__ import annotations

import logging
from typing import Sequence

import jax
import numpy as np

from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.pooling import l2_normalize_host

log = logging.getLogger(__name__)

WEIGHTINGS = ("uniform", "softmax")
STUDENT_INITS = ("start", "best_submodel", "submodel_average")


def ensemble_weights(scores: Sequence[float], weighting: str = "softmax", temperature: float = 1.0) -> np.ndarray:
    """a_k: uniform (1/K), or softmax(score_k / temperature) of the submodels' dev scores (the
    paper's second method, scores in Spearman x 100)."""
    scores = np.asarray(scores, np.float64)
    if scores.ndim != 1 or not len(scores):
        raise ValueError(f"ensemble_weights: need a list of submodel scores, got {scores.tolist()}")
    if weighting == "uniform":
        return np.full(len(scores), 1.0 / len(scores))
    if weighting != "softmax":
        raise ValueError(f"ensemble weighting {weighting!r}: choose from {WEIGHTINGS}")
    if temperature <= 0:
        raise ValueError(f"ensemble weighting temperature {temperature}: must be > 0")
    z = (scores - scores.max()) / temperature
    return np.exp(z) / np.exp(z).sum()


class EnsembleEncoder:
    """sum_k a_k normalize(f_k(x)) over submodel encoders of one embedding width (eq. 2)."""

    def __init__(self, encoders: Sequence, weights: Sequence[float]):
        if len(encoders) != len(weights) or not encoders:
            raise ValueError(f"EnsembleEncoder: {len(encoders)} encoders, {len(weights)} weights")
        dims = {e.get_sentence_embedding_dimension() for e in encoders}
        if len(dims) != 1:
            raise ValueError(f"EnsembleEncoder: submodels embed in different widths {sorted(dims)}")
        weights = np.asarray(weights, np.float64)
        if (weights < 0).any() or not np.isclose(weights.sum(), 1.0):
            raise ValueError(f"EnsembleEncoder: weights must be >= 0 and sum to 1, got {weights.tolist()}")
        self.encoders, self.weights = list(encoders), weights

    @classmethod
    def from_paths(cls, paths: Sequence[str], weights: Sequence[float] | None = None, **kwargs) -> "EnsembleEncoder":
        encoders = [SentenceEncoder.from_pretrained(p, **kwargs) for p in paths]
        return cls(encoders, weights if weights is not None else np.full(len(paths), 1.0 / len(paths)))

    # What a teacher / an evaluated model needs (SentenceEncoder's interface).
    @property
    def params(self):
        return [e.params for e in self.encoders]

    @property
    def module(self):
        """Identity for the teacher-embedding cache: the submodels' modules and the weights."""
        return (tuple(e.module for e in self.encoders), tuple(np.round(self.weights, 12).tolist()))

    @property
    def max_seq_length(self) -> int:
        return min(e.max_seq_length for e in self.encoders)

    @property
    def tokenizer(self):
        return self.encoders[0].tokenizer

    def get_sentence_embedding_dimension(self) -> int:
        return self.encoders[0].get_sentence_embedding_dimension()

    def encode(self, sentences, batch_size: int = 64, normalize: bool = True, show_progress_bar: bool | None = None,
               **kwargs) -> np.ndarray:
        single = isinstance(sentences, str)
        parts = [e.encode([sentences] if single else sentences, batch_size=batch_size, normalize=True,
                          show_progress_bar=show_progress_bar) for e in self.encoders]
        out = np.tensordot(self.weights.astype(np.float32), np.stack(parts), axes=1).astype(np.float32)
        if normalize:
            out = l2_normalize_host(out)
        return out[0] if single else out


def average_submodels(paths: Sequence[str], out_dir: str) -> str:
    """Save the submodels' parameters averaged element-wise (a uniform weight average, "model soup")
    to out_dir and return it. Submodels fine-tuned a few hundred steps from one start stay in one
    basin, so the average is one model of the same size close to the ensemble: a student start."""
    encoders = [SentenceEncoder.from_pretrained(p) for p in paths]
    first = encoders[0]
    shapes = lambda e: jax.tree_util.tree_map(np.shape, e.params)  # noqa: E731
    for path, e in zip(paths[1:], encoders[1:]):
        if shapes(e) != shapes(first) or e.config != first.config or tuple(e.module.pooling) != tuple(first.module.pooling):
            raise ValueError(f"student_init='submodel_average': {path} differs from {paths[0]} in architecture or "
                             "pooling; only submodels of one architecture and pooling can be averaged")
    first.params = jax.tree_util.tree_map(lambda *xs: np.mean(np.stack([np.asarray(x, np.float32) for x in xs]), 0),
                                          *[e.params for e in encoders])
    first.save_pretrained(out_dir)
    return out_dir
