"""The contrastive dual-encoder train step: a pure function of (state, batch, rng).

Both towers share parameters. Each side (anchor / positive / hard negative) is embedded with its
own dropout rng, in chunks of `chunk_size` rows (chunk i of a side uses fold_in(side_rng, i)).
With `gradcache=True` the step runs GradCache (Gao et al. 2021): embeddings of every chunk
without gradients, the loss gradient w.r.t. the embeddings, then each chunk re-encoded with the
same rng and back-propagated with its slice of that gradient - the loss still sees the whole
(global) batch, while activation memory is bounded by one chunk. Both paths give the same
gradient. A packed batch (`packed_*` features from sentemb_jax.data.packing) runs every side in
one encoder call over rows of real tokens - the same loss, 2-3x fewer tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import gin
from sentemb_jax.data.packing import packing_inputs
from sentemb_jax.losses import in_batch_softmax_loss

Array = jax.Array


@gin.configurable(module="sentemb_jax")
@dataclasses.dataclass(frozen=True)
class ContrastiveConfig:
    """Which batch features are anchor / positive / negative, and the loss settings.

    SimCSE unsupervised: anchor='view1', positive='view2' (same text, two dropout masks).
    loss: `loss(embeddings, batch, params, cfg) -> scalar` over the sides' embeddings (a dict by
    side name); None is the in-batch softmax (`in_batch_softmax_from_embeddings`). A loss-only method is such a
    function (e.g. sentemb_jax.methods.triplet): `ContrastiveConfig.loss = @sentemb_jax.triplet_margin_loss`.
    """

    anchor: str = "anchor"
    positive: str = "positive"
    negative: str | None = None
    temperature: float = 0.05
    learnable_temperature: bool = False
    bidirectional: bool = False
    label_smoothing: float = 0.0
    mask_duplicates: bool = True
    chunk_size: int | None = None
    gradcache: bool = False
    loss: Callable | None = None


@flax.struct.dataclass
class TrainState:
    step: Array
    params: Any
    opt_state: Any


def initial_params(tower_params, cfg: ContrastiveConfig) -> dict:
    params = {"tower": tower_params}
    if cfg.learnable_temperature:
        params["log_temperature"] = jnp.log(jnp.asarray(cfg.temperature, jnp.float32))
    return params


def temperature_of(params, cfg: ContrastiveConfig):
    return jnp.exp(params["log_temperature"]) if cfg.learnable_temperature else cfg.temperature


def same_rows(ids: Array, mask: Array) -> Array:
    """[B, B] True where two rows hold the same tokens (duplicate texts)."""
    ids = jnp.where(mask > 0, ids, -1)
    return jnp.all(ids[:, None, :] == ids[None, :, :], axis=-1)


def _chunks(n: int, size: int | None) -> list[tuple[int, int]]:
    size = size or n
    if n % size:
        raise ValueError(f"batch of {n} rows is not divisible by chunk_size={size}")
    return [(i, i + size) for i in range(0, n, size)]


def _chunked(ids: Array, mask: Array, chunk_size: int | None) -> tuple[Array, Array, Array]:
    """[B, L] -> [chunks, B / chunks, L] ids and mask, and each chunk's index."""
    n = len(_chunks(ids.shape[0], chunk_size))
    return ids.reshape(n, -1, ids.shape[1]), mask.reshape(n, -1, mask.shape[1]), jnp.arange(n)


def embed_side(module: nn.Module, tower_params, ids: Array, mask: Array, rng: Array, chunk_size: int | None) -> Array:
    """Embeddings of one side, chunk by chunk (chunk i: dropout rng fold_in(rng, i)), train mode."""
    if len(_chunks(ids.shape[0], chunk_size)) == 1:
        return module.apply({"params": tower_params}, ids, mask, False, rngs={"dropout": jax.random.fold_in(rng, 0)})
    # lax.map, not a Python loop: one traced copy of the encoder however many chunks (compile time).
    out = jax.lax.map(lambda x: module.apply({"params": tower_params}, x[0], x[1], False,
                                             rngs={"dropout": jax.random.fold_in(rng, x[2])}),
                      _chunked(ids, mask, chunk_size))
    return out.reshape(-1, out.shape[-1])


def sides_of(cfg: ContrastiveConfig) -> list[str]:
    return [cfg.anchor, cfg.positive] + ([cfg.negative] if cfg.negative else [])


def side_features(batch: dict, sides) -> dict:
    """The `<side>_input_ids` / `<side>_attention_mask` arrays of a pipeline batch (what a step takes)."""
    return {k: v for k, v in batch.items() if k.rsplit("_", 2)[0] in sides and k.endswith(("_input_ids", "_attention_mask"))}


