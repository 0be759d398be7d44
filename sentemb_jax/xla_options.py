"""XLA's GPU options as a small named set, not folklore in XLA_FLAGS.

    python -m sentemb_jax.main --gin_file=... --gin.run.xla_options="('autotune_cache', 'triton_gemm_off')"
    python -m sentemb_jax.benchmarks.step_time ... --xla_options=autotune_cache,command_buffers_off

Each name stands for XLA flags (GPU_OPTIONS) that the accelerator report A/Bs one at a time against
XLA's defaults. XLA reads XLA_FLAGS once, when its backend starts, and aborts the process on a flag
it does not know: so a name is checked against this table before anything compiles (an unknown
one is a ConfigError listing the known ones), and applying options after the backend has started
is refused rather than silently ignored. The flags are XLA's DebugOptions, which every build
parses (a CPU-only jaxlib accepts them and does nothing with them).
"""
from __future__ import annotations

import os
from typing import Iterable

from jax._src import xla_bridge  # backend_started: no public API says whether XLA's backend has started

from sentemb_jax.errors import ConfigError
from sentemb_jax.paths import is_remote

# name -> (flags, with {run_dir} for the run's directory; what the option changes)
GPU_OPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "command_buffers_off": (("--xla_gpu_enable_command_buffer=",),
                            "every kernel launched from the host, no CUDA graphs (XLA records them by default)"),
    "triton_gemm_off": (("--xla_gpu_enable_triton_gemm=false",),
                        "matrix products from cuBLAS only, no Triton GEMM fusions"),
    "cublaslt": (("--xla_gpu_enable_cublaslt=true",),
                 "cuBLASLt for matrix products: bias and activation epilogues fused into the GEMM"),
    "latency_hiding": (("--xla_gpu_enable_latency_hiding_scheduler=true",),
                       "the latency-hiding scheduler: collectives overlapped with compute (meshes of GPUs)"),
    "autotune_cache": (("--xla_gpu_per_fusion_autotune_cache_dir={run_dir}/xla_autotune",),
                       "autotuning results kept in the run directory: a restarted run does not tune again"),
}


def xla_flags(names: Iterable[str], run_dir: str | None = None, *, where: str = "xla_options") -> list[str]:
    """The XLA flags of the named options, in order. ConfigError naming `where` for an unknown or
    repeated name, or for 'autotune_cache' without a run directory."""
    if isinstance(names, str):
        raise ConfigError(f"{where} = {names!r}: want a tuple of option names, e.g. ({names!r},)")
    flags, seen = [], set()
    for name in names:
        if name not in GPU_OPTIONS:
            raise ConfigError(f"{where}: unknown XLA option {name!r}; known: {', '.join(sorted(GPU_OPTIONS))}")
        if name in seen:
            raise ConfigError(f"{where}: XLA option {name!r} given twice")
        seen.add(name)
        templates, _ = GPU_OPTIONS[name]
        if any("{run_dir}" in t for t in templates) and not run_dir:
            raise ConfigError(f"{where}: XLA option {name!r} keeps its files in the run directory, and this job has none "
                              "(set MODEL_DIR)")
        if any("{run_dir}" in t for t in templates) and is_remote(run_dir):
            raise ConfigError(f"{where}: XLA option {name!r} keeps its files in the run directory, and {run_dir} is not "
                              "local (XLA writes the autotuning cache to a local path)")
        flags += [t.format(run_dir=os.path.abspath(os.path.expanduser(run_dir or ""))) for t in templates]
    return flags


def backend_started() -> bool:
    """Whether this process's XLA backend has started (XLA_FLAGS set from now on do nothing)."""
    return xla_bridge.backends_are_initialized()


def apply_xla_options(names: Iterable[str], run_dir: str | None = None, *, where: str = "xla_options") -> list[str]:
    """Append the named options' flags to this process's XLA_FLAGS (and return them). Refused once
    XLA's backend has started: the flags would then do nothing."""
    flags = xla_flags(names, run_dir, where=where)
    if not flags:
        return flags
    if backend_started():
        raise ConfigError(f"{where}: XLA options {' '.join(flags)} come too late: this process's XLA backend has started")
    if "autotune_cache" in names:
        os.makedirs(os.path.join(os.path.abspath(os.path.expanduser(run_dir)), "xla_autotune"), exist_ok=True)
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()
    return flags
