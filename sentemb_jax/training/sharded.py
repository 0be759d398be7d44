"""The train step under a device mesh: explicit in/out shardings derived from logical axis rules.

    step_fn, state_shardings = build_sharded_step(module, optimizer, cfg, mesh, example_batch)
    state = place_state(tower_params, optimizer, cfg, state_shardings)
    with activation_rules(mesh):
        state, metrics = step_fn(state, shard_batch(batch, mesh), rng)
"""
from __future__ import annotations

import contextlib
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sentemb_jax import partitioning
from sentemb_jax.training.step import ContrastiveConfig, TrainState, initial_params, train_step


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


def state_shardings(module: nn.Module, optimizer, cfg: ContrastiveConfig, mesh: Mesh, example_batch: dict,
                    rules=partitioning.LOGICAL_AXIS_RULES):
    """(abstract TrainState, TrainState of NamedShardings) without allocating any weights."""
    ids = example_batch[f"{cfg.anchor}_input_ids"][:1]
    mask = example_batch[f"{cfg.anchor}_attention_mask"][:1]
    tower, tower_sh = tower_shardings(module, ids, mask, mesh, rules)
    replicated = NamedSharding(mesh, P())
    params_shardings = {"tower": tower_sh}
    abstract_params = initial_params(tower, cfg) if not cfg.learnable_temperature else None
    if cfg.learnable_temperature:
        abstract_params = {"tower": tower, "log_temperature": jax.ShapeDtypeStruct((), jnp.float32)}
        params_shardings["log_temperature"] = replicated
    abstract_opt, opt_shardings = optimizer_shardings(optimizer, abstract_params, params_shardings, mesh)
    abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params, opt_state=abstract_opt)
    return abstract, TrainState(step=replicated, params=params_shardings, opt_state=opt_shardings)


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


def jit_train_step(step_fn, shardings, mesh: Mesh, skip_nonfinite: bool = False):
    """`step_fn(state, batch, rng)` jitted with explicit in/out shardings (batch along the data
    axes, rng and metrics replicated), the state donated, and the non-finite guard."""
    replicated = NamedSharding(mesh, P())
    return jax.jit(guard_nonfinite(step_fn, skip_nonfinite),
                   in_shardings=(shardings, partitioning.batch_sharding(mesh), replicated),
                   out_shardings=(shardings, replicated), donate_argnums=(0,))


def build_sharded_step(module: nn.Module, optimizer, cfg: ContrastiveConfig, mesh: Mesh, example_batch: dict,
                       rules=partitioning.LOGICAL_AXIS_RULES, skip_nonfinite: bool = False):
    """A jitted train step with explicit in/out shardings and the state donated."""
    abstract, shardings = state_shardings(module, optimizer, cfg, mesh, example_batch, rules)
    step = jit_train_step(functools.partial(train_step, module=module, optimizer=optimizer, cfg=cfg), shardings, mesh,
                          skip_nonfinite)
    return step, abstract, shardings


def place_state(tower_params, optimizer, cfg: ContrastiveConfig, shardings: TrainState) -> TrainState:
    """Initial TrainState (step 0) from tower params, laid out by `shardings`."""
    # A fresh copy: the step donates its state, which must not delete the caller's arrays.
    copy = jax.jit(lambda p: jax.tree_util.tree_map(jnp.copy, p), out_shardings=shardings.params)
    params = copy(initial_params(tower_params, cfg))
    opt_state = jax.jit(optimizer.init, out_shardings=shardings.opt_state)(params)
    return TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), shardings.step), params=params, opt_state=opt_state)
