"""In-batch softmax training of a shared-weight dual encoder (Sentence-T5 eq. 2; SimCSE) - the
smallest method, and the one a loss-only method extends (methods/triplet.py).

    python -m sentemb_jax.main --gin_file=gin/models/minilm_l6.gin --gin_file=gin/runs/minilm_nli.gin \
        --gin.MODEL_DIR="'/tmp/minilm_nli'"

Every side (anchor / positive / hard negative) runs in one encoder call, in chunks of `chunk_size`
rows (training.step). With `gradcache=True` the step runs GradCache (Gao et al. 2021): embeddings of
every chunk without gradients, the loss gradient w.r.t. the embeddings, then each chunk re-encoded
with the same rng and back-propagated with its slice of that gradient - the loss still sees the
whole (global) batch, while activation memory is bounded by one chunk. Both paths give the same
gradient.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sentemb_jax import validation as v
from sentemb_jax.losses import in_batch_softmax_loss
from sentemb_jax.training.method import Method, TrainState
from sentemb_jax.training.step import (
    apply_gradients,
    chunked,
    embed_packed,
    embed_side,
    interleave_rows,
    interleave_sides,
    split_sides,
)

Array = jax.Array
API = "sentemb_jax.Contrastive"


def same_rows(ids: Array, mask: Array) -> Array:
    """[B, B] True where two rows hold the same tokens (duplicate texts)."""
    ids = jnp.where(mask > 0, ids, -1)
    return jnp.all(ids[:, None, :] == ids[None, :, :], axis=-1)


@dataclasses.dataclass
class Contrastive(Method):
    """In-batch softmax over anchors x (positives + hard negatives).

    anchor / positive / negative: the batch's text sides (SimCSE unsupervised: view1 / view2, the
    same text under two dropout masks). temperature: the softmax's (learnable_temperature: trained,
    from this value). bidirectional: also positives -> anchors. mask_duplicates: a positive that
    repeats another row's text is not its negative. chunk_size / gradcache: see the module docstring.
    single_call: a padded batch's sides run as one encoder call (rows interleaved text by text, each
    row its own dropout mask; training.step); False: one call per side, each side its own rng - the
    same loss and gradients without dropout, two or three smaller programs.
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
    single_call: bool = True

    def __post_init__(self):
        api = f"sentemb_jax.{type(self).__name__}"
        v.require_number(self.temperature, api, "temperature", 0, low_open=True)
        v.require_number(self.label_smoothing, api, "label_smoothing", 0, 1, high_open=True)
        v.require_int(self.chunk_size, api, "chunk_size", 1, allow_none=True, none_means=" (whole batch)")
        for name in ("learnable_temperature", "bidirectional", "mask_duplicates", "gradcache", "single_call"):
            v.require_bool(getattr(self, name), api, name)
        for name in ("anchor", "positive"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                v.fail(getattr(self, name), api, name, "must be a side's name (e.g. 'anchor', 'view1')")

    @property
    def sides(self) -> tuple[str, ...]:
        return (self.anchor, self.positive) + ((self.negative,) if self.negative else ())

    def init_params(self, width: int | None) -> dict:
        return {"log_temperature": jnp.log(jnp.asarray(self.temperature, jnp.float32))} if self.learnable_temperature else {}

    def temperature_of(self, params):
        return jnp.exp(params["log_temperature"]) if self.learnable_temperature else self.temperature

    def loss(self, embeddings: dict[str, Array], batch: dict, params) -> Array:
        """The in-batch softmax over the sides' embeddings (a dict by side name); a loss-only method
        overrides this (methods/triplet.py)."""
        duplicates = None
        if self.mask_duplicates:
            duplicates = same_rows(batch[f"{self.positive}_input_ids"], batch[f"{self.positive}_attention_mask"])
        return in_batch_softmax_loss(
            embeddings[self.anchor], embeddings[self.positive], embeddings.get(self.negative) if self.negative else None,
            temperature=self.temperature_of(params), bidirectional=self.bidirectional,
            label_smoothing=self.label_smoothing, duplicates=duplicates,
        )

    def encoder_calls(self, batch: dict, rng: Array) -> list[tuple[list[str], Array, Array, Array]]:
        """(sides, ids, mask, dropout rng) of each encoder call of a padded batch: every side in one
        call, rows interleaved text by text (single_call); else one call per side, side i drawing
        dropout from fold_in(rng, i)."""
        sides = list(self.sides)
        if self.single_call:
            return [(sides, *interleave_sides(batch, sides), rng)]
        return [([s], batch[f"{s}_input_ids"], batch[f"{s}_attention_mask"], jax.random.fold_in(rng, i))
                for i, s in enumerate(sides)]

    def loss_and_grads(self, module, params, batch: dict, rng: Array):
        """(loss, gradient) of `params` ({"tower": ..., ["log_temperature"]}) on `batch`."""
        if "packed_input_ids" in batch:
            if self.gradcache or self.chunk_size:
                raise ValueError("packed batches run the whole batch in one call: unset chunk_size / gradcache, or packing")
            return jax.value_and_grad(lambda p: self.loss(embed_packed(module, p["tower"], batch, rng, list(self.sides)),
                                                          batch, p))(params)
        calls = self.encoder_calls(batch, rng)

        def embed_all(tower_params):
            out = {}
            for sides, ids, mask, call_rng in calls:
                out.update(split_sides(embed_side(module, tower_params, ids, mask, call_rng, self.chunk_size), sides))
            return out

        if not self.gradcache:
            return jax.value_and_grad(lambda p: self.loss(embed_all(p["tower"]), batch, p))(params)

        # GradCache pass 1: every chunk's embeddings, no graph kept (lax.map: one chunk live at a time).
        embeddings = jax.lax.stop_gradient(embed_all(params["tower"]))
        other = {k: x for k, x in params.items() if k != "tower"}
        # Pass 2: gradient of the loss w.r.t. the embeddings (and the temperature).
        loss, (emb_grads, other_grads) = jax.value_and_grad(
            lambda e, o: self.loss(e, batch, {**o, "tower": None}), argnums=(0, 1))(embeddings, other)
        # Pass 3: re-encode each chunk with the same rng and accumulate its vector-Jacobian product.
        tower_grads = jax.tree_util.tree_map(jnp.zeros_like, params["tower"])
        for sides, ids, mask, call_rng in calls:
            ids, mask, index = chunked(ids, mask, self.chunk_size)
            cotangent = interleave_rows(emb_grads, sides).reshape(ids.shape[0], ids.shape[1], -1)

            def accumulate(acc, x, call_rng=call_rng):
                ids_i, mask_i, i, cot_i = x
                rngs = {"dropout": jax.random.fold_in(call_rng, i)}
                _, vjp = jax.vjp(lambda p: module.apply({"params": p}, ids_i, mask_i, False, rngs=rngs), params["tower"])
                return jax.tree_util.tree_map(jnp.add, acc, vjp(cot_i)[0]), None

            tower_grads, _ = jax.lax.scan(accumulate, tower_grads, (ids, mask, index, cotangent))
        return loss, {"tower": tower_grads, **other_grads}

    def step(self, state: TrainState, batch: dict, rng: Array, *, module, optimizer):
        rng = jax.random.fold_in(rng, state.step)
        loss, grads = self.loss_and_grads(module, state.params, batch, rng)
        temperature = self.temperature_of(state.params)  # the one this step used
        state, metrics = apply_gradients(state, loss, grads, optimizer)
        return state, {**metrics, "temperature": temperature}


@dataclasses.dataclass
class SimCSE(Contrastive):
    """Unsupervised SimCSE (Gao et al. 2021): a text and itself under two dropout masks are each
    other's positive (the `sentences` task's view1 / view2 with views ('none', 'none'))."""

    anchor: str = "view1"
    positive: str = "view2"
