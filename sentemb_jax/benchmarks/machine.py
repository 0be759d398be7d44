"""What machine a benchmark ran on: CPU model, vector / matrix extensions, cores, and matmul peaks
measured in the run (so that numbers from different machines of the pool can be compared)."""
from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from sentemb_jax.errors import UsageError
from sentemb_jax.host import cpu_flags, cpu_model, usable_cores  # noqa: F401  (benchmarks import them from here)

# Extensions that decide CPU inference speed: AVX2 / AVX-512 (float32 FMA), VNNI (int8 dot
# products), AVX512-BF16 (bfloat16 dot products), AMX (bfloat16 / int8 matrix tiles).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
# Settings that make a library use fewer of those extensions than the CPU has (to see how a run
# would go on an older CPU): XLA (in XLA_FLAGS), ATen, MKL, oneDNN, OpenBLAS. A benchmark run
# under them says so on its first line.
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE")


def keep_jax_on_cpu_and_compiling() -> None:
    """These benchmarks compare CPUs, and sentence-transformers' rows run on the CPU; JAX would take
    a GPU or TPU where the machine has one. So JAX runs on the CPU too, in this process and in the
    workers it starts, unless JAX_PLATFORMS says otherwise.
    They also time compiles ("first call from cold"): a persistent compilation cache set in the
    environment (JAX_COMPILATION_CACHE_DIR) would turn those into loads from a folder, so it is off
    here and in the workers (benchmarks.cold_start turns it on where it measures it)."""
    if not os.environ.get("JAX_PLATFORMS"):
        os.environ["JAX_PLATFORMS"] = "cpu"  # worker processes read it when they import jax
        jax.config.update("jax_platforms", "cpu")  # this process imported jax before
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    jax.config.update("jax_enable_compilation_cache", False)


def cpu_description() -> str:
    """'<model> (<extensions>), <n> cores' - the first line a benchmark prints ('<n> of <m> cores'
    when the process may use fewer than the host has)."""
    flags = cpu_flags()
    isa = [x for x in ISA_FLAGS if x in flags]
    caps = [f"{name}={os.environ[name]}" for name in ISA_CAPS if os.environ.get(name)]
    caps += [flag for flag in os.environ.get("XLA_FLAGS", "").split() if flag.startswith("--xla_cpu_max_isa")]
    capped = f"; extensions capped by {' '.join(caps)}" if caps else ""
    usable, host = usable_cores(), os.cpu_count()
    cores = f"{usable} cores" if usable == host else f"{usable} of {host} cores"
    return f"{cpu_model()} ({', '.join(isa) or 'ISA unknown'}), {cores}{capped}"


def numpy_matmul_gflops(n: int = 2048, repeats: int = 10) -> float:
    """float32 n x n matmul rate of numpy (its BLAS) on this machine, now."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    start = time.perf_counter()
    for _ in range(repeats):
        a @ a
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e9


# Dense peak FLOP/s from the vendors' data sheets, by device kind (jax's device_kind) and the dtype
# the matmuls run in: bf16, tf32 (float32 dots at JAX's default precision on NVIDIA GPUs) or fp32
# (float32 at precision 'highest'). A benchmark prints MFU against these beside the ceiling it
# measures itself.
SPEC_PEAKS = {
    "H100 PCIe": {"bfloat16": 756e12, "tf32": 378e12, "float32": 51e12},
    "H100": {"bfloat16": 989e12, "tf32": 495e12, "float32": 67e12},  # SXM
    "H200": {"bfloat16": 989e12, "tf32": 495e12, "float32": 67e12},
    "A100": {"bfloat16": 312e12, "tf32": 156e12, "float32": 19.5e12},
    "TPU v4": {"bfloat16": 275e12},
    "TPU v5 lite": {"bfloat16": 197e12},
    "TPU v5": {"bfloat16": 459e12},
    "TPU v6 lite": {"bfloat16": 918e12},
}
PLATFORMS = ("cpu", "gpu", "tpu")


def select_devices(name: str | None) -> list:
    """The devices a benchmark runs on: those of platform `name` ('cpu', 'gpu', 'tpu'), or, for
    None, what JAX finds by default. A platform JAX does not find is an error naming what it found."""
    if name is None:
        return jax.devices()
    if name not in PLATFORMS:
        raise UsageError(f"--device {name!r}: one of {', '.join(PLATFORMS)}")
    try:
        devices = jax.devices(name)
    except RuntimeError:
        devices = []
    if not devices:
        found = ", ".join(sorted({f"{d.platform} ({d.device_kind})" for d in jax.devices()}))
        hint = " (JAX_PLATFORMS=%s limits JAX to those)" % os.environ["JAX_PLATFORMS"] if os.environ.get("JAX_PLATFORMS") else ""
        raise UsageError(f"--device {name}: JAX finds no {name.upper()} here, only {found}{hint}")
    return devices


def device_description(devices) -> str:
    """'<n> x <device kind>' for accelerators; the CPU's description (model, extensions, cores) for CPUs."""
    first = devices[0]
    if first.platform == "cpu":
        return cpu_description()
    return f"{len(devices)} x {first.device_kind} ({first.platform})"


def _matmul_kind(device, dtype: str, precision: str) -> str:
    if str(dtype) in ("bfloat16", "float16"):
        return "bfloat16"
    if device.platform == "gpu" and precision != "highest":
        return "tf32"  # XLA:GPU runs float32 dots as TF32 unless the precision is 'highest'
    return "float32"


def spec_peak(device, dtype: str = "float32", precision: str = "default") -> float | None:
    """The data-sheet dense peak FLOP/s of `device` for matmuls in `dtype` at `precision`; None
    where none is known (CPUs, other accelerators)."""
    kind = getattr(device, "device_kind", "")
    for name in sorted(SPEC_PEAKS, key=len, reverse=True):  # 'H100 PCIe' before 'H100'
        if name.lower() in kind.lower():
            return SPEC_PEAKS[name].get(_matmul_kind(device, dtype, precision))
    return None


def matmul_ceiling(device, dtype: str = "float32", precision: str = "default", n: int | None = None,
                   repeats: int | None = None) -> float:
    """FLOP/s of an n x n matmul in `dtype` at `precision` ('default', 'high', 'highest') on
    `device`, measured now: the fastest of a few calls after a warm-up, the device synchronised
    before every clock read. What a step's MFU is measured against, on the same device."""
    cpu = device.platform == "cpu"
    n = n or (2048 if cpu else 8192)
    a = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype), device)
    product = jax.jit(lambda x, y: x @ y)
    with jax.default_matmul_precision(None if precision == "default" else precision):
        product(a, a).block_until_ready()
        best = float("inf")
        for _ in range(repeats or (3 if cpu else 20)):
            started = time.perf_counter()
            product(a, a).block_until_ready()
            best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best
