"""The train step under a device mesh: explicit in/out shardings derived from logical axis rules.

    abstract, shardings = tower_shardings(module, ids, mask, mesh)
    step = jit_train_step(step_fn, state_shardings, mesh)
    with activation_rules(mesh):
        state, metrics = step(state, shard_batch(batch, mesh), rng)

The run setup (training.setup) builds every method's step through these.
"""
from __future__ import annotations

import contextlib

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sentemb_jax import partitioning


@contextlib.contextmanager
def activation_rules(mesh: Mesh, rules=partitioning.LOGICAL_AXIS_RULES):
    """Mesh + logical rules in scope, so activation constraints resolve while tracing."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        yield


def tower_shardings(module: nn.Module, ids, mask, mesh: Mesh, rules=partitioning.LOGICAL_AXIS_RULES):
    """(abstract tower params, their NamedShardings by the logical axis rules), no weights allocated."""
    boxed = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), ids, mask))["params"]
    return nn.meta.unbox(boxed), partitioning.mesh_shardings(partitioning.logical_specs(boxed), mesh, rules)


def optimizer_shardings(optimizer, abstract_params, params_shardings, mesh: Mesh):
    """(abstract optimizer state, its shardings derived from the params')."""
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    return abstract_opt, partitioning.derive_state_shardings(abstract_opt, abstract_params, params_shardings, mesh)


def guard_nonfinite(step_fn, skip: bool = False):
    """`step_fn(state, batch, rng) -> (state, metrics)` with metrics['finite'] (loss and gradient
    norm finite). skip=True: a non-finite step returns the state it was given (the batch is
    skipped, nothing updated); otherwise the caller stops the job before saving that state."""

    def guarded(state, batch, rng):
        new, metrics = step_fn(state, batch, rng)
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
        if skip:
            new = jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, state)
        return new, {**metrics, "finite": finite}

    return guarded


def with_matmul_precision(step_fn, precision: str | None):
    """`step_fn` traced under jax.default_matmul_precision(precision) ('default' / None: JAX's own -
    TF32 on NVIDIA GPUs, bf16 passes on TPUs; 'highest': IEEE float32 products)."""
    if precision in (None, "default"):
        return step_fn

    def precise(*args):
        with jax.default_matmul_precision(precision):
            return step_fn(*args)

    return precise


def jit_train_step(step_fn, shardings, mesh: Mesh, skip_nonfinite: bool = False, batch_sharding="data",
                   matmul_precision: str | None = None):
    """`step_fn(state, batch, rng)` jitted with explicit in/out shardings (the state's; the batch along
    the data axes, or as placed with batch_sharding=None; rng and metrics replicated), the state
    donated, and the non-finite guard."""
    replicated = NamedSharding(mesh, P())
    batch = partitioning.batch_sharding(mesh) if batch_sharding == "data" else batch_sharding
    return jax.jit(with_matmul_precision(guard_nonfinite(step_fn, skip_nonfinite), matmul_precision),
                   in_shardings=(shardings, batch, replicated), out_shardings=(shardings, replicated), donate_argnums=(0,))
