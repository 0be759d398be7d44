"""The run setup: `setup_run(config, method) -> Run`, the one place a train program is built.

    run = setup_run(config, ConGen(teacher=...))                 # mesh, tower, optimizer, step, input
    state = run.initial_state()
    with run.context():
        state, metrics = run.step_fn(state, run.device_batch(next(iter(run.batches))), run.rng())

The trainer (training.trainer), the Trans-Encoder's phases, the TPU compile command and the
step-time benchmark (abstract=True: shapes only, nothing read; `run.lower()` /
`run.random_batch()`), the scaling check and the preflight all build through it - the tests
check that no other module jits a train step.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sentemb_jax import partitioning, sharded_load
from sentemb_jax.data import reader
from sentemb_jax.data.packing import pack_batch
from sentemb_jax.data.sources import seqio_route_reason
from sentemb_jax.dependencies import require_tensorflow
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import ConfigError, TrainingError
from sentemb_jax.models.sentence import SentenceEmbedder
from sentemb_jax.run_dir import ENCODER_JSON
from sentemb_jax.st_layout import transformer_dir_of
from sentemb_jax.tokenization import TRAIN_BUCKETS, Tokenizer, check_ids_fit
from sentemb_jax.training import sharded
from sentemb_jax.training.config import RunConfig, TowerConfig
from sentemb_jax.training.method import Method, MethodContext, TrainState, random_rows
from sentemb_jax.training.optimizers import make_optimizer

PROCESS_PRNG_IMPL = jax.config.jax_default_prng_impl  # what JAX had before any run set one
# RunConfig.prng_impl=None on these platforms: 'rbg' draws dropout bits with XLA's RngBitGenerator
# (Philox: 10 rounds per 128 bits) instead of threefry's 20-round hash per 64 bits, written out as
# elementwise ops - about 7 G draws a Sentence-T5 Base step. Splits and fold_ins stay threefry, and
# the bits do not depend on the sharding (tests/multidevice_steps.py), so 8 devices = 1 and exact
# resume hold; they differ from another platform's bits.
PLATFORM_PRNG_IMPLS = {"gpu": "rbg", "cuda": "rbg", "rocm": "rbg"}

log = logging.getLogger(__name__)
_INIT_IDS = np.ones((1, 8), np.int32)  # shapes for initialisation only


@dataclasses.dataclass
class Run:
    """A built train program and what feeds it. `abstract_state` holds ShapeDtypeStructs with the
    state's shardings (a restore target, a compile's input); `batches` is the batch source (None
    in a compile-only run); `model` the tower's owner (a SentenceEncoder, or the job's model).
    `backbone_from`: the model directory whose safetensors initial_state reads the backbone from,
    region by region into its shardings (sharded_load), while model.params["backbone"] holds only
    its shapes; None: model.params holds the start weights (or None: a random init)."""

    config: RunConfig
    method: Method
    mesh: Mesh
    model: Any
    module: nn.Module
    optimizer: Any
    abstract_state: TrainState
    shardings: TrainState
    step_fn: Callable
    batches: Any
    task: str | None
    pad_id: int
    width: int | None
    extra_params: dict
    extra_state: Any
    fixed_padding: bool
    backbone_from: str | None = None

    def context(self):
        """The mesh and its activation-sharding rules, in scope while the step traces and runs."""
        return sharded.activation_rules(self.mesh)

    def rng(self):
        return jax.random.PRNGKey(self.config.data.seed)

    def device_batch(self, batch: dict) -> dict:
        """A source batch -> the step's batch: the method's features, packed rows (DataConfig.pack),
        placed along the mesh's data axes."""
        model_batch = self.method.model_batch(batch)
        if self.config.data.pack:
            model_batch = pack_batch(model_batch, self.method.sides, self.config.data.sequence_length, self.pad_id,
                                     row_multiple=math.lcm(8, partitioning.batch_shards(self.mesh)))
        return self._place(model_batch)

    def _place(self, batch: dict) -> dict:
        shards = partitioning.batch_shards(self.mesh)
        if all(np.shape(x)[0] % shards == 0 for x in batch.values()):
            return partitioning.shard_batch(batch, self.mesh)
        # A short last batch of an epoch (the Trans-Encoder's): kept whole on every device.
        replicated = NamedSharding(self.mesh, P())
        return {k: jax.device_put(np.asarray(x), replicated) for k, x in batch.items()}

    def batch_shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
        """The step's batch at the configured shapes (every text padded to sequence_length, unpacked)."""
        data = self.config.data
        ids = jax.ShapeDtypeStruct((data.batch_size, data.sequence_length), jnp.int32)
        out = {f"{side}_{key}": ids for side in self.method.sides for key in ("input_ids", "attention_mask")}
        return {**out, **self.method.batch_features(data.batch_size, data.sequence_length)}

    def example_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        """batch_shapes() placed on the mesh (what `lower` compiles for)."""
        sharding = partitioning.batch_sharding(self.mesh)
        return {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for k, s in self.batch_shapes().items()}

    def random_batch(self, seed: int = 0, lengths: tuple[int, int] | None = None) -> dict:
        """A host batch of the configured shapes: random ids (3 .. vocab), each text `lengths`
        (default: the whole sequence) tokens long; unit rows for float inputs, zeros-one labels."""
        rng = np.random.default_rng(seed)
        vocab = int(getattr(self.module.backbone_config, "vocab_size", 1000))
        out = {}
        for key, s in self.batch_shapes().items():
            if key.endswith("_input_ids") or key == "input_ids":
                out[key] = rng.integers(3, vocab, s.shape).astype(np.int32)
            elif key.endswith("attention_mask"):
                low, high = lengths or (s.shape[1], s.shape[1])
                n = rng.integers(low, high + 1, (s.shape[0], 1))
                out[key] = (np.arange(s.shape[1])[None, :] < n).astype(np.int32)
            elif key == "labels":
                out[key] = rng.uniform(0, 1, s.shape).astype(np.float32)
            else:
                out[key] = random_rows(rng, s.shape)
        for key in list(out):
            if key.endswith("_input_ids"):
                out[key] = out[key] * out[key.replace("_input_ids", "_attention_mask")]
        if "input_ids" in out:
            out["input_ids"] = out["input_ids"] * out["attention_mask"]
        return out

    def lower(self):
        """The step lowered for the configured shapes (no arrays allocated): `.compile()` gives the
        executable, its memory_analysis() and cost_analysis()."""
        with self.context():
            return self.step_fn.lower(self.abstract_state, self.example_batch(), self.abstract_rng())

    def abstract_rng(self) -> jax.ShapeDtypeStruct:
        """The step's rng argument as a shape (its size follows RunConfig.prng_impl), replicated."""
        key = jax.eval_shape(self.rng)
        return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=NamedSharding(self.mesh, P()))

    def initial_state(self, tower=None) -> TrainState:
        """The state at step 0 on the mesh: the tower's start params (`tower`, else the model's, else a
        random init for a tower from scratch), the method's own params and state, a fresh optimizer.
        With `backbone_from` (and no `tower`), the backbone is read from its files by region, each
        device its own slice: never a whole copy on a host or on one device."""
        sh = self.shardings
        backbone = None
        if tower is None and self.backbone_from is not None:
            # warn=False: from_pretrained's header checks have warned of task heads already.
            backbone = sharded_load.load_backbone(self.backbone_from, self.module.backbone_config,
                                                  sh.params["tower"]["backbone"], warn=False)
            tower = {k: v for k, v in self.model.params.items() if k != "backbone"}
        if tower is None:
            tower = self.model.params
        if tower is None:
            module = self.module
            init = jax.jit(lambda r: nn.meta.unbox(module.init(r, _INIT_IDS, _INIT_IDS)["params"]),
                           out_shardings=sh.params["tower"])
            tower = init(jax.random.PRNGKey(self.config.data.seed))
        # A fresh copy: the step donates its state, which must not delete the caller's arrays. A
        # backbone just read has no other owner, and copying it would hold it twice on the devices.
        params_sh = sh.params
        if backbone is not None:
            params_sh = {**sh.params, "tower": {k: v for k, v in sh.params["tower"].items() if k != "backbone"}}
        copy = jax.jit(lambda p: jax.tree_util.tree_map(jnp.copy, p), out_shardings=params_sh)
        params = copy({"tower": tower, **self.extra_params})
        if backbone is not None:
            params["tower"]["backbone"] = backbone
        opt_state = jax.jit(self.optimizer.init, out_shardings=sh.opt_state)(params)
        extra = jax.device_put(self.extra_state, sh.extra) if self.extra_state is not None else None
        return TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), sh.step), params=params, opt_state=opt_state,
                          extra=extra)

    def restore_target(self) -> TrainState:
        """abstract_state with its shardings: what a checkpoint restores into."""
        return jax.tree_util.tree_map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                      self.abstract_state, self.shardings)


