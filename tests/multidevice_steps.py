"""Run in a subprocess with 8 simulated CPU devices (see test_sharding.py); prints JSON."""
import json

import flax.linen as nn
import jax
import numpy as np

from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.losses import in_batch_softmax_loss
from sentemb_jax.methods.contrastive import Contrastive
from sentemb_jax.models import T5Config
from sentemb_jax.models.sentence import SentenceEmbedder
from sentemb_jax.training.config import EvalConfig, MeshConfig, OptimizerConfig, RunConfig, ScheduleConfig
from sentemb_jax.training.setup import setup_run

assert jax.device_count() == 8, jax.devices()
B, L = 32, 12
rng = np.random.default_rng(0)


def batch(i):
    r = np.random.default_rng(i)
    out = {}
    for side in ("anchor", "positive", "negative"):
        ids = r.integers(2, 128, (B, L)).astype(np.int32)
        mask = (np.arange(L)[None] < r.integers(3, L + 1, (B, 1))).astype(np.int32)
        out[f"{side}_input_ids"], out[f"{side}_attention_mask"] = ids * mask, mask
    return out


def run(mesh_shape, pooling, dropout, steps=3, prng_impl=None):
    cfg = T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, dropout_rate=dropout, dense_act_fn="gelu_new", is_gated_act=True,
                   tie_word_embeddings=False)
    module = SentenceEmbedder(cfg, pooling=(pooling,), projection_dim=16)
    b0 = batch(0)
    # The init key names its generator: the process default is whatever the previous run set.
    init_key = jax.random.key(0, impl="threefry2x32")
    tower = nn.meta.unbox(module.init(init_key, b0["anchor_input_ids"][:2], b0["anchor_attention_mask"][:2])["params"])
    # The run setup builds the program, as the trainer does: mesh, optimizer, shardings, the jitted step.
    config = RunConfig(model_dir="/unused", num_steps=steps, mesh=MeshConfig(*mesh_shape),
                       optimizer=OptimizerConfig(name="adafactor", min_dim_size_to_factor=8),
                       schedule=ScheduleConfig(peak=1e-2, decay="constant"), evaluation=EvalConfig(every=None),
                       prng_impl=prng_impl)
    devices = jax.devices()[: int(np.prod(mesh_shape))]
    run = setup_run(config, Contrastive(negative="negative", temperature=0.05, bidirectional=True),
                    model=SentenceEncoder(module, tower, None), devices=devices, abstract=True)
    state = run.initial_state()
    losses = []
    with run.context():
        for i in range(steps):
            state, metrics = run.step_fn(state, run.device_batch(batch(i)), jax.random.PRNGKey(42))
            losses.append(float(metrics["loss"]))
    specs = {"/".join(str(getattr(k, "key", k)) for k in path): str(x.sharding.spec)
             for path, x in jax.tree_util.tree_flatten_with_path(state.params)[0]}
    opt_specs = sorted({str(x.sharding.spec) for x in jax.tree_util.tree_leaves(state.opt_state) if hasattr(x, "sharding")})
    return jax.device_get(state.params), losses, specs, opt_specs, module, tower


out = {}
for pooling in ("mean", "encdec_first"):
    ref, ref_losses, _, _, module, tower = run((1, 1, 1), pooling, 0.1)
    for name, shape in {"data4_model2": (4, 1, 2), "fsdp8": (1, 8, 1)}.items():
        params, losses, specs, opt_specs, _, _ = run(shape, pooling, 0.1)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(params)))
        out[f"{pooling}/{name}"] = {"max_param_diff": diff, "losses": losses, "ref_losses": ref_losses,
                                    "sample_specs": {k: v for k, v in specs.items() if k.endswith(("wi_0/kernel", "shared/embedding"))},
                                    "opt_specs": opt_specs}

# The GPUs' generator ('rbg', training.setup.PLATFORM_PRNG_IMPLS): sharded = one device as well.
ref, ref_losses, _, _, _, _ = run((1, 1, 1), "mean", 0.1, prng_impl="rbg")
params, losses, _, _, _, _ = run((4, 1, 2), "mean", 0.1, prng_impl="rbg")
out["mean/data4_model2/rbg"] = {
    "max_param_diff": max(float(np.abs(a - b).max()) for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(params))),
    "losses": losses, "ref_losses": ref_losses, "threefry_losses": out["mean/data4_model2"]["ref_losses"]}

# Negatives: with dropout off, the sharded step's loss equals the global-batch loss over all 32
# candidates (plus 32 hard negatives), not the mean of 4 per-shard losses over 8.
_, losses, _, _, module, tower = run((4, 1, 2), "mean", 0.0, steps=1)
b = batch(0)
emb = {s: module.apply({"params": tower}, b[f"{s}_input_ids"], b[f"{s}_attention_mask"]) for s in ("anchor", "positive", "negative")}
global_loss = float(in_batch_softmax_loss(emb["anchor"], emb["positive"], emb["negative"], 0.05, bidirectional=True))
per_shard = float(np.mean([in_batch_softmax_loss(emb["anchor"][i:i + 8], emb["positive"][i:i + 8], emb["negative"][i:i + 8], 0.05,
                                                 bidirectional=True) for i in range(0, 32, 8)]))
out["negatives"] = {"sharded_loss": losses[0], "global_loss": global_loss, "per_shard_loss": per_shard}
print("RESULT " + json.dumps(out))
