"""CrossEncoder directories both ways with transformers / sentence-transformers 6.2 (all local, no
downloads): Hugging Face *ForSequenceClassification checkpoints (saved by transformers or by
sentence-transformers) load with their classifier, and what save_pretrained writes loads in
sentence_transformers.CrossEncoder with equal scores (max |diff| <= 1e-5, sigmoid and logits), on
STS-B dev pairs; T5 and earlier versions' directories keep our layout."""
import json
import os
import shutil

import numpy as np
import pytest
import torch
import transformers
from hf_models import make_t5

from sentemb_jax.cross_encoder import HEAD_CONFIG, HEAD_FILE, CrossEncoder
from sentemb_jax.errors import CheckpointError

TOL = 1e-5
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


@pytest.fixture(scope="module")
def pairs(data_dir):
    from sentemb_jax.data.files import read_sts_pairs

    s1, s2, _ = read_sts_pairs(os.path.join(data_dir, "stsb", "dev.tsv"))
    return list(zip(s1[:96], s2[:96]))


def _copy_tokenizer(src: str, dst: str) -> None:
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), dst)


def _tiny_bert_classifier(path, minilm_dir, num_labels=1, seed=0):
    """A random BertForSequenceClassification (MiniLM's WordPiece tokenizer) saved by transformers;
    its classifier and pooler scaled up so that scores spread well beyond sigmoid's flat middle."""
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=128, num_labels=num_labels)
    model = transformers.BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        model.classifier.weight.normal_(0, 1.0)
        model.bert.pooler.dense.weight.normal_(0, 0.3)
    model.save_pretrained(path)
    _copy_tokenizer(minilm_dir, path)
    return model


def _st(path):
    from sentence_transformers import CrossEncoder as STCrossEncoder

    return STCrossEncoder(str(path), device="cpu")


def _st_scores(model, pairs):
    """sentence-transformers' predict: its default activation (sigmoid for one label) and the logits."""
    return (model.predict(pairs, batch_size=32),
            model.predict(pairs, batch_size=32, activation_fn=torch.nn.Identity()))


def _max_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max())


def _assert_same_scores(ours: CrossEncoder, theirs, pairs, what: str):
    sig, logits = _st_scores(theirs, pairs)
    d_sig, d_logit = _max_diff(ours.predict(pairs), sig), _max_diff(ours.predict(pairs, activation="none"), logits)
    print(f"{what}: max |ours - sentence-transformers| sigmoid {d_sig:.2e}, logits {d_logit:.2e} "
          f"(logits span {logits.min():.2f} .. {logits.max():.2f})")
    # Logits of up to ~10 here: float32 sums in another order differ by a few ulps of them.
    assert d_sig <= TOL and d_logit <= TOL * max(1.0, float(np.abs(logits).max())), (d_sig, d_logit)
    return d_logit


def test_hf_and_st_sequence_classifiers_load_with_their_classifier(tmp_path, minilm_dir, pairs):
    hf_dir, st_dir = tmp_path / "hf", tmp_path / "st"
    model = _tiny_bert_classifier(hf_dir, minilm_dir)
    theirs = _st(hf_dir)
    theirs.save_pretrained(str(st_dir))  # sentence-transformers' own layout of the same model
    assert (st_dir / "modules.json").is_file()
    for d in (hf_dir, st_dir):
        ours = CrossEncoder.from_pretrained(str(d))
        assert ours.module.pooling == "pooler" and ours.tokenizer.max_length == 128  # capped at the positions, as ST
        _assert_same_scores(ours, theirs, pairs, f"{d.name} -> ours")
    # The classifier is the checkpoint's, not a new one: the torch model's own logits on one pair.
    enc = theirs.tokenizer([pairs[0][0]], [pairs[0][1]], return_tensors="pt")
    with torch.no_grad():
        want = model(**enc).logits[0, 0].item()
    assert abs(float(ours.predict(pairs[:1], activation="none")[0]) - want) <= TOL


