"""What every method's step shares: embedding texts (with dropout, in chunks), every side of a
batch in one encoder call (padded or packed), and the one optimizer update.

A padded batch's sides (anchor / positive / hard negative, or two views) run as one encoder call
over their rows interleaved text by text (`interleave_sides`): one large program instead of one
per side, and on a mesh each device keeps its own rows (the batch axis is sharded; a concatenation
side after side would move rows between devices). The call runs in chunks of `chunk_size` rows
(chunk i draws dropout from fold_in(rng, i)); every row has its own dropout mask, so the two views
of one text still differ. A packed batch (`packed_*` features from sentemb_jax.data.packing) runs
every side in one encoder call over rows of real tokens - the same embeddings (eval mode), 2-3x
fewer tokens.
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


def interleave_sides(batch: dict, sides: list[str]) -> tuple[Array, Array]:
    """The sides' [B, L_side] ids and masks as [B x sides, L] rows, text by text (row b x S + s is
    side s of text b), each padded to the longest side's length."""
    length = max(batch[f"{s}_input_ids"].shape[1] for s in sides)
    sizes = {batch[f"{s}_input_ids"].shape[0] for s in sides}
    if len(sizes) != 1:
        raise ValueError(f"sides {sides} have {sorted(sizes)} rows: one encoder call needs the same number per side")

    def stack(key):
        rows = [jnp.pad(batch[f"{s}_{key}"], ((0, 0), (0, length - batch[f"{s}_{key}"].shape[1]))) for s in sides]
        x = jnp.stack(rows, axis=1)
        return x.reshape(-1, length)

    return stack("input_ids"), stack("attention_mask")


def split_sides(rows: Array, sides: list[str]) -> dict[str, Array]:
    """The inverse of interleave_sides on [B x sides, ...] outputs: a dict of [B, ...] by side."""
    rows = rows.reshape((-1, len(sides)) + rows.shape[1:])
    return {s: rows[:, i] for i, s in enumerate(sides)}


def interleave_rows(by_side: dict[str, Array], sides: list[str]) -> Array:
    """A dict of [B, ...] by side -> [B x sides, ...] in interleave_sides' row order."""
    x = jnp.stack([by_side[s] for s in sides], axis=1)
    return x.reshape((-1,) + x.shape[2:])


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
    with jax.named_scope("optimizer"):  # the profile's op class (benchmarks.profile_table)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), \
        {"loss": loss, "grad_norm": optax.tree.norm(grads)}