def prng_impl_of(config: RunConfig, devices=None) -> str:
    """The generator a run draws dropout from: RunConfig.prng_impl, else the platform's default
    (PLATFORM_PRNG_IMPLS: 'rbg' on GPUs), else the process's own (threefry2x32)."""
    if config.prng_impl is not None:
        return config.prng_impl
    platform = (devices[0] if devices else jax.devices()[0]).platform
    return PLATFORM_PRNG_IMPLS.get(platform, PROCESS_PRNG_IMPL)


def recorded_prng_impl(config: RunConfig, devices=None) -> str | None:
    """The generator as the run record keeps it: None where the config names none and the run draws
    the process's own (as records before the platform defaults had it), else the one it draws -
    so a run started on a CPU and resumed on a GPU (or the reverse) is refused as a changed
    configuration instead of switching generators silently."""
    impl = prng_impl_of(config, devices)
    return None if config.prng_impl is None and impl == PROCESS_PRNG_IMPL else impl


def setup_run(config: RunConfig, method: Method, *, model=None, batches=None, devices=None, abstract: bool = False) -> Run:
    """Build the run's program: the mesh (MeshConfig; a mesh that does not fit the devices is a
    ConfigError before anything compiles), the tower (TowerConfig, or the job's `model`), the
    method's preparation (a teacher, its cached embeddings) and head, the optimizer, the state's
    shapes and shardings, the jitted step and the input (the task's pipeline, or the job's
    `batches`). abstract=True: nothing is read and no teacher runs (compile-only and timing runs)."""
    # Every run sets the generator: one run's 'unsafe_rbg' must not carry into the next run of the
    # same process (a notebook, the tests), whose config says nothing - the platform's default.
    jax.config.update("jax_default_prng_impl", prng_impl_of(config, devices))
    chunk = getattr(method, "chunk_size", None)
    if chunk and config.data.batch_size % chunk:  # else a ValueError while the step is traced
        raise ConfigError(f"{{where}} does not divide DataConfig.batch_size={config.data.batch_size}: the step embeds "
                          "each side in chunks of chunk_size rows", api=f"sentemb_jax.{type(method).__name__}",
                          param="chunk_size", value=chunk)
    mesh = partitioning.make_mesh(*config.mesh.shape, devices=devices)
    fixed_padding = _fixed_padding(config)
    backbone_from = None
    if model is None:
        if config.model is None:
            raise TrainingError("RunConfig.model is None and no model was given: set a TowerConfig (gin: MODEL)")
        backbone_from = sharded_start(config.model)
        model = load_tower(config.model, config.data.sequence_length, tokenizer=not abstract,
                           read_backbone=backbone_from is None)
    task = None
    if batches is None and not abstract:
        batches = _input(config, model, fixed_padding)
        task = batches.task
    is_tower = isinstance(model, SentenceEncoder)
    method.prepare(MethodContext(student=model, sequence_length=config.data.sequence_length, seed=config.data.seed,
                                 source=batches if task else None, abstract=abstract))
    if is_tower:
        model = with_head(model, method.student_head(model.get_sentence_embedding_dimension()), config.data.seed)
    module = model.module
    optimizer = make_optimizer(config.optimizer, config.schedule, config.num_steps)
    width = None
    if isinstance(module, SentenceEmbedder):
        tower_abs = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), _INIT_IDS, _INIT_IDS))["params"]
        width = jax.eval_shape(lambda p: module.apply({"params": p}, _INIT_IDS, _INIT_IDS), nn.meta.unbox(tower_abs)).shape[-1]
    extra_params = method.init_params(width)
    extra_state = method.init_extra(width)
    abstract_state, shardings = _state_shapes(module, optimizer, mesh, method, extra_params, extra_state)
    step = functools.partial(method.step, module=module, optimizer=optimizer)
    step_fn = sharded.jit_train_step(step, shardings, mesh, config.skip_nonfinite > 0,
                                     batch_sharding="data" if batches is None else None,
                                     matmul_precision=config.matmul_precision)
    pad_id = int(batches.pad_id) if task else int(model.tokenizer.pad_id) if getattr(model, "tokenizer", None) else 0
    return Run(config, method, mesh, model, module, optimizer, abstract_state, shardings, step_fn, batches, task, pad_id,
               width, extra_params, extra_state, fixed_padding, backbone_from)


