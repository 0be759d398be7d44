"""The Trans-Encoder job: cycles of bi -> cross and cross -> bi distillation over unlabelled pairs
(the method's pieces - pseudo-labels, losses, steps, one phase's fit - are in
sentemb_jax.methods.trans_encoder).

    python -m sentemb_jax.main --gin_file=gin/runs/trans_encoder_sts_cpu.gin --gin.MODEL_DIR="'/tmp/te'"
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import time
from typing import Sequence

import jax
import numpy as np

import gin
from sentemb_jax import partitioning, preflight
from sentemb_jax import validation as v
from sentemb_jax.cross_encoder import CrossEncoder
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import ConfigError
from sentemb_jax.evaluation.pairs import AveragedPairScores
from sentemb_jax.evaluation.sts import cosine_scores
from sentemb_jax.methods.trans_encoder import (
    SCHEDULES,
    BiEncoderPhase,
    CrossEncoderPhase,
    DistillPhase,
    EvalSet,
    bi_to_cross_defaults,
    cross_encoder_scores,
    cross_to_bi_defaults,
    fit_phase,
    mutual_labels,
    read_unlabelled_pairs,
    relabel,
    score_eval_set,
)
from sentemb_jax.paths import default_data_dir
from sentemb_jax.run_dir import write_results
from sentemb_jax.tokenization import Tokenizer
from sentemb_jax.training.config import MeshConfig

log = logging.getLogger(__name__)
JOB = "sentemb_jax.trans_encoder"


@gin.configurable(module="sentemb_jax")
def trans_encoder(
    model_dir: str = gin.REQUIRED,
    bi_encoders: Sequence[str] = gin.REQUIRED,
    pair_files: Sequence[str] = gin.REQUIRED,
    dev: EvalSet = gin.REQUIRED,
    cross_encoders: Sequence[str] | None = None,
    cycles: int = 3,
    schedule: str = "refresh",
    mutual: bool | None = None,
    bi_to_cross: DistillPhase | None = None,
    cross_to_bi: DistillPhase | None = None,
    cross_pooling: str = "first",
    report: Sequence[EvalSet] = (),
    checkpoint_every: int = 200,
    seed: int = 0,
    data_dir: str | None = None,
    mesh: MeshConfig = MeshConfig(),
) -> dict:
    """Trans-Encoder self-distillation (one model) or mutual distillation (several, `mutual`).

    bi_encoders: start checkpoints (sentence-transformers / HF dirs), one per model.
    cross_encoders: each model's cross-encoder start (default: its bi-encoder's weights + a new head).
    schedule: `refresh` - each cycle the cross-encoder restarts from its start weights and the
      bi-encoder from its start checkpoint (paper's default); `sequential` - each starts from the
      other's latest backbone.
    mutual: pseudo-labels are the mean of every model's predictions (default: when > 1 model).
    dev: the selection set (STS-B dev for STS); the best bi- and cross-encoder of each model by it
      are saved under model_dir/model_<i>/{bi_best,cross_best} (results["best"]: their dev and report
      scores), the latest ones under {bi_last,cross_last}. report: sets scored after each
      phase (e.g. STS-B test), written with everything else to model_dir/results.json.
    data_dir: relative paths in pair_files / dev / report are under it (default: the shared data).
    mesh: the device mesh every phase's step runs on (each phase is a run of the run setup:
      sharded step, the phase's optimizer and schedule).
    A rerun with the same model_dir resumes: finished phases come back from their checkpoints.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"trans_encoder.schedule {schedule!r}: choose from {SCHEDULES}")
    bi_to_cross, cross_to_bi = bi_to_cross or bi_to_cross_defaults(), cross_to_bi or cross_to_bi_defaults()
    for ph in (bi_to_cross, cross_to_bi):
        relabel(np.zeros(2), ph.relabel)  # fail on a bad mode before any training
    mutual = len(bi_encoders) > 1 if mutual is None else mutual
    v.require_int(cycles, JOB, "cycles", 1)
    v.require_int(checkpoint_every, JOB, "checkpoint_every", 1)
    v.check_seed(seed, JOB)
    data_dir = data_dir or default_data_dir()
    pair_files = [_under(p, "pair_files", data_dir) for p in pair_files]
    dev = dataclasses.replace(dev, path=_under(dev.path, "dev", data_dir))
    report = [dataclasses.replace(ev, path=_under(ev.path, "report", data_dir)) for ev in report]
    _check_inputs(data_dir, bi_encoders, cross_encoders, pair_files, dev, report)
    partitioning.make_mesh(*mesh.shape)  # a mesh the devices cannot hold: refused before any work
    run = _Run(model_dir, read_unlabelled_pairs(pair_files), dev, report, schedule, mutual, bi_to_cross, cross_to_bi,
               checkpoint_every, seed, mesh)
    os.makedirs(model_dir, exist_ok=True)
    run.start_models(bi_encoders, cross_encoders, cross_pooling)
    for cycle in range(1, cycles + 1):
        record = {"cycle": cycle, "models": []}
        t0 = time.perf_counter()
        run.bi_to_cross(cycle, record)
        run.cross_to_bi(cycle, record)
        if len(run.bis) > 1:
            record["ensemble"] = {"bi": run.scores(AveragedPairScores(run.bis)), "cross": run.scores(AveragedPairScores(run.crosses))}
        record["seconds"] = time.perf_counter() - t0
        run.results["cycles"].append(record)
        run.results["best"] = run.best
        log.info("cycle %d: %s", cycle, json.dumps(record["models"]))
        run.write_results()
    if report:  # the kept models (best by dev over every phase, not the last epoch's) on the report sets too
        run.score_kept_models()
        run.write_results()
    return run.results


