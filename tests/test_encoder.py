"""SentenceEncoder on T5 and BERT checkpoints, HF and sentence-transformers layouts."""
import json
import os

import jax
import numpy as np
import pytest
import torch
from hf_models import make_bert, make_t5

from sentemb_jax import CheckpointError, SentenceEncoder
from sentemb_jax.tokenization import Tokenizer, bucket_length

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

SENTENCES = ["A man is playing a guitar.", "hello", "The quick brown fox jumps over the lazy dog again and again.", "x y z"]


def test_bucket_lengths():
    assert [bucket_length(n) for n in (1, 8, 9, 17, 33, 500, 513, 1100)] == [8, 8, 12, 20, 40, 512, 1024, 1536]


def test_tokenizer_pads_to_bucket_and_truncates(minilm_dir):
    tok = Tokenizer.from_pretrained(minilm_dir, max_length=40)
    batch = tok(["a b c", "word " * 100], batch_size=4)
    assert batch["input_ids"].shape == (4, 40)
    assert batch["attention_mask"].sum(1).tolist() == [5, 40, 0, 0]
    short = tok(["a b c"])
    assert short["input_ids"].shape == (1, 8)
    assert short["input_ids"][0, :5].tolist() == tok.hf("a b c")["input_ids"]


def _torch_mean(last, mask):
    m = mask.unsqueeze(-1).float()
    return (last * m).sum(1) / m.sum(1).clamp(min=1e-9)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_t5_encoder_mean_and_encdec_first(version, tmp_path):
    ref = make_t5(str(tmp_path), version)
    enc = SentenceEncoder.from_pretrained(str(tmp_path), pooling="mean")
    tok = enc.tokenizer.hf(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        last = ref.encoder(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"]).last_hidden_state
        want = torch.nn.functional.normalize(_torch_mean(last, tok["attention_mask"]), dim=-1).numpy()
        start = torch.zeros((len(SENTENCES), 1), dtype=torch.long)
        dec = ref(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"], decoder_input_ids=start,
                  output_hidden_states=True).decoder_hidden_states[-1][:, 0]
        want_dec = torch.nn.functional.normalize(dec, dim=-1).numpy()
    # A plain HF directory has no Normalize module: unit vectors when asked for (normalize_embeddings).
    assert np.abs(enc.encode(SENTENCES, batch_size=3, normalize_embeddings=True) - want).max() <= 1e-4
    raw = enc.encode(SENTENCES, batch_size=3)
    assert np.abs(raw / np.linalg.norm(raw, axis=1, keepdims=True) - want).max() <= 1e-4
    assert np.abs(np.linalg.norm(raw, axis=1) - 1).max() > 1e-2
    encdec = SentenceEncoder.from_pretrained(str(tmp_path), pooling="encdec_first")
    assert np.abs(encdec.encode(SENTENCES, normalize_embeddings=True) - want_dec).max() <= 1e-4
    first = SentenceEncoder.from_pretrained(str(tmp_path), pooling="first", normalize=False)
    assert np.abs(first.encode(SENTENCES, normalize=False) - last[:, 0].numpy()).max() <= 1e-4


def test_encoders_of_one_architecture_share_programs_and_embed_with_their_own_params(tmp_path):
    """Two loads of one tiny T5 share encode's jitted programs (the second adds no executable for a
    shape the first ran), each embeds with its own params (the second's, changed, give its own
    output, equal to its module's plain apply), and another architecture (its first layer only) or
    another pooling has programs of its own."""
    make_t5(str(tmp_path), "1.1")
    a = SentenceEncoder.from_pretrained(str(tmp_path), pooling="mean")
    b = SentenceEncoder.from_pretrained(str(tmp_path), pooling="mean")
    assert (b._embed, b._embed_packed, b._tokens) == (a._embed, a._embed_packed, a._tokens)
    want_a = a.encode(SENTENCES)
    executables = a._embed_packed._cache_size()
    assert np.array_equal(b.encode(SENTENCES), want_a) and a._embed_packed._cache_size() == executables
    b.params = jax.tree_util.tree_map(lambda x: np.asarray(x) * 1.5, b.params)
    got_b = b.encode(SENTENCES)
    assert a._embed_packed._cache_size() == executables and np.abs(got_b - want_a).max() > 1e-2
    assert np.array_equal(a.encode(SENTENCES), want_a)  # a's own params still: nothing of b's leaks in
    padded = b.tokenizer(SENTENCES)
    plain = np.asarray(b.module.apply({"params": b.params}, padded["input_ids"], padded["attention_mask"]))
    assert np.abs(got_b - plain).max() <= 1e-5
    assert a.first_layers(1)._embed is not a._embed
    assert SentenceEncoder.from_pretrained(str(tmp_path), pooling="first")._embed is not a._embed


def test_shared_programs_are_built_once_per_equal_module_and_per_call_when_unhashable():
    from sentemb_jax.inference import shared_programs

    def build(module):
        return (object(),)

    assert shared_programs(build, ("config", 1)) is shared_programs(build, ("config", 1))
    assert shared_programs(build, ("config", 1)) is not shared_programs(build, ("config", 2))
    assert shared_programs(build, ["config", 1]) is not shared_programs(build, ["config", 1])  # a list: no hash
    optimised = shared_programs(build, ("config", 1))
    before = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", not before)  # jit's cache does not key on it
    try:
        assert shared_programs(build, ("config", 1)) is not optimised
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
    assert shared_programs(build, ("config", 1)) is optimised


def test_encdec_needs_decoder(tmp_path):
    make_t5(str(tmp_path), "1.1", encoder_only=True)
    with pytest.raises(CheckpointError, match="needs a T5 checkpoint with a decoder"):
        SentenceEncoder.from_pretrained(str(tmp_path), pooling="encdec_first")


def _save_st_model(model_dir, pooling_mode, dense_out=None):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models  # sentence_transformers.models is deprecated

    word = models.Transformer(model_dir, max_seq_length=48)
    mods = [word, models.Pooling(word.get_embedding_dimension(), pooling_mode=pooling_mode)]
    if dense_out:
        torch.manual_seed(3)
        mods.append(models.Dense(mods[-1].get_embedding_dimension(), dense_out, bias=False,
                                 activation_function=torch.nn.Identity()))
    mods.append(models.Normalize())
    st = SentenceTransformer(modules=mods, device="cpu")
    out = os.path.join(model_dir, "st")
    st.save(out)
    return st, out


def test_sentence_transformers_t5_with_dense(tmp_path):
    """A Sentence-T5-shaped ST model (T5 encoder, mean, Dense without bias, Normalize) equals ST."""
    make_t5(str(tmp_path), "1.1", encoder_only=True)
    st, out = _save_st_model(str(tmp_path), "mean", dense_out=24)
    ours = SentenceEncoder.from_pretrained(out)
    assert ours.get_sentence_embedding_dimension() == 24 and ours.max_seq_length == 48
    want = st.encode(SENTENCES, convert_to_numpy=True)
    assert np.abs(ours.encode(SENTENCES) - want).max() <= 1e-5


@pytest.mark.parametrize("modes", [("cls",), ("max",), ("cls", "mean"), ("weightedmean",), ("lasttoken",)])
def test_sentence_transformers_pooling_modes(modes, tmp_path):
    make_bert(str(tmp_path), "bert", pooler=False)
    from transformers import BertTokenizerFast

    # A real WordPiece vocabulary: tokenizer.json written from a vocab built on the fly.
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(" ".join(SENTENCES).lower().replace(".", " .").split()))
    (tmp_path / "vocab.txt").write_text("\n".join(vocab + [f"w{i}" for i in range(120 - len(vocab))]) + "\n")
    BertTokenizerFast.from_pretrained(str(tmp_path)).save_pretrained(str(tmp_path))
    st, out = _save_st_model(str(tmp_path), modes[0] if len(modes) == 1 else list(modes))
    ours = SentenceEncoder.from_pretrained(out)
    assert ours.module.pooling == tuple(m for m in modes)
    want = st.encode(SENTENCES, convert_to_numpy=True)
    assert np.abs(ours.encode(SENTENCES) - want).max() <= 1e-5


def test_unsupported_st_module(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": "my.CustomModule"}]))
    with pytest.raises(CheckpointError, match="my.CustomModule"):
        SentenceEncoder.from_pretrained(str(tmp_path))


def test_save_pretrained_round_trip_and_sentence_transformers_loads_it(tmp_path):
    """save_pretrained writes a sentence-transformers directory: we and ST load it and agree."""
    make_t5(str(tmp_path / "src"), "1.1", encoder_only=True)
    _, st_dir = _save_st_model(str(tmp_path / "src"), "mean", dense_out=24)
    ours = SentenceEncoder.from_pretrained(st_dir)
    ours.save_pretrained(str(tmp_path / "saved"))
    again = SentenceEncoder.from_pretrained(str(tmp_path / "saved"))
    assert again.module.pooling == ours.module.pooling and again.module.projection_dim == 24
    np.testing.assert_array_equal(again.encode(SENTENCES), ours.encode(SENTENCES))
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert np.abs(st.encode(SENTENCES, convert_to_numpy=True) - ours.encode(SENTENCES)).max() <= 1e-5


def test_saved_model_keeps_the_vocabulary_the_tf_input_pipeline_reads(tmp_path, minilm_dir):
    """An exported model (e.g. an ensemble submodel) can be trained further: HF's fast tokenizer
    saves only tokenizer.json, so save_pretrained also copies vocab.txt, and the saved model's
    in-graph tokenizer gives the original's ids."""
    import tensorflow as tf

    from sentemb_jax.data.vocab import tokenizer_spec_for
    from sentemb_jax.st_layout import transformer_dir_of

    out = str(tmp_path / "saved")
    SentenceEncoder.from_pretrained(minilm_dir).first_layers(1).save_pretrained(out)
    source = transformer_dir_of(minilm_dir)
    with open(os.path.join(source, "vocab.txt"), "rb") as a, open(os.path.join(out, "vocab.txt"), "rb") as b:
        assert a.read() == b.read()
    text = tf.constant("A man is playing a guitar, unbelievably loudly.")
    want = tokenizer_spec_for(source).tokenize_tf(text, 32).numpy().tolist()
    assert tokenizer_spec_for(out).tokenize_tf(text, 32).numpy().tolist() == want
    assert want == Tokenizer.from_pretrained(out).tokenize([text.numpy().decode()])[0]