def _state_shapes(module, optimizer, mesh: Mesh, method: Method, extra_params: dict, extra_state):
    """(abstract TrainState, TrainState of shardings), no weights allocated: the tower's by the
    logical axis rules, the method's params replicated, the optimizer state's derived from the params'."""
    replicated = NamedSharding(mesh, P())
    tower, tower_sh = sharded.tower_shardings(module, _INIT_IDS, _INIT_IDS, mesh)
    shapes = lambda tree: jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.asarray(x).dtype), tree)  # noqa: E731
    params = {"tower": tower, **shapes(extra_params)}
    params_sh = {"tower": tower_sh, **jax.tree_util.tree_map(lambda _: replicated, extra_params)}
    opt, opt_sh = sharded.optimizer_shardings(optimizer, params, params_sh, mesh)
    extra = shapes(extra_state) if extra_state is not None else None
    extra_sh = method.extra_shardings(mesh, extra) if extra is not None else None
    abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params, opt_state=opt, extra=extra)
    return abstract, TrainState(step=replicated, params=params_sh, opt_state=opt_sh, extra=extra_sh)


# ------------------------------------------------------------------------------------------------
# The tower


def sharded_start(tower: TowerConfig) -> str | None:
    """The directory whose backbone weights Run.initial_state reads by region straight into the
    mesh's shardings (sharded_load): a local model directory with safetensors weights, started whole
    (every layer, its own weights). None - the tower loads whole, on the host, as before - for pickle
    weights (refused by region), a run directory (its weights come from a checkpoint), `init_layers`
    (first_layers cuts a loaded tree) and `init_random` (which reads none), and a tower from scratch."""
    if not tower.init_from or tower.init_layers or tower.init_random:
        return None
    if not os.path.isdir(tower.init_from) or os.path.isfile(os.path.join(tower.init_from, ENCODER_JSON)):
        return None  # from_pretrained says what is wrong with a missing directory; a run restores its own
    directory = transformer_dir_of(tower.init_from)
    return directory if sharded_load.has_safetensors(directory) else None


