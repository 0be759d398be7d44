"""MPNet through the family interface: our Flax MPNet equals Hugging Face's PyTorch `MPNetModel` on
random tiny configs (every hidden state and the pooler, padded and packed, scanned or not, its
first layers), its sequence classifier maps both ways, and the shipped all-mpnet-base-v2 encodes as
sentence-transformers does (1e-4 on STS-B test sentences, padded and packed)."""
from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_models import make_mpnet, padded_batch

from sentemb_jax import CrossEncoder, SentenceEncoder
from sentemb_jax.checkpoints import config_from_hf, load_hf_checkpoint, params_to_hf, read_hf_tensors, stack_layers
from sentemb_jax.errors import CheckpointError
from sentemb_jax.models import MPNetConfig, build_model, family_of

TOL = 1e-4
TEXTS = ["A man is playing a guitar.", "Someone makes music on a stringed instrument, loudly and with joy.", "hi",
         "The quick brown fox jumps over the lazy dog near the river bank in the evening.", "Two dogs run."]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mpnet"))
    ref = make_mpnet(path)
    cfg, params, _ = load_hf_checkpoint(path)
    ids, mask = padded_batch(cfg.vocab_size, [23, 5, 11, 2], pad_id=1, low=2)
    return ref, cfg, params, ids, mask


@pytest.fixture(scope="module")
def tiny_with_tokenizer(mpnet_dir, tmp_path_factory):
    """A random 3-layer MPNet with all-mpnet-base-v2's tokenizer: real sentences go through it."""
    path = str(tmp_path_factory.mktemp("mpnet_tok"))
    return path, make_mpnet(path, pooler=False, tokenizer_dir=mpnet_dir)


def _encode(cfg, params, ids, mask, hidden=False):
    return build_model(cfg).apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), True, hidden, method="encode")


def test_hidden_states_and_pooler_equal_hugging_face(tiny):
    ref, cfg, params, ids, mask = tiny
    assert isinstance(cfg, MPNetConfig) and cfg.add_pooling_layer and family_of(cfg).name == "mpnet"
    with torch.no_grad():
        out = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True)
    last, hidden = _encode(cfg, params, ids, mask, hidden=True)
    assert np.abs(np.asarray(last) - out.last_hidden_state.numpy()).max() <= TOL
    assert len(hidden) == len(out.hidden_states) == cfg.num_hidden_layers + 1
    for ours, theirs in zip(hidden, out.hidden_states):
        assert np.abs(np.asarray(ours) - theirs.numpy()).max() <= TOL
    pooled = build_model(cfg).apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
    assert np.abs(np.asarray(pooled) - out.pooler_output.numpy()).max() <= TOL


def test_positions_and_buckets_as_hugging_face():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder, create_position_ids_from_input_ids

    from sentemb_jax.models.mpnet import position_ids_for
    from sentemb_jax.models.t5 import relative_position_bucket

    ids = np.array([[5, 6, 7, 1, 1], [8, 1, 1, 1, 1]])
    np.testing.assert_array_equal(np.asarray(position_ids_for(jnp.asarray(ids))),
                                  create_position_ids_from_input_ids(torch.tensor(ids), padding_idx=1).numpy())
    rel = np.arange(-300, 300)[None, :] - np.arange(0, 1)[:, None]
    np.testing.assert_array_equal(np.asarray(relative_position_bucket(jnp.asarray(rel), True, 32, 128)),
                                  MPNetEncoder.relative_position_bucket(torch.tensor(rel)).numpy())


def test_scan_equals_loop(tiny):
    _, cfg, params, ids, mask = tiny
    a, _ = _encode(cfg, params, ids, mask)
    b, _ = _encode(dataclasses.replace(cfg, scan_layers=True), stack_layers(params), ids, mask)
    assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-5


def test_written_tensors_are_the_read_ones(tiny):
    """params_to_hf writes back exactly the reference's tensors, under transformers' names."""
    ref, cfg, params, _, _ = tiny
    written = params_to_hf(cfg, params)
    ref_tensors = {k: v.numpy() for k, v in ref.state_dict().items() if k != "embeddings.position_ids"}
    assert set(written) == set(ref_tensors)
    for name, value in written.items():
        np.testing.assert_array_equal(value, ref_tensors[name])


def test_config_checks_name_the_field():
    with pytest.raises(CheckpointError, match="relative_attention_num_buckets must be 32"):
        config_from_hf({"model_type": "mpnet", "relative_attention_num_buckets": 16})
    with pytest.raises(CheckpointError, match="hidden_size 30 must be a multiple of num_attention_heads 4"):
        config_from_hf({"model_type": "mpnet", "hidden_size": 30, "num_attention_heads": 4})
    with pytest.raises(CheckpointError, match="hidden_dropout_prob must be a probability"):
        config_from_hf({"model_type": "mpnet", "hidden_dropout_prob": 1.5})