def _under(path: str, what: str, data_dir: str) -> str:
    """Absolute paths stay as they are; relative ones must stay under data_dir."""
    if isinstance(path, str) and not os.path.isabs(path) and not v.is_under(path, data_dir):
        raise ConfigError(f"{{where}}: a relative path must stay under data_dir {os.path.normpath(data_dir)} (it "
                          f"resolves to {os.path.normpath(os.path.join(data_dir, path))}); give an absolute path for a "
                          "file elsewhere", api=JOB, param=what, value=path)
    return os.path.join(data_dir, path)


def _check_inputs(data_dir: str, bi_encoders, cross_encoders, pair_files, dev: EvalSet, report) -> None:
    """Before any work: every start model directory, DATA_DIR (when a path is under it) and every
    pair / dev / report file exist; a failure names the gin binding (sentemb_jax.trans_encoder.<param>)."""
    for param, paths in (("bi_encoders", bi_encoders), ("cross_encoders", cross_encoders or ())):
        for path in paths:
            preflight.require_model_dir(path, JOB, param)
    files = [("pair_files", p) for p in pair_files] + [("dev", dev.path)] + [("report", ev.path) for ev in report]
    if any(path.startswith(os.path.join(data_dir, "")) for _, path in files):
        preflight.require_dir(data_dir, JOB, "data_dir")
    for param, path in files:
        preflight.require_file(path, JOB, param)


