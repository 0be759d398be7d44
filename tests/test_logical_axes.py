"""Every parameter carries t5x logical axis names; scanned stacks add the `layers` axis."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import traverse_util

from sentemb_jax.models import BertConfig, T5Config
from sentemb_jax.models.sentence import SentenceEmbedder

VOCABULARY = {"vocab", "embed", "mlp", "heads", "kv", "joined_kv", "layers", "relpos_buckets", "abspos_buckets", "affinity", None}

CONFIGS = {
    "t5_v1_0": T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=4),
    "t5_v1_1": T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=4,
                        dense_act_fn="gelu_new", is_gated_act=True, tie_word_embeddings=False, has_lm_head=True),
    "bert": BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
                       add_pooling_layer=True),
}


def _specs(cfg, pooling=("mean",)):
    module = SentenceEmbedder(cfg, pooling=pooling, projection_dim=8)
    ids = jnp.ones((2, 5), jnp.int32)
    abstract = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), ids, ids))
    return traverse_util.flatten_dict(abstract["params"])


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("scan", [False, True])
def test_every_param_has_logical_axes(name, scan):
    cfg = dataclasses.replace(CONFIGS[name], scan_layers=scan)
    pooling = ("encdec_first",) if name.startswith("t5") else ("cls",)
    flat = _specs(cfg, pooling)
    assert flat, "no params"
    for path, leaf in flat.items():
        assert isinstance(leaf, nn.LogicallyPartitioned), f"{'/'.join(path)} has no logical axis names"
        names = leaf.names
        assert len(names) == len(leaf.value.shape), path
        assert set(names) <= VOCABULARY, (path, names)
        in_stack = any(p == "layers" for p in path)
        assert (names[0] == "layers") == (scan and in_stack), (path, names)
    kernel = flat[("projection", "kernel")]
    assert kernel.names == ("embed", "affinity")
    if name.startswith("t5"):
        assert flat[("backbone", "shared", "embedding")].names == ("vocab", "embed")
        assert flat[("backbone", "encoder", "relpos_bias", "rel_embedding")].names == ("relpos_buckets", "heads")
        q = [v for k, v in flat.items() if k[-2:] == ("query", "kernel")][0]
        assert q.names[-2:] == ("embed", "joined_kv")
        wo = [v for k, v in flat.items() if k[-2:] == ("wo", "kernel")][0]
        assert wo.names[-2:] == ("mlp", "embed")
