"""The train loop: one canonical loop for every contrastive job.

    python -m sentemb_jax.main --gin_file=gin/runs/minilm_nli.gin --gin.MODEL_DIR="'/tmp/run'"

* Towers start from a Hugging Face / sentence-transformers directory (`init_from`), optionally
  with params restored from another run's checkpoint (`params_from`: two-stage training; the
  optimizer state and step start afresh).
* Sharded `jax.jit` step over a (data, fsdp, model) mesh (gin: sentemb_jax.make_mesh.*).
* Orbax checkpoints every `checkpoint_every` steps (last `keep_checkpoints` kept, written
  atomically), holding the TrainState and the input pipeline's position; a run restarted with
  the same MODEL_DIR resumes exactly where the last checkpoint left it.
* STS-B dev Spearman every `eval_every` steps; the best params are kept in MODEL_DIR/best.
* Metrics to TensorBoard event files and MODEL_DIR/metrics.jsonl; a progress bar with loss and
  pairs/s.
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import seqio
from etils import epath
from tqdm.auto import tqdm

import gin
from sentemb_jax.data.files import default_data_dir
from sentemb_jax.data.files import is_remote as _is_remote
from sentemb_jax.data.packing import pack_batch
from sentemb_jax.data.pipeline import InputPipeline
from sentemb_jax.data.tasks import RowFileSource, register_tasks
from sentemb_jax.distributed import is_primary
from sentemb_jax.encoder import SentenceEncoder, transformer_dir_of
from sentemb_jax.errors import TrainingError
from sentemb_jax.models import BertConfig, ModelConfig, T5Config
from sentemb_jax.models.sentence import SentenceEmbedder
from sentemb_jax.partitioning import batch_shards, make_mesh, shard_batch
from sentemb_jax.run_dir import BEST, CHECKPOINTS, ENCODER_JSON, METRICS_JSONL, checkpoint_manager, run_path, write_gin_config
from sentemb_jax.tokenization import TRAIN_BUCKETS, Tokenizer
from sentemb_jax.training import run_record
from sentemb_jax.training.checks import check_train_config, check_train_inputs
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
from sentemb_jax.training.optimizers import run_optimizer
from sentemb_jax.training.sharded import activation_rules, build_sharded_step, place_state
from sentemb_jax.training.step import ContrastiveConfig, TrainState, side_features, sides_of

log = logging.getLogger(__name__)


def _model_ref(init_from: str | None) -> str | None:
    """The start model as recorded in MODEL_DIR (encoder.json, run_config.json): absolute when local."""
    return os.path.abspath(init_from) if init_from and not _is_remote(init_from) else init_from


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
    (`copies` train states: keep_checkpoints + the one being written + the best one)."""
    state_bytes = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
                      for x in jax.tree_util.tree_leaves(abstract_state) if hasattr(x, "shape"))
    if _is_remote(model_dir):
        return  # a bucket: no free-space figure to check
    free = shutil.disk_usage(model_dir).free
    if free < copies * state_bytes:
        raise TrainingError(f"MODEL_DIR {model_dir}: {free / 2**30:.2f} GiB free, but {copies} checkpoints of this "
                            f"train state ({state_bytes / 2**30:.2f} GiB each) need {copies * state_bytes / 2**30:.2f} GiB "
                            "(free space, or lower train.keep_checkpoints)")


class ContrastiveMethod:
    """The train loop's method interface, and its default method: in-batch softmax training
    (Sentence-T5, SimCSE). A method gives the text sides a batch needs (`sides`), prepares what it
    needs from the task and the start encoder (`prepare`; e.g. a teacher's cached embeddings), may
    ask for a projection head on the student (`student_projection`), turns a pipeline batch into
    the step's batch (`model_batch`), and builds the sharded step and its initial state. Other
    methods implement the same (sentemb_jax.methods.queue_distill.QueueDistillMethod, made by
    `QueueDistillConfig.make_method`); the loop never imports them."""

    def __init__(self, cfg: ContrastiveConfig):
        self.cfg = cfg
        self.sides = tuple(sides_of(cfg))

    def prepare(self, task_name: str, encoder) -> None:
        """Nothing to prepare: the contrastive loss needs only the batch."""

    def student_projection(self, width: int) -> int | None:
        return None

    def model_batch(self, batch: dict) -> dict:
        return side_features(batch, self.sides)

    def build_step(self, module, optimizer, mesh, example: dict, skip_nonfinite: bool = False):
        return build_sharded_step(module, optimizer, self.cfg, mesh, example, skip_nonfinite=skip_nonfinite)

    def initial_state(self, tower_params, optimizer, shardings: TrainState) -> TrainState:
        return place_state(tower_params, optimizer, self.cfg, shardings)