def in_batch_softmax_from_embeddings(embeddings: dict[str, Array], batch: dict, params, cfg: ContrastiveConfig) -> Array:
    """The default loss: in-batch softmax over the anchors x (positives + hard negatives)."""
    duplicates = None
    if cfg.mask_duplicates:
        duplicates = same_rows(batch[f"{cfg.positive}_input_ids"], batch[f"{cfg.positive}_attention_mask"])
    return in_batch_softmax_loss(
        embeddings[cfg.anchor], embeddings[cfg.positive], embeddings.get(cfg.negative) if cfg.negative else None,
        temperature=temperature_of(params, cfg), bidirectional=cfg.bidirectional,
        label_smoothing=cfg.label_smoothing, duplicates=duplicates,
    )



def embed_packed(module: nn.Module, tower_params, batch: dict, rng: Array, sides: list[str],
                 deterministic: bool = False) -> dict[str, Array]:
    """Every side's embeddings from one encoder call over the packed rows (sentemb_jax.data.packing)."""
    out = module.apply({"params": tower_params}, batch["packed_input_ids"], None, deterministic,
                       packing=packing_inputs(batch), rngs={"dropout": rng})
    sizes = [batch[f"{s}_input_ids"].shape[0] for s in sides]
    return dict(zip(sides, jnp.split(out, np.cumsum(sizes)[:-1].tolist(), axis=0)))


def loss_and_grads(module: nn.Module, params, batch: dict, rng: Array, cfg: ContrastiveConfig):
    loss_fn = cfg.loss or in_batch_softmax_from_embeddings
    side_rngs = {side: jax.random.fold_in(rng, i) for i, side in enumerate(sides_of(cfg))}
    if "packed_input_ids" in batch:
        if cfg.gradcache or cfg.chunk_size:
            raise ValueError("packed batches run the whole batch in one call: unset chunk_size / gradcache, or packing")
        return jax.value_and_grad(
            lambda p: loss_fn(embed_packed(module, p["tower"], batch, rng, sides_of(cfg)), batch, p, cfg))(params)

    def embed_all(tower_params):
        return {s: embed_side(module, tower_params, batch[f"{s}_input_ids"], batch[f"{s}_attention_mask"], side_rngs[s],
                              cfg.chunk_size) for s in sides_of(cfg)}

    if not cfg.gradcache:
        def full_loss(p):
            return loss_fn(embed_all(p["tower"]), batch, p, cfg)

        return jax.value_and_grad(full_loss)(params)

    # GradCache pass 1: every chunk's embeddings, no graph kept (lax.map: one chunk live at a time).
    embeddings = jax.lax.stop_gradient(embed_all(params["tower"]))

    def encode_chunk(tower_params, side, ids, mask, i):
        rngs = {"dropout": jax.random.fold_in(side_rngs[side], i)}
        return module.apply({"params": tower_params}, ids, mask, False, rngs=rngs)

    other = {k: v for k, v in params.items() if k != "tower"}
    # Pass 2: gradient of the loss w.r.t. the embeddings (and the temperature).
    loss, (emb_grads, other_grads) = jax.value_and_grad(
        lambda e, o: loss_fn(e, batch, {**o, "tower": None}, cfg), argnums=(0, 1))(embeddings, other)
    # Pass 3: re-encode each chunk with the same rng and accumulate its vector-Jacobian product.
    tower_grads = jax.tree_util.tree_map(jnp.zeros_like, params["tower"])
    for side in sides_of(cfg):
        ids, mask, index = _chunked(batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"], cfg.chunk_size)
        cotangent = emb_grads[side].reshape(ids.shape[0], ids.shape[1], -1)

        def accumulate(acc, x, side=side):
            ids_i, mask_i, i, cot_i = x
            _, vjp = jax.vjp(lambda p: encode_chunk(p, side, ids_i, mask_i, i), params["tower"])
            return jax.tree_util.tree_map(jnp.add, acc, vjp(cot_i)[0]), None

        tower_grads, _ = jax.lax.scan(accumulate, tower_grads, (ids, mask, index, cotangent))
    return loss, {"tower": tower_grads, **other_grads}


def apply_gradients(state, loss: Array, grads, optimizer: optax.GradientTransformation):
    """The one optimizer update of every step function: `state` (TrainState or a method's state
    with more fields, e.g. DistillState) one step on; metrics loss and gradient norm."""
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), \
        {"loss": loss, "grad_norm": optax.tree.norm(grads)}


def train_step(state: TrainState, batch: dict, rng: Array, *, module: nn.Module, optimizer: optax.GradientTransformation,
               cfg: ContrastiveConfig):
    """One optimizer step; returns (new state, metrics)."""
    rng = jax.random.fold_in(rng, state.step)
    loss, grads = loss_and_grads(module, state.params, batch, rng, cfg)
    temperature = temperature_of(state.params, cfg)  # the one this step used
    state, metrics = apply_gradients(state, loss, grads, optimizer)
    return state, {**metrics, "temperature": temperature}
