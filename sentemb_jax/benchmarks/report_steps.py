"""The accelerator report's step_time rows: which configs each step stage times (the report's
plan and stages: benchmarks.accelerator_report).

`t5_base`: Sentence-T5 Base at the recipe's batch and length (profiled). `levers` and
`xla_options`: the A/B rows, on T5-base cut to two layers at the same batch, each against the
defaults. `methods`: MiniLM, T5-large and every method's step. `tiny_step_args`: what
`--tiny_shapes` appends to a row - the same configs, programs and code paths at CPU sizes.
"""
from __future__ import annotations

BF16 = "--gin.sentemb_jax.TowerConfig.config_overrides={'dtype': 'bfloat16'}"
MINILM = ["--gin_file", "gin/models/minilm_l6.gin", "--gin_file", "gin/runs/minilm_nli.gin"]
STUDENT = ["--gin_file", "gin/models/minilm_student.gin"]
ONE = ["--mesh", "1,1,1"]
T5_BASE = ["--gin_file", "gin/st5_base.gin", *ONE, "--gin.sentemb_jax.DataConfig.batch_size=256"]  # the recipe's batch
# The levers' A/B: T5-base at the recipe's batch and length cut to two encoder layers and one decoder
# layer, so that each variant compiles in seconds, not the full model's two minutes.
T5_BASE_TWO_LAYERS = [*T5_BASE, "--gin.sentemb_jax.T5Config.num_layers=2", "--gin.sentemb_jax.T5Config.num_decoder_layers=1"]
# (label, bindings or step_time flags, what it turns off or on against the defaults)
LEVERS = [
    ("defaults", [], "every lever as shipped: rbg dropout bits on GPUs, one encoder call, bf16 products"),
    ("threefry", ["--gin.sentemb_jax.RunConfig.prng_impl='threefry2x32'"], "dropout bits from threefry"),
    ("per_side_calls", ["--gin.sentemb_jax.Contrastive.single_call=False"], "one encoder call per side"),
    *((f"xla_{name}", [f"--xla_options={name}"], f"XLA option {name}") for name in
      ("command_buffers_off", "triton_gemm_off", "cublaslt")),  # autotune_cache: compile time only; latency_hiding: meshes
]
# cuDNN's fused attention: jax.nn.dot_product_attention(implementation='cudnn') runs on NVIDIA GPUs only.
GPU_ONLY = {"minilm_bf16_cudnn_attention": "cuDNN's fused attention runs on NVIDIA GPUs only"}

# --tiny_shapes: what it appends to each command (after the GPU's own arguments: the last value of a
# flag or binding wins). The tests are collected, not run: every file found, conftest and each
# module imported on this Python; their bodies are device checks at fixed shapes, which the suite
# runs. A step_time row: 4 texts a side of 16 tokens, 1 timed step; every T5 one encoder and one
# decoder layer of width 64 (the vocabulary as the size file has it); every MiniLM tower the first
# layer of the shipped weights (the students' STUDENT_LAYERS, the others' init_layers; a teacher
# stays whole: it only runs forward); ConGen's and SCT's queues 64 entries, not 16,384 (the default
# job's 1,024: each step enqueues its batch of 128). Trans-Encoder's two steps keep their shapes: step_time builds them at DistillPhase's
# defaults whatever the bindings say (benchmarks.aot.trans_encoder_runs).
TINY_TESTS = ["--collect-only"]
TINY_ENCODE = ["--rounds", "1", "--batch_size", "16"]
TINY_TRAIN = ["--rounds", "1", "--steps", "1", "--batch_size", "4"]
TINY_JOB = ["--gin.NUM_STEPS=2", "--gin.sentemb_jax.ConGen.queue_size=1024"]
TINY_DATA = ["--gin.sentemb_jax.DataConfig.batch_size=4", "--gin.sentemb_jax.DataConfig.sequence_length=16"]
TINY_T5 = [f"--gin.sentemb_jax.T5Config.{k}={v}" for k, v in
           (("num_layers", 1), ("num_decoder_layers", 1), ("d_model", 64), ("d_ff", 128), ("num_heads", 2), ("d_kv", 32))]
