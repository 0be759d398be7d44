"""Ahead-of-time programs: what `sentemb_jax.main` would run for a gin file, with abstract inputs.

The train step comes from the run setup itself (training.setup.setup_run with abstract=True: the
same mesh, tower, method, optimizer, shardings and jitted step the trainer builds; nothing read,
no weights allocated), for the compile-only tools:

* `sentemb_jax.benchmarks.memory_check`: on simulated CPU devices (XLA's CPU compiler);
* `sentemb_jax.benchmarks.tpu_compile`: on the abstract devices of a TPU topology (the TPU
  compiler of libtpu, no TPU needed).

    program = train_program(["gin/st5_11b.gin"], ["sentemb_jax.MeshConfig.fsdp = 16"], devices)
    compiled, seconds = program.compile()

Programs: `train_program` (the train job's step, any method), `encode_program` (the function
behind SentenceEncoder.encode: module.apply on a batch of ids), `trans_encoder_programs` (the
Trans-Encoder's cross-encoder and bi-encoder phase steps, built through the run setup too), the
ensemble_distill job's student step. The `*_run` functions give the runs themselves (what
`sentemb_jax.benchmarks.step_time` times with real arrays).
"""
from __future__ import annotations

import contextlib
import dataclasses
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
from sentemb_jax import partitioning
from sentemb_jax.cross_encoder import CrossEncoder
from sentemb_jax.errors import ConfigError  # a gin file the compile-only tools cannot build a program from
from sentemb_jax.jobs.train import bound_model, bound_train, made
from sentemb_jax.methods.trans_encoder import BiEncoderPhase, CrossEncoderPhase, bi_to_cross_defaults, cross_to_bi_defaults
from sentemb_jax.models.common import remat_policy
from sentemb_jax.models.cross import CrossEncoderModule
from sentemb_jax.training.config import DataConfig, RunConfig, ScheduleConfig
from sentemb_jax.training.method import Method
from sentemb_jax.training.setup import Run, load_tower, setup_run
from sentemb_jax.training.sharded import activation_rules, tower_shardings

PLACEHOLDERS = ["TOKENIZER_DIR = '/unused'", "MODEL_DIR = '/unused'"]


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
    runner.parse_gin(list(gin_files), list(bindings), placeholders=PLACEHOLDERS)


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


def _backbone_info(module) -> dict:
    cfg = module.backbone_config
    return {"dtype": str(np.dtype(cfg.dtype)) if not isinstance(cfg.dtype, str) else cfg.dtype,
            "scan": bool(getattr(cfg, "scan_layers", False)), "remat": remat_policy(getattr(cfg, "remat", False)),
            "layers": int(getattr(cfg, "num_layers", getattr(cfg, "num_hidden_layers", 0)))}


def program_of(run: Run, label: str, kind: str = "train", notes: Sequence[str] = ()) -> Program:
    """The Program of a run built by setup_run(..., abstract=True): its step, lowered for the
    configured batch (every text padded to the sequence length) with the state's shardings."""
    data, module = run.config.data, run.module
    tower = run.abstract_state.params["tower"]
    sides = max(len(run.method.sides), 1)
    info = {"batch": data.batch_size, "length": data.sequence_length, "sides": sides,
            "method": type(run.method).__name__, "optimizer": run.config.optimizer.name, **_backbone_info(module),
            "notes": list(notes)}
    return Program(label, kind, run.step_fn, (run.restore_target(), run.example_batch(), run.abstract_rng()), run.mesh,
                   _count(tower),
                   _enc_dec_params(module, tower), data.batch_size, data.batch_size * data.sequence_length * sides, info,
                   decoder_params=_decoder_params(module, tower))


def train_run(gin_files: Sequence[str], bindings: Sequence[str] = (), devices=None) -> tuple[Run, list[str]]:
    """(the run the train job builds for these gin files, built abstractly on `devices` - default
    jax.devices() - with the gin file's mesh, method, optimizer, batch size and length; notes)."""
    parse_gin(gin_files, bindings)
    config, method = bound_train()
    notes = ["DataConfig.pack=True compiled unpacked (every text padded to the length: an upper bound)"] \
        if config.data.pack else []
    return setup_run(config, method, devices=devices, abstract=True), notes


