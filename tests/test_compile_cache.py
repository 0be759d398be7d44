"""The persistent compilation cache (sentemb_jax.compile_cache): a second process loads what the first
compiled and computes the same bits; each kind of machine has its own directory."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache import compilation_cache

from sentemb_jax import compile_cache
from sentemb_jax.errors import ConfigError
from sentemb_jax.main import run

# Counts jax's own cache-hit events (no timing): a hit is a compile loaded from the directory.
_ENCODE_TWICE = """
import hashlib, json, sys
from sentemb_jax import SentenceEncoder, enable_compilation_cache
from sentemb_jax.compile_cache import cache_hits
hits = cache_hits()
path = enable_compilation_cache(sys.argv[1])
encoder = SentenceEncoder.from_pretrained(sys.argv[2])
e = encoder.encode(["A man plays a guitar.", "Someone makes music.", "x " * 40], batch_size=8)
print(json.dumps({"path": path, "hits": len(hits), "sha256": hashlib.sha256(e.tobytes()).hexdigest()}))
"""


@pytest.fixture
def restore_jax_cache():
    """enable_compilation_cache changes process-wide settings: the tests after this one compile as before."""
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {n: getattr(jax.config, n) for n in names}
    yield
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def test_a_second_process_loads_the_first_ones_compiles_and_encodes_the_same_bits(tmp_path, minilm_dir):
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _ENCODE_TWICE, str(tmp_path / "xla"), minilm_dir],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        if len(runs) == 1:
            entries = os.listdir(runs[0]["path"])
    first, second = runs
    assert first["path"] == second["path"] == str(tmp_path / "xla" / compile_cache.machine_key())
    assert first["hits"] == 0 and len(entries) > 0  # the first process compiled and wrote
    assert second["hits"] > 0  # the second loaded them
    assert sorted(os.listdir(second["path"])) == sorted(entries)  # and compiled nothing new
    assert first["sha256"] == second["sha256"]  # bitwise the same embeddings


def test_each_kind_of_machine_gets_its_own_directory(monkeypatch):
    here = compile_cache.machine_key()
    assert compile_cache.machine_key() == here and len(here) == 16
    monkeypatch.setattr(compile_cache, "cpu_flags", lambda: {"avx2", "fma"})  # an AVX2-only host
    avx2 = compile_cache.machine_key()
    monkeypatch.setattr(compile_cache, "cpu_flags", lambda: {"avx2", "fma", "avx512f", "amx_bf16"})
    assert len({here, avx2, compile_cache.machine_key()}) == 3
    monkeypatch.setattr(compile_cache, "cpu_model", lambda: "Another CPU")
    assert compile_cache.machine_key() not in {here, avx2}


def test_the_job_binding_keeps_the_jobs_compiles(tmp_path, restore_jax_cache):
    def job():
        return float(jax.jit(lambda x: jnp.sin(x) * 3.0 + 0.25)(jnp.arange(7.0)).sum())

    assert run(job=job, compilation_cache_dir=str(tmp_path / "c")) == pytest.approx(job())
    path = tmp_path / "c" / compile_cache.machine_key()
    assert jax.config.jax_compilation_cache_dir == str(path)
    assert len(os.listdir(path)) > 0


def test_bad_values_are_refused_with_their_name(tmp_path, restore_jax_cache):
    with pytest.raises(ConfigError, match="compilation_cache_dir='': want a directory path"):
        compile_cache.enable_compilation_cache("")
    with pytest.raises(ConfigError, match="min_compile_time_secs=-1: want a number >= 0"):
        compile_cache.enable_compilation_cache(str(tmp_path), -1)
    with pytest.raises(ConfigError, match="min_compile_time_secs='0': want a number >= 0"):
        compile_cache.enable_compilation_cache(str(tmp_path), "0")
    with pytest.raises(ConfigError, match="compilation_cache_dir='gs://': want a directory path"):
        compile_cache.enable_compilation_cache("gs://")
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ConfigError, match=r"compilation_cache_dir='.*/file': cannot create .*/file/"):
        compile_cache.enable_compilation_cache(str(tmp_path / "file"))
    assert jax.config.jax_compilation_cache_dir != str(tmp_path / "file")


def test_the_cold_start_benchmark_alternates_and_reports_the_ratios(monkeypatch, capsys, minilm_dir):
    """benchmarks.cold_start's bookkeeping, with its processes replaced by fixed rows (the real run is
    in docs/RESULTS.md): the priming process first, then per round both kinds, first one then the other."""
    from sentemb_jax.benchmarks import cold_start

    started = []

    def fake_start(args, cache):
        started.append("cache" if cache else "none")
        n = len(started)
        if cache:
            return {"load_s": 1.0, "first_encode_s": 6.0, "warm_up_s": 2.0, "steady_encode_s": 5.0, "reload_first_encode_s": 5.0,
                    "cache_hits": 30 + n}
        return {"load_s": 1.5, "first_encode_s": 9.0, "warm_up_s": 5.0, "steady_encode_s": 5.0, "reload_first_encode_s": 5.5,
                "cache_hits": 0}

    monkeypatch.setattr(cold_start, "_start", fake_start)
    monkeypatch.setattr(cold_start, "keep_jax_on_cpu_and_compiling", lambda: None)  # process-wide: not in a test
    assert cold_start.main(["--rounds", "2", "--model", minilm_dir]) == 0
    assert started == ["cache", "none", "cache", "cache", "none"]
    out = capsys.readouterr().out
    assert "warm_up_s: without / with the cache = 2.50" in out
    assert "first_encode_s: without / with the cache = 1.50" in out
    assert "first encode + warm_up: 14.00 s -> 8.00 s (1.75x)" in out
    assert "without cache: from_pretrained 1.50 s, first encode 9.00 s, warm_up() 5.00 s (steady encode 5.00 s; " \
           "a second load's first encode 5.50 s; 0 cache hits)" in out


def test_a_relative_or_pathlike_directory_is_made_absolute(tmp_path, monkeypatch, restore_jax_cache):
    monkeypatch.chdir(tmp_path)
    path = compile_cache.enable_compilation_cache("rel")
    assert path == str(tmp_path / "rel" / compile_cache.machine_key()) == jax.config.jax_compilation_cache_dir
    assert compile_cache.enable_compilation_cache(tmp_path / "p") == str(tmp_path / "p" / compile_cache.machine_key())