TINY_CHUNK = ["--gin.sentemb_jax.Contrastive.chunk_size=2"]  # GradCache's chunks divide the batch of 4
TINY_QUEUES = {"gin/runs/congen_cpu.gin": "--gin.sentemb_jax.ConGen.queue_size=64",
               "gin/runs/sct_cpu.gin": "--gin.sentemb_jax.SCT.queue_size=64"}


def tiny_step_args(label: str, argv: list[str]) -> list[str]:
    """What `--tiny_shapes` appends to the step_time row `label` of arguments `argv`."""
    files = [a for a in argv if a.endswith(".gin")]
    out = ["--steps", "1", "--warmup", "1", *TINY_DATA]
    if any("st5_" in f for f in files):
        out += TINY_T5
    elif "gin/models/minilm_student.gin" in files:
        out += ["--gin.STUDENT_LAYERS=1"]
    elif "gin/models/minilm_l6.gin" in files:
        out += ["--gin.sentemb_jax.TowerConfig.init_layers=1"]
    out += [TINY_QUEUES[f] for f in files if f in TINY_QUEUES]
    return out + (TINY_CHUNK if "gradcache" in label else [])


def step_time_configs(stage: str = "methods") -> list[tuple[str, list[str], str]]:
    """(label, step_time arguments, program) of a stage: 't5_base' (Sentence-T5 Base at the recipe's
    shapes), 'levers' and 'xla_options' (each A/B on two-layer T5-base), 'methods' (MiniLM, T5-large
    and every method's step)."""
    if stage == "t5_base":
        return [("t5_base_bf16", T5_BASE, "train")]
    if stage in ("levers", "xla_options"):
        chosen = [lever for lever in LEVERS if (lever[0].startswith("xla_")) == (stage == "xla_options")]
        return [(f"lever_{label}", T5_BASE_TWO_LAYERS + extra, "train") for label, extra, _ in chosen]
    return [
        ("minilm_bf16_batch256", MINILM + [BF16, "--gin.sentemb_jax.DataConfig.batch_size=256",
                                           "--gin.sentemb_jax.DataConfig.pack=False"], "train"),
        # cuDNN's fused attention has no dropout: attention dropout off in this row.
        ("minilm_bf16_cudnn_attention", MINILM + ["--gin.sentemb_jax.DataConfig.batch_size=256",
                                                  "--gin.sentemb_jax.DataConfig.pack=False",
                                                  "--gin.sentemb_jax.TowerConfig.config_overrides={'dtype': 'bfloat16', "
                                                  "'attention_implementation': 'cudnn', 'attention_probs_dropout_prob': 0.0}"],
         "train"),
        ("minilm_fp32_batch256", MINILM + ["--gin.sentemb_jax.DataConfig.batch_size=256",
                                           "--gin.sentemb_jax.DataConfig.pack=False"], "train"),
        ("t5_large_bf16", ["--gin_file", "gin/st5_large.gin", *ONE, "--gin.sentemb_jax.DataConfig.batch_size=128"], "train"),
        ("minilm_gradcache", MINILM + [BF16, "--gin.sentemb_jax.DataConfig.batch_size=256", "--gin.sentemb_jax.DataConfig.pack=False",
                                       "--gin.sentemb_jax.Contrastive.chunk_size=64", "--gin.sentemb_jax.Contrastive.gradcache=True"], "train"),
        ("congen", STUDENT + ["--gin_file", "gin/runs/congen_cpu.gin", "--gin.sentemb_jax.DataConfig.batch_size=128"], "train"),
        ("sct", STUDENT + ["--gin_file", "gin/runs/sct_cpu.gin", "--gin.sentemb_jax.DataConfig.batch_size=128"], "train"),
        ("trans_encoder_cross", ["--gin_file", "gin/models/minilm_l6.gin", "--gin_file", "gin/runs/trans_encoder_sts_cpu.gin"],
         "cross_step"),
        ("trans_encoder_bi", ["--gin_file", "gin/models/minilm_l6.gin", "--gin_file", "gin/runs/trans_encoder_sts_cpu.gin"],
         "bi_step"),
        ("ensemble_student", STUDENT + ["--gin_file", "gin/runs/ensemble_distill_cpu.gin"], "ensemble_student"),
    ]
