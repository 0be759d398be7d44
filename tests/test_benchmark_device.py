"""encode_throughput / train_throughput --device and --fp32_matmul: both sides on one device with the
same float32 matmul mode, said in the header; a GPU that JAX does not find is named before any work.
This machine has no GPU: the GPU path is checked through its pure parts and faked devices."""
from __future__ import annotations

import subprocess
import sys
import time
import types

import jax
import pytest

from sentemb_jax.benchmarks import encode_throughput as encode
from sentemb_jax.benchmarks import machine, torch_side
from sentemb_jax.benchmarks import train_throughput as train
from sentemb_jax.errors import UsageError

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

FAKE_GPU = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H200", id=0)


def test_fp32_matmul_settings_name_each_sides_switch():
    cpu = machine.fp32_matmul_settings("cpu")
    assert cpu["label"] == "ieee (CPU)" and cpu["torch_device"] == "cpu"
    assert cpu["jax_matmul_precision"] is None and cpu["torch_fp32_precision"] is None  # both keep their defaults
    assert cpu["ceiling_precision"] == "default"
    assert machine.fp32_matmul_settings("cpu", "ieee") == cpu
    gpu = machine.fp32_matmul_settings("gpu")  # IEEE unless asked: JAX's own GPU default would be TF32
    assert (gpu["torch_device"], gpu["jax_matmul_precision"], gpu["torch_fp32_precision"], gpu["ceiling_precision"]) == (
        "cuda", "highest", "ieee", "highest")
    tf32 = machine.fp32_matmul_settings("gpu", "tf32")
    assert (tf32["label"], tf32["jax_matmul_precision"], tf32["torch_fp32_precision"]) == ("tf32", "tensorfloat32", "tf32")
    with pytest.raises(UsageError, match="--fp32_matmul tf32: a mode of NVIDIA GPUs; on the CPU both sides"):
        machine.fp32_matmul_settings("cpu", "tf32")
    with pytest.raises(UsageError, match="--fp32_matmul 'fp16': one of ieee, tf32"):
        machine.fp32_matmul_settings("gpu", "fp16")
    with pytest.raises(UsageError, match="--device 'tpu': one of cpu, gpu"):
        machine.fp32_matmul_settings("tpu")


def test_the_header_line_states_both_sides():
    assert machine.fp32_matmul_line(machine.fp32_matmul_settings("cpu")) == (
        "fp32 matmul: ieee (CPU) on both sides (JAX and torch defaults)")
    assert machine.fp32_matmul_line(machine.fp32_matmul_settings("gpu", "tf32")) == (
        "fp32 matmul: tf32 on both sides (JAX jax_default_matmul_precision=tensorfloat32; "
        "torch cuda.matmul.fp32_precision=tf32)")


def test_applied_settings_reach_jax_programs_and_torch(monkeypatch):
    """What a worker sets: the precision of every dot JAX traces after it, torch's cuBLAS float32 mode
    (settable without a GPU). Restored afterwards: both are process-wide."""
    import torch

    x = jax.numpy.ones((4, 4))
    dot = lambda: jax.jit(lambda a, b: a @ b).lower(x, x).as_text()  # noqa: E731
    before_jax, before_torch = jax.config.jax_default_matmul_precision, torch.backends.cuda.matmul.fp32_precision
    try:
        machine.apply_jax_fp32_matmul(machine.fp32_matmul_settings("cpu"))  # the CPU: nothing changes
        torch_side.apply_torch_fp32_matmul(machine.fp32_matmul_settings("cpu"))
        assert jax.config.jax_default_matmul_precision == before_jax
        assert torch.backends.cuda.matmul.fp32_precision == before_torch
        for mode, hlo, cublas in (("ieee", "HIGHEST", "ieee"), ("tf32", "HIGH", "tf32")):
            settings = machine.fp32_matmul_settings("gpu", mode)
            machine.apply_jax_fp32_matmul(settings)
            torch_side.apply_torch_fp32_matmul(settings)
            assert f"precision = [{hlo}, {hlo}]" in dot()
            assert torch.backends.cuda.matmul.fp32_precision == cublas
    finally:
        jax.config.update("jax_default_matmul_precision", before_jax)
        torch.backends.cuda.matmul.fp32_precision = before_torch


