"""SIGTERM / SIGINT during training: finish the step, checkpoint it, stop with a distinct exit code.

Preemptible / spot TPU VMs get SIGTERM shortly before they go, and Ctrl-C is SIGINT. Inside the
train loop both only set a flag; the loop finishes the step under way, writes a checkpoint of it
(model, optimizer and input position), waits for the write to be final and raises `Preempted`.
The job runner exits with 128 + the signal number (143 for SIGTERM, 130 for SIGINT), and the
same command resumes exactly from that step. A second Ctrl-C stops at once (KeyboardInterrupt).
On several processes the flag is combined across them every step, so all stop at the same step.
"""
from __future__ import annotations

import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils


class StopSignals:
    """Context manager: while inside, SIGTERM and SIGINT set `requested()` instead of killing."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self._signum: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self._signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: the user does not want to wait for the checkpoint
        self._signum = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def requested(self) -> int | None:
        """The signal received (by any process of the job), else None."""
        if jax.process_count() == 1:
            return self._signum

        seen = multihost_utils.process_allgather(np.int32(self._signum or 0))
        return int(np.max(seen)) or None
