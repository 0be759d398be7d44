"""The distillation jobs: distill_report (the README's default job: distil, then the STS table of
teacher, student before and after) and ensemble_distill (submodels, their ensemble, its student).

    python -m sentemb_jax.main --gin_file=gin/runs/default.gin
    python -m sentemb_jax.main --gin_file=gin/ensemble_distill.gin --gin.MODEL_DIR="'/tmp/ensemble'"
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Sequence

import numpy as np

import gin
from sentemb_jax import preflight, validation
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import DataError
from sentemb_jax.evaluation import plots
from sentemb_jax.evaluation.report import sts_rows_table
from sentemb_jax.evaluation.sts import STS_TASKS, TASK_LABELS, StsbEvaluator
from sentemb_jax.jobs.evaluate import check_inputs, sts_inputs, sts_scores
from sentemb_jax.jobs.train import made
from sentemb_jax.methods.ensemble import STUDENT_INITS, WEIGHTINGS, EnsembleEncoder, average_submodels, ensemble_weights
from sentemb_jax.methods.queue_distill import EnsembleStudent
from sentemb_jax.paths import default_data_dir
from sentemb_jax.run_dir import METRICS_JSONL, write_results
from sentemb_jax.training.checks import check_inputs as check_train_inputs
from sentemb_jax.training.config import RunConfig
from sentemb_jax.training.method import Method
from sentemb_jax.training.trainer import train

log = logging.getLogger(__name__)


@gin.configurable(module="sentemb_jax")
def distill_report(model_dir: str = gin.REQUIRED, teacher: str = gin.REQUIRED, config: RunConfig = gin.REQUIRED,
                   method: Method = gin.REQUIRED, student_layers: int = 3, data_dir: str | None = None,
                   sickr_test_path: str | None = None) -> dict:
    """Score the teacher and the student before training (its first `student_layers` layers) on the
    STS table, train the student (`config` with `method`, e.g. ConGen; its MODEL_DIR is
    `model_dir`), score the best student by STS-B dev; print the three rows; write
    model_dir/{student (the model), results.md, sts_teacher_student.png, stsb_dev_curve.png}.
    Scores of a finished part are reused on a rerun."""
    validation.require_int(student_layers, "sentemb_jax.distill_report", "student_layers", 1)
    data_dir = data_dir or default_data_dir()
    student_dir = os.path.join(model_dir, "student")
    # Before any work: the teacher, DATA_DIR, a SICK-R test file given by path, some STS task to
    # score, and what the training reads (its start model, its task's files, STS-B dev).
    preflight.require_model_dir(teacher, "sentemb_jax.distill_report", "teacher")
    check_inputs("distill_report", None, data_dir, sickr_test_path=sickr_test_path)
    preflight.require_some_task("distill_report (STS table)", data_dir, *sts_inputs(data_dir, sickr_test_path),
                                "sentemb_jax.distill_report")
    config, method = config.replace(model_dir=model_dir), made(method, Method)
    check_train_inputs(config, method)

    def scored(name: str, make) -> dict:
        label = {"teacher": teacher, "student_before": f"{teacher} (first {student_layers} layers)",
                 "student_after": student_dir}[name]
        return sts_scores(label, os.path.join(model_dir, "eval", name), data_dir, make, sickr_test_path)

    teacher_encoder = SentenceEncoder.from_pretrained(teacher)
    rows = {"teacher": scored("teacher", lambda: teacher_encoder),
            "student before": scored("student_before", lambda: teacher_encoder.first_layers(student_layers))}
    result = train(config, method, export_dir=student_dir)
    rows["student after"] = scored("student_after", lambda: SentenceEncoder.from_pretrained(student_dir))
    labels = {**TASK_LABELS, "avg": "Avg"}
    table = sts_rows_table(rows)
    with open(os.path.join(model_dir, METRICS_JSONL)) as f:
        history = [json.loads(line) for line in f]  # also right when a rerun found the training done
    curve = [c for c in history if "stsb_dev_spearman" in c]
    best = max(curve, key=lambda c: c["stsb_dev_spearman"]) if curve else {}
    note = (f"Student: the first {student_layers} layers of {teacher}, trained {history[-1]['step']} steps "
            f"({history[-1]['train_seconds'] / 60:.1f} min of training); best STS-B dev "
            f"{best.get('stsb_dev_spearman', float('nan')):.2f} at step {best.get('step')}. STS: Spearman x 100.")
    print("\n" + table + "\n\n" + note)
    write_results(model_dir, {"sts": rows, "best_dev": best, "steps": history[-1]["step"]}, table + "\n\n" + note + "\n")
    shown = [t for t in (*STS_TASKS, "avg") if all(r.get(t) is not None for r in rows.values())]  # no SICK-R test here
    plots.plot_grouped_bars({n: {labels.get(t, t): r[t] for t in shown} for n, r in rows.items()},
                            os.path.join(model_dir, "sts_teacher_student.png"), "STS: teacher, student before / after")
    plots.plot_curve([c["train_seconds"] / 60 for c in curve], [c["stsb_dev_spearman"] for c in curve],
                     os.path.join(model_dir, "stsb_dev_curve.png"), "Student STS-B dev during training",
                     "training minutes", "Spearman x 100")
    return {"sts": rows, "train": result}


@gin.configurable(module="sentemb_jax")
def ensemble_distill(model_dir: str = gin.REQUIRED, submodels: Sequence[RunConfig] = gin.REQUIRED,
                     submodel_methods: Sequence[Method] = gin.REQUIRED, student: RunConfig = gin.REQUIRED,
                     method: EnsembleStudent = gin.REQUIRED, weighting: str = "softmax",
                     weight_temperature: float = 1.0, data_dir: str | None = None, student_layers: int | None = None,
                     teacher: str | None = None, student_init: str = "start") -> dict:
    """Train the submodels (each a RunConfig, with its method), weight them by STS-B dev,
    score the ensemble, distil it into `student` (a RunConfig trained with `method`, an
    EnsembleStudent whose teacher is the ensemble), then score everything on the STS table:
    MODEL_DIR/results.md.

    submodels: e.g. [@sub1/sentemb_jax.RunConfig(), @sub2/sentemb_jax.RunConfig()] (each gin scope
      its own views and seed); each trains in MODEL_DIR/sub<k> and exports its best tower by STS-B
      dev to MODEL_DIR/sub<k>/model. The student trains in MODEL_DIR/student.
    submodel_methods: one method per submodel (e.g. [@sub1/sentemb_jax.SimCSE(), ...]).
    teacher / student_layers: the model the submodels and the student start from, and how many of
      its layers they keep (for the "student before" row).
    student_init: 'start' - the student starts where its gin scope says (the submodels' start, as
      the paper's student starts from the pre-trained model); 'best_submodel' - from the submodel
      with the best STS-B dev (same size), so distillation moves it towards the ensemble;
      'submodel_average' - from the element-wise average of the submodels' parameters (same
      architecture and pooling required).
    """
    if student_init not in STUDENT_INITS:
        raise ValueError(f"ensemble_distill.student_init {student_init!r}: choose from {STUDENT_INITS}")
    sel = "sentemb_jax.ensemble_distill"
    validation.require_choice(weighting, WEIGHTINGS, sel, "weighting")
    validation.require_number(weight_temperature, sel, "weight_temperature", 0, low_open=True)
    validation.require_int(student_layers, sel, "student_layers", 1, allow_none=True, none_means=" (every layer)")
    data_dir = data_dir or default_data_dir()
    submodels = [config.replace(model_dir=os.path.join(model_dir, f"sub{k}")) for k, config in enumerate(submodels, start=1)]
    submodel_methods, method = [made(m, Method) for m in submodel_methods], made(method, EnsembleStudent)
    student = student.replace(model_dir=os.path.join(model_dir, "student"))
    if len(submodel_methods) != len(submodels):
        validation.fail(submodel_methods, sel, "submodel_methods", f"must hold one method per submodel ({len(submodels)})")
    _check_inputs(model_dir, submodels, submodel_methods, student, method, data_dir, teacher)
    os.makedirs(model_dir, exist_ok=True)
    paths, dev = [], []
    for k, (config, submodel_method) in enumerate(zip(submodels, submodel_methods), start=1):
        run = config.model_dir
        out = train(config, submodel_method, export_dir=os.path.join(run, "model"))
        if not out.get("best"):
            raise ValueError(f"submodel {k}: no STS-B dev score (set EvalConfig.every in its scope): it cannot be weighted")
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
    ensemble_dev = StsbEvaluator(data_dir, "dev")(ensemble)["spearman"]
    log.info("ensemble STS-B dev %.2f (submodels %s)", ensemble_dev, np.round(dev, 2).tolist())
    rows["ensemble"] = sts_scores(f"ensemble of {paths} weights {np.round(weights, 6).tolist()}",
                                  os.path.join(model_dir, "eval_ensemble"), data_dir, lambda: ensemble)
    student_method = dataclasses.replace(method, teacher=tuple(paths), teacher_weights=tuple(float(w) for w in weights))
    student_dir = student.model_dir
    init = {}
    if student_init == "best_submodel":  # already the student's size: no layers to drop
        init = {"init_from": paths[int(np.argmax(dev))], "init_layers": None}
        log.info("student starts from %s (best STS-B dev of the submodels)", init["init_from"])
    elif student_init == "submodel_average":
        init = {"init_from": average_submodels(paths, os.path.join(model_dir, "submodel_average")), "init_layers": None}
        log.info("student starts from the average of the submodels' parameters, %s", init["init_from"])
    if init:
        student = student.replace(model=dataclasses.replace(student.model, **init))
    out = train(student, student_method, export_dir=os.path.join(student_dir, "model"))
    student_dev = float(out["best"]["stsb_dev_spearman"]) if out.get("best") else None
    rows["distilled student"] = sts_scores(os.path.join(student_dir, "model"), os.path.join(student_dir, "eval"), data_dir)
    table = sts_rows_table(rows)
    summary = {"submodel_dev": dev, "ensemble_dev": ensemble_dev, "student_dev": student_dev, "weights": weights.tolist(),
               "weighting": weighting, "student_init": init.get("init_from", "start"), "rows": rows}
    student_text = "-" if student_dev is None else f"{student_dev:.2f}"
    write_results(model_dir, summary, f"# Ensemble distillation\n\nSTS-B dev: submodels {np.round(dev, 2).tolist()}, "
                  f"ensemble {ensemble_dev:.2f}, student {student_text}; weights ({weighting}): "
                  f"{np.round(weights, 4).tolist()}\n\n{table}\n")
    print(table)
    return summary


def _check_inputs(model_dir: str, submodels: Sequence[RunConfig], submodel_methods: Sequence[Method], student: RunConfig,
                  method: Method, data_dir: str, teacher: str | None) -> None:
    """Before any work: the start model, DATA_DIR, STS-B dev (weights) and some STS task (the
    tables), and what each submodel's and the student's training reads."""
    job = "sentemb_jax.ensemble_distill"
    if teacher:
        preflight.require_model_dir(teacher, job, "teacher")
    preflight.require_dir(data_dir, job, "data_dir")
    dev = os.path.join(data_dir, "stsb", "dev.tsv")
    if not os.path.isfile(dev):
        raise DataError(f"{dev}: no such file (STS-B dev weights the submodels; data_dir ({{where}}))",
                        api=job, param="data_dir", value=data_dir, source=True)
    preflight.require_some_task("ensemble_distill (STS table)", data_dir, *sts_inputs(data_dir, None), job)
    for config, submodel_method in zip(submodels, submodel_methods):
        check_train_inputs(config, submodel_method)
    check_train_inputs(student, method)


def _start_model(teacher: str, layers: int | None):
    model = SentenceEncoder.from_pretrained(teacher)
    return model.first_layers(layers) if layers else model
