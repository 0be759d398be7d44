"""Random initialisation as t5x does it (what training from scratch depends on)."""
import flax.linen as nn
import jax
import numpy as np

from sentemb_jax.models import T5Config
from sentemb_jax.models.sentence import SentenceEmbedder


def test_query_init_folds_in_one_over_sqrt_head_dim():
    # T5 attention has no 1/sqrt(d_kv) on the logits; t5x puts it into the query's init instead.
    cfg = T5Config(vocab_size=64, d_model=128, d_ff=256, num_layers=1, num_heads=4, d_kv=64, has_decoder=False)
    ids = np.ones((1, 8), np.int32)
    params = nn.meta.unbox(SentenceEmbedder(cfg).init(jax.random.PRNGKey(0), ids, ids)["params"])
    attention = params["backbone"]["encoder"]["layers_0"]["self_attention"]
    ratio = float(np.std(attention["query"]["kernel"]) / np.std(attention["key"]["kernel"]))
    np.testing.assert_allclose(ratio, 64 ** -0.5, rtol=0.05)
    np.testing.assert_allclose(float(np.std(attention["key"]["kernel"])), 128 ** -0.5, rtol=0.05)  # fan-in