def _hf_mean(model, enc, texts, layer=-1):
    feats = enc.tokenizer.hf(texts, padding=True, truncation=True, max_length=enc.tokenizer.max_length, return_tensors="pt")
    with torch.no_grad():
        states = model(input_ids=feats["input_ids"], attention_mask=feats["attention_mask"],
                       output_hidden_states=True).hidden_states[layer]
    m = feats["attention_mask"][..., None].float()
    mean = ((states * m).sum(1) / m.sum(1)).numpy()
    return mean / np.linalg.norm(mean, axis=1, keepdims=True)


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_encode_padded_packed_and_first_layers_equal_hugging_face(tiny_with_tokenizer):
    path, ref = tiny_with_tokenizer
    enc = SentenceEncoder.from_pretrained(path)
    want = _hf_mean(ref, enc, TEXTS)
    packed = _unit(enc.encode(TEXTS, batch_size=4))
    enc.packed = False
    padded = _unit(enc.encode(TEXTS, batch_size=4))
    enc.packed = True
    assert np.abs(packed - want).max() <= TOL and np.abs(padded - want).max() <= TOL
    two = enc.first_layers(2)
    assert two.config.num_hidden_layers == 2 and two.hf_config["num_hidden_layers"] == 2
    assert np.abs(_unit(two.encode(TEXTS)) - _hf_mean(ref, enc, TEXTS, layer=2)).max() <= TOL


def test_bf16_encode_stays_close(tiny_with_tokenizer):
    path, _ = tiny_with_tokenizer
    fp32 = _unit(SentenceEncoder.from_pretrained(path).encode(TEXTS))
    bf16 = _unit(SentenceEncoder.from_pretrained(path, dtype="bfloat16").encode(TEXTS))
    assert np.min(np.sum(fp32 * bf16, axis=1)) > 0.999


def test_sentence_transformers_export_loads_there(tiny_with_tokenizer, tmp_path):
    from sentence_transformers import SentenceTransformer

    path, _ = tiny_with_tokenizer
    enc = SentenceEncoder.from_pretrained(path)
    enc.save_pretrained(str(tmp_path / "st"))
    theirs = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS)
    assert np.abs(_unit(theirs) - _unit(enc.encode(TEXTS))).max() <= TOL
    assert json.load(open(tmp_path / "st" / "config.json"))["model_type"] == "mpnet"


def test_sequence_classifier_both_ways(mpnet_dir, tmp_path):
    """MPNetForSequenceClassification (one label) -> CrossEncoder gives transformers' logits; saved
    back, transformers reads it and gives them again."""
    from transformers import AutoModelForSequenceClassification

    src = str(tmp_path / "cls")
    ref = make_mpnet(src, tokenizer_dir=mpnet_dir, classifier=True)
    pairs = [("A man plays a guitar.", "Someone plays music."), ("Dogs run.", "A cat sleeps on the sofa all day long.")]
    ce = CrossEncoder.from_pretrained(src)
    assert ce.module.pooling == "pooler"
    feats = ce.tokenizer.hf([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        want = ref(input_ids=feats["input_ids"], attention_mask=feats["attention_mask"]).logits[:, 0].numpy()
    got = ce.predict(pairs, activation="none")
    assert np.abs(got - want).max() <= TOL
    ce.save_pretrained(str(tmp_path / "out"))
    back = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "out")).eval()
    assert type(back).__name__ == "MPNetForSequenceClassification"
    with torch.no_grad():
        again = back(input_ids=feats["input_ids"], attention_mask=feats["attention_mask"]).logits[:, 0].numpy()
    assert np.abs(again - want).max() <= TOL
    assert sorted(read_hf_tensors(str(tmp_path / "out"))) == sorted(k for k in ref.state_dict()
                                                                      if k != "mpnet.embeddings.position_ids")


def test_all_mpnet_base_v2_equals_sentence_transformers(mpnet_dir, stsb_test):
    """The shipped model on 96 STS-B test sentences (the longest among them included), packed and
    padded, against SentenceTransformer(all-mpnet-base-v2).encode."""
    from st_reference import st_encode

    s1, s2, _ = stsb_test
    texts = sorted(set(s1 + s2), key=len)
    texts = texts[:48] + texts[-48:]
    enc = SentenceEncoder.from_pretrained(mpnet_dir)
    assert isinstance(enc.config, MPNetConfig) and enc.tokenizer.max_length == 384
    want = st_encode(mpnet_dir, texts)
    assert np.abs(enc.encode(texts, batch_size=32) - want).max() <= TOL
    enc.packed = False
    assert np.abs(enc.encode(texts, batch_size=32) - want).max() <= TOL