def load_tower(tower: TowerConfig, sequence_length: int, tokenizer: bool = True,
               read_backbone: bool = True) -> SentenceEncoder:
    """The tower to train: a model directory's (its first `init_layers` layers; random weights with
    `init_random`: params None, initialised on the mesh), or one built from `backbone` (params None;
    tokenizer=False: without its tokenizer, for compile-only runs on a host that lacks it).
    read_backbone=False: the backbone's params as shapes only (SentenceEncoder.from_pretrained), for
    Run.initial_state to read by region (sharded_start)."""
    if tower.init_from:
        encoder = SentenceEncoder.from_pretrained(tower.init_from, pooling=tower.pooling, read_backbone=read_backbone,
                                                  **tower.overrides)
        if tower.init_layers:
            encoder = encoder.first_layers(tower.init_layers)
        if tower.init_random:
            encoder.params = None
        return encoder
    module = SentenceEmbedder(tower.backbone, pooling=tower.pooling or ("mean",), projection_dim=tower.projection_dim,
                              normalize=tower.normalize)
    tok = Tokenizer.from_pretrained(tower.tokenizer_dir, max_length=sequence_length) if tokenizer else None
    if tok is not None:
        check_ids_fit(tok, tower.backbone.vocab_size, f"{tower.tokenizer_dir} (TowerConfig.tokenizer_dir, beside TowerConfig.backbone)")
    return SentenceEncoder(module, None, tok)


