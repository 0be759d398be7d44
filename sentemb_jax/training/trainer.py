"""Training a run: checks, the run setup, MODEL_DIR (checkpoints, run record, metrics), the loop.

    from sentemb_jax import RunConfig, TowerConfig, DataConfig, Contrastive
    train(RunConfig(model_dir="/tmp/run", num_steps=200, model=TowerConfig(init_from=path),
                    data=DataConfig(task="nli_triples", pack=True)), Contrastive(negative="negative"))

* The program is built by training.setup.setup_run (mesh, tower, optimizer, shardings, the jitted
  step, the input); the method (training.method) is injected beside the config.
* Orbax checkpoints every CheckpointConfig.every steps (the last `keep`, written atomically),
  holding the TrainState and the input's position; a rerun with the same MODEL_DIR resumes exactly
  where the last checkpoint left it - with the configuration it was made with (run_record).
* STS-B dev Spearman every EvalConfig.every steps; the best state is kept in MODEL_DIR/best.
* Metrics to TensorBoard event files and MODEL_DIR/metrics.jsonl; a progress bar.
* Several processes: each reads every process_count-th row of the global order (batch_size is the
  global batch); checkpoints are written by all, metrics, TensorBoard and exports by process 0.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from tqdm.auto import tqdm

from sentemb_jax.distributed import is_primary
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import TrainingError
from sentemb_jax.paths import default_data_dir, is_remote
from sentemb_jax.run_dir import BEST, CHECKPOINTS, ENCODER_JSON, METRICS_JSONL, checkpoint_manager, run_path
from sentemb_jax.training import run_record
from sentemb_jax.training.checks import check_inputs
from sentemb_jax.training.config import RunConfig, record_of
from sentemb_jax.training.loop import (
    BestCheckpoint,
    MetricsWriter,
    RunState,
    Schedule,
    StsDevEvaluator,
    host_params,
    restore_run,
    run_loop,
)
from sentemb_jax.training.method import Method
from sentemb_jax.training.setup import Run, setup_run

log = logging.getLogger(__name__)


def train(config: RunConfig, method: Method, export_dir: str | None = None,
          on_start: Callable[[], None] | None = None) -> dict:
    """Train `config`'s tower with `method`; the last metrics, the best STS-B dev score and the
    evaluations. export_dir: at the end, the best tower by STS-B dev (the last one without
    evaluation) as a sentence-transformers directory. on_start: called once every start check has
    passed, before the first step (the command line keeps the gin configuration then)."""
    check_inputs(config, method)
    run = fit(config, method, on_start=on_start, export_dir=export_dir)
    return {**run.metrics, "best": run.best, "evaluations": run.evaluations}


def fit(config: RunConfig, method: Method, *, model=None, batches=None, evaluator=None, keeper=None,
        label: str = "train", on_start: Callable[[], None] | None = None, export_dir: str | None = None) -> RunState:
    """The run: setup, MODEL_DIR checks, resume or start, the loop; the RunState at its end. A job
    may hand it its own `model` (with its start params), `batches` (a batch source of the loop),
    `evaluator` (`evaluator(params) -> float`, `metric`, `label`) and `keeper` of the best (the
    Trans-Encoder's phases do)."""
    model_dir = config.model_dir
    _check_model_dir(model_dir)
    run = setup_run(config, method, model=model, batches=batches)
    target = run.restore_target()
    _check_disk_space(model_dir, run.abstract_state, config.checkpoints.keep + 1 + (1 if config.evaluation.every else 0))
    manager = checkpoint_manager(model_dir, CHECKPOINTS, keep=config.checkpoints.keep)
    best_manager = checkpoint_manager(model_dir, BEST, keep=1) if keeper is None else None
    record = _run_record(run)
    if manager.latest_step() is not None:  # a resume: only with the configuration and data it was made with
        run_record.check_resume(model_dir, record, config.checkpoints.allow_config_change, TrainingError)
    state, resumed = restore_run(manager, target, model_dir, TrainingError)
    if state is not None:
        run.batches.load_state_dict(resumed["input"])
        log.info("resumed from %s at step %d", model_dir, int(state.step))
    else:
        state = run.initial_state(_params_from_run(config.model.params_from, target)
                                  if config.model is not None and config.model.params_from else None)
    if is_primary():  # run metadata only now that every check has passed (a refused start rewrites nothing)
        if model is None:
            _write_architecture(model_dir, run)
        run_record.write(model_dir, record)
        if on_start is not None:
            on_start()
    data_dir = config.data.data_dir or default_data_dir()
    if evaluator is None and config.evaluation.every:
        evaluator = StsDevEvaluator(run.model, data_dir)
    schedule = Schedule(config.num_steps, config.log_every, config.evaluation.every, config.checkpoints.every,
                        config.evaluation.at_start, checkpoint_at_eval=config.checkpoints.at_evaluation,
                        time_budget_s=config.time_budget_s)
    loop = RunState(state, model_dir, run.batches, schedule, manager,
                    keeper=keeper if keeper is not None else BestCheckpoint(best_manager),
                    writer=MetricsWriter(model_dir, run_path(model_dir, METRICS_JSONL)) if is_primary() else None,
                    evaluator=evaluator if config.evaluation.every else None,
                    bar=tqdm(total=config.num_steps, initial=int(state.step), desc=label, unit="step", disable=None),
                    batch_size=config.data.batch_size, skip_nonfinite=config.skip_nonfinite, resumed=resumed)
    run_loop(loop, run.step_fn, run.device_batch, run.rng(), context=run.context())
    if export_dir:
        _export_tower(loop, run, best_manager, target, export_dir)
    return loop


def _check_model_dir(model_dir: str) -> None:
    try:
        root = epath.Path(model_dir)
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write_test.{jax.process_index()}.{os.getpid()}"  # one per process (multi-host)
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise TrainingError(f"MODEL_DIR {model_dir}: not writable ({e.strerror or e})") from None


def _check_disk_space(model_dir: str, abstract_state, copies: int) -> None:
    """Stop before the first step when MODEL_DIR cannot hold the checkpoints the run will keep
    (`copies` train states: keep + the one being written + the best one)."""
    state_bytes = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
                      for x in jax.tree_util.tree_leaves(abstract_state) if hasattr(x, "shape"))
    if is_remote(model_dir):
        return  # a bucket: no free-space figure to check
    free = shutil.disk_usage(model_dir).free
    if free < copies * state_bytes:
        raise TrainingError(f"MODEL_DIR {model_dir}: {free / 2**30:.2f} GiB free, but {copies} checkpoints of this "
                            f"train state ({state_bytes / 2**30:.2f} GiB each) need {copies * state_bytes / 2**30:.2f} GiB "
                            "(free space, or lower CheckpointConfig.keep)")


