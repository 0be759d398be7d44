"""What machine a benchmark ran on: CPU model, vector / matrix extensions, cores, and matmul peaks
measured in the run (so that numbers from different machines of the pool can be compared)."""
from __future__ import annotations

import os
import time

import jax
import numpy as np

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