gin.external_configurable(T5Config, module="sentemb_jax")
gin.external_configurable(BertConfig, module="sentemb_jax")


@gin.configurable(module="sentemb_jax")
def tower_module(backbone: ModelConfig = gin.REQUIRED, pooling=("mean",), projection_dim: int | None = None,
                 normalize: bool = True) -> SentenceEmbedder:
    """A dual-encoder tower from a backbone config (random init; gin/models/*.gin set the sizes)."""
    return SentenceEmbedder(backbone, pooling=tuple(pooling), projection_dim=projection_dim, normalize=normalize)


@gin.configurable(module="sentemb_jax")
def train(
    model_dir: str = gin.REQUIRED,
    init_from: str | None = None,
    tokenizer_dir: str | None = None,
    task: str = gin.REQUIRED,
    num_steps: int = gin.REQUIRED,
    batch_size: int = 64,
    sequence_length: int = 64,
    seed: int = 0,
    pooling=None,
    contrastive: ContrastiveConfig = ContrastiveConfig(),
    params_from: str | None = None,
    checkpoint_every: int = 100,
    keep_checkpoints: int = 2,
    eval_every: int | None = 100,
    data_dir: str | None = None,
    log_every: int = 10,
    config_overrides: dict | None = None,
    time_budget_s: float | None = None,
    eval_at_start: bool = False,
    same_length: bool = True,
    prng_impl: str | None = None,
    pack: bool = False,
    init_layers: int | None = None,
    init_random: bool = False,
    distill=None,
    export_dir: str | None = None,
    skip_nonfinite: int = 0,
    fixed_padding: bool | None = None,
    allow_config_change: bool = False,
    check_only: bool = False,
) -> dict:
    """Train a dual encoder; returns the last metrics (and the best STS-B dev score).

    time_budget_s: stop (evaluate and checkpoint first) once this much *training* time has
      passed - data + step time, not evaluation or checkpoint writes; `train_seconds` in the
      metrics and checkpoints counts it across restarts.
    eval_at_start: score STS-B dev before the first step (the untrained model's figure).
    same_length: pad every side of a batch to one bucket (fewest compiles); False pads each side
      to its own bucket (short positives are not padded to the anchors' length: faster steps).
    prng_impl: e.g. 'unsafe_rbg' - dropout masks from a cheaper generator than threefry (about
      12% of a tiny T5 step on CPU; t5x's hardware-RNG option on TPU). Changes the random stream.
    pack: lay every text of a batch (all sides) end to end in rows of `sequence_length` tokens
      and run the towers once over them (sentemb_jax.data.packing): the encoder sees real tokens,
      not padding - 2-3x fewer tokens for NLI batches. Same loss and embeddings as unpacked (eval
      mode; dropout masks differ). Not with GradCache / chunk_size.
    init_layers: keep only the first k encoder layers of `init_from` (layer dropping: a student
      from its teacher).
    init_random: keep the architecture (and tokenizer) of `init_from` but start from random
      weights (a random student).
    distill: a QueueDistillConfig - train with ConGen / SCT / a distillation baseline
      (sentemb_jax.methods.queue_distill) on the `sentences` task's two views instead of the
      contrastive loss.
    export_dir: at the end, write the best tower by STS-B dev (the last one without evaluation)
      there as a sentence-transformers directory.
    skip_nonfinite: by default (0) a step whose loss or gradient norm is NaN / inf stops the job
      (TrainingError naming the step and the batch's source lines) before anything of it is
      saved - the last checkpoint stays the last good one. N > 0: such a step leaves the state
      as it was (the batch is skipped, logged with its source lines, counted as
      `skipped_batches`); more than N bad batches in a row still stop the job.
    fixed_padding: pad every text to `sequence_length` (one batch shape). None: on when the job
      runs on several processes (sentemb_jax.distributed), whose batch parts must have one shape.
    allow_config_change: resume MODEL_DIR although its model, batch, method or data differ from
      what its checkpoints were made with (refused by default, listing the differences;
      sentemb_jax.training.run_record).
    check_only: only check that what the run reads exists (model directories, DATA_DIR, the files
      of `task`, STS-B dev; sentemb_jax.training.checks.check_train_inputs) and return {}: how jobs that
      run several trains (distill_report, ensemble_distill) check them all before any work.

    Several processes: each reads every process_count-th row of the global order (batch_size is
    the global batch), its part of each batch is placed with make_array_from_process_local_data,
    checkpoints are written by all; metrics, TensorBoard and exports by process 0.
    """
    check_train_config(locals())  # every number / choice (and the optimizer's) in range, before any work: exit 2
    # Before any work: a missing model directory, DATA_DIR or file of this task is named with its binding.
    check_train_inputs(task, data_dir, init_from, tokenizer_dir, params_from, eval_every, distill)
    if check_only:
        return {}
    _check_model_dir(model_dir)
    if prng_impl:
        jax.config.update("jax_default_prng_impl", prng_impl)
    data_dir = data_dir or default_data_dir()
    encoder, tokenizer_dir = _start_encoder(init_from, tokenizer_dir, pooling, config_overrides, sequence_length,
                                            init_layers, init_random)
    names = register_tasks(tokenizer_dir=tokenizer_dir, data_dir=data_dir)
    if task not in names:
        raise TrainingError(f"task {task!r} unknown; registered: {sorted(names)}")
    method = distill.make_method(sequence_length, seed) if distill is not None else ContrastiveMethod(contrastive)
    method.prepare(names[task], encoder)
    encoder = _with_projection(encoder, method.student_projection(encoder.get_sentence_embedding_dimension()), seed)
    optimizer, mesh = run_optimizer(num_steps), make_mesh()
    fixed_padding = _check_processes(batch_size, pack, fixed_padding)
    pipeline = _input_pipeline(names[task], batch_size, sequence_length, seed, fixed_padding, same_length)
    first = _init_batch(method.sides[0])
    step_fn, abstract, shardings = method.build_step(encoder.module, optimizer, mesh, first,
                                                     skip_nonfinite=skip_nonfinite > 0)
    _check_disk_space(model_dir, abstract, keep_checkpoints + 1 + (1 if eval_every else 0))
    manager, best_manager = _checkpoint_managers(model_dir, keep_checkpoints)
    restore_target = jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract, shardings)
    record = _run_record(encoder.module, init_from, tokenizer_dir, init_layers, init_random, config_overrides, params_from,
                         task=task, batch_size=batch_size, sequence_length=sequence_length, seed=seed, pack=pack,
                         fixed_padding=fixed_padding, prng_impl=prng_impl,
                         method=distill if distill is not None else contrastive, data_files=_task_files(names[task]))
    if manager.latest_step() is not None:  # a resume: only with the configuration and data it was made with
        run_record.check_resume(model_dir, record, allow_config_change, TrainingError)
    state, resumed = restore_run(manager, restore_target, model_dir, TrainingError)
    if state is not None:
        pipeline.load_state_dict(resumed["input"])
        log.info("resumed from %s at step %d", model_dir, int(state.step))
    else:
        state = method.initial_state(_initial_tower(encoder, first, shardings, seed, params_from, restore_target),
                                     optimizer, shardings)
    if is_primary():  # run metadata only now that every check has passed (a refused start rewrites nothing)
        _write_architecture(model_dir, encoder, init_from, pooling, config_overrides, init_layers)
        run_record.write(model_dir, record)
        write_gin_config(model_dir, gin.config_str())  # as t5x at the start of training
    schedule = Schedule(num_steps, log_every, eval_every, checkpoint_every, eval_at_start, time_budget_s=time_budget_s)
    run = RunState(state, model_dir, pipeline, schedule, manager, keeper=BestCheckpoint(best_manager),
                   writer=MetricsWriter(model_dir, run_path(model_dir, METRICS_JSONL)) if is_primary() else None,
                   evaluator=StsDevEvaluator(encoder, data_dir) if eval_every else None,
                   bar=tqdm(total=num_steps, initial=int(state.step), desc="train", unit="step", disable=None),
                   batch_size=batch_size, skip_nonfinite=skip_nonfinite, resumed=resumed)
    run_loop(run, step_fn, _device_batch(method, mesh, pack, sequence_length, pipeline.pad_id), jax.random.PRNGKey(seed),
             context=activation_rules(mesh))
    if export_dir:
        _export_tower(run, encoder, best_manager, restore_target, export_dir)
    return {**run.metrics, "best": run.best}


