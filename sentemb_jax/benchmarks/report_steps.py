"""The accelerator report's step_time rows: which configs each step stage times (the report's
plan and stages: benchmarks.accelerator_report).

`t5_base`: Sentence-T5 Base at the recipe's batch and length (profiled). `levers` and
`xla_options`: the A/B rows, on T5-base cut to two layers at the same batch, each against the
defaults. `methods`: MiniLM, T5-large and every method's step. `--quick`: the same stages at the
tiny T5's toy sizes.
"""
from __future__ import annotations

SMALL = ["--gin.sentemb_jax.DataConfig.batch_size=8", "--gin.sentemb_jax.DataConfig.sequence_length=16",
         "--gin.sentemb_jax.DataConfig.pack=False"]
TINY_T5 = ["--gin_file", "gin/models/t5_tiny_scratch.gin", "--gin_file", "gin/runs/tiny_t5_scratch.gin"]
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


def step_time_configs(quick: bool, stage: str = "methods") -> list[tuple[str, list[str], str]]:
    """(label, step_time arguments, program) of a stage: 't5_base' (Sentence-T5 Base at the recipe's
    shapes), 'levers' (each lever's A/B on two-layer T5-base), 'methods' (MiniLM, T5-large and
    every method's step)."""
    if quick:
        tiny = TINY_T5 + SMALL
        return {"t5_base": [("t5_tiny_contrastive", tiny, "train")],
                "levers": [(f"lever_{label}", tiny + extra, "train") for label, extra, _ in LEVERS[:3]],
                "xla_options": [],
                "methods": [("t5_tiny_gradcache", tiny + ["--gin.sentemb_jax.Contrastive.chunk_size=4",
                                                          "--gin.sentemb_jax.Contrastive.gradcache=True"], "train")]}[stage]
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
