"""Ahead-of-time programs: what `sentemb_jax.main` would run for a gin file, with abstract inputs.

One place builds the jitted step and its abstract arguments (`jax.ShapeDtypeStruct`s carrying
their shardings; no weights are allocated) for the two compile-only tools:

* `sentemb_jax.benchmarks.memory_check`: on simulated CPU devices (XLA's CPU compiler);
* `sentemb_jax.benchmarks.tpu_compile`: on the abstract devices of a TPU topology (the TPU
  compiler of libtpu, no TPU needed).

    program = train_program(["gin/st5_11b.gin"], ["sentemb_jax.make_mesh.fsdp = 16"], devices)
    compiled, seconds = program.compile()

Programs: `train_program` (the train loop's sharded step: ContrastiveMethod for contrastive gin
files, QueueDistillMethod for `train.distill` - ConGen / SCT), `encode_program` (the function
behind SentenceEncoder.encode: module.apply on a batch of ids), `trans_encoder_programs` (the
Trans-Encoder cross-encoder and bi-encoder steps, jitted as methods/trans_encoder.py does).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import gin
from sentemb_jax import main as runner
from sentemb_jax import partitioning, validation
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import ConfigError  # a gin file the compile-only tools cannot build a program from
from sentemb_jax.methods import trans_encoder as te
from sentemb_jax.methods.queue_distill import QueueDistillMethod
from sentemb_jax.models.cross import CrossEncoderModule
from sentemb_jax.training.optimizers import learning_rate_schedule, make_optimizer, run_optimizer
from sentemb_jax.training.sharded import activation_rules, tower_shardings
from sentemb_jax.training.trainer import ContrastiveMethod, _with_projection, tower_module

PLACEHOLDERS = ["TOKENIZER_DIR = '/unused'", "MODEL_DIR = '/unused'", "MODEL_PATH = '/unused'"]


@dataclasses.dataclass
class Program:
    """A jitted function, its abstract arguments and what a row of the report needs to know."""

    label: str  # e.g. "gin/st5_11b.gin" or "gin/st5_11b.gin encode"
    kind: str  # train / encode / cross_step / bi_step
    fn: Any  # a jax.jit-wrapped function (lower(*args) works)
    args: tuple  # ShapeDtypeStructs with shardings
    mesh: Any  # jax.sharding.Mesh, or None for a single-device program
    params: int  # parameters of the trained / encoded tower
    matmul_params: int  # the same without embedding tables (the N of 6 x N x tokens)
    examples: int  # examples (rows of the batch) per call
    tokens: int  # tokens through the encoder per call (every side, padded length)
    info: dict  # batch, length, dtype, scan, remat, optimizer, notes
    train: bool = True  # 6 x N x tokens (train) or 2 x N x tokens (inference)
    decoder_params: int = 0  # matmul params of a decoder fed one token per text (Sentence-T5 encdec_first)

    def context(self):
        if self.mesh is None:
            return contextlib.nullcontext()

        return activation_rules(self.mesh)

    def lower(self):
        with self.context():
            return self.fn.lower(*self.args)

    def compile(self):
        """(compiled executable, compile seconds)."""
        started = time.perf_counter()
        lowered = self.lower()
        compiled = lowered.compile()
        return compiled, time.perf_counter() - started

    @property
    def model_flops(self) -> float:
        """6 x N x tokens for a train step (forward + backward), 2 x N x tokens for inference; N the
        encoder's matmul params (a decoder's run on one token per text: N_dec x texts)."""
        texts = self.tokens // max(self.info["length"], 1)
        encoder = self.matmul_params - self.decoder_params
        return (6 if self.train else 2) * (encoder * self.tokens + self.decoder_params * texts)


def parse_gin(gin_files: Sequence[str], bindings: Sequence[str]) -> None:
    """The gin configuration `python -m sentemb_jax.main --gin_file=... --gin.KEY=VALUE` would have
    (placeholders for the directories that only the data / checkpoints need)."""
    runner.register_configurables()
    runner.parse_gin(list(gin_files), [*PLACEHOLDERS, *bindings])


def _query(name: str, default=None):
    try:
        return gin.query_parameter(name)
    except ValueError:
        return default


def _count(tree) -> int:
    return int(sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree)))


def _matmul_params(tower_params, decoder_only: bool = False) -> int:
    """Parameters that multiply activations: all but embedding tables (token / relative-position);
    decoder_only: those of the decoder alone."""
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(tower_params)[0]:
        keys = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path).lower()
        if any(name in keys for name in ("embedding", "shared", "relative_attention_bias", "position")):
            continue
        if decoder_only and "decoder" not in keys:
            continue
        total += int(np.prod(leaf.shape))
    return total


def _enc_dec_params(module, tower_params) -> int:
    """Matmul params the tower runs: a decoder the pooling ignores (has_decoder with mean pooling)
    is not counted."""
    unused = _matmul_params(tower_params, decoder_only=True) if not _decoder_params(module, tower_params) else 0
    return _matmul_params(tower_params) - unused


def _decoder_params(module, tower_params) -> int:
    """Matmul params of a decoder the tower runs (encdec_first); 0 when the pooling ignores it."""
    if "encdec_first" not in tuple(getattr(module, "pooling", ())):
        return 0
    return _matmul_params(tower_params, decoder_only=True)


def _abstract(tree, shardings):
    return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def _tower_module():
    """The tower `train` builds from scratch (sentemb_jax.tower_module from the gin file's backbone)."""
    if _query("sentemb_jax.tower_module.backbone") is None:
        init_from = _query("sentemb_jax.train.init_from")
        raise ConfigError("this gin file takes its architecture from a model directory (train.init_from="
                          f"{init_from!r}), which a compile without weights cannot read: add a model-size gin file "
                          "and the tower, e.g. --gin_file gin/models/t5_tiny.gin "
                          "--gin.sentemb_jax.tower_module.backbone=@sentemb_jax.T5Config()")
    return tower_module()


def _backbone_info(module) -> dict:
    cfg = module.backbone_config
    return {"dtype": str(np.dtype(cfg.dtype)) if not isinstance(cfg.dtype, str) else cfg.dtype,
            "scan": bool(getattr(cfg, "scan_layers", False)), "remat": bool(getattr(cfg, "remat", False)),
            "layers": int(getattr(cfg, "num_layers", getattr(cfg, "num_hidden_layers", 0)))}


def train_program(gin_files: Sequence[str], bindings: Sequence[str] = (), devices=None, label: str | None = None) -> Program:
    """The sharded train step `sentemb_jax.main` runs for these gin files, on `devices` (default:
    jax.devices()) with the gin file's mesh (make_mesh.*), optimizer, batch size and length."""
    parse_gin(gin_files, bindings)
    batch_size = _query("sentemb_jax.train.batch_size", 64)
    length = _query("sentemb_jax.train.sequence_length", 64)
    notes = []
    if _query("sentemb_jax.train.pack", False):
        notes.append("train.pack=True compiled unpacked (every text padded to the length: an upper bound)")
    module = _tower_module()
    distill = _query("sentemb_jax.train.distill")
    if distill is not None:
        cfg = gin.get_configurable("sentemb_jax.QueueDistillConfig")()
        method = QueueDistillMethod(cfg, length)
        teacher_dim = _query("%TEACHER_DIM")  # the width of the cached teacher embeddings (no teacher loaded)
        if cfg.needs_cached_teacher or cfg.queue_init == "data":
            if teacher_dim is None:
                raise ConfigError(f"{cfg.method}: give the teacher's embedding width, e.g. --gin.TEACHER_DIM=768 "
                                  "(its embeddings are cached rows of the batch; the teacher is not loaded here)")
            method.teacher_rows = jax.ShapeDtypeStruct((1, int(teacher_dim)), jnp.float32)
            if cfg.method == "sct_distill":
                method.teacher_rows2 = method.teacher_rows
            # The student head as train() adds it (QueueDistillConfig.head), from the cached rows' width.
            student = SentenceEncoder(module, None, None)
            head = method.student_projection(student.get_sentence_embedding_dimension())
            module = _with_projection(student, head, 0).module
        info_method = f"distill:{cfg.method}"
    else:
        cfg = gin.get_configurable("sentemb_jax.ContrastiveConfig")()  # what train.contrastive gets
        method = ContrastiveMethod(cfg)
        info_method = "contrastive"
    steps = validation.bound_value("sentemb_jax.train.num_steps")  # a macro resolved
    optimizer = run_optimizer(steps if isinstance(steps, int) else 1)  # as train() builds it
    mesh = partitioning.make_mesh(devices=devices)
    example = {f"{s}_{k}": np.ones((1, 8), np.int32) for s in method.sides for k in ("input_ids", "attention_mask")}
    step, abstract, shardings = method.build_step(module, optimizer, mesh, example)
    state = _abstract(abstract, shardings)
    batch_sharding = partitioning.batch_sharding(mesh)
    batch = {k: jax.ShapeDtypeStruct((batch_size, length), jnp.int32, sharding=batch_sharding) for k in example}
    if distill is not None:
        for key, rows in (("teacher_view1", method.teacher_rows), ("teacher_view2", method.teacher_rows2)):
            if rows is not None and (key == "teacher_view2" or cfg.needs_cached_teacher):
                batch[key] = jax.ShapeDtypeStruct((batch_size, rows.shape[1]), jnp.float32, sharding=batch_sharding)
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    tower = abstract.params["tower"]
    info = {"batch": batch_size, "length": length, "sides": len(method.sides), "method": info_method,
            "optimizer": _query("sentemb_jax.make_optimizer.name", "adafactor"), **_backbone_info(module), "notes": notes}
    return Program(label or " + ".join(gin_files), "train", step, (state, batch, rng), mesh, _count(tower),
                   _enc_dec_params(module, tower), batch_size, batch_size * length * len(method.sides), info,
                   decoder_params=_decoder_params(module, tower))


def encode_program(gin_files: Sequence[str], bindings: Sequence[str] = (), devices=None, batch_size: int = 1024,
                   length: int = 128, sharded: bool = True, label: str | None = None) -> Program:
    """The function behind SentenceEncoder.encode (`module.apply({'params': p}, ids, mask)`, eval
    mode) for the gin file's tower at [batch_size, length].

    sharded=False: as SentenceEncoder.encode runs it - plain jax.jit on one device (the first of
    `devices`). sharded=True: params laid out over the gin file's mesh by the logical axis rules and
    the batch over data x fsdp (how a pod would serve a model that does not fit one chip)."""
    parse_gin(gin_files, bindings)
    module = _tower_module()
    ids = np.ones((1, 8), np.int32)
    devices = list(devices if devices is not None else jax.devices())
    if sharded:
        mesh = partitioning.make_mesh(devices=devices)
        tower, tower_sh = tower_shardings(module, ids, ids, mesh)
        batch_sh = partitioning.batch_sharding(mesh)
        fn = jax.jit(lambda p, i, m: module.apply({"params": p}, i, m), in_shardings=(tower_sh, batch_sh, batch_sh),
                     out_shardings=NamedSharding(mesh, P(("data", "fsdp"))))
    else:
        mesh = None

        tower = nn.meta.unbox(jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), ids, ids))["params"])
        one = SingleDeviceSharding(devices[0])
        tower_sh = jax.tree_util.tree_map(lambda _: one, tower)
        batch_sh = one
        fn = jax.jit(lambda p, i, m: module.apply({"params": p}, i, m))  # as SentenceEncoder._embed
    params = _abstract(tower, tower_sh)
    batch = [jax.ShapeDtypeStruct((batch_size, length), jnp.int32, sharding=batch_sh) for _ in range(2)]
    info = {"batch": batch_size, "length": length, "sides": 1, "method": "encode" + (" (sharded)" if sharded else " (1 device)"),
            "optimizer": "-", **_backbone_info(module), "notes": []}
    return Program(label or " + ".join(gin_files) + " encode", "encode", fn, (params, *batch), mesh, _count(tower),
                   _enc_dec_params(module, tower), batch_size, batch_size * length, info, train=False,
                   decoder_params=_decoder_params(module, tower))