def _device_batch(method, mesh, pack: bool, sequence_length: int, pad_id: int):
    """A pipeline batch -> the step's batch: the method's features, packed rows (train.pack),
    placed along the mesh's data axes."""

    def device_batch(batch: dict) -> dict:
        model_batch = method.model_batch(batch)
        if pack:
            model_batch = pack_batch(model_batch, method.sides, sequence_length, pad_id,
                                     row_multiple=math.lcm(8, batch_shards(mesh)))
        return shard_batch(model_batch, mesh)

    return device_batch


def _task_files(task_name: str) -> list[str]:
    """The data files a (file-backed) task or mixture reads for training; TFDS tasks have none here."""
    provider = seqio.get_mixture_or_task(task_name)
    tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
    return [path for t in tasks if isinstance(t.source, RowFileSource) for path in t.source.list_shards("train")]


def _write_architecture(model_dir, encoder, init_from, pooling, config_overrides, init_layers) -> None:
    """MODEL_DIR/encoder.json: what SentenceEncoder.from_pretrained(MODEL_DIR) needs to rebuild the
    tower around a checkpoint (the model it started from, layers kept, an added head)."""
    projection = encoder.module.projection_dim if encoder.module.projection_activation == "tanh" else None
    arch = {"init_from": _model_ref(init_from),
            "pooling": list(pooling) if isinstance(pooling, (list, tuple)) else pooling,
            "config_overrides": config_overrides or {}, "init_layers": init_layers,
            "projection_dim": projection, "projection_activation": "tanh" if projection else None}
    epath.Path(run_path(model_dir, ENCODER_JSON)).write_text(json.dumps(arch, indent=1))


