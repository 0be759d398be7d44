"""What this host is: its CPU model, the CPU's extensions and the cores this process may use
(what benchmarks print first, and what keys the compilation cache: sentemb_jax.compile_cache)."""
from __future__ import annotations

import os
import platform


def _cpuinfo_field(name: str) -> str | None:
    """The first `name : value` line of /proc/cpuinfo (None off Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith(name))
    except (OSError, StopIteration):
        return None


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
