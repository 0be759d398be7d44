"""Gin helpers that compose jobs: several jobs one after another, a path built from macros."""
from __future__ import annotations

import os

import gin


@gin.configurable(module="sentemb_jax")
def join_path(parts=gin.REQUIRED) -> str:
    return os.path.join(*parts)


@gin.configurable(module="sentemb_jax")
def run_stages(stages=gin.REQUIRED) -> list:
    """Run jobs one after another, e.g. scoped trains: [@stage1/sentemb_jax.train, @stage2/sentemb_jax.train]."""
    return [stage() for stage in stages]
