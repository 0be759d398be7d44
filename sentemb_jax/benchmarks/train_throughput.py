"""Training throughput: our MiniLM in-batch softmax step vs sentence-transformers' MNRL, side by side.

    python -m sentemb_jax.benchmarks.train_throughput [--rounds 3] [--steps 8] [--batch_size 64]

Both train all-MiniLM-L6-v2 on the same NLI entailment pairs (the first steps x batch_size of
nli/pairs.tsv), batch 64, max length 64, AdamW lr 2e-5 (weight decay 0.01), temperature 0.05
(MNRL's scale 20). Ours is the train job's step, built by the run setup (training.setup).
Each lives in its own worker process (warmed up: every batch shape compiled / allocator warm);
rounds alternate, one implementation at a time. Prints pairs/s of both, model-FLOPs utilisation
against a float32 matmul measured in this run, and last `ratio_vs_sentence_transformers=<x.xx>`.
Model FLOPs: 6 x (non-embedding params) per real token, two sentences per pair (fwd + bwd).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer import losses

from sentemb_jax.benchmarks.encode_throughput import run_side_by_side, serve_rounds
from sentemb_jax.benchmarks.machine import cpu_description, keep_jax_on_cpu_and_compiling, numpy_matmul_gflops, usable_cores
from sentemb_jax.data.files import FileSpec, read_examples
from sentemb_jax.hub import packaged_minilm_path
from sentemb_jax.methods.contrastive import Contrastive
from sentemb_jax.paths import default_data_dir
from sentemb_jax.tokenization import TRAIN_BUCKETS, Tokenizer
from sentemb_jax.training.config import DataConfig, EvalConfig, OptimizerConfig, RunConfig, ScheduleConfig, TowerConfig
from sentemb_jax.training.setup import setup_run


def _pairs(data_dir: str | None, n: int) -> list[tuple[str, str]]:
    spec = FileSpec(os.path.join(data_dir or default_data_dir(), "nli", "pairs.tsv"),
                    {"anchor": "sentence1", "positive": "sentence2"}, keep={"label": ("entailment",)})
    rows = read_examples(spec)[:n]
    return [(r["anchor"], r["positive"]) for r in rows]


def _worker(kind: str, model_dir: str, pairs, batch_size: int, steps: int, threads: int, pack: bool, conn) -> None:
    batches = [pairs[i : i + batch_size] for i in range(0, steps * batch_size, batch_size)]
    if kind == "sentence_transformers":
        torch.set_num_threads(threads)
        transformers.utils.logging.disable_progress_bar()  # its "Loading weights" bar
        model = SentenceTransformer(model_dir, device="cpu")
        model.max_seq_length = 64
        loss_fn = losses.MultipleNegativesRankingLoss(model, scale=20.0)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
        model.train()

        def run():
            for b in batches:
                feats = [model.preprocess([p[0] for p in b]), model.preprocess([p[1] for p in b])]
                loss = loss_fn(feats, None)
                opt.zero_grad()
                loss.backward()
                opt.step()
            return float(loss.detach())
    else:
        # The train job's own step, built by the run setup: AdamW at a constant 2e-5, weight decay
        # 0.01 and no gradient clipping, as torch.optim.AdamW's defaults on the other side.
        config = RunConfig(model_dir="/unused", num_steps=steps, model=TowerConfig(init_from=model_dir),
                           data=DataConfig(batch_size=batch_size, sequence_length=64, pack=pack),
                           optimizer=OptimizerConfig(name="adamw", clip_norm=None, weight_decay=0.01),
                           schedule=ScheduleConfig(peak=2e-5, decay="constant"), evaluation=EvalConfig(every=None))
        train_run = setup_run(config, Contrastive(temperature=0.05), abstract=True)
        tok = train_run.model.tokenizer
        tok.max_length, tok.buckets = 64, tuple(b for b in TRAIN_BUCKETS if b < 64) + (64,)

        def features(b):  # host work of every step, timed like sentence-transformers' tokenize
            a, p = tok([x[0] for x in b]), tok([x[1] for x in b])
            return train_run.device_batch({"anchor_input_ids": a["input_ids"], "anchor_attention_mask": a["attention_mask"],
                                           "positive_input_ids": p["input_ids"], "positive_attention_mask": p["attention_mask"]})

        state = train_run.initial_state()
        rng = train_run.rng()

        def run():
            nonlocal state
            with train_run.context():
                for b in batches:
                    state, metrics = train_run.step_fn(state, features(b), rng)
            return float(metrics["loss"])
    start = time.perf_counter()
    run()  # warm-up: the first round from cold (ours: compiles)
    conn.send(("ready", {"first_call_s": time.perf_counter() - start}))
    serve_rounds(conn, run)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--model", default=None, help="model directory (default: the shipped all-MiniLM-L6-v2)")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--with_unpacked", action="store_true", help="also time our step without sequence packing")
    args = parser.parse_args(argv)

    keep_jax_on_cpu_and_compiling()
    print(f"machine: {cpu_description()}", flush=True)
    model_dir = args.model or packaged_minilm_path()
    pairs = _pairs(args.data_dir, args.steps * args.batch_size)
    tok = Tokenizer.from_pretrained(model_dir, max_length=64)
    real_tokens_per_pair = sum(len(tok.tokenize([a])[0]) + len(tok.tokenize([b])[0]) for a, b in pairs) / len(pairs)
    non_embedding_params = 22.7e6 - 30522 * 384 - 512 * 384 - 2 * 384  # all-MiniLM-L6-v2
    flops_per_pair = 6 * non_embedding_params * real_tokens_per_pair
    threads = usable_cores()  # XLA's CPU client uses every core it may; give torch the same
    common = (model_dir, pairs, args.batch_size, args.steps, threads)
    peak = numpy_matmul_gflops()
    workers = {"sentemb_jax": (_worker, ("sentemb_jax", *common, True)),
               "sentence_transformers": (_worker, ("sentence_transformers", *common, False))}
    if args.with_unpacked:
        workers["sentemb_jax_unpacked"] = (_worker, ("sentemb_jax", *common, False))
    startup: dict = {}
    try:
        med = run_side_by_side(workers, args.rounds, label="pairs/s", count=len(pairs), startup=startup)
    except RuntimeError as e:  # a worker that failed or died: named, the last line, exit 1
        sys.exit(f"error: {e}")
    print(f"batch_size={args.batch_size} steps/round={args.steps} threads={threads} real tokens/pair={real_tokens_per_pair:.1f}")
    print(f"float32 matmul peak (numpy, 2048^2, this run): {peak:.0f} GFLOP/s")
    for n, v in med.items():
        print(f"{n}: {v:.1f} pairs/s (median), MFU {v * flops_per_pair / 1e9 / peak * 100:.1f}%; "
              f"first round from cold {startup[n]['first_call_s']:.1f} s")
    print(f"ratio_vs_sentence_transformers={med['sentemb_jax'] / med['sentence_transformers']:.2f}")


if __name__ == "__main__":
    main()