@pytest.mark.parametrize("pooling", [None, "first", "mean"])
def test_saved_minilm_cross_encoder_loads_in_sentence_transformers(tmp_path, minilm_dir, pairs, pooling):
    """all-MiniLM-L6-v2 + a new head (None: HF's pooler head, from MiniLM's pretrained pooler), its
    head made larger so that the logits spread; save -> sentence_transformers.CrossEncoder."""
    ours = CrossEncoder.from_pretrained(minilm_dir, pooling=pooling, max_seq_length=48, seed=1)
    rng = np.random.default_rng(0)
    ours.params["head"]["kernel"] = rng.normal(0, 0.25, ours.params["head"]["kernel"].shape).astype(np.float32)
    out = tmp_path / "cross"
    ours.save_pretrained(str(out))
    hf = json.loads((out / "config.json").read_text())
    st_cfg = json.loads((out / "config_sentence_transformers.json").read_text())
    assert st_cfg["model_type"] == "CrossEncoder" and st_cfg["activation_fn"] == "torch.nn.modules.activation.Sigmoid"
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 48
    assert not (out / HEAD_FILE).exists() and not (out / HEAD_CONFIG).exists()
    theirs = _st(out)
    assert theirs.max_seq_length == 48
    _assert_same_scores(ours, theirs, pairs, f"ours ({ours.module.pooling}) -> sentence-transformers")
    if pooling is None:  # Hugging Face's layout: transformers' own class scores it the same
        assert ours.module.pooling == "pooler"
        assert hf["architectures"] == ["BertForSequenceClassification"]
        assert hf["id2label"] == {"0": "LABEL_0"} and hf["label2id"] == {"LABEL_0": 0}
        model = transformers.AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
        assert model.config.num_labels == 1
        enc = theirs.tokenizer([a for a, _ in pairs], [b for _, b in pairs], padding=True, truncation=True,
                               max_length=48, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[:, 0].numpy()
        assert _max_diff(ours.predict(pairs, activation="none"), logits) <= TOL
    else:  # no HF class has this head: sentence-transformers' modules (Pooling, Dense to the score)
        assert (out / "2_Dense" / "config.json").is_file() and hf["architectures"] == ["BertModel"]
    back = CrossEncoder.from_pretrained(str(out))
    assert back.module.pooling == ours.module.pooling and back.tokenizer.max_length == 48
    assert _max_diff(back.predict(pairs, activation="none"), ours.predict(pairs, activation="none")) <= 1e-6


def test_roberta_sequence_classifier_maps_both_ways(tmp_path, minilm_dir):
    """RoBERTa's head (classifier.dense + tanh, classifier.out_proj) onto ours and back, against
    transformers' RobertaForSequenceClassification on token ids."""
    torch.manual_seed(0)
    cfg = transformers.RobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=130, pad_token_id=1, type_vocab_size=1,
                                     num_labels=1)
    model = transformers.RobertaForSequenceClassification(cfg).eval()
    with torch.no_grad():
        model.classifier.out_proj.weight.normal_(0, 1.0)
    model.save_pretrained(tmp_path / "rb")
    _copy_tokenizer(minilm_dir, tmp_path / "rb")
    ids = torch.tensor([[0, 45, 99, 7, 2, 1, 1], [0, 8, 9, 10, 11, 12, 2]])
    mask = (ids != 1).long()
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits[:, 0].numpy()
    feats = {"input_ids": ids.numpy().astype(np.int32), "attention_mask": mask.numpy().astype(np.int32)}
    ours = CrossEncoder.from_pretrained(str(tmp_path / "rb"))
    assert ours.module.pooling == "pooler"
    assert _max_diff(ours._logits(ours.params, feats), want) <= TOL
    ours.save_pretrained(str(tmp_path / "out"))
    again = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "out")).eval()
    assert type(again).__name__ == "RobertaForSequenceClassification"
    with torch.no_grad():
        assert _max_diff(again(input_ids=ids, attention_mask=mask).logits[:, 0].numpy(), want) <= TOL