class _Run:
    """One Trans-Encoder run: the models, their start weights, the best kept so far, results.json."""

    def __init__(self, model_dir: str, pairs, dev: EvalSet, report, schedule: str, mutual: bool,
                 bi_to_cross_phase: DistillPhase, cross_to_bi_phase: DistillPhase, checkpoint_every: int, seed: int,
                 mesh: MeshConfig):
        self.model_dir, self.dev, self.report, self.schedule, self.mutual = model_dir, dev, report, schedule, mutual
        self.phases = {"bi_to_cross": bi_to_cross_phase, "cross_to_bi": cross_to_bi_phase}
        self.checkpoint_every, self.seed, self.mesh = checkpoint_every, seed, mesh
        self.pairs = pairs
        self.swapped = [(b, a) for a, b in pairs]
        self.s1, self.s2 = [p[0] for p in pairs], [p[1] for p in pairs]
        self.results = {"pairs": len(pairs), "schedule": schedule, "mutual": mutual, "models": [], "cycles": []}
        self.best: dict[str, dict] = {}  # "model_<i>/bi" -> {"dev": score, "cycle": c}: the best over all phases

    def start_models(self, bi_encoders, cross_encoders, cross_pooling: str) -> None:
        self.bis = [SentenceEncoder.from_pretrained(p) for p in bi_encoders]
        self.bi_start = [b.params for b in self.bis]
        self.crosses = [CrossEncoder.from_pretrained(c, pooling=cross_pooling, max_seq_length=self.phases["bi_to_cross"].max_length,
                                                     seed=self.seed + i) for i, c in enumerate(cross_encoders or bi_encoders)]
        self.cross_start = [c.params for c in self.crosses]
        if len(self.crosses) != len(self.bis):
            raise ValueError(f"trans_encoder: {len(self.bis)} bi_encoders but {len(self.crosses)} cross_encoders")
        if self.schedule == "sequential":
            for i, (b, c) in enumerate(zip(self.bis, self.crosses)):
                if b.config != c.config:
                    raise ValueError(f"trans_encoder: schedule 'sequential' passes weights between model {i}'s bi- and "
                                     "cross-encoder, which need the same backbone config")
        for i, path in enumerate(bi_encoders):
            self.results["models"].append({"bi_encoder": path, "start": self.scores(self.bis[i])})
            log.info("model %d start: %s", i, self.results["models"][-1]["start"])

    def scores(self, model, dev: float | None = None) -> dict:
        """The dev and report sets' scores of `model`; `dev` given: the loop's last evaluation of these params."""
        return {"dev": score_eval_set(model, self.dev) if dev is None else dev,
                **{ev.name: score_eval_set(model, ev) for ev in self.report}}

    def keep_if_best(self, key: str, score: float, cycle: int) -> bool:
        """Record `score` as model_<i>/<kind>'s best over every phase when it beats the one before."""
        if key in self.best and score <= self.best[key]["dev"]:
            return False
        self.best[key] = {"dev": score, "cycle": cycle}
        return True

    def labels(self, kind: str, mode: str) -> list[np.ndarray]:
        """Each model's pseudo-labels of the pairs from its `kind` encoder (their mean when mutual), relabelled."""
        if kind == "bi":
            labels = [cosine_scores(b, self.s1, self.s2) for b in self.bis]
        else:
            labels = [np.asarray(cross_encoder_scores(c.predict(self.pairs, activation="none"),
                                                      c.predict(self.swapped, activation="none"))) for c in self.crosses]
        if self.mutual:
            labels = [mutual_labels(labels)] * len(labels)
        return [relabel(x, mode) for x in labels]

    def bi_to_cross(self, cycle: int, record: dict) -> None:
        phase = self.phases["bi_to_cross"]
        labels = self.labels("bi", phase.relabel)
        record["bi_labels"] = [_summary(x) for x in labels]
        for i, cross in enumerate(self.crosses):
            init = self.cross_start[i]
            if self.schedule == "sequential":  # the bi-encoder that just made the labels, under the latest head
                init = {"backbone": self.bis[i].params["backbone"], "head": cross.params["head"]}
            cross.params, info = self._run_phase(
                cross, i, "cross", cycle, "bi_to_cross", init, CrossEncoderPhase(loss=phase.loss),
                cross.packed_features, self.pairs + self.swapped, np.concatenate([labels[i], labels[i]]), 1000 * cycle + i)
            record["models"].append({"cross": {**self.scores(cross, info["history"][-1]["dev"]), "epochs": info["history"]}})

    def cross_to_bi(self, cycle: int, record: dict) -> None:
        phase = self.phases["cross_to_bi"]
        labels = self.labels("cross", phase.relabel)
        record["cross_labels"] = [_summary(x) for x in labels]
        for i, bi in enumerate(self.bis):
            init = self.bi_start[i]
            if self.schedule == "sequential":
                init = {**bi.params, "backbone": self.crosses[i].params["backbone"]}
            # Training truncates at the phase's max length; evaluation keeps the model's own.
            tok = Tokenizer(bi.tokenizer.hf, phase.max_length, lowercase=bi.tokenizer.lowercase)
            bi.params, info = self._run_phase(
                bi, i, "bi", cycle, "cross_to_bi", init, BiEncoderPhase(loss=phase.loss),
                functools.partial(_pair_features, tok=tok), self.pairs, labels[i], 1000 * cycle + 500 + i)
            record["models"][i]["bi"] = {**self.scores(bi, info["history"][-1]["dev"]), "epochs": info["history"]}

    def _run_phase(self, model, i: int, kind: str, cycle: int, direction: str, init, method, features, examples, labels,
                   seed_offset: int):
        """One phase of model i's `kind` encoder, starting from `init`; its best by dev is kept in
        model_<i>/<kind>_best, its last in model_<i>/<kind>_last."""
        arrow = {"bi_to_cross": "bi->cross", "cross_to_bi": "cross->bi"}[direction]
        name = f"model {i} cycle {cycle} {arrow}"
        out = os.path.join(self.model_dir, f"model_{i}", f"cycle_{cycle}", direction)
        model.params = init
        params, info = fit_phase(name, out, model, method, examples, labels, features, self.phases[direction],
                                 self.seed + seed_offset, _DevScore(model, self.dev, name), self.checkpoint_every,
                                 _BestKeeper(self, model, i, kind, cycle), self.mesh)
        if info["best"] is not None:  # a phase restored from its checkpoint saved its best dir in the earlier run
            self.keep_if_best(f"model_{i}/{kind}", info["best"], cycle)
        model.params = params
        model.save_pretrained(os.path.join(self.model_dir, f"model_{i}", f"{kind}_last"))
        return params, info

    def score_kept_models(self) -> None:
        for key, entry in self.best.items():
            i, kind = key.split("/")
            path = os.path.join(self.model_dir, i, f"{kind}_best")
            kept = (CrossEncoder if kind == "cross" else SentenceEncoder).from_pretrained(path)
            entry.update({ev.name: score_eval_set(kept, ev) for ev in self.report})
        log.info("kept models: %s", json.dumps(self.best))

    def write_results(self) -> None:
        write_results(self.model_dir, self.results)