def train_program(gin_files: Sequence[str], bindings: Sequence[str] = (), devices=None, label: str | None = None) -> Program:
    """The sharded train step `sentemb_jax.main` runs for these gin files (train_run's)."""
    run, notes = train_run(gin_files, bindings, devices)
    return program_of(run, label or " + ".join(gin_files), notes=notes)


def ensemble_student_run(gin_files: Sequence[str], bindings: Sequence[str] = (), devices=None) -> Run:
    """The ensemble_distill job's student step (its RunConfig and EnsembleStudent), built abstractly:
    random rows of the student's width stand in for the ensemble's cached embeddings."""
    parse_gin(gin_files, bindings)
    bound = gin.get_bindings("sentemb_jax.ensemble_distill")
    if "student" not in bound or "method" not in bound:
        raise ConfigError("these gin files configure no ensemble_distill job (sentemb_jax.ensemble_distill.student / "
                          ".method unbound): give an ensemble recipe, e.g. gin/runs/ensemble_distill_cpu.gin")
    return setup_run(bound["student"], made(bound["method"], Method), devices=devices, abstract=True)


def encode_program(gin_files: Sequence[str], bindings: Sequence[str] = (), devices=None, batch_size: int = 1024,
                   length: int = 128, sharded: bool = True, label: str | None = None) -> Program:
    """The function behind SentenceEncoder.encode (`module.apply({'params': p}, ids, mask)`, eval
    mode) for the gin file's tower at [batch_size, length].

    sharded=False: as SentenceEncoder.encode runs it - plain jax.jit on one device (the first of
    `devices`). sharded=True: params laid out over the gin file's mesh by the logical axis rules and
    the batch over data x fsdp (how a pod would serve a model that does not fit one chip)."""
    parse_gin(gin_files, bindings)
    module = load_tower(bound_model(), length, tokenizer=False).module
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


def trans_encoder_runs(gin_files: Sequence[str], bindings: Sequence[str] = (), devices=None,
                       only: str | None = None) -> list[tuple[str, Run]]:
    """Trans-Encoder's two phase steps for the gin file's backbone, built by the run setup as the
    job builds them: the cross-encoder step (bi -> cross) and the bi-encoder step (cross -> bi) at
    DistillPhase's defaults (paper Table 16: cross batch 32 x 64 tokens, bi batch 128 x 32 per
    side), each phase's optimizer, on the gin file's mesh; [(kind, run)]."""
    parse_gin(gin_files, bindings)
    tower = load_tower(bound_model(), 64, tokenizer=False)
    mesh = gin.get_configurable("sentemb_jax.MeshConfig")()
    steps = {"cross_step": (bi_to_cross_defaults(), CrossEncoderPhase), "bi_step": (cross_to_bi_defaults(), BiEncoderPhase)}
    if only is not None and only not in steps:
        raise ConfigError(f"trans_encoder has no program {only!r}: {', '.join(steps)}")
    runs = []
    for kind, (phase, method_class) in ((k, v) for k, v in steps.items() if only in (None, k)):
        model = tower
        if kind == "cross_step":
            model = CrossEncoder(CrossEncoderModule(tower.config, pooling="mean"), None, tower.tokenizer)
        phase_config = RunConfig(model_dir="/unused", num_steps=1000, data=DataConfig(
            batch_size=phase.batch_size, sequence_length=phase.max_length), optimizer=phase.optimizer,
            schedule=ScheduleConfig(peak=phase.learning_rate, warmup_steps=100), mesh=mesh)
        runs.append((kind, setup_run(phase_config, method_class(loss=phase.loss), model=model, devices=devices,
                                     abstract=True)))
    return runs


def trans_encoder_programs(gin_files: Sequence[str], bindings: Sequence[str] = (), devices=None,
                           label: str | None = None, only: str | None = None) -> list[Program]:
    """trans_encoder_runs' steps as Programs (pairs unpacked; the job packs them: fewer tokens,
    same shapes or smaller)."""
    return [program_of(run, f"{label or ' + '.join(gin_files)} {kind}", kind, ["pairs unpacked"])
            for kind, run in trans_encoder_runs(gin_files, bindings, devices, only)]


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
    if kind == "ensemble_student":
        return [program_of(ensemble_student_run(gin_files, bindings, devices), " + ".join(gin_files) + " student",
                           "ensemble_student")]
    raise ConfigError(f"unknown program kind {kind!r}: train, encode, encode1, trans_encoder, ensemble_student")

