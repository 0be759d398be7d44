"""The step-time benchmark on tiny configs on the CPU: each method's real step (contrastive with and
without GradCache, ConGen, SCT, both Trans-Encoder steps, the ensemble student) is built by the
run setup, timed, and reported with consistent numbers; bad input is named before any compile."""
import json

import pytest
from run_utils import REPO

from sentemb_jax.benchmarks import step_time
from sentemb_jax.errors import ConfigError, UsageError

# Dropout off: these tests check the timing and its arithmetic, not dropout, and dropout's masks are
# half of what XLA compiles for these tiny steps (tiny T5 train step: 5.5 s -> 2.5 s on 2 cores).
TINY = ["--gin_file=gin/models/t5_tiny_scratch.gin", "--gin.sentemb_jax.T5Config.dropout_rate=0.0"]
SMALL = ["--gin.sentemb_jax.DataConfig.batch_size=8", "--gin.sentemb_jax.DataConfig.sequence_length=16",
         "--gin.sentemb_jax.DataConfig.pack=False"]
CASES = {
    "contrastive": (["--gin_file=gin/runs/tiny_t5_scratch.gin", *SMALL], "train", "Contrastive"),
    "gradcache": (["--gin_file=gin/runs/tiny_t5_scratch.gin", *SMALL, "--gin.sentemb_jax.Contrastive.chunk_size=4",
                  "--gin.sentemb_jax.Contrastive.gradcache=True"],
                  "train", "Contrastive"),
    "congen": (["--gin_file=gin/runs/congen_cpu.gin", *SMALL, "--gin.TEACHER=@sentemb_jax.packaged_minilm_path()",
                "--gin.sentemb_jax.ConGen.queue_size=64"], "train", "ConGen"),
    "sct": (["--gin_file=gin/runs/sct_cpu.gin", *SMALL, "--gin.sentemb_jax.SCT.queue_size=64"], "train", "SCT"),
    "cross_step": ([], "cross_step", "CrossEncoderPhase"),
    "bi_step": ([], "bi_step", "BiEncoderPhase"),
    "ensemble": (["--gin_file=gin/runs/ensemble_distill_cpu.gin", *SMALL, "--gin.STUDENT_LAYERS=None", "--gin.MODEL_PATH='/unused'"], "ensemble_student", "EnsembleStudent"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_methods_step_is_timed_with_consistent_numbers(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    args, program, method = CASES[case]
    out = tmp_path / "r.json"
    assert step_time.main([*TINY, *args, f"--program={program}", "--steps=2", "--warmup=1", f"--json={out}"]) == 0
    r = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert r["method"] == method and r["program"] == program and "ms median" in printed
    assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"]
    assert r["examples_per_s"] == pytest.approx(r["batch"] / r["median_s"])
    assert r["tokens_per_s"] == pytest.approx(r["batch"] * r["sequence_length"] * r["sides"] / r["median_s"])
    assert r["achieved_tflops"] == pytest.approx(r["model_flops"] / r["median_s"] / 1e12)
    assert r["mfu_vs_ceiling"] == pytest.approx(r["achieved_tflops"] / r["ceiling_tflops"])
    assert r["spec_peak_tflops"] is None and r["peak_device_bytes"] is None  # a CPU: no data sheet, no memory_stats
    assert r["compiled_bytes"] > 0


def test_flops_count_attention_beside_six_n_tokens():
    class Cfg:
        num_layers, num_heads, d_kv = 2, 4, 16

    class Module:
        backbone_config = Cfg()

    assert step_time.attention_flops_per_token(Module(), 32) == 12 * 2 * 32 * 4 * 16


def test_bad_input_is_named_before_any_compile():
    with pytest.raises(UsageError, match="JAX finds no GPU here, only cpu"):
        step_time.main([*TINY, "--gin_file=gin/runs/tiny_t5_scratch.gin", "--device=gpu"])
    with pytest.raises(ConfigError, match="mesh data=2 x fsdp=1 x model=1 = 2 devices, but JAX finds 1 CPU"):
        step_time.main([*TINY, "--gin_file=gin/runs/tiny_t5_scratch.gin", "--mesh=2,1,1"])
    with pytest.raises(UsageError, match="--mesh"):
        step_time.main([*TINY, "--gin_file=gin/runs/tiny_t5_scratch.gin", "--mesh=2x1"])
    # A GradCache chunk that does not divide the batch: before, a ValueError while the step was traced.
    with pytest.raises(ConfigError) as e:
        step_time.main([*TINY, "--gin_file=gin/runs/tiny_t5_scratch.gin", *SMALL, "--gin.sentemb_jax.Contrastive.chunk_size=3",
                        "--gin.sentemb_jax.Contrastive.gradcache=True"])
    assert str(e.value) == ("sentemb_jax.Contrastive(chunk_size=3) does not divide DataConfig.batch_size=8: the step "
                            "embeds each side in chunks of chunk_size rows")


def test_a_runs_prng_impl_does_not_carry_into_the_next_run(monkeypatch):
    """The tiny T5 recipe draws dropout with 'unsafe_rbg'; a run built after it in the same process
    whose config names no generator gets the process's own (threefry), not the previous run's."""
    import jax

    from sentemb_jax.benchmarks import aot
    from sentemb_jax.benchmarks.machine import select_devices
    from sentemb_jax.training import setup

    monkeypatch.chdir(REPO)
    devices = select_devices(None)
    aot.train_run([TINY[0].split("=", 1)[1], "gin/runs/tiny_t5_scratch.gin"], [], devices)
    assert jax.config.jax_default_prng_impl == "unsafe_rbg"
    aot.train_run(["gin/models/minilm_l6.gin", "gin/runs/minilm_nli.gin"], [], devices)
    assert jax.config.jax_default_prng_impl == setup.PROCESS_PRNG_IMPL == "threefry2x32"


def test_a_run_without_a_generator_draws_rbg_on_gpus_and_threefry_elsewhere():
    import types

    from sentemb_jax.training import setup
    from sentemb_jax.training.config import RunConfig

    config = RunConfig(model_dir="/unused", num_steps=1)
    gpu, tpu, cpu = (types.SimpleNamespace(platform=p) for p in ("gpu", "tpu", "cpu"))
    assert setup.prng_impl_of(config, [gpu]) == "rbg"
    assert setup.prng_impl_of(config, [tpu]) == setup.prng_impl_of(config, [cpu]) == "threefry2x32"
    assert setup.prng_impl_of(config) == "threefry2x32"  # this machine's devices: CPUs
    assert setup.prng_impl_of(config.replace(prng_impl="threefry2x32"), [gpu]) == "threefry2x32"  # said: kept


def test_the_run_record_keeps_the_generator_a_platform_default_chose():
    """A run that names no generator records None where it draws the process's own (as before the
    platform defaults), 'rbg' where a GPU chose it: resuming across the two is a changed config."""
    import types

    from sentemb_jax.training import setup
    from sentemb_jax.training.config import RunConfig

    config = RunConfig(model_dir="/unused", num_steps=1)
    gpu, cpu = types.SimpleNamespace(platform="gpu"), types.SimpleNamespace(platform="cpu")
    assert setup.recorded_prng_impl(config, [cpu]) is None
    assert setup.recorded_prng_impl(config, [gpu]) == "rbg"
    assert setup.recorded_prng_impl(config.replace(prng_impl="threefry2x32"), [cpu]) == "threefry2x32"