def trans_encoder_programs(gin_files: Sequence[str], bindings: Sequence[str] = (), devices=None,
                           label: str | None = None, only: str | None = None) -> list[Program]:
    """Trans-Encoder's two steps (methods/trans_encoder.py) for the gin file's backbone: the
    cross-encoder step (bi -> cross) and the bi-encoder step (cross -> bi) at DistillPhase's
    defaults (paper Table 16: cross batch 32 x 64 tokens, bi batch 128 x 32 per side), AdamW with
    clipping, jitted as the job does: `jax.jit(step, donate_argnums=(0,))`, no mesh - one device.
    Pairs unpacked (the job packs whole pairs into rows: fewer tokens, same shapes or smaller)."""
    parse_gin(gin_files, bindings)
    tower = _tower_module()
    devices = list(devices if devices is not None else jax.devices())
    one = SingleDeviceSharding(devices[0])
    programs = []
    steps = {"cross_step": te.bi_to_cross_defaults, "bi_step": te.cross_to_bi_defaults}
    if only is not None and only not in steps:
        raise ConfigError(f"trans_encoder has no program {only!r}: {', '.join(steps)}")
    for kind, phase in ((k, defaults()) for k, defaults in steps.items() if only in (None, k)):
        schedule = learning_rate_schedule(phase.learning_rate, 100, 1000)
        optimizer = make_optimizer("adamw", schedule, clip_norm=1.0, weight_decay=phase.weight_decay)
        ids = np.ones((1, 8), np.int32)
        if kind == "cross_step":
            module = CrossEncoderModule(tower.backbone_config, pooling="mean")
            step_fn = functools.partial(te.cross_step, module=module)
            batch = {"input_ids": (phase.batch_size, phase.max_length), "attention_mask": (phase.batch_size, phase.max_length)}
            sides = 1
        else:
            module = tower
            step_fn = functools.partial(te.bi_step, module=module)
            batch = {f"sentence{i}_{k}": (phase.batch_size, phase.max_length) for i in (1, 2)
                     for k in ("input_ids", "attention_mask")}
            sides = 2
        params = nn.meta.unbox(jax.eval_shape(lambda m=module: m.init(jax.random.PRNGKey(0), ids, ids))["params"])
        state = jax.eval_shape(lambda p, o=optimizer: te.init_state(p, o), params)
        sds = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one)  # noqa: E731
        state = jax.tree_util.tree_map(sds, state)
        abstract_batch = {k: jax.ShapeDtypeStruct(s, jnp.int32, sharding=one) for k, s in batch.items()}
        abstract_batch["labels"] = jax.ShapeDtypeStruct((phase.batch_size,), jnp.float32, sharding=one)
        rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=one)
        fn = jax.jit(functools.partial(step_fn, optimizer=optimizer, loss=phase.loss), donate_argnums=(0,))
        info = {"batch": phase.batch_size, "length": phase.max_length, "sides": sides, "method": f"trans_encoder {kind}",
                "optimizer": "adamw", **_backbone_info(tower), "notes": ["pairs unpacked; one device (no mesh)"]}
        programs.append(Program(f"{label or ' + '.join(gin_files)} {kind}", kind, fn, (state, abstract_batch, rng), None,
                                _count(params), _matmul_params(params), phase.batch_size,
                                phase.batch_size * phase.max_length * sides, info))
    return programs


def build(kind: str, gin_files: Sequence[str], bindings: Sequence[str], devices, only: str | None = None,
          **kwargs) -> list[Program]:
    """Programs of one kind: 'train', 'encode', 'encode1' (one device, as SentenceEncoder.encode),
    'trans_encoder' (both steps, or the one step `only` names)."""
    if kind == "train":
        return [train_program(gin_files, bindings, devices)]
    if kind == "encode":
        return [encode_program(gin_files, bindings, devices, sharded=True, **kwargs)]
    if kind == "encode1":
        return [encode_program(gin_files, bindings, devices, sharded=False, **kwargs)]
    if kind == "trans_encoder":
        return trans_encoder_programs(gin_files, bindings, devices, only=only)
    raise ConfigError(f"unknown program kind {kind!r}: train, encode, encode1, trans_encoder")