@pytest.mark.parametrize("module", ["encode_throughput", "train_throughput"])
def test_device_gpu_without_a_gpu_is_named_before_any_work(module):
    """The real command: exit 2 (a command line this machine cannot run, as step_time's --device), the
    message last on stderr naming what JAX found, stdout empty (no header, no model, no worker)."""
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", f"sentemb_jax.benchmarks.{module}", "--device", "gpu"],
                         capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - started
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{module}.py: error: --device gpu: JAX finds no GPU here, only cpu (cpu)"), last
    assert out.stdout == ""
    assert seconds < 120, seconds  # the imports; nothing loads a model


def test_a_gpu_jax_finds_lets_its_processes_share_it_and_one_torch_does_not_find_is_named(monkeypatch):
    import os

    import torch

    monkeypatch.setattr(machine, "_compile_every_time", lambda: None)  # process-wide: not in a test
    monkeypatch.setattr(machine, "select_devices", lambda name: [FAKE_GPU])
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # as set; select_benchmark_device leaves it
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "")  # so that the unset below is undone after the test
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
    assert machine.select_benchmark_device("gpu") == ("gpu", [FAKE_GPU])
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"  # side-by-side workers share the GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match=r"--device gpu: JAX finds 1 x NVIDIA H200 \(gpu\) but torch .* finds no CUDA"):
        encode.check_torch_finds("gpu", [FAKE_GPU])
    encode.check_torch_finds("cpu", jax.devices("cpu"))  # the CPU: nothing to check
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    encode.check_torch_finds("gpu", [FAKE_GPU])


def test_gpu_rows_refuse_cpu_only_runtimes_and_add_torch_autocast():
    kinds = encode._kinds(True, False, None)
    assert encode._on_device(kinds, "cpu", True) == kinds  # the CPU: as before
    assert encode._on_device(kinds, "gpu", True) == [*kinds, "sentence_transformers_autocast_bf16"]
    assert encode._on_device(encode._kinds(False, False, None), "gpu", False) == encode._kinds(False, False, None)
    with pytest.raises(UsageError, match=r"--device gpu: rows \['sentemb_jax_onnx'\] run on the CPU only"):
        encode._on_device(encode._kinds(False, False, "sentemb_jax_onnx"), "gpu", False)


def _side_by_side(seen, rates):
    def run(workers, rounds, label="sent/s", count=1, startup=None, start_together=False):
        seen.update(workers)
        run.together.append(start_together)
        startup.update({n: {"first_call_s": 1.0, "stsb_test": 82.0} for n in workers})
        return {n: rates.get(n, 100.0) for n in workers}
    run.together = []
    return run


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_encode_header_and_workers_follow_the_device(monkeypatch, capsys, data_dir, device):
    """Every worker gets the device's settings (torch 'cuda' on a GPU) and its default batch; the
    header's second line states the fp32 matmul mode of both sides."""
    seen: dict = {}
    devices = jax.devices("cpu") if device == "cpu" else [FAKE_GPU]
    monkeypatch.setattr(encode, "select_benchmark_device", lambda name: (device, devices))
    monkeypatch.setattr(encode, "check_torch_finds", lambda device, devices: None)  # no CUDA here
    side_by_side = _side_by_side(seen, {"sentence_transformers": 50.0})
    monkeypatch.setattr(encode, "run_side_by_side", side_by_side)
    encode.main(["--only", "sentemb_jax_packed", "--data_dir", data_dir])
    assert side_by_side.together == [device == "gpu"]  # a GPU host's cores start the workers side by side
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("machine: ") and (device == "cpu" or out[0] == "machine: 1 x NVIDIA H200 (gpu)")
    torch_device = {"cpu": "cpu", "gpu": "cuda"}[device]
    assert out[1] == (f"device: {device} (sentence-transformers on torch {torch_device}); "
                      + machine.fp32_matmul_line(machine.fp32_matmul_settings(device)))
    assert out[2].startswith("GPU memory: ") == (device == "gpu")
    for _, args in seen.values():  # (kind, model, data_dir, texts, batch, threads, onnx_paths, settings, xla_flags)
        assert args[4] == {"cpu": 64, "gpu": 512}[device] and args[7] == machine.fp32_matmul_settings(device)
    assert out[-1] == "ratio_vs_sentence_transformers=2.00"


