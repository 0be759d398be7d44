"""What machine a benchmark ran on: CPU model, vector / matrix extensions, cores, and matmul peaks
measured in the run (so that numbers from different machines of the pool can be compared)."""
from __future__ import annotations

import importlib.util
import os
import time

import jax
import jax.extend.backend
import jax.numpy as jnp
import numpy as np

import sentemb_jax  # its _GPU_PLUGINS: the jaxlib plugins that give JAX a GPU
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
        _pin_jax_platform("cpu")
    _compile_every_time()


def _pin_jax_platform(platform: str) -> None:
    os.environ["JAX_PLATFORMS"] = platform  # worker processes read it when they import jax
    jax.config.update("jax_platforms", platform)  # this process imported jax before


def _compile_every_time() -> None:
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    jax.config.update("jax_enable_compilation_cache", False)


# The devices a JAX-vs-torch benchmark (encode_throughput, train_throughput) runs both sides on, as
# torch names them. No TPU: torch (sentence-transformers) has no TPU backend here.
TORCH_DEVICES = {"cpu": "cpu", "gpu": "cuda"}
FP32_MATMUL_MODES = ("ieee", "tf32")


def select_benchmark_device(name: str | None) -> tuple[str, list]:
    """('cpu' | 'gpu', JAX's devices there) for a benchmark that runs JAX and torch side by side on one
    device. `name` None: a GPU where JAX's default backend is one, else the CPU. Called before this
    process's JAX backend starts; it
    - lets every process allocate GPU memory as it needs it (XLA_PYTHON_CLIENT_PREALLOCATE=false,
      unless set): by default each JAX process takes 75% of the GPU at start, so the second of the
      side-by-side workers would run out of memory;
    - keeps JAX off the GPU for --device cpu (and in the workers: JAX_PLATFORMS, read when they import jax);
    - turns the persistent compilation cache off, as keep_jax_on_cpu_and_compiling does.
    A GPU that JAX does not find is a UsageError naming what it found, before any model loads (torch's
    side: torch_side.check_torch_finds; this module imports no torch, for step_time's sake)."""
    if name not in (None, *TORCH_DEVICES):
        raise UsageError(f"--device {name!r}: one of {', '.join(TORCH_DEVICES)}")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if name == "cpu" and not os.environ.get("JAX_PLATFORMS"):
        _pin_jax_platform("cpu")
    _compile_every_time()
    if name is None:
        name = "gpu" if jax.default_backend() == "gpu" else "cpu"
    try:
        devices = select_devices(name)
    except UsageError as e:
        if name == "gpu" and not any(importlib.util.find_spec(p) for p in sentemb_jax._GPU_PLUGINS):
            raise UsageError(f"{e}; no GPU plugin of jaxlib is installed (e.g. pip install 'jax[cuda12]')") from None
        raise
    # The workers take the same platform (they read JAX_PLATFORMS when they import jax), named as JAX
    # started it here: 'gpu' there would expand to every GPU plugin (cuda, rocm, oneapi), each one
    # that is not installed an error.
    started = next((p for p in jax.extend.backend.backends() if p in ("cuda", "rocm", "oneapi")), None)
    if not os.environ.get("JAX_PLATFORMS") and (name == "cpu" or started):
        os.environ["JAX_PLATFORMS"] = started if name == "gpu" else "cpu"
    return name, devices


def fp32_matmul_settings(device: str, mode: str | None = None) -> dict:
    """How float32 matmuls run on both sides of a benchmark on `device` ('cpu' | 'gpu'); `mode` 'ieee'
    (the default) or 'tf32' (--fp32_matmul). On NVIDIA GPUs JAX multiplies float32 in TF32 by default
    and torch in IEEE float32, so an unset mode would compare different arithmetic: both are set
    explicitly. The CPU has no TF32: there both libraries keep their defaults (IEEE float32), as before
    this option. A pure function (tested without a GPU); apply_jax_fp32_matmul and
    torch_side.apply_torch_fp32_matmul set it in a worker."""
    mode = mode or "ieee"
    if mode not in FP32_MATMUL_MODES:
        raise UsageError(f"--fp32_matmul {mode!r}: one of {', '.join(FP32_MATMUL_MODES)}")
    if device == "cpu":
        if mode != "ieee":
            raise UsageError(f"--fp32_matmul {mode}: a mode of NVIDIA GPUs; on the CPU both sides multiply float32 "
                             "in IEEE float32 (leave it out, or use --device gpu)")
        return {"device": "cpu", "mode": "ieee", "label": "ieee (CPU)", "torch_device": "cpu",
                "jax_matmul_precision": None, "torch_fp32_precision": None, "ceiling_precision": "default"}
    if device not in TORCH_DEVICES:
        raise UsageError(f"--device {device!r}: one of {', '.join(TORCH_DEVICES)}")
    ieee = mode == "ieee"
    jax_precision = "highest" if ieee else "tensorfloat32"
    return {"device": device, "mode": mode, "label": "ieee" if ieee else "tf32", "torch_device": TORCH_DEVICES[device],
            "jax_matmul_precision": jax_precision, "torch_fp32_precision": "ieee" if ieee else "tf32",
            "ceiling_precision": jax_precision}


def fp32_matmul_line(settings: dict) -> str:
    """The header line that states (and so lets a reader check) the float32 matmul mode of both sides."""
    if settings["jax_matmul_precision"] is None:
        return f"fp32 matmul: {settings['label']} on both sides (JAX and torch defaults)"
    return (f"fp32 matmul: {settings['label']} on both sides (JAX jax_default_matmul_precision="
            f"{settings['jax_matmul_precision']}; torch cuda.matmul.fp32_precision={settings['torch_fp32_precision']})")


def apply_jax_fp32_matmul(settings: dict) -> None:
    """In a JAX worker, before its model is built: the float32 matmul mode of fp32_matmul_settings."""
    if settings["jax_matmul_precision"]:  # read when a function is traced: every jit after this
        jax.config.update("jax_default_matmul_precision", settings["jax_matmul_precision"])


def gpu_memory_line() -> str:
    """How the side-by-side processes share one GPU's memory (a line of a GPU run's header)."""
    fraction = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    return (f"GPU memory: every JAX process XLA_PYTHON_CLIENT_PREALLOCATE={os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE')}"
            f"{f' XLA_PYTHON_CLIENT_MEM_FRACTION={fraction}' if fraction else ''} (false: allocates as it needs, "
            "so the workers share the GPU)")


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
    `device`, measured now: the best of three rounds of `repeats` products issued back to back
    (as a step's matmuls run: one launch's host latency hides behind the last), after a warm-up,
    the device synchronised before every clock read. What a step's MFU is measured against."""
    cpu = device.platform == "cpu"
    n = n or (2048 if cpu else 8192)
    a = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype), device)
    b = jax.device_put(jnp.asarray(np.random.default_rng(1).standard_normal((n, n)), dtype), device)
    product = jax.jit(lambda x, y: x @ y)
    repeats = repeats or (2 if cpu else 20)
    with jax.default_matmul_precision(None if precision == "default" else precision):
        product(a, b).block_until_ready()
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            for _ in range(repeats):
                out = product(a, b)
            out.block_until_ready()
            best = min(best, (time.perf_counter() - started) / repeats)
    return 2 * n**3 / best
