"""Tiny random Hugging Face (PyTorch) checkpoints written to temp dirs, as parity references."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

from sentemb_jax.benchmarks import report_kit


def _spm_model() -> str:
    """seqio's test sentencepiece model (report_kit.seqio_test_spm), or the file
    SENTEMB_TEST_SPM_MODEL names: on a host without seqio, `report_kit` carries it."""
    return (os.environ.get("SENTEMB_TEST_SPM_MODEL") or report_kit.seqio_test_spm()
            or "(seqio is not installed: set SENTEMB_TEST_SPM_MODEL to seqio's test_data/sentencepiece/sentencepiece.model)")


SPM_MODEL = _spm_model()

T5_TINY = dict(vocab_size=160, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_decoder_layers=2, num_heads=4,
               relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.1)


def make_t5(path: str, version: str = "1.0", seed: int = 0, encoder_only: bool = False):
    """T5 v1.0 (ReLU, tied, rescaled LM head) or v1.1 (gated-GELU, own lm_head) + sentencepiece tokenizer."""
    torch.manual_seed(seed)
    v11 = version == "1.1"
    cfg = transformers.T5Config(**T5_TINY, feed_forward_proj="gated-gelu" if v11 else "relu", tie_word_embeddings=not v11)
    cls = transformers.T5EncoderModel if encoder_only else transformers.T5ForConditionalGeneration
    model = cls(cfg).eval()
    model.save_pretrained(path)
    if v11 and not encoder_only:
        # transformers 5 always ties T5 weights; write the layout of real v1.1 checkpoints instead:
        # tie_word_embeddings false and a separate lm_head.weight (equal values keep the reference exact).
        with open(os.path.join(path, "config.json")) as f:
            hf = json.load(f)
        hf["tie_word_embeddings"] = False
        hf.pop("scale_decoder_outputs", None)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(hf, f)
        tensors = load_file(os.path.join(path, "model.safetensors"))
        tensors["lm_head.weight"] = tensors["shared.weight"].clone()
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(SPM_MODEL, os.path.join(path, "spiece.model"))
    return model


def make_bert(path: str, model_type: str = "bert", seed: int = 0, pooler: bool = True):
    torch.manual_seed(seed)
    kw = dict(vocab_size=120, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=80, hidden_act="gelu")
    if model_type == "roberta":
        cfg = transformers.RobertaConfig(**kw, pad_token_id=1, type_vocab_size=1)
        model = transformers.RobertaModel(cfg, add_pooling_layer=pooler)
    else:
        cfg = transformers.BertConfig(**kw, type_vocab_size=2)
        model = transformers.BertModel(cfg, add_pooling_layer=pooler)
    model.eval().save_pretrained(path)
    return model


MPNET_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def make_mpnet(path: str, seed: int = 0, pooler: bool = True, tokenizer_dir: str | None = None, classifier: bool = False,
               layers: int = 3):
    """A tiny random MPNetModel (MPNetForSequenceClassification with one label: `classifier`); with
    `tokenizer_dir` (all-mpnet-base-v2), its vocabulary and tokenizer files, so real text goes in."""
    torch.manual_seed(seed)
    cfg = transformers.MPNetConfig(vocab_size=30527 if tokenizer_dir else 120, hidden_size=32, num_hidden_layers=layers,
                                   num_attention_heads=4, intermediate_size=64, max_position_embeddings=80,
                                   relative_attention_num_buckets=32, num_labels=1)
    if classifier:
        model = transformers.MPNetForSequenceClassification(cfg)
    else:
        model = transformers.MPNetModel(cfg, add_pooling_layer=pooler)
    model.eval().save_pretrained(path)
    for name in MPNET_TOKENIZER_FILES if tokenizer_dir else ():
        shutil.copy(os.path.join(tokenizer_dir, name), path)
    return model


def padded_batch(vocab: int, lengths: list[int], pad_id: int, low: int = 3, seed: int = 0):
    """Random ids with right padding to max(lengths); mask 1 on real tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(low, vocab, size=(len(lengths), max(lengths))).astype(np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids[mask == 0] = pad_id
    return ids, mask


def make_minilm_shaped_bert(path, minilm_dir: str, seed: int = 0, layers: int = 2, hidden: int = 32,
                            dropout: float = 0.1):
    """A small random BERT with all-MiniLM-L6-v2's WordPiece tokenizer (real text goes through it).
    `dropout` (BERT's 0.1 by default) sets both of its rates: 0 for a test that does not check
    dropout, whose masks are about half of what XLA compiles for a step of a model this small."""
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                                  intermediate_size=2 * hidden, max_position_embeddings=128,
                                  hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if os.path.isfile(os.path.join(minilm_dir, name)):
            shutil.copy(os.path.join(minilm_dir, name), path)
    return model
