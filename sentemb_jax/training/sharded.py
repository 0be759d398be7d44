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
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sentemb_jax import partitioning
from sentemb_jax.training.step import ContrastiveConfig, TrainState, initial_params, train_step


@contextlib.contextmanager
def activation_rules(mesh: Mesh, rules=partitioning.LOGICAL_AXIS_RULES):
    """Mesh + logical rules in scope, so activation constraints resolve while tracing."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        yield


def state_shardings(module: nn.Module, optimizer, cfg: ContrastiveConfig, mesh: Mesh, example_batch: dict,
                    rules=partitioning.LOGICAL_AXIS_RULES):
    """(abstract TrainState, TrainState of NamedShardings) without allocating any weights."""
    ids = example_batch[f"{cfg.anchor}_input_ids"][:1]
    mask = example_batch[f"{cfg.anchor}_attention_mask"][:1]
    boxed = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), ids, mask))["params"]
    replicated = NamedSharding(mesh, P())
    params_shardings = {"tower": partitioning.mesh_shardings(partitioning.logical_specs(boxed), mesh, rules)}
    abstract_params = initial_params(nn.meta.unbox(boxed), cfg) if not cfg.learnable_temperature else None
    if cfg.learnable_temperature:
        abstract_params = {"tower": nn.meta.unbox(boxed), "log_temperature": jax.ShapeDtypeStruct((), jnp.float32)}
        params_shardings["log_temperature"] = replicated
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    opt_shardings = partitioning.derive_state_shardings(abstract_opt, abstract_params, params_shardings, mesh)
    abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params, opt_state=abstract_opt)
    return abstract, TrainState(step=replicated, params=params_shardings, opt_state=opt_shardings)


def build_sharded_step(module: nn.Module, optimizer, cfg: ContrastiveConfig, mesh: Mesh, example_batch: dict,
                       rules=partitioning.LOGICAL_AXIS_RULES):
    """A jitted train step with explicit in/out shardings and the state donated."""
    abstract, shardings = state_shardings(module, optimizer, cfg, mesh, example_batch, rules)
    replicated = NamedSharding(mesh, P())
    step = jax.jit(
        functools.partial(train_step, module=module, optimizer=optimizer, cfg=cfg),
        in_shardings=(shardings, partitioning.batch_sharding(mesh), replicated),
        out_shardings=(shardings, replicated),
        donate_argnums=(0,),
    )
    return step, abstract, shardings


def place_state(tower_params, optimizer, cfg: ContrastiveConfig, shardings: TrainState) -> TrainState:
    """Initial TrainState (step 0) from tower params, laid out by `shardings`."""
    # A fresh copy: the step donates its state, which must not delete the caller's arrays.
    copy = jax.jit(lambda p: jax.tree_util.tree_map(jnp.copy, p), out_shardings=shardings.params)
    params = copy(initial_params(tower_params, cfg))
    opt_state = jax.jit(optimizer.init, out_shardings=shardings.opt_state)(params)
    return TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), shardings.step), params=params, opt_state=opt_state)