def _pair_features(batch, tok: Tokenizer) -> dict:
    """Both sides of the pairs, tokenised at the phase's max length (the run packs them into rows of
    real tokens: the same loss, ~2x fewer tokens than padding each side)."""
    f1, f2 = tok([a for a, _ in batch]), tok([b for _, b in batch])
    return {"sentence1_input_ids": f1["input_ids"], "sentence1_attention_mask": f1["attention_mask"],
            "sentence2_input_ids": f2["input_ids"], "sentence2_attention_mask": f2["attention_mask"]}


def _summary(x: np.ndarray) -> dict:
    return {"mean": float(np.mean(x)), "std": float(np.std(x)), "min": float(np.min(x)), "max": float(np.max(x))}


@contextlib.contextmanager
def _params_in(model, params):
    """`model` with `params` (on the host) for the duration; its own params back afterwards."""
    old, model.params = model.params, jax.device_get(params)
    try:
        yield model
    finally:
        model.params = old


class _DevScore:
    """A phase's evaluator for the train loop: the dev set's score of `model` with the phase's params."""

    metric = "dev"

    def __init__(self, model, ev: EvalSet, phase: str):
        self.model, self.ev, self.label = model, ev, f"{phase}: {ev.name}"

    def __call__(self, params) -> float:
        with _params_in(self.model, params["tower"]):
            return score_eval_set(self.model, self.ev)


class _BestKeeper:
    """A phase's keeper of the best for the train loop: model_<i>/<kind>_best (a sentence-transformers
    or cross-encoder directory) when the phase's new best also beats every earlier phase's."""

    def __init__(self, run: _Run, model, i: int, kind: str, cycle: int):
        self.run, self.model, self.key, self.cycle = run, model, f"model_{i}/{kind}", cycle
        self.out_dir = os.path.join(run.model_dir, f"model_{i}", f"{kind}_best")

    def save(self, state, score: float) -> None:
        if self.run.keep_if_best(self.key, score, self.cycle):
            with _params_in(self.model, state.params["tower"]):
                self.model.save_pretrained(self.out_dir)

    def wait_until_finished(self) -> None:
        """Saved synchronously."""
