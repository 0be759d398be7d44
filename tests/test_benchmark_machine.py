"""benchmarks.machine: the first line every benchmark prints names the CPU, its extensions and any
setting that capped the extensions our libraries use (so numbers from a capped run are never taken
for the machine's own)."""
from __future__ import annotations

from sentemb_jax.benchmarks import machine


def test_cpu_description_names_model_extensions_and_caps(monkeypatch):
    for name in (*machine.ISA_CAPS, "XLA_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"fpu", "avx2", "fma", "amx_bf16"})
    monkeypatch.setattr(machine, "cpu_model", lambda: "Test CPU")
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(machine, "usable_cores", lambda: 2)
    assert machine.cpu_description() == "Test CPU (avx2, fma, amx_bf16), 2 cores"

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_cpu_max_isa=AVX2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "")  # empty: not a cap
    assert machine.cpu_description() == (
        "Test CPU (avx2, fma, amx_bf16), 2 cores; extensions capped by ONEDNN_MAX_CPU_ISA=AVX2 --xla_cpu_max_isa=AVX2")


def test_cpu_description_says_when_the_process_may_use_fewer_cores_than_the_host(monkeypatch):
    """Under taskset / a cpuset the benchmarks run (and give torch) the cores they may use."""
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2"})
    monkeypatch.setattr(machine, "cpu_model", lambda: "Test CPU")
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    for cap in machine.ISA_CAPS:  # a host may cap the math libraries' instruction sets (said in the description)
        monkeypatch.delenv(cap, raising=False)
    assert machine.usable_cores() == 2
    assert machine.cpu_description().endswith("(avx2), 2 of 16 cores")


def test_the_benchmarks_keep_jax_on_the_cpu_unless_jax_platforms_says_otherwise(monkeypatch, tmp_path):
    """On a machine with a GPU, JAX would take it while sentence-transformers' rows run on the CPU.
    And a persistent compilation cache in the environment (this suite sets one) would make "first
    call from cold" a load: the benchmark and its workers compile."""
    import os
    import subprocess
    import sys

    import jax

    before = jax.config.jax_platforms, jax.config.jax_enable_compilation_cache
    monkeypatch.setenv("JAX_PLATFORMS", "")  # unset in effect; restored after the test
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("JAX_ENABLE_COMPILATION_CACHE", "true")
    worker_reads = ("import jax, jax.numpy as jnp; jax.jit(lambda x: x + 1)(jnp.ones(2)).block_until_ready(); "
                    "print(jax.config.jax_platforms, jax.config.jax_enable_compilation_cache)")
    try:
        machine.keep_jax_on_cpu_and_compiling()
        assert os.environ["JAX_PLATFORMS"] == "cpu" and jax.config.jax_platforms == "cpu"
        assert jax.config.jax_enable_compilation_cache is False
        worker = subprocess.run([sys.executable, "-c", worker_reads], capture_output=True, text=True, timeout=300)
        assert worker.stdout.strip().splitlines()[-1] == "cpu False"  # the workers it starts read it
        assert os.listdir(tmp_path) == []  # and wrote nothing to the cache folder
        jax.config.update("jax_platforms", before[0])
        monkeypatch.setenv("JAX_PLATFORMS", "cuda")
        machine.keep_jax_on_cpu_and_compiling()
        assert os.environ["JAX_PLATFORMS"] == "cuda" and jax.config.jax_platforms == before[0]
    finally:
        jax.config.update("jax_platforms", before[0])
        jax.config.update("jax_enable_compilation_cache", before[1])


def test_xla_dot_probe_names_the_fusion_per_flag_set_and_a_flag_set_that_kills_xla(capsys):
    """Each flag set in its own process: a set XLA refuses (it exits on an unknown flag) is a row saying
    so, the other set's products still give their fusion and GFLOP/s; exit 1."""
    import re

    from lab import xla_dot_probe

    code = xla_dot_probe.main(["--flags=", "--flags=--xla_not_a_real_flag=1", "--shape", "64x32x16", "--calls", "2",
                               "--no_torch"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out[0].startswith("machine: ") and out[1] == "XLA_FLAGS=''"
    for line, dtype in zip(out[2:4], ("float32 ", "bfloat16")):
        m = re.fullmatch(rf"  jax \S+ 64x32x16 {dtype} -> float32: +([\d.]+) GFLOP/s, fusion: (__\w+_fusion|none)", line)
        assert m, line  # its GFLOP/s is whatever this machine gives (0.0 when loaded: 2 x 64 x 32 x 16 FLOPs)
    assert out[4] == "XLA_FLAGS='--xla_not_a_real_flag=1'"
    assert out[5].startswith("  its process exited with 1: ") and "Unknown flag in XLA_FLAGS: --xla_not_a_real_flag=1" in out[5]
    assert len(out) == 6
