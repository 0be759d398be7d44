"""Issue 5's learning check: a tiny T5 v1.1 dual encoder trained from random init on NLI.

    python -m sentemb_jax.experiments.tiny_t5_from_scratch --out runs/tiny_t5_scratch [--minutes 30]

1. Trains an 8k-piece SentencePiece vocabulary (unigram, T5 ids: pad 0, eos 1, unk 2) on the NLI
   and wiki sentences of DATA_DIR and writes a tokenizer directory (spiece.model + config.json).
2. Writes the training file (under --out, never into DATA_DIR): nli/triples.tsv plus every
   entailment pair of nli/pairs.tsv not already there, each with a contradiction hypothesis of
   the same premise as its hard negative (SimCSE's construction) or, when the premise has none,
   a random contradiction hypothesis (then just one more easy negative).
3. Runs `gin/runs/tiny_t5_scratch.gin` (encoder-mean) and `gin/runs/tiny_t5_scratch_encdec.gin`
   (encoder-decoder first token), each in its own process, for `--minutes` of training time
   (STS-B dev evaluation and checkpoint writes are not counted; `train_seconds` in metrics.jsonl).
4. Prints a table of STS-B dev Spearman against training minutes, writes `curves.png`.
A finished run is not repeated (delete its directory to start over); a killed one resumes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import sentencepiece as spm
import transformers

from sentemb_jax.data.files import FileSpec, default_data_dir, read_examples

SOURCES = (("nli/sentences.tsv", "sentence"), ("unlabelled/wiki1m_head.tsv", "sentence"))
RUNS = {"encoder_mean": "gin/runs/tiny_t5_scratch.gin", "encdec_first": "gin/runs/tiny_t5_scratch_encdec.gin"}


def train_tokenizer(out_dir: str, data_dir: str, vocab_size: int = 8192) -> str:
    """SentencePiece (unigram) on the NLI + wiki sentences; a directory AutoTokenizer and seqio load."""
    model = os.path.join(out_dir, "spiece.model")
    if os.path.isfile(model):
        return out_dir
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
    """triples.tsv + the entailment pairs it lacks, each with a hard negative; returns counts."""
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
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("anchor\tpositive\tnegative\n")
        f.writelines("\t".join(r) + "\n" for r in rows)
    counts = {"triples": len(triples), "added_hard_negative": hard, "added_random_negative": random, "total": len(rows)}
    print(f"training triples {out_path}: {counts}")
    return counts


def run_job(gin_file: str, model_dir: str, tokenizer_dir: str, minutes: float, data_dir: str, triples: str) -> None:
    cmd = [sys.executable, "-m", "sentemb_jax.main", f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'",
           f"--gin.TOKENIZER_DIR='{tokenizer_dir}'", f"--gin.DATA_DIR='{data_dir}'",
           f"--gin.sentemb_jax.train.time_budget_s={minutes * 60.0}",
           f"--gin.sentemb_jax.data.register_tasks.files={{'nli_triples': '{triples}'}}"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def read_curve(model_dir: str) -> list[dict]:
    """(step, training minutes, STS-B dev) of every evaluation in metrics.jsonl."""
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{"step": r["step"], "minutes": r["train_seconds"] / 60.0, "stsb_dev": r["stsb_dev_spearman"]}
            for r in rows if "stsb_dev_spearman" in r]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/tiny_t5_scratch")
    parser.add_argument("--minutes", type=float, default=30.0, help="training-time budget per run")
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS), help="none: table and plot only")
    parser.add_argument("--data_dir", default=None)
    args = parser.parse_args(argv)
    data_dir = args.data_dir or default_data_dir()
    tokenizer_dir = train_tokenizer(os.path.join(args.out, "tokenizer"), data_dir)
    triples = os.path.abspath(os.path.join(args.out, "nli_triples_plus_pairs.tsv"))
    build_nli_triples(data_dir, triples)
    for name in args.runs:
        run_job(RUNS[name], os.path.join(args.out, name), tokenizer_dir, args.minutes, data_dir, triples)
    # Table and plot: every run of this output directory (also those of an earlier invocation).
    curves = {name: read_curve(os.path.join(args.out, name)) for name in RUNS
              if os.path.isfile(os.path.join(args.out, name, "metrics.jsonl"))}
    for name, curve in curves.items():
        print(f"\n{name}: step  train_min  stsb_dev")
        for point in curve:
            print(f"  {point['step']:6d}  {point['minutes']:8.1f}  {point['stsb_dev']:7.2f}")
        reached = [p for p in curve if p["stsb_dev"] >= 70.0]
        first = f"{reached[0]['minutes']:.1f} min (step {reached[0]['step']})" if reached else "never"
        print(f"{name}: start {curve[0]['stsb_dev']:.2f}, best {max(p['stsb_dev'] for p in curve):.2f}, "
              f"first >= 70 after {first}")
    _plot(curves, os.path.join(args.out, "curves.png"))


def _plot(curves: dict, path: str) -> None:
    matplotlib.use("Agg")

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, curve in curves.items():
        ax.plot([p["minutes"] for p in curve], [p["stsb_dev"] for p in curve], marker=".", label=name)
    ax.axhline(70.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("training minutes (2-core CPU)")
    ax.set_ylabel("STS-B dev Spearman x 100")
    ax.set_title("tiny T5 v1.1 from random init on NLI (triples + entailment pairs)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
