"""A persistent XLA compilation cache, one directory per kind of machine.

    from sentemb_jax import enable_compilation_cache
    enable_compilation_cache("~/.cache/sentemb_jax/xla")   # before the first encode / train step
    # a job: --gin.run.compilation_cache_dir="'~/.cache/sentemb_jax/xla'" (a gs:// path on a TPU pod)

A process that restarts (a server scaled out, a preempted training run) then loads the executables
an earlier process compiled instead of compiling them again (measured: docs/RESULTS.md, "Speed on
every CPU"). It is jax's own cache (`jax_compilation_cache_dir`) with two settings changed:

* Every compile is kept, not only those over jax's default second: an encoder's bucket shapes
  compile in 0.1-1 s each, and there are dozens of them.
* Each machine kind gets its own subdirectory. jax's key names the platform ("cpu") but not the
  CPU's extensions, and XLA:CPU compiles for the host's: an executable built on an AVX-512 / AMX
  host, loaded by an AVX2 host sharing the directory (an NFS home), would die on SIGILL.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform

import jax
import jaxlib
from jax.experimental.compilation_cache import compilation_cache

from sentemb_jax.errors import ConfigError
from sentemb_jax.host import cpu_flags, cpu_model
from sentemb_jax.paths import is_remote


def machine_key() -> str:
    """Names what an executable compiled here depends on beyond jax's own key: the architecture,
    the CPU model and extensions, and the jax / jaxlib versions (they change the executable format)."""
    flags = sorted(cpu_flags())
    facts = [platform.machine(), cpu_model(), flags, jax.__version__, jaxlib.__version__]
    if not flags:  # nothing says what this CPU can run (macOS, an unknown /proc/cpuinfo): this host only
        facts.append(platform.node())
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]


def cache_hits() -> list[str]:
    """A list that grows by one for each compile this process loads from the cache from now on (jax's
    monitoring events: counted, not timed)."""
    hits: list[str] = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
    return hits


def enable_compilation_cache(directory: str, min_compile_time_secs: float = 0.0) -> str:
    """Keep every compile (taking over min_compile_time_secs) in `directory`/<machine_key()>, and
    read them back in later processes; returns that path. Call it before the first compile; a call
    after it applies to the compiles from then on."""
    directory = os.fspath(directory) if isinstance(directory, os.PathLike) else directory
    if not isinstance(directory, str) or not directory.strip() or directory.rstrip("/").endswith(":"):
        raise ConfigError(f"compilation_cache_dir={directory!r}: want a directory path")
    if isinstance(min_compile_time_secs, bool) or not isinstance(min_compile_time_secs, (int, float)) \
            or not min_compile_time_secs >= 0:
        raise ConfigError(f"min_compile_time_secs={min_compile_time_secs!r}: want a number >= 0")
    remote = is_remote(directory)
    path = (directory.rstrip("/") + "/" if remote else os.path.join(os.path.abspath(os.path.expanduser(directory)), ""))
    path += machine_key()
    if not remote:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"compilation_cache_dir={directory!r}: cannot create {path}: {e.strerror}") from None
    jax.config.update("jax_enable_compilation_cache", True)  # JAX_ENABLE_COMPILATION_CACHE=false would turn it off
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # a process that compiled before this call checks the cache again
    return path
