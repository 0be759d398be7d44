"""Run one of our modules in a child Python process, and name the signal when it dies on one.

The TPU compiler (libtpu 0.0.42) dies on a signal for some shapes (a stack overflow on its own
threads, docs/scale.md). Tools that compile many configs run each compile in a child, so one
crash names its config, keeps its output in a file, and the others are still compiled."""
from __future__ import annotations

import os
import subprocess
import sys

from sentemb_jax.errors import signal_name
from sentemb_jax.paths import new_cache_log


def what_went_wrong(done: subprocess.CompletedProcess, died: str | None) -> str:
    """A failed child in one line: run_module's 'died on SIGSEGV; its output: FILE', or 'exited with 3:
    <its last stderr line>'."""
    return died or f"{how_it_ended(done.returncode)}: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"


def how_it_ended(returncode: int) -> str:
    """'exited with 3', or 'died on SIGILL' for a process a signal ended (a negative return code)."""
    return f"died on {signal_name(-returncode)}" if returncode < 0 else f"exited with {returncode}"


def keep_output(done: subprocess.CompletedProcess, tag: str) -> str:
    """A child's stdout and stderr, kept in a new file of the cache log directory; its path."""
    kept = new_cache_log(tag)
    with open(kept, "w", encoding="utf-8") as f:
        f.write(done.stdout + done.stderr)
    return kept


def run_module(module: str, args: list[str], tag: str,
               env: dict | None = None) -> tuple[subprocess.CompletedProcess, str | None]:
    """`python -m module args` with its output captured; (the finished process, None), or, when it died
    on a signal, (it, "died on SIGSEGV; its output: FILE"): the output (a crash's trace) is kept in a
    new file of the cache log directory (keep_output), not printed. env: variables set for the child
    on top of this process's."""
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          errors="replace", cwd=os.getcwd(),  # a crash dump need not be UTF-8
                          env={**os.environ, **env} if env else None)
    if done.returncode >= 0:
        return done, None
    return done, f"{how_it_ended(done.returncode)}; its output: {keep_output(done, tag)}"