def test_t5_cross_encoder_keeps_our_layout(tmp_path, pairs):
    make_t5(str(tmp_path / "t5"), "1.1")
    ours = CrossEncoder.from_pretrained(str(tmp_path / "t5"), pooling="mean", max_seq_length=40)
    ours.save_pretrained(str(tmp_path / "out"))
    files = set(os.listdir(tmp_path / "out"))
    assert {HEAD_FILE, HEAD_CONFIG, "README.md"} <= files and "modules.json" not in files
    saved = json.loads((tmp_path / "out" / HEAD_CONFIG).read_text())
    assert saved["pooling"] == "mean" and saved["max_seq_length"] == 40 and "sentemb_jax.CrossEncoder" in saved["layout"]
    back = CrossEncoder.from_pretrained(str(tmp_path / "out"))
    assert back.module.pooling == "mean" and back.tokenizer.max_length == 40
    assert _max_diff(back.predict(pairs[:20]), ours.predict(pairs[:20])) == 0.0
    with pytest.raises(ValueError, match="'pooler'.*BERT-family"):
        CrossEncoder.from_pretrained(str(tmp_path / "t5"), pooling="pooler")


def test_earlier_versions_directory_still_loads_and_resaves(tmp_path, minilm_dir, pairs):
    """The layout save_pretrained wrote before: the backbone + cross_encoder_head.safetensors +
    cross_encoder.json (no max length: 64, as then)."""
    from hf_models import make_minilm_shaped_bert

    from sentemb_jax.checkpoints import write_safetensors

    old = tmp_path / "old"
    make_minilm_shaped_bert(str(old), minilm_dir)
    rng = np.random.default_rng(0)
    head = {"kernel": rng.normal(0, 0.5, (32, 1)).astype(np.float32), "bias": np.array([0.3], np.float32)}
    write_safetensors(str(old / HEAD_FILE), head)
    (old / HEAD_CONFIG).write_text(json.dumps({"pooling": "mean", "t5_pair_format": "sentence1: {} sentence2: {}"}))
    ours = CrossEncoder.from_pretrained(str(old))
    assert ours.module.pooling == "mean" and ours.tokenizer.max_length == 64
    np.testing.assert_array_equal(np.asarray(ours.params["head"]["kernel"]), head["kernel"])
    same = CrossEncoder.from_pretrained(str(tmp_path / "old"), pooling="first")  # a saved head keeps its pooling
    assert same.module.pooling == "mean"
    # Saved again: sentence-transformers' layout, the old head files gone (they would decide the load).
    ours.save_pretrained(str(old))
    assert not (old / HEAD_FILE).exists() and (old / "2_Dense").is_dir()
    _assert_same_scores(CrossEncoder.from_pretrained(str(old)), _st(old), pairs, "earlier layout, saved again")


def test_refusals(tmp_path, minilm_dir):
    three = tmp_path / "nli"
    _tiny_bert_classifier(three, minilm_dir, num_labels=3)
    with pytest.raises(CheckpointError, match="a classifier with 3 labels; CrossEncoder scores a pair with one logit"):
        CrossEncoder.from_pretrained(str(three))
    # A pickle checkpoint is refused unless allowed; allowed, it keeps its classifier too.
    pkl = tmp_path / "pkl"
    model = _tiny_bert_classifier(tmp_path / "src", minilm_dir)
    shutil.copytree(tmp_path / "src", pkl)
    os.remove(pkl / "model.safetensors")
    torch.save(model.state_dict(), pkl / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="refusing a pickle-based checkpoint"):
        CrossEncoder.from_pretrained(str(pkl))
    pairs = [("a man plays a guitar", "someone plays music")]
    a = CrossEncoder.from_pretrained(str(pkl), allow_pickle=True).predict(pairs, activation="none")
    b = CrossEncoder.from_pretrained(str(tmp_path / "src")).predict(pairs, activation="none")
    assert _max_diff(a, b) == 0.0


@pytest.mark.fast_compile  # test_packing compiles these programs so: one compile, loaded here from the run's cache
def test_pooler_head_packed_logits_and_gradients_equal_padded():
    """The `pooler` head (HF's) through the packed training path, as test_packing checks first / mean."""
    from test_packing import test_packed_cross_encoder_logits_and_gradients_equal_padded as packed_equals_padded

    packed_equals_padded("bert", "pooler")