def _with_projection(encoder: SentenceEncoder, dim: int | None, seed: int) -> SentenceEncoder:
    """`encoder` with a new Linear + tanh projection to `dim` (ConGen's student head); unchanged for
    None, or when it already ends in that head (a student that ConGen trained before)."""
    m = encoder.module
    if not dim or (m.projection_dim == dim and m.projection_bias and m.projection_activation == "tanh"):
        return encoder
    if m.projection_dim:  # the tower has one projection slot: the new head takes the place of this one
        log.warning("the student's own projection (%d-d, activation %s) is replaced by a new Linear + tanh head to %d",
                    m.projection_dim, m.projection_activation, dim)
    module = encoder.module.clone(projection_dim=dim, projection_bias=True, projection_activation="tanh")
    if encoder.params is None:  # random init: the whole tower is initialised by the train loop
        return SentenceEncoder(module, None, encoder.tokenizer, encoder.hf_config)
    dummy = np.ones((1, 8), np.int32)
    fresh = module.init(jax.random.PRNGKey(seed), dummy, dummy)["params"]
    return SentenceEncoder(module, {**encoder.params, "projection": nn.meta.unbox(fresh)["projection"]},
                           encoder.tokenizer, encoder.hf_config)


def _params_from_run(run_dir: str, restore_target: TrainState):
    """Tower params of another run's latest checkpoint (stage 2 of two-stage training)."""
    manager = checkpoint_manager(run_dir, CHECKPOINTS, create=False)
    step = manager.latest_step()
    if step is None:
        raise TrainingError(f"params_from={run_dir}: no checkpoint found under {run_dir}/checkpoints")
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(restore_target)))
    log.info("stage start: params from %s step %d (optimizer state and step reset)", run_dir, step)
    return restored["state"].params["tower"]


def _start_encoder(init_from, tokenizer_dir, pooling, config_overrides, sequence_length, init_layers, init_random):
    """The tower to train and the tokenizer directory: a model directory's (its first `init_layers`
    layers; random weights with `init_random`), or a tower from gin with no weights (from scratch)."""
    if init_from:
        encoder = SentenceEncoder.from_pretrained(init_from, pooling=pooling, **(config_overrides or {}))
        tokenizer_dir = tokenizer_dir or transformer_dir_of(init_from)
    elif tokenizer_dir:
        # From scratch: the tower from gin (sentemb_jax.tower_module.*), weights initialised by the loop.
        tokenizer = Tokenizer.from_pretrained(tokenizer_dir, max_length=sequence_length)
        encoder = SentenceEncoder(tower_module(), None, tokenizer)
    else:
        raise TrainingError("give train.init_from (a model directory) or train.tokenizer_dir (to train from scratch)")
    if init_layers:
        if encoder.params is None:
            raise TrainingError("train.init_layers needs train.init_from (the model whose first layers to keep)")
        encoder = encoder.first_layers(init_layers)
    if init_random:
        if encoder.params is None:
            raise TrainingError("train.init_random needs train.init_from (the architecture to initialise)")
        encoder.params = None  # initialised by the loop like a from-scratch tower
    return encoder, tokenizer_dir


