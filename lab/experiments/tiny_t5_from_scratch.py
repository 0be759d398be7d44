"""The learning check: a tiny T5 v1.1 dual encoder trained from random init on NLI.

    python -m lab.experiments.tiny_t5_from_scratch --out runs/tiny_t5_scratch [--minutes 30]

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

import matplotlib
import matplotlib.pyplot as plt

from sentemb_jax.data.from_scratch import build_nli_triples, train_tokenizer
from sentemb_jax.paths import default_data_dir

RUNS = {"encoder_mean": ("gin/models/t5_tiny_scratch.gin", "gin/runs/tiny_t5_scratch.gin"),
        "encdec_first": ("gin/models/t5_tiny_scratch_encdec.gin", "gin/runs/tiny_t5_scratch_encdec.gin")}


def run_job(gin_files: tuple[str, str], model_dir: str, tokenizer_dir: str, minutes: float, data_dir: str,
            triples: str) -> None:
    cmd = [sys.executable, "-m", "sentemb_jax.main", *(f"--gin_file={f}" for f in gin_files), f"--gin.MODEL_DIR='{model_dir}'",
           f"--gin.TOKENIZER_DIR='{tokenizer_dir}'", f"--gin.DATA_DIR='{data_dir}'",
           f"--gin.sentemb_jax.RunConfig.time_budget_s={minutes * 60.0}",
           f"--gin.sentemb_jax.DataConfig.files={{'nli_triples': '{triples}'}}"]
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