def test_train_mfu_is_against_a_ceiling_measured_on_the_device_with_the_spec_peak_beside(monkeypatch, capsys, data_dir):
    """A GPU run (faked): float32 and bf16 rows each against the ceiling of their dtype and mode on the
    device, the data-sheet peak beside; bf16 rows pair JAX bf16 with torch autocast."""
    seen: dict = {}
    ceilings = []

    def ceiling(device, dtype, precision):
        ceilings.append((device, dtype, precision))
        return 400e12 if dtype == "bfloat16" else 50e12

    monkeypatch.setattr(train, "select_benchmark_device", lambda name: ("gpu", [FAKE_GPU]))
    monkeypatch.setattr(train, "check_torch_finds", lambda device, devices: None)  # no CUDA here
    monkeypatch.setattr(train, "matmul_ceiling", ceiling)
    monkeypatch.setattr(train, "run_side_by_side", _side_by_side(seen, {"sentemb_jax": 2000.0, "sentemb_jax_bf16": 4000.0}))
    train.main(["--bf16", "--data_dir", data_dir, "--steps", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("device: gpu (sentence-transformers on torch cuda); fp32 matmul: ieee on both sides")
    assert list(seen) == ["sentemb_jax", "sentence_transformers", "sentemb_jax_bf16", "sentence_transformers_autocast_bf16"]
    # (kind, model, pairs, batch, steps, threads, pack, bf16, settings)
    assert [(a[0], a[3], a[7], a[8]["torch_device"]) for _, a in seen.values()] == [
        ("sentemb_jax", 512, False, "cuda"), ("sentence_transformers", 512, False, "cuda"),
        ("sentemb_jax", 512, True, "cuda"), ("sentence_transformers", 512, True, "cuda")]
    assert ceilings == [(FAKE_GPU, "float32", "highest"), (FAKE_GPU, "bfloat16", "default")]
    assert "float32 matmul ceiling (JAX, gpu, this run, fp32 matmul ieee): 50.000 TFLOP/s; spec peak 67 TFLOP/s" in out
    assert "bfloat16 matmul ceiling (JAX, gpu, this run): 400.000 TFLOP/s; spec peak 989 TFLOP/s" in out
    row = next(line for line in out if line.startswith("sentemb_jax: "))
    assert row.startswith("sentemb_jax: 2000.0 pairs/s (median), MFU ") and "% of the spec peak" in row
    assert out[-2] == "sentemb_jax_bf16 / sentence_transformers_autocast_bf16 = 40.00"
    assert out[-1] == "ratio_vs_sentence_transformers=20.00"


def test_train_on_the_cpu_measures_its_ceiling_there(monkeypatch, capsys, data_dir):
    seen: dict = {}
    monkeypatch.setattr(train, "select_benchmark_device", lambda name: ("cpu", jax.devices("cpu")))
    monkeypatch.setattr(train, "run_side_by_side", _side_by_side(seen, {"sentemb_jax": 50.0, "sentence_transformers": 25.0}))
    train.main(["--data_dir", data_dir, "--steps", "1"])
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "device: cpu (sentence-transformers on torch cpu); fp32 matmul: ieee (CPU) on both sides (JAX and torch defaults)"
    assert list(seen) == ["sentemb_jax", "sentence_transformers"] and seen["sentemb_jax"][1][3] == 64
    assert any(line.startswith("float32 matmul ceiling (JAX, cpu, this run, fp32 matmul ieee (CPU)): ") and
               line.endswith("no spec peak known for this device") for line in out)
    assert out[-1] == "ratio_vs_sentence_transformers=2.00"


def test_too_few_pairs_for_the_steps_are_named(monkeypatch, data_dir):
    monkeypatch.setattr(train, "select_benchmark_device", lambda name: ("cpu", jax.devices("cpu")))
    monkeypatch.setattr(train, "run_side_by_side", lambda *a, **k: pytest.fail("workers started"))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data_dir", data_dir, "--steps", "100000", "--batch_size", "64"])
    assert "entailment pairs, fewer than --steps 100000 x --batch_size 64" in str(exit_info.value.code)