def _model_ref(init_from: str | None) -> str | None:
    """The start model as recorded in MODEL_DIR (encoder.json, run_config.json): absolute when local."""
    return os.path.abspath(init_from) if init_from and not is_remote(init_from) else init_from


def _write_architecture(model_dir: str, run: Run) -> None:
    """MODEL_DIR/encoder.json: what SentenceEncoder.from_pretrained(MODEL_DIR) needs to rebuild the
    tower around a checkpoint (the model it started from, layers kept, an added head)."""
    tower, module = run.config.model, run.module
    projection = module.projection_dim if module.projection_activation == "tanh" else None
    arch = {"init_from": _model_ref(tower.init_from), "pooling": list(tower.pooling) if tower.pooling else None,
            "config_overrides": tower.overrides, "init_layers": tower.init_layers,
            "projection_dim": projection, "projection_activation": "tanh" if projection else None}
    epath.Path(run_path(model_dir, ENCODER_JSON)).write_text(json.dumps(arch, indent=1))


def _run_record(run: Run) -> dict:
    """What MODEL_DIR/run_config.json records (a resume is refused when it differs): the model (where
    it starts, its backbone, pooling and head), the data and batch shape, the method and the mesh-
    independent settings that change what a step computes, and every data file's fingerprint.
    What may change between restarts is left out: num_steps, budget, intervals, the mesh."""
    config, module = run.config, run.module
    tower = config.model
    model = {"backbone": record_of(module.backbone_config)}
    if tower is not None:
        model.update({"init_from": _model_ref(tower.init_from), "tokenizer_dir": None if tower.init_from else tower.tokenizer_dir,
                      "init_layers": tower.init_layers, "init_random": tower.init_random, "config_overrides": tower.overrides,
                      "params_from": tower.params_from})
    if hasattr(module, "projection_dim"):
        model.update({"pooling": list(module.pooling), "projection_dim": module.projection_dim, "normalize": module.normalize})
    data = config.data
    return run_record.operative_config(
        model=model, task=data.task if run.task else None, batch_size=data.batch_size, sequence_length=data.sequence_length,
        seed=data.seed, pack=data.pack, fixed_padding=run.fixed_padding, prng_impl=config.prng_impl,
        data_options=record_of(data.task_options()) if run.task else None, input_route=data.route if run.task else None,
        method=run.method.record(),
        data_files=run.batches.data_files() if run.task else [])


def _params_from_run(run_dir: str, restore_target):
    """Tower params of another run's latest checkpoint (stage 2 of two-stage training)."""
    manager = checkpoint_manager(run_dir, CHECKPOINTS, create=False)
    step = manager.latest_step()
    if step is None:
        raise TrainingError(f"TowerConfig.params_from={run_dir}: no checkpoint found under {run_dir}/checkpoints")
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(restore_target)))
    log.info("stage start: params from %s step %d (optimizer state and step reset)", run_dir, step)
    return restored["state"].params["tower"]


def _export_tower(loop: RunState, run: Run, best_manager, restore_target, export_dir: str) -> None:
    """The best tower by STS-B dev (the last one when nothing was scored) as a sentence-transformers directory."""
    tower = loop.state.params["tower"]
    if loop.best is not None and best_manager is not None and best_manager.latest_step() is not None:
        restored = best_manager.restore(best_manager.latest_step(), args=ocp.args.Composite(
            state=ocp.args.StandardRestore(restore_target)))
        tower = restored["state"].params["tower"]
    encoder: SentenceEncoder = run.model
    encoder.params = host_params(tower)
    if is_primary():
        encoder.save_pretrained(export_dir)
        log.info("exported the %s tower to %s", "best" if loop.best else "last", export_dir)
