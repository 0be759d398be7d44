"""Named XLA GPU options (sentemb_jax.xla_options): known names only, refused before anything
compiles, real flags of this jaxlib, and never applied once the backend has started."""
import os
import subprocess
import sys

import pytest

from sentemb_jax.errors import ConfigError
from sentemb_jax.xla_options import GPU_OPTIONS, apply_xla_options, xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_names_become_their_flags_in_order(tmp_path):
    assert xla_flags(["triton_gemm_off", "command_buffers_off"]) == [
        "--xla_gpu_enable_triton_gemm=false", "--xla_gpu_enable_command_buffer="]
    assert xla_flags(["autotune_cache"], str(tmp_path)) == [f"--xla_gpu_per_fusion_autotune_cache_dir={tmp_path}/xla_autotune"]
    assert xla_flags(()) == []


@pytest.mark.parametrize("names,message", [
    (["triton_gemm"], "x: unknown XLA option 'triton_gemm'; known: autotune_cache, command_buffers_off, cublaslt, "
                      "latency_hiding, triton_gemm_off"),
    (["cublaslt", "cublaslt"], "x: XLA option 'cublaslt' given twice"),
    ("cublaslt", "x = 'cublaslt': want a tuple of option names, e.g. ('cublaslt',)"),
    (["autotune_cache"], "x: XLA option 'autotune_cache' keeps its files in the run directory, and this job has none (set MODEL_DIR)"),
])
def test_bad_names_are_one_line_naming_the_binding(names, message):
    with pytest.raises(ConfigError) as e:
        xla_flags(names, where="x")
    assert str(e.value) == message


def test_the_autotuning_cache_wants_a_local_run_directory():
    with pytest.raises(ConfigError, match="gs://b/run is not local"):
        xla_flags(["autotune_cache"], "gs://b/run", where="x")


def test_every_option_is_a_flag_this_xla_accepts(tmp_path):
    """XLA aborts a process on a flag it does not know: a fresh Python starts its backend under all of
    them and runs a product (the CPU build parses the GPU options and ignores them)."""
    flags = xla_flags(sorted(GPU_OPTIONS), str(tmp_path))
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    probe = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; print(float((jnp.ones((4, 4)) @ jnp.ones(4)).sum()))"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0 and probe.stdout.strip() == "16.0", probe.stderr[-2000:]
    bad = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"],
                         env={**env, "XLA_FLAGS": "--xla_gpu_no_such_option=1"}, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0  # what a misspelt flag would do to a job, hence the named set


def test_options_after_the_backend_started_are_refused(tmp_path, monkeypatch):
    import jax

    jax.devices()  # this process's backend is up
    monkeypatch.setenv("XLA_FLAGS", "")
    with pytest.raises(ConfigError, match="come too late: this process's XLA backend has started"):
        apply_xla_options(["triton_gemm_off"])
    assert os.environ["XLA_FLAGS"] == ""
    assert apply_xla_options([]) == []  # nothing asked, nothing refused


def test_a_job_with_an_unknown_option_fails_before_it_runs(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "sentemb_jax.main", "--gin_file=gin/models/minilm_l6.gin",
                           "--gin_file=gin/runs/eval_stsb_dev.gin", f"--gin.MODEL_DIR='{out}'",
                           "--gin.run.xla_options=('triton_off',)"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: gin binding run.xla_options: unknown XLA option 'triton_off'; known: autotune_cache,")
    assert not out.exists()


def test_step_time_runs_under_an_option_and_records_it(tmp_path, monkeypatch):
    """In a fresh process (the backend must not have started): the tiny T5 step under the autotuning
    cache option, its flag in the JSON and the cache folder in --json's directory."""
    import json

    out = tmp_path / "step.json"
    proc = subprocess.run([sys.executable, "-m", "sentemb_jax.benchmarks.step_time", "--gin_file=gin/models/t5_tiny_scratch.gin",
                           "--gin_file=gin/runs/tiny_t5_scratch.gin", "--gin.sentemb_jax.DataConfig.batch_size=4",
                           "--gin.sentemb_jax.DataConfig.sequence_length=8", "--steps=1", "--warmup=1",
                           "--xla_options=autotune_cache", f"--json={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["xla_options"] == ["autotune_cache"]
    assert result["xla_flags"] == [f"--xla_gpu_per_fusion_autotune_cache_dir={tmp_path}/xla_autotune"]
    assert (tmp_path / "xla_autotune").is_dir() and "XLA options: autotune_cache" in proc.stdout
