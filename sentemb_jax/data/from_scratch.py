"""Inputs of a T5 trained from random init on this machine's data (no T5 checkpoint exists here):
the repository's own SentencePiece vocabulary and the NLI training triples.

    train_tokenizer(out_dir, data_dir)     # out_dir/spiece.model (+ a tokenizer directory)
    build_nli_triples(data_dir, out_path)  # the NLI triples plus entailment pairs with a hard negative

Used by `lab.experiments.tiny_t5_from_scratch` (the learning check from scratch) and the CPU
scaling ladder (`gin/runs/scaling_tiny_t5.gin`). Both are made once and reused.
"""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import sentencepiece as spm

from sentemb_jax.data.files import FileSpec, read_examples

SOURCES = (("nli/sentences.tsv", "sentence"), ("unlabelled/wiki1m_head.tsv", "sentence"))


def train_tokenizer(out_dir: str, data_dir: str, vocab_size: int = 8192) -> str:
    """SentencePiece (unigram) on the NLI + wiki sentences; a directory AutoTokenizer and seqio load."""
    model = os.path.join(out_dir, "spiece.model")
    if os.path.isfile(model):
        return out_dir
    import transformers  # lazy: slow to import (seconds); only the config is written with it
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        for rel, column in SOURCES:
            for row in read_examples(FileSpec(os.path.join(data_dir, rel), {"text": column})):
                f.write(row["text"] + "\n")
        corpus = f.name
    try:
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=os.path.join(out_dir, "spiece"), vocab_size=vocab_size, model_type="unigram",
            pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, num_threads=2,
            input_sentence_size=200_000, shuffle_input_sentence=True, minloglevel=2)
    finally:
        os.remove(corpus)
    # config.json tells AutoTokenizer this is a T5 tokenizer; no extra ids (the model has 8192 rows).
    transformers.T5Config(vocab_size=vocab_size).save_pretrained(out_dir)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "model_max_length": 512}, f)
    return out_dir


def build_nli_triples(data_dir: str, out_path: str, seed: int = 0) -> dict:
    """triples.tsv + the entailment pairs it lacks, each with a hard negative; returns counts.
    An existing `out_path` is kept (its counts are not recomputed: {})."""
    if os.path.isfile(out_path):
        return {}
    triples = read_examples(FileSpec(os.path.join(data_dir, "nli", "triples.tsv"),
                                     {"anchor": "anchor", "positive": "positive", "negative": "negative"}))
    pairs = read_examples(FileSpec(os.path.join(data_dir, "nli", "pairs.tsv"),
                                   {"anchor": "sentence1", "positive": "sentence2", "label": "label"},
                                   text_fields=("anchor", "positive")))
    contradictions: dict[str, list[str]] = {}
    for row in pairs:
        if row["label"] == "contradiction":
            contradictions.setdefault(row["anchor"], []).append(row["positive"])
    pool = [h for hs in contradictions.values() for h in hs]
    rng = np.random.default_rng(seed)
    seen = {(t["anchor"], t["positive"]) for t in triples}
    rows = [(t["anchor"], t["positive"], t["negative"]) for t in triples]
    hard = random = 0
    for row in pairs:
        key = (row["anchor"], row["positive"])
        if row["label"] != "entailment" or key in seen:
            continue
        seen.add(key)
        own = contradictions.get(row["anchor"])
        if own:
            negative, hard = own[rng.integers(len(own))], hard + 1
        else:
            negative, random = pool[rng.integers(len(pool))], random + 1
        rows.append((*key, negative))
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path + ".tmp", "w", encoding="utf-8") as f:  # a killed write leaves no half file behind
        f.write("anchor\tpositive\tnegative\n")
        f.writelines("\t".join(r) + "\n" for r in rows)
    os.replace(out_path + ".tmp", out_path)
    counts = {"triples": len(triples), "added_hard_negative": hard, "added_random_negative": random, "total": len(rows)}
    print(f"training triples {out_path}: {counts}")
    return counts
