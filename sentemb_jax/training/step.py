"""What every method's step shares: embedding a side (with dropout, in chunks), every side of a
packed batch in one call, and the one optimizer update.

Each side (anchor / positive / hard negative, or a view) is embedded with its own dropout rng, in
chunks of `chunk_size` rows (chunk i of a side uses fold_in(side_rng, i)). A packed batch
(`packed_*` features from sentemb_jax.data.packing) runs every side in one encoder call over rows
of real tokens - the same embeddings (eval mode), 2-3x fewer tokens.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from sentemb_jax.data.packing import packing_inputs
from sentemb_jax.training.method import TrainState  # noqa: F401 - the state every step updates

Array = jax.Array


def chunks(n: int, size: int | None) -> list[tuple[int, int]]:
    size = size or n
    if n % size:
        raise ValueError(f"batch of {n} rows is not divisible by chunk_size={size}")
    return [(i, i + size) for i in range(0, n, size)]


def chunked(ids: Array, mask: Array, chunk_size: int | None) -> tuple[Array, Array, Array]:
    """[B, L] -> [chunks, B / chunks, L] ids and mask, and each chunk's index."""
    n = len(chunks(ids.shape[0], chunk_size))
    return ids.reshape(n, -1, ids.shape[1]), mask.reshape(n, -1, mask.shape[1]), jnp.arange(n)


def embed_side(module: nn.Module, tower_params, ids: Array, mask: Array, rng: Array, chunk_size: int | None) -> Array:
    """Embeddings of one side, chunk by chunk (chunk i: dropout rng fold_in(rng, i)), train mode."""
    if len(chunks(ids.shape[0], chunk_size)) == 1:
        return module.apply({"params": tower_params}, ids, mask, False, rngs={"dropout": jax.random.fold_in(rng, 0)})
    # lax.map, not a Python loop: one traced copy of the encoder however many chunks (compile time).
    out = jax.lax.map(lambda x: module.apply({"params": tower_params}, x[0], x[1], False,
                                             rngs={"dropout": jax.random.fold_in(rng, x[2])}),
                      chunked(ids, mask, chunk_size))
    return out.reshape(-1, out.shape[-1])


def embed_packed(module: nn.Module, tower_params, batch: dict, rng: Array, sides: list[str],
                 deterministic: bool = False) -> dict[str, Array]:
    """Every side's embeddings from one encoder call over the packed rows (sentemb_jax.data.packing)."""
    out = module.apply({"params": tower_params}, batch["packed_input_ids"], None, deterministic,
                       packing=packing_inputs(batch), rngs={"dropout": rng})
    sizes = [batch[f"{s}_input_ids"].shape[0] for s in sides]
    return dict(zip(sides, jnp.split(out, np.cumsum(sizes)[:-1].tolist(), axis=0)))


def apply_gradients(state, loss: Array, grads, optimizer: optax.GradientTransformation):
    """The one optimizer update of every step function: `state` one step on; metrics loss and
    gradient norm."""
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), \
        {"loss": loss, "grad_norm": optax.tree.norm(grads)}
