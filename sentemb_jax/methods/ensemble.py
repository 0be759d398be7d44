"""Ensemble distillation of augmented SimCSE submodels (the round-trip-translation ensemble paper).

    python -m sentemb_jax.main --gin_file=gin/ensemble_distill.gin --gin.MODEL_DIR="'/tmp/ensemble'"

1. K SimCSE submodels, one `train` job each (gin scopes sub1, sub2, ...), differing by their views
   (round-trip translations from extra columns: `column:<name>` in either of the paper's modes -
   both views the translation, or the sentence paired with its translation - else our
   augmentations) and seeds; optional cleaning of the training sentences (register_tasks.clean)
   and extra unlabelled sentences (a split may list several files).
2. The ensemble f_T(x) = sum_k a_k f_k(x) (eq. 2) of the submodels' L2-normalised embeddings,
   each with its own pooling; a = uniform, or softmax of the submodels' STS-B dev scores / T.
   `EnsembleEncoder` encodes like a SentenceEncoder, so it evaluates and teaches like one.
3. The student (same size as one submodel) distilled from the ensemble's cached embeddings of the
   original sentences: lambda InfoNCE(student, teacher; tau 0.3) + (1 - lambda) MAE (eq. 3-4),
   lambda 0.1 (`QueueDistillConfig.method = 'ensemble'`; MSE / KL / SmoothL1 for Table 4).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Callable, Sequence

import gin
import numpy as np

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
        from sentemb_jax.encoder import SentenceEncoder

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
            out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
        return out[0] if single else out


@gin.configurable(module="sentemb_jax")
def ensemble_distill(model_dir: str = gin.REQUIRED, submodels: Sequence[Callable] = gin.REQUIRED,
                     student: Callable = gin.REQUIRED, distill=gin.REQUIRED, weighting: str = "softmax",
                     weight_temperature: float = 1.0, data_dir: str | None = None, student_layers: int | None = None,
                     teacher: str | None = None, student_init: str = "start") -> dict:
    """Train the submodels (each a gin-scoped `train`), weight them by STS-B dev, score the
    ensemble, distil it into `student` (a gin-scoped `train`, given `distill` with the ensemble as
    teacher), then score everything on the STS table: MODEL_DIR/results.md.

    submodels: e.g. [@sub1/sentemb_jax.train, @sub2/sentemb_jax.train]; each writes
      MODEL_DIR/sub<k> and exports its best tower by STS-B dev to MODEL_DIR/sub<k>/model.
    distill: a QueueDistillConfig (method 'ensemble'); its teacher / teacher_weights are set here.
    teacher / student_layers: the model the submodels and the student start from, and how many of
      its layers they keep (for the "student before" row).
    student_init: 'start' - the student starts where its gin scope says (the submodels' start, as
      the paper's student starts from the pre-trained model); 'best_submodel' - from the submodel
      with the best STS-B dev (same size), so distillation moves it towards the ensemble;
      'submodel_average' - from the element-wise average of the submodels' parameters (same
      architecture and pooling required).
    """
    from sentemb_jax.data.files import default_data_dir
    from sentemb_jax.evaluation.jobs import sts_scores
    from sentemb_jax.evaluation.report import sts_rows_table
    from sentemb_jax.jobs import stsb_split_scores

    if student_init not in STUDENT_INITS:
        raise ValueError(f"ensemble_distill.student_init {student_init!r}: choose from {STUDENT_INITS}")
    from sentemb_jax import validation

    sel = "sentemb_jax.ensemble_distill"
    validation.require_choice(weighting, WEIGHTINGS, sel, "weighting")
    validation.require_number(weight_temperature, sel, "weight_temperature", 0, low_open=True)
    validation.require_int(student_layers, sel, "student_layers", 1, allow_none=True, none_means=" (every layer)")
    data_dir = data_dir or default_data_dir()
    _check_inputs(model_dir, submodels, student, distill, data_dir, teacher)
    os.makedirs(model_dir, exist_ok=True)
    paths, dev = [], []
    for k, train_submodel in enumerate(submodels, start=1):
        run = os.path.join(model_dir, f"sub{k}")
        out = train_submodel(model_dir=run, export_dir=os.path.join(run, "model"))
        if not out.get("best"):
            raise ValueError(f"submodel {k}: no STS-B dev score (set train.eval_every in its scope): it cannot be weighted")
        paths.append(os.path.join(run, "model"))
        dev.append(float(out["best"]["stsb_dev_spearman"]))
    weights = ensemble_weights(dev, weighting, weight_temperature)
    log.info("ensemble weights %s from STS-B dev %s", np.round(weights, 4).tolist(), dev)
    rows = {}
    if teacher:
        rows["student before"] = sts_scores(f"{teacher} (first {student_layers} layers)", os.path.join(model_dir, "eval_start"),
                                            data_dir, lambda: _start_model(teacher, student_layers))
    for k, path in enumerate(paths, start=1):
        rows[f"submodel {k}"] = sts_scores(path, os.path.join(model_dir, f"sub{k}", "eval"), data_dir)
    ensemble = EnsembleEncoder.from_paths(paths, weights)
    # Its STS-B dev beside the submodels' (the split choices are made on), not only the test table.
    ensemble_dev = stsb_split_scores(ensemble, data_dir, "dev")["spearman"]
    log.info("ensemble STS-B dev %.2f (submodels %s)", ensemble_dev, np.round(dev, 2).tolist())
    rows["ensemble"] = sts_scores(f"ensemble of {paths} weights {np.round(weights, 6).tolist()}",
                                  os.path.join(model_dir, "eval_ensemble"), data_dir, lambda: ensemble)
    cfg = dataclasses.replace(distill, teacher=tuple(paths), teacher_weights=tuple(float(w) for w in weights))
    student_dir = os.path.join(model_dir, "student")
    init = {}
    if student_init == "best_submodel":  # already the student's size: no layers to drop
        init = {"init_from": paths[int(np.argmax(dev))], "init_layers": None}
        log.info("student starts from %s (best STS-B dev of the submodels)", init["init_from"])
    elif student_init == "submodel_average":
        init = {"init_from": average_submodels(paths, os.path.join(model_dir, "submodel_average")), "init_layers": None}
        log.info("student starts from the average of the submodels' parameters, %s", init["init_from"])
    out = student(model_dir=student_dir, distill=cfg, export_dir=os.path.join(student_dir, "model"), **init)
    student_dev = float(out["best"]["stsb_dev_spearman"]) if out.get("best") else None
    rows["distilled student"] = sts_scores(os.path.join(student_dir, "model"), os.path.join(student_dir, "eval"), data_dir)
    table = sts_rows_table(rows)
    summary = {"submodel_dev": dev, "ensemble_dev": ensemble_dev, "student_dev": student_dev, "weights": weights.tolist(),
               "weighting": weighting, "student_init": init.get("init_from", "start"), "rows": rows}
    with open(os.path.join(model_dir, "results.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(model_dir, "results.md"), "w") as f:
        student_text = "-" if student_dev is None else f"{student_dev:.2f}"
        f.write(f"# Ensemble distillation\n\nSTS-B dev: submodels {np.round(dev, 2).tolist()}, ensemble {ensemble_dev:.2f}, "
                f"student {student_text}; weights ({weighting}): {np.round(weights, 4).tolist()}\n\n{table}\n")
    print(table)
    return summary


def _check_inputs(model_dir: str, submodels: Sequence[Callable], student: Callable, distill, data_dir: str,
                  teacher: str | None) -> None:
    """Before any work: the start model, DATA_DIR, STS-B dev (weights) and some STS task (the
    tables), and what each submodel's and the student's `train` reads (in its own gin scope)."""
    from sentemb_jax import preflight
    from sentemb_jax.data.files import DataError
    from sentemb_jax.evaluation.jobs import sts_inputs

    job = "sentemb_jax.ensemble_distill"
    if teacher:
        preflight.require_model_dir(teacher, job, "teacher")
    preflight.require_dir(data_dir, job, "data_dir")
    dev = os.path.join(data_dir, "stsb", "dev.tsv")
    if not os.path.isfile(dev):
        raise DataError(f"{dev}: no such file (STS-B dev weights the submodels; data_dir {preflight.source(job, 'data_dir')})")
    preflight.require_some_task("ensemble_distill (STS table)", data_dir, *sts_inputs(data_dir, None), job)
    for k, train_submodel in enumerate(submodels, start=1):
        train_submodel(model_dir=os.path.join(model_dir, f"sub{k}"), check_only=True)
    student(model_dir=os.path.join(model_dir, "student"), distill=distill, check_only=True)


def average_submodels(paths: Sequence[str], out_dir: str) -> str:
    """Save the submodels' parameters averaged element-wise (a uniform weight average, "model soup")
    to out_dir and return it. Submodels fine-tuned a few hundred steps from one start stay in one
    basin, so the average is one model of the same size close to the ensemble: a student start."""
    import jax

    from sentemb_jax.encoder import SentenceEncoder

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


def _start_model(teacher: str, layers: int | None):
    from sentemb_jax.encoder import SentenceEncoder

    model = SentenceEncoder.from_pretrained(teacher)
    return model.first_layers(layers) if layers else model
