"""The train job's checks, run before any work: its numbers and choices (a ConfigError naming the gin
binding: exit 2) and the inputs it will read (a missing directory or file named with its binding:
exit 1). `sentemb_jax.train` calls both first; jobs that run several trains call it with
check_only=True for each before the first starts."""
from __future__ import annotations

import json
import os

from sentemb_jax.data.tasks import register_tasks
from sentemb_jax.encoder import transformer_dir_of
from sentemb_jax.errors import DataError, TrainingError
from sentemb_jax.partitioning import make_mesh
from sentemb_jax.paths import default_data_dir, is_remote
from sentemb_jax.pooling import POOLING_MODES, check_pooling_modes
from sentemb_jax.preflight import require_dir, require_model_dir, source
from sentemb_jax.training.optimizers import run_optimizer
from sentemb_jax.validation import (
    PRNG_IMPLS,
    TRAIN,
    _is_int,
    check_batch_size,
    check_seed,
    fail,
    require_choice,
    require_int,
    require_number,
)


def check_train_config(args: dict) -> None:
    """Every number and choice of `sentemb_jax.train(**args)`, its ContrastiveConfig and the
    optimizer gin configures for it (make_optimizer / learning_rate_schedule): before any work."""
    a = args.get
    check_batch_size(a("batch_size"), TRAIN)
    require_int(a("num_steps"), TRAIN, "num_steps", 1)
    require_int(a("sequence_length"), TRAIN, "sequence_length", 2)
    require_int(a("checkpoint_every"), TRAIN, "checkpoint_every", 1)
    require_int(a("keep_checkpoints"), TRAIN, "keep_checkpoints", 1)
    require_int(a("eval_every"), TRAIN, "eval_every", 1, allow_none=True, none_means=" (no evaluation)")
    require_int(a("log_every"), TRAIN, "log_every", 1)
    require_number(a("time_budget_s"), TRAIN, "time_budget_s", 0, low_open=True, allow_none=True,
                   none_means=" (no budget)")
    check_seed(a("seed"), TRAIN)
    require_int(a("skip_nonfinite"), TRAIN, "skip_nonfinite", 0)
    require_int(a("init_layers"), TRAIN, "init_layers", 1, allow_none=True, none_means=" (every layer)")
    if a("prng_impl") is not None:
        require_choice(a("prng_impl"), PRNG_IMPLS, TRAIN, "prng_impl")
    if not isinstance(a("task"), str) or not a("task"):
        fail(a("task"), TRAIN, "task", "must be a task name (a string, e.g. 'nli_triples')")
    if a("pooling") is not None:
        try:
            check_pooling_modes(a("pooling"))
        except (ValueError, TypeError):
            fail(a("pooling"), TRAIN, "pooling", f"must be None (the model's own) or modes from {POOLING_MODES}")
    contrastive = a("contrastive")
    if contrastive is not None and a("distill") is None:
        check_contrastive(contrastive)
    check_positions(a("sequence_length"), a("init_from"), TRAIN, "sequence_length")
    run_optimizer(a("num_steps"))  # its gin bindings (learning rate, schedule, clipping) checked now, not after the model loads
    make_mesh()  # its axis sizes against the devices, likewise


def check_positions(length, model_dir, selector: str, param: str) -> None:
    """A length past the position table of a BERT-family `model_dir` (read from its config.json
    only; nothing loaded) is refused: those tokens would get NaN embeddings. T5: no table."""
    if not model_dir or not isinstance(model_dir, str) or is_remote(model_dir) or not os.path.isdir(model_dir):
        return  # a missing directory is reported by the preflight checks
    try:
        with open(os.path.join(transformer_dir_of(model_dir), "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        positions = int(cfg["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # no table (T5) or an unreadable config: reported when the model loads
    if str(cfg.get("model_type", "")).startswith("t5"):
        return
    limit = positions - (int(cfg.get("pad_token_id", 1)) + 1 if cfg.get("model_type") == "roberta" else 0)
    if _is_int(length) and length > limit:
        fail(length, selector, param, f"must be an integer in [2, {limit}]: {model_dir} has {limit} positions "
             "(longer texts would get NaN embeddings)")


def check_contrastive(cfg) -> None:
    sel = "sentemb_jax.ContrastiveConfig"
    require_number(getattr(cfg, "temperature", 0.05), sel, "temperature", 0, low_open=True)
    require_number(getattr(cfg, "label_smoothing", 0.0), sel, "label_smoothing", 0, 1, high_open=True)
    require_int(getattr(cfg, "chunk_size", None), sel, "chunk_size", 1, allow_none=True, none_means=" (whole batch)")


def check_train_inputs(task: str, data_dir: str | None, init_from: str | None, tokenizer_dir: str | None,
                       params_from: str | None, eval_every: int | None, distill) -> None:
    """What `sentemb_jax.train` will read, before it reads any of it: its start model / tokenizer
    directories, another run's directory (params_from), the teacher(s) of `distill`, DATA_DIR, the
    files of its own task (only those: a job on NLI needs no QA file) and STS-B dev when it scores it.
    The gin scope of the call is used (a scoped train, e.g. an ensemble's submodel, gets its own files)."""
    train = "sentemb_jax.train"
    if init_from:
        require_model_dir(init_from, train, "init_from")
    if tokenizer_dir:
        require_model_dir(tokenizer_dir, train, "tokenizer_dir")
    if params_from:
        require_dir(params_from, train, "params_from", what="run directory")
    teachers = getattr(distill, "teacher", None)
    for teacher in [teachers] if isinstance(teachers, str) else list(teachers or ()):
        require_model_dir(teacher, "sentemb_jax.QueueDistillConfig", "teacher")
    if data_dir:
        require_dir(data_dir, train, "data_dir")
    else:
        data_dir = default_data_dir()
        if not os.path.isdir(data_dir):
            raise DataError(f"{data_dir}: no such data directory (sentemb_jax.train.data_dir unset: "
                            "$SENTEMB_DATA_DIR, else ../shared/data)")
    names = register_tasks(tokenizer_dir=None, data_dir=data_dir)  # the names only: nothing registered or read
    if task not in names:
        raise TrainingError(f"task {task!r} unknown; registered: {sorted(names)}")
    register_tasks(tokenizer_dir=None, data_dir=data_dir, require=(task,))
    if eval_every:
        dev = os.path.join(data_dir, "stsb", "dev.tsv")
        if not os.path.isfile(dev):
            raise DataError(f"{dev}: no such file (STS-B dev, scored every train.eval_every={eval_every} steps; "
                            f"data_dir {source(train, 'data_dir')})")