def _check_processes(batch_size: int, pack: bool, fixed_padding: bool | None) -> bool:
    """fixed_padding as the run uses it (None: on with several processes), after the multi-process checks."""
    processes = jax.process_count()
    if batch_size % processes:
        raise TrainingError(f"train.batch_size={batch_size} must divide into the {processes} processes' parts")
    if fixed_padding is None:
        fixed_padding = processes > 1
    if processes > 1 and (pack or not fixed_padding):
        raise TrainingError("a multi-process run needs batch parts of one shape on every process: "
                            "train.pack=False and train.fixed_padding=True (or None)")
    return fixed_padding


def _input_pipeline(task_name: str, batch_size: int, sequence_length: int, seed: int, fixed_padding: bool,
                    same_length: bool) -> InputPipeline:
    """This process's part of each global batch (every process_count-th row of the global order)."""
    processes = jax.process_count()
    return InputPipeline(task_name, batch_size=batch_size // processes, sequence_length=sequence_length, seed=seed,
                         buckets=(sequence_length,) if fixed_padding else TRAIN_BUCKETS,
                         same_length=same_length or fixed_padding,
                         shard_info=seqio.ShardInfo(jax.process_index(), processes) if processes > 1 else None)


def _init_batch(side: str) -> dict:
    dummy = np.ones((1, 8), np.int32)  # shapes for initialisation only
    return {f"{side}_input_ids": dummy, f"{side}_attention_mask": dummy}


def _checkpoint_managers(model_dir: str, keep_checkpoints: int):
    """MODEL_DIR/checkpoints (the last `keep_checkpoints`) and MODEL_DIR/best (one)."""
    return checkpoint_manager(model_dir, CHECKPOINTS, keep=keep_checkpoints), checkpoint_manager(model_dir, BEST, keep=1)


def _run_record(module, init_from, tokenizer_dir, init_layers, init_random, config_overrides, params_from, **run) -> dict:
    """What MODEL_DIR/run_config.json records (a resume is refused when it differs)."""
    return run_record.operative_config(
        model={"init_from": _model_ref(init_from),
               "tokenizer_dir": None if init_from else tokenizer_dir, "init_layers": init_layers,
               "init_random": init_random, "config_overrides": config_overrides or {}, "params_from": params_from,
               "backbone": module.backbone_config, "pooling": list(module.pooling),
               "projection_dim": module.projection_dim, "normalize": module.normalize}, **run)


def _initial_tower(encoder: SentenceEncoder, first: dict, shardings, seed: int, params_from: str | None, restore_target):
    """The tower's first params: the start model's, random ones (from scratch), or another run's (params_from)."""
    tower = encoder.params
    if tower is None:
        ids, mask = first.values()
        module = encoder.module
        init = jax.jit(lambda r: nn.meta.unbox(module.init(r, ids, mask)["params"]), out_shardings=shardings.params["tower"])
        tower = init(jax.random.PRNGKey(seed))
    if params_from:
        tower = _params_from_run(params_from, restore_target)
    return tower


def _export_tower(run: RunState, encoder: SentenceEncoder, best_manager, restore_target, export_dir: str) -> None:
    """The best tower by STS-B dev (the last one when nothing was scored) as a sentence-transformers directory."""
    tower = run.state.params["tower"]
    if run.best is not None and best_manager.latest_step() is not None:
        restored = best_manager.restore(best_manager.latest_step(), args=ocp.args.Composite(
            state=ocp.args.StandardRestore(restore_target)))
        tower = restored["state"].params["tower"]
    encoder.params = host_params(tower)
    if is_primary():
        encoder.save_pretrained(export_dir)
        log.info("exported the %s tower to %s", "best" if run.best else "last", export_dir)