def with_head(encoder: SentenceEncoder, dim: int | None, seed: int) -> SentenceEncoder:
    """`encoder` with a new Linear + tanh projection to `dim` (ConGen's student head); unchanged for
    None, or when it already ends in that head (a student that ConGen trained before)."""
    m = encoder.module
    if not dim or (m.projection_dim == dim and m.projection_bias and m.projection_activation == "tanh"):
        return encoder
    if m.projection_dim:  # the tower has one projection slot: the new head takes the place of this one
        log.warning(
            "the student's own projection (%d-d, activation %s) is replaced by a new Linear + tanh head to %d",
            m.projection_dim, m.projection_activation, dim)
    module = encoder.module.clone(projection_dim=dim, projection_bias=True, projection_activation="tanh")
    if encoder.params is None:  # random init: the whole tower is initialised on the mesh
        return SentenceEncoder(module, None, encoder.tokenizer, encoder.hf_config)
    fresh = module.init(jax.random.PRNGKey(seed), _INIT_IDS, _INIT_IDS)["params"]
    return SentenceEncoder(module, {**encoder.params, "projection": nn.meta.unbox(fresh)["projection"]},
                           encoder.tokenizer, encoder.hf_config)


def _input(config: RunConfig, model, fixed_padding: bool):
    """This process's part of each global batch of the config's task, through its input route
    (DataConfig.route): the TensorFlow-free reader, or the seqio pipeline."""
    data, processes = config.data, jax.process_count()
    shard = (jax.process_index(), processes) if processes > 1 else None
    buckets = (data.sequence_length,) if fixed_padding else TRAIN_BUCKETS
    if data.route == "numpy":
        return reader.numpy_batches(data, _input_tokenizer(config, model), shard, buckets, data.same_length or fixed_padding)
    require_tensorflow(*seqio_route_reason(data))
    if config.model is not None and config.model.tokenizer_dir:  # seqio's vocabulary reads that directory
        _input_tokenizer(config, model)
    from sentemb_jax.data import pipeline  # lazy: seqio / TensorFlow, only for the seqio route

    task = pipeline.register_task(data, _tokenizer_dir(config.model, model))
    return pipeline.task_pipeline(task, data, fixed_padding)


def _input_tokenizer(config: RunConfig, model) -> Tokenizer:
    """The tokenizer of the training input: the model's own, or TowerConfig.tokenizer_dir's,
    whose ids are checked against the model's embedding table (one it has no row for would embed
    as NaN), on either input route."""
    own = getattr(model, "tokenizer", None)
    if own is not None and not (config.model and config.model.tokenizer_dir):
        return own
    tokenizer = Tokenizer.from_pretrained(_tokenizer_dir(config.model, model), max_length=config.data.sequence_length)
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab_size is not None:
        check_ids_fit(tokenizer, vocab_size, f"{tokenizer.source_dir} (the tokenizer of the training input)")
    return tokenizer


def _tokenizer_dir(tower: TowerConfig | None, model) -> str | None:
    if tower is not None and tower.tokenizer_dir:
        return tower.tokenizer_dir
    if tower is not None and tower.init_from:
        return transformer_dir_of(tower.init_from)
    return getattr(getattr(model, "tokenizer", None), "source_dir", None)


# ------------------------------------------------------------------------------------------------
# The input


def _fixed_padding(config: RunConfig) -> bool:
    """DataConfig.fixed_padding as the run uses it (None: on with several processes), after the
    multi-process checks."""
    data, processes = config.data, jax.process_count()
    if data.batch_size % processes:
        raise TrainingError(f"DataConfig.batch_size={data.batch_size} must divide into the {processes} processes' parts")
    fixed = processes > 1 if data.fixed_padding is None else data.fixed_padding
    if processes > 1 and (data.pack or not fixed):
        raise TrainingError("a multi-process run needs batch parts of one shape on every process: "
                            "DataConfig.pack=False and DataConfig.fixed_padding=True (or None)")
    return fixed
