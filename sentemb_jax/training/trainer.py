"""Training a run: checks, the run setup, MODEL_DIR (checkpoints, run record, metrics), the loop.

    from sentemb_jax import RunConfig, TowerConfig, DataConfig, Contrastive
    train(RunConfig(model_dir="/tmp/run", num_steps=200, model=TowerConfig(init_from=path),
                    data=DataConfig(task="nli_triples", pack=True)), Contrastive(negative="negative"))

* The program is built by training.setup.setup_run (mesh, tower, optimizer, shardings, the jitted
  step, the input); the method (training.method) is injected beside the config.
* Orbax checkpoints every CheckpointConfig.every steps (the last `keep`, written atomically),
  holding the TrainState and the input's position; a rerun with the same MODEL_DIR resumes exactly
  where the last checkpoint left it - with the configuration it was made with (run_record). A
  checkpoint that does not fit the run's train state is refused, naming what differs; a MODEL_DIR
  whose checkpoints are all damaged (set aside) is never started again from step 0 unless
  CheckpointConfig.restart_from_scratch says so (the old ones are moved to MODEL_DIR/previous_runs).
* One writer per MODEL_DIR: the run holds MODEL_DIR/.sentemb.lock (sentemb_jax.locking) while it
  runs; a second job on the same MODEL_DIR is refused naming the holder.
* STS-B dev Spearman every EvalConfig.every steps; the best state is kept in MODEL_DIR/best.
* Metrics to TensorBoard event files and MODEL_DIR/metrics.jsonl; a progress bar.
* Several processes: each reads every process_count-th row of the global order (batch_size is the
  global batch); checkpoints are written by all, metrics, TensorBoard and exports by process 0.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from typing import Callable

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from sentemb_jax import faults
from sentemb_jax.distributed import is_primary
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import TrainingError
from sentemb_jax.locking import LOCK_FILE, DirectoryLock
from sentemb_jax.paths import default_data_dir, is_remote
from sentemb_jax.run_dir import (
    BEST,
    CHECKPOINTS,
    DAMAGED_CHECKPOINTS,
    ENCODER_JSON,
    METRICS_JSONL,
    RUN_CONFIG_JSON,
    TENSORBOARD,
    checkpoint_manager,
    run_path,
)
from sentemb_jax.st_layout import write_json
from sentemb_jax.training import run_record
from sentemb_jax.training.checks import check_disk_space, check_inputs
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
from sentemb_jax.training.setup import Run, recorded_prng_impl, setup_run

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
    with DirectoryLock(model_dir, "MODEL_DIR", lock_path=_lock_path(model_dir), job=f"sentemb_jax {label} job"):
        return _fit(config, method, model=model, batches=batches, evaluator=evaluator, keeper=keeper, label=label,
                    on_start=on_start, export_dir=export_dir)


def _fit(config: RunConfig, method: Method, *, model, batches, evaluator, keeper, label: str, on_start,
         export_dir: str | None) -> RunState:
    model_dir = config.model_dir
    run = setup_run(config, method, model=model, batches=batches)
    target = run.restore_target()
    check_disk_space(model_dir, run.abstract_state, config.checkpoints.keep, bool(config.evaluation.every))
    if config.checkpoints.restart_from_scratch:  # said explicitly: the old run is set aside
        _start_again(model_dir)
    manager = checkpoint_manager(model_dir, CHECKPOINTS, keep=config.checkpoints.keep)
    best_manager = checkpoint_manager(model_dir, BEST, keep=1) if keeper is None else None
    record = _run_record(run)
    if manager.latest_step() is not None:  # a resume: only with the configuration and data it was made with
        run_record.check_resume(model_dir, record, config.checkpoints.allow_config_change, TrainingError)
        # A checkpoint that reads but is of another tree / shape is a configuration difference, not damage.
        run_record.check_fit(manager, _metadata_reader(model_dir), target, model_dir, TrainingError)
    state, resumed = restore_run(manager, target, model_dir, TrainingError)
    if state is not None:
        run.batches.load_state_dict(resumed["input"])
        log.info("resumed from %s at step %d", model_dir, int(state.step))
    else:
        _refuse_start_over(model_dir)
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


def _lock_path(model_dir: str) -> str | None:
    """MODEL_DIR/.sentemb.lock for process 0; `.sentemb.lock.<i>` for process i of a multi-process job
    (the processes of one job share MODEL_DIR; those of two jobs collide process by process)."""
    if is_remote(model_dir):
        return None
    index = jax.process_index()
    return os.path.join(model_dir, LOCK_FILE if index == 0 else f"{LOCK_FILE}.{index}")


def _metadata_reader(model_dir: str) -> Callable:
    """step -> the tree of the checkpoint's train state as its metadata describes it (orbax's public
    item_metadata: shapes and dtypes, no array read); raises when the metadata cannot be read."""
    reader = checkpoint_manager(model_dir, CHECKPOINTS, create=False, item_handlers={
        "state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()})

    def read(step: int):
        meta = reader.item_metadata(step)["state"]
        return getattr(meta, "tree", meta)

    return read


PREVIOUS_RUNS = "previous_runs"  # MODEL_DIR/previous_runs/<time>/: a run set aside by restart_from_scratch


def _previous_checkpoints(model_dir: str, kinds=(CHECKPOINTS, DAMAGED_CHECKPOINTS)) -> dict[str, list]:
    """{kind: its steps} of the checkpoint folders of MODEL_DIR that hold any (finalised steps;
    every entry of damaged_checkpoints)."""
    found = {}
    for kind in kinds:
        path = epath.Path(run_path(model_dir, kind))
        if path.is_dir():
            names = [p.name for p in path.iterdir()]
            steps = sorted((int(n) if n.isdigit() else n for n in names if kind == DAMAGED_CHECKPOINTS or n.isdigit()),
                           key=lambda x: (isinstance(x, str), x))
            if steps:
                found[kind] = steps
    return found


def _describe_previous(found: dict) -> str:
    return ", ".join(f"{kind}/ (steps {steps})" for kind, steps in found.items())


def _refuse_start_over(model_dir: str) -> None:
    """A run that would start from step 0 in a MODEL_DIR holding checkpoints - all damaged and set
    aside, or none restorable - is refused: a silent restart would overwrite what is there."""
    found = _previous_checkpoints(model_dir)
    if found:
        raise TrainingError(f"MODEL_DIR {model_dir} holds {_describe_previous(found)} but no checkpoint this run can "
                            "resume from: it would start again from step 0 over them. Use a new MODEL_DIR, or set "
                            "CheckpointConfig.restart_from_scratch=True to start again here (the old checkpoints "
                            f"moved to {model_dir}/{PREVIOUS_RUNS})")


def _start_again(model_dir: str) -> None:
    """restart_from_scratch: MODEL_DIR's checkpoints (resumable, best and damaged), metrics, events
    and run record are moved to MODEL_DIR/previous_runs/<time>/, with a warning; the run starts at 0."""
    found = _previous_checkpoints(model_dir, (CHECKPOINTS, BEST, DAMAGED_CHECKPOINTS))
    if not found:
        log.info("CheckpointConfig.restart_from_scratch=True: %s holds no checkpoint; a new run", model_dir)
        return
    if is_remote(model_dir):
        raise TrainingError(f"CheckpointConfig.restart_from_scratch=True on a bucket ({model_dir}): move or delete its "
                            f"{_describe_previous(found)} yourself, or use a new MODEL_DIR")
    aside = os.path.join(model_dir, PREVIOUS_RUNS, time.strftime("%Y%m%d-%H%M%S"))
    if is_primary():
        os.makedirs(aside, exist_ok=True)
        for name in (CHECKPOINTS, BEST, DAMAGED_CHECKPOINTS, METRICS_JSONL, TENSORBOARD, RUN_CONFIG_JSON):
            if os.path.exists(os.path.join(model_dir, name)):
                shutil.move(os.path.join(model_dir, name), os.path.join(aside, name))
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("sentemb_jax restart_from_scratch")
    log.warning("starting MODEL_DIR %s again from step 0 (CheckpointConfig.restart_from_scratch=True): its %s moved to %s",
                model_dir, _describe_previous(found), aside)


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
        seed=data.seed, pack=data.pack, fixed_padding=run.fixed_padding,
        prng_impl=recorded_prng_impl(config, list(run.mesh.devices.flat)),
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
    tower, which, step = loop.state.params["tower"], "last", loop.step
    if loop.best is not None and best_manager is not None and best_manager.latest_step() is not None:
        step = best_manager.latest_step()
        restored = best_manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(restore_target)))
        tower, which = restored["state"].params["tower"], "best"
    encoder: SentenceEncoder = run.model
    encoder.params = host_params(tower)
    if is_primary():
        faults.in_phase("export")  # tests only (SENTEMB_FAULT=sigterm_in:export)
        record = os.path.join(export_dir, EXPORT_RECORD)
        if os.path.exists(record):  # an interrupted export must not keep the last one's record beside new weights
            os.remove(record)
        encoder.save_pretrained(export_dir)
        best = None if loop.best is None else {k: int(v) if k == "step" else float(v) for k, v in loop.best.items()}
        write_json(record, {"model_dir": loop.model_dir, "tower": which, "step": int(step), "best": best,
                             "run_config_sha256": _sha256(run_path(loop.model_dir, RUN_CONFIG_JSON))})
        log.info("exported the %s tower (step %d) to %s", which, step, export_dir)


# What an export was made from: the run, which tower, its step, the best score, the run's configuration.
EXPORT_RECORD = "sentemb_export.json"


def _sha256(path: str) -> str | None:
    try:
        return hashlib.sha256(epath.Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


