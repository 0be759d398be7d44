"""The run configuration: one frozen, typed value per run, in groups, checked when it is made.

    config = RunConfig(model_dir="/tmp/run", num_steps=200,
                       model=TowerConfig(init_from="/path/to/all-MiniLM-L6-v2"),
                       data=DataConfig(task="nli_triples", batch_size=64, sequence_length=64, pack=True),
                       optimizer=OptimizerConfig(name="adamw"), schedule=ScheduleConfig(peak=2e-5, warmup_steps=20))
    run = setup_run(config, Contrastive(negative="negative"))       # sentemb_jax.training.setup

Groups: `model` (the tower: where it starts, or the backbone built from scratch), `data` (the task,
its files and views, batch shape), `optimizer` and `schedule`, `mesh`, `checkpoints`, `evaluation`.
A bad value is a ConfigError naming the field (`DataConfig(batch_size=0): must be an integer >= 1`);
the command line names the gin binding that set it. What a run *does* with its batches - the
loss, its state, its teacher - is the Method injected beside the config (training.method).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from sentemb_jax import validation as v
from sentemb_jax.data.kinds import MIXTURES, check_task_options
from sentemb_jax.pooling import POOLING_MODES, check_pooling_modes

API = "sentemb_jax"
READERS = ("auto", "numpy", "seqio")
MATMUL_PRECISIONS = ("default", "high", "highest")


def _api(cls) -> str:
    return f"{API}.{cls.__name__}"


def _frozen_mapping(value):
    """A mapping as a sorted tuple of items (hashable, comparable) - how config_overrides are kept."""
    if value is None or isinstance(value, tuple):
        return value
    return tuple(sorted(dict(value).items()))


@dataclasses.dataclass(frozen=True)
class TowerConfig:
    """The tower a run trains: a model directory's (`init_from`: Hugging Face or sentence-transformers
    format; `init_layers` keeps its first k layers, `init_random` its architecture only), or one
    built from `backbone` (a T5Config / BertConfig; gin/models/*.gin) with the tokenizer of
    `tokenizer_dir`. `params_from`: another run's directory whose latest tower params replace the
    start weights (two-stage training; optimizer and step start afresh)."""

    init_from: str | None = None
    tokenizer_dir: str | None = None
    init_layers: int | None = None
    init_random: bool = False
    params_from: str | None = None
    pooling: tuple[str, ...] | None = None  # None: the model directory's own (from scratch: mean)
    config_overrides: Any = None  # {field: value} applied to the model directory's config (e.g. dropout)
    backbone: Any = None  # from scratch: the backbone config (sentemb_jax.T5Config / BertConfig)
    projection_dim: int | None = None  # from scratch: a projection after pooling
    normalize: bool = True  # from scratch: L2-normalised embeddings

    def __post_init__(self):
        api = _api(TowerConfig)
        for name in ("init_from", "tokenizer_dir", "params_from"):
            v.require_path(getattr(self, name), api, name, allow_none=True)
            object.__setattr__(self, name, v.expand_path(getattr(self, name)))
        v.require_int(self.init_layers, api, "init_layers", 1, allow_none=True, none_means=" (every layer)")
        v.require_bool(self.init_random, api, "init_random")
        v.require_bool(self.normalize, api, "normalize")
        v.require_int(self.projection_dim, api, "projection_dim", 1, allow_none=True, none_means=" (no projection)")
        if self.pooling is not None:
            modes = (self.pooling,) if isinstance(self.pooling, str) else self.pooling
            try:
                check_pooling_modes(modes)
            except (ValueError, TypeError):
                v.fail(self.pooling, api, "pooling", f"must be None (the model's own) or modes from {POOLING_MODES}")
            object.__setattr__(self, "pooling", tuple(modes))
        if self.config_overrides is not None and not isinstance(self.config_overrides, (Mapping, tuple)):
            v.fail(self.config_overrides, api, "config_overrides", "must be a mapping {config field: value} or None")
        object.__setattr__(self, "config_overrides", _frozen_mapping(self.config_overrides))
        if not self.init_from and not self.tokenizer_dir:
            v.fail(self.init_from, api, "init_from", "give a model directory (init_from) or, to train from scratch, "
                   "tokenizer_dir and a backbone")
        if not self.init_from:
            if self.init_layers:
                v.fail(self.init_layers, api, "init_layers", "needs init_from (the model whose first layers to keep)")
            if self.init_random:
                v.fail(self.init_random, api, "init_random", "needs init_from (the architecture to initialise)")
            if self.backbone is None:
                v.fail(self.backbone, api, "backbone", "a tower from scratch needs a backbone config "
                       "(e.g. @sentemb_jax.T5Config() with a gin/models size file)")

    @property
    def overrides(self) -> dict:
        return dict(self.config_overrides or ())

    @property
    def from_scratch(self) -> bool:
        return not self.init_from


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """What the run reads and how batches are shaped.

    task: a registered kind (`nli_triples`, `nli_pairs`, `commqa`, `qa_nli_pairs`, `sentences`,
      `sts_pairs`) over the files under `data_dir` (default: $SENTEMB_DATA_DIR, else ../shared/data);
      `files` replaces a kind's default files (a path, a list read as one, a glob or a prepared corpus).
    views / augment_rate / sentence_column / view_columns / clean: the `sentences` task's two views.
    same_length: every side of a batch padded to one bucket; pack: every text laid end to end in
      rows of sequence_length (2-3x fewer tokens, same loss); fixed_padding: every text padded to
      sequence_length (None: on with several processes, whose parts must have one shape).
    reader: 'numpy' - files and prepared corpora read without TensorFlow, tokenised by the model's
      Hugging Face tokenizer (data.reader); 'seqio' - seqio tasks with in-graph tokenisation (needs
      TensorFlow; mixtures); 'auto' - numpy, seqio for a mixture. The two give the same batches but
      for augmented views, whose words numpy draws (docs/data.md).
    The rest are the file readers' rules (data.sources, data.tasks)."""

    task: str = "nli_triples"
    batch_size: int = 64
    sequence_length: int = 64
    seed: int = 0
    pack: bool = False
    same_length: bool = True
    fixed_padding: bool | None = None
    data_dir: str | None = None
    files: Any = None
    views: tuple[str, ...] = ("none", "none")
    augment_rate: float = 0.1
    sentence_column: str = "sentence"
    view_columns: tuple[str, ...] = ()
    clean: bool = False
    on_bad_row: str = "error"
    nli_pair_labels: tuple[str, ...] = ("entailment",)
    commqa_labels: tuple[str, ...] = ("Good",)
    sts_score_range: tuple[float, float] = (0.0, 5.0)
    window_shards: int = 16
    on_bad_shard: str = "error"
    reader: str = "auto"

    def __post_init__(self):
        api = _api(DataConfig)
        v.require_choice(self.reader, READERS, api, "reader")
        if not isinstance(self.task, str) or not self.task:
            v.fail(self.task, api, "task", "must be a task name (a string, e.g. 'nli_triples')")
        v.check_batch_size(self.batch_size, api)
        v.require_int(self.sequence_length, api, "sequence_length", 2)
        v.check_seed(self.seed, api)
        v.require_bool(self.pack, api, "pack")
        v.require_bool(self.same_length, api, "same_length")
        if self.fixed_padding is not None:
            v.require_bool(self.fixed_padding, api, "fixed_padding")
        v.require_path(self.data_dir, api, "data_dir", allow_none=True)
        object.__setattr__(self, "data_dir", v.expand_path(self.data_dir))
        check_task_options(files=dict(self.files or ()) if self.files is not None else None, on_bad_row=self.on_bad_row,
                           on_bad_shard=self.on_bad_shard, window_shards=self.window_shards,
                           augment_rate=self.augment_rate, sts_score_range=self.sts_score_range, views=self.views)
        for name in ("views", "view_columns", "nli_pair_labels", "commqa_labels", "sts_score_range"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        if isinstance(self.files, Mapping):
            object.__setattr__(self, "files", _frozen_mapping({k: tuple(x) if isinstance(x, list) else x
                                                              for k, x in self.files.items()}))

    @property
    def route(self) -> str:
        """The input route this config reads through ('numpy' or 'seqio')."""
        if self.reader != "auto":
            return self.reader
        return "seqio" if self.task in MIXTURES else "numpy"

    def task_options(self) -> dict:
        """register_tasks' keyword arguments for these files and views."""
        return dict(files=dict(self.files or ()), on_bad_row=self.on_bad_row, views=self.views,
                    augment_rate=self.augment_rate, sentence_column=self.sentence_column, view_columns=self.view_columns,
                    nli_pair_labels=self.nli_pair_labels, commqa_labels=self.commqa_labels,
                    sts_score_range=self.sts_score_range, clean=self.clean, window_shards=self.window_shards,
                    on_bad_shard=self.on_bad_shard)


OPTIMIZERS = ("adafactor", "adamw")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Adafactor (factored second moments) or AdamW, after global-norm clipping of the gradient.

    The Adafactor defaults are not t5x's: multiply_by_parameter_scale False (steps of lr, not lr x
    the parameter's RMS) and clipping_threshold None (no update clipping); t5x's (True, 1.0) are in
    the T5 model files (gin/models/st5_*.gin)."""

    name: str = "adafactor"
    clip_norm: float | None = 1.0
    weight_decay: float = 0.0
    adafactor_decay_rate: float = 0.8
    min_dim_size_to_factor: int = 128
    multiply_by_parameter_scale: bool = False
    clipping_threshold: float | None = None

    def __post_init__(self):
        api = _api(OptimizerConfig)
        v.require_choice(self.name, OPTIMIZERS, api, "name")
        v.require_number(self.clip_norm, api, "clip_norm", 0, low_open=True, allow_none=True, none_means=" (no clipping)")
        v.require_number(self.weight_decay, api, "weight_decay", 0)
        v.require_number(self.adafactor_decay_rate, api, "adafactor_decay_rate", 0, 1, low_open=True)
        v.require_int(self.min_dim_size_to_factor, api, "min_dim_size_to_factor", 1)
        v.require_bool(self.multiply_by_parameter_scale, api, "multiply_by_parameter_scale")
        v.require_number(self.clipping_threshold, api, "clipping_threshold", 0, low_open=True, allow_none=True,
                         none_means=" (no update clipping)")


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """The learning rate: linear warm-up to `peak` (over `warmup_steps`, or `warmup_fraction` of the
    run), then linear decay to 0 at `total_steps` (None: the run's num_steps) or constant."""

    peak: float = 1e-3
    warmup_steps: int = 0
    warmup_fraction: float | None = None
    decay: str = "linear"
    total_steps: int | None = None

    def __post_init__(self):
        api = _api(ScheduleConfig)
        v.require_number(self.peak, api, "peak", 0)
        v.require_int(self.warmup_steps, api, "warmup_steps", 0)
        v.require_number(self.warmup_fraction, api, "warmup_fraction", 0, 1, high_open=True, allow_none=True)
        v.require_choice(self.decay, ("linear", "constant"), api, "decay")
        v.require_int(self.total_steps, api, "total_steps", 1, allow_none=True, none_means=" (the run's num_steps)")
        if self.total_steps is not None and self.warmup_fraction is None and self.warmup_steps > self.total_steps:
            v.fail(self.warmup_steps, api, "warmup_steps", f"must be <= total_steps ({self.total_steps})")

    def steps(self, num_steps: int) -> tuple[int, int]:
        """(warm-up steps, total steps) for a run of num_steps."""
        total = self.total_steps or num_steps
        warmup = int(self.warmup_fraction * total) if self.warmup_fraction is not None else self.warmup_steps
        if warmup > total:
            v.fail(self.warmup_steps, _api(ScheduleConfig), "warmup_steps",
                   f"must be <= the schedule's {total} steps (RunConfig.num_steps or total_steps)")
        return warmup, total


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """A (data, fsdp, model) device mesh; data=-1 takes the devices left over (partitioning.make_mesh)."""

    data: int = -1
    fsdp: int = 1
    model: int = 1

    def __post_init__(self):
        api = _api(MeshConfig)
        if self.data != -1 and not (v._is_int(self.data) and self.data >= 1):
            v.fail(self.data, api, "data", "must be -1 (the devices left over) or an integer >= 1")
        v.require_int(self.fsdp, api, "fsdp", 1)
        v.require_int(self.model, api, "model", 1)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data, self.fsdp, self.model)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints every `every` steps (the last `keep`; written atomically, with the input's
    position). allow_config_change: resume although model, batch, method or data differ from what
    the checkpoints were made with (refused by default, naming the differences). at_evaluation: a
    checkpoint after every evaluation too (the Trans-Encoder's epoch ends). restart_from_scratch:
    start again from step 0 although MODEL_DIR holds checkpoints (the old run is moved to
    MODEL_DIR/previous_runs/<time>/, with a warning); without it such a start is refused."""

    every: int = 100
    keep: int = 2
    allow_config_change: bool = False
    at_evaluation: bool = False
    restart_from_scratch: bool = False

    def __post_init__(self):
        api = _api(CheckpointConfig)
        v.require_int(self.every, api, "every", 1)
        v.require_int(self.keep, api, "keep", 1)
        v.require_bool(self.allow_config_change, api, "allow_config_change")
        v.require_bool(self.at_evaluation, api, "at_evaluation")
        v.require_bool(self.restart_from_scratch, api, "restart_from_scratch")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """STS-B dev Spearman every `every` steps (None: none during the run); the best params are kept
    in MODEL_DIR/best. at_start: score the untrained model before the first step."""

    every: int | None = 100
    at_start: bool = False

    def __post_init__(self):
        api = _api(EvalConfig)
        v.require_int(self.every, api, "every", 1, allow_none=True, none_means=" (no evaluation)")
        v.require_bool(self.at_start, api, "at_start")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything a run is, but its method.

    num_steps: optimizer steps of the run (the schedule spans them unless it says otherwise).
    time_budget_s: stop (evaluate and checkpoint first) once this much *training* time has passed -
      data + step time, not evaluation or checkpoint writes; counted across restarts.
    log_every: metrics, the non-finite check and the progress bar every this many steps (the loop
      reads nothing from the device in between).
    skip_nonfinite: 0 - a step whose loss or gradient norm is NaN / inf stops the job (naming the
      step and the batch's source lines) before anything of it is saved; N > 0 - such a batch is
      skipped (state unchanged, counted), more than N in a row still stop the job.
    prng_impl: the generator of dropout masks, one of 'threefry2x32', 'rbg', 'unsafe_rbg'; None:
      'rbg' on GPUs, threefry2x32 elsewhere (training.setup.PLATFORM_PRNG_IMPLS).
    matmul_precision: float32 matrix products - 'default' (TF32 on NVIDIA GPUs, bf16 passes on
      TPUs), 'high' or 'highest' (IEEE float32 everywhere); bfloat16 models are unaffected.
    """

    model_dir: str
    num_steps: int
    model: TowerConfig | None = None  # None: the job hands the run its model (the Trans-Encoder's phases)
    data: DataConfig = DataConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    mesh: MeshConfig = MeshConfig()
    checkpoints: CheckpointConfig = CheckpointConfig()
    evaluation: EvalConfig = EvalConfig()
    log_every: int = 10
    time_budget_s: float | None = None
    skip_nonfinite: int = 0
    prng_impl: str | None = None
    matmul_precision: str = "default"

    def __post_init__(self):
        api = _api(RunConfig)
        v.require_path(self.model_dir, api, "model_dir")
        object.__setattr__(self, "model_dir", v.expand_path(self.model_dir))
        v.require_int(self.num_steps, api, "num_steps", 1)
        v.require_int(self.log_every, api, "log_every", 1)
        v.require_number(self.time_budget_s, api, "time_budget_s", 0, low_open=True, allow_none=True,
                         none_means=" (no budget)")
        v.require_int(self.skip_nonfinite, api, "skip_nonfinite", 0)
        if self.prng_impl is not None:
            v.require_choice(self.prng_impl, v.PRNG_IMPLS, api, "prng_impl")
        v.require_choice(self.matmul_precision, MATMUL_PRECISIONS, api, "matmul_precision")
        if self.model is not None and not isinstance(self.model, TowerConfig):
            v.fail(self.model, api, "model", "must be a TowerConfig (e.g. @sentemb_jax.TowerConfig(); gin/models/*.gin)")
        for name, cls in (("data", DataConfig), ("optimizer", OptimizerConfig),
                          ("schedule", ScheduleConfig), ("mesh", MeshConfig), ("checkpoints", CheckpointConfig),
                          ("evaluation", EvalConfig)):
            if not isinstance(getattr(self, name), cls):
                v.fail(getattr(self, name), api, name, f"must be a {cls.__name__} (e.g. @sentemb_jax.{cls.__name__}())")
        self.schedule.steps(self.num_steps)  # the warm-up fits the schedule

    def replace(self, **changes) -> "RunConfig":
        """A copy with fields changed; `group__field=value` changes one field of a group
        (`config.replace(data__batch_size=8)`), checked like a new config."""
        groups: dict[str, dict] = {}
        top = {}
        for key, value in changes.items():
            if "__" in key:
                group, field = key.split("__", 1)
                groups.setdefault(group, {})[field] = value
            else:
                top[key] = value
        for group, fields in groups.items():
            top[group] = dataclasses.replace(top.get(group, getattr(self, group)), **fields)
        return dataclasses.replace(self, **top)


def record_of(value) -> Any:
    """A config (or a method's settings) as plain JSON-able data: dataclasses as dicts with their
    class name, tuples as lists, classes and dtypes by name (what run_config.json compares)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {"class": type(value).__name__}
        for f in dataclasses.fields(value):
            if f.init and f.compare:
                out[f.name] = record_of(getattr(value, f.name))
        return out
    if isinstance(value, Mapping):
        return {str(k): record_of(x) for k, x in value.items()}
    if isinstance(value, (list, tuple)):
        return [record_of(x) for x in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return getattr(value, "__name__", None) or str(value)
