"""What this host is: its CPU model, the CPU's extensions and the cores this process may use
(what benchmarks print first, and what keys the compilation cache: sentemb_jax.compile_cache)."""
from __future__ import annotations

import functools
import os
import platform


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """The first value of each field of /proc/cpuinfo (the first CPU's); empty off Linux."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def _cpuinfo_field(name: str) -> str | None:
    return _cpuinfo().get(name) or None


def cpu_flags() -> set[str]:
    """The CPU's extensions (x86 `flags`, Arm `Features`); empty where /proc/cpuinfo says neither."""
    return set((_cpuinfo_field("flags") or _cpuinfo_field("Features") or "").split())


def cpu_model() -> str:
    arm = [_cpuinfo_field(f) for f in ("CPU implementer", "CPU part")]
    return (_cpuinfo_field("model name") or (" ".join(f"Arm {v}" for v in arm) if all(arm) else None)
            or platform.processor() or "unknown CPU")


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask (taskset, a container's cpuset), which XLA's
    thread pool also follows; os.cpu_count() counts the whole host."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS)
        return os.cpu_count() or 1
