"""Deterministic fault injection for tests of kill-and-resume: no wall-clock race.

    SENTEMB_FAULT=after_step:N   SIGKILL right after step N's update has been checkpointed (if
                                 step N is a checkpoint step, once its write is finalised) - the
                                 moment between two checkpoints
    SENTEMB_FAULT=sigterm_after_step:N  SIGTERM (a preemption notice) right after step N; the loop
                                 checkpoints step N and stops (sentemb_jax.training.preemption)
    SENTEMB_FAULT=in_save:N      SIGKILL inside the write of step N's checkpoint: every byte is
                                 written under orbax's temporary name, the rename that finalises
                                 it has not happened (the moment a half-written checkpoint exists)
    SENTEMB_FAULT=after_rung:K   SIGKILL of a scaling study right after its K-th rung is finished
                                 (trained, evaluated, rung.json written) and before the next starts
    SENTEMB_FAULT=sigterm_in:PHASE  SIGTERM to the job at the start of a phase outside the train
                                 loop: eval_at_start, teacher_embedding, export, or
                                 prepare_after_shard (in prepare_corpus's parent, once its first
                                 shard is finished, while the workers write the others)

Unset (always, outside tests) it does nothing. The train loop calls `install()` once and
`after_step(step, wait)` after each step; each phase calls `in_phase(name)` as it starts.
"""
from __future__ import annotations

import functools
import os
import signal

ENV = "SENTEMB_FAULT"
KINDS = ("after_step", "sigterm_after_step", "in_save", "after_rung")
PHASES = ("eval_at_start", "teacher_embedding", "export", "prepare_after_shard")


def planned() -> tuple[str, int | str] | None:
    value = os.environ.get(ENV)
    if not value:
        return None
    kind, _, where = value.partition(":")
    if kind == "sigterm_in" and where in PHASES:
        return kind, where
    if kind not in KINDS or not where.isdigit():
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(k + ':<step>' for k in KINDS)} "
                         f"or sigterm_in:<{'|'.join(PHASES)}>")
    return kind, int(where)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    """For in_save:N, make orbax's finalisation of checkpoint N (a directory named N under a
    `checkpoints` directory) kill the process before it renames the temporary directory."""
    plan = planned()
    if plan is None or plan[0] != "in_save":
        return
    from orbax.checkpoint._src.path import (
        atomicity,  # the class whose finalize() renames tmp -> N  # lazy: a private orbax module, only for the test-only fault injection
    )

    cls = atomicity.AtomicRenameTemporaryPath
    if getattr(cls.finalize, "_sentemb_fault", False):
        return
    original = cls.finalize

    @functools.wraps(original)
    async def finalize(self):
        final = self.get_final()
        if final.name == str(plan[1]) and final.parent.name == "checkpoints":
            _die()
        return await original(self)

    finalize._sentemb_fault = True
    cls.finalize = finalize


def after_step(step: int, wait_for_checkpoint) -> None:
    plan = planned()
    if plan == ("after_step", step):
        wait_for_checkpoint()  # a checkpoint of this step, if one was started, is finalised first
        _die()
    if plan == ("sigterm_after_step", step):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before this call returns


def in_phase(name: str) -> None:
    if planned() == ("sigterm_in", name):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before this call returns


def after_rung(finished: int) -> None:
    if planned() == ("after_rung", finished):
        _die()
