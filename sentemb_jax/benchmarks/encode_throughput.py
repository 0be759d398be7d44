"""Encoding throughput: our JAX encoder vs sentence-transformers, same model, data, batch and threads.

    python -m sentemb_jax.benchmarks.encode_throughput [--rounds 5] [--batch_size 64]

Encodes the STS-B test sentences (both columns) with all-MiniLM-L6-v2. Each implementation lives
in its own worker process (so torch's OpenMP spin-waiting and XLA's thread pool never compete),
both are warmed up, then this script alternates them round by round - only one runs at a time -
and prints sentences/s of each (median over rounds). The last line is
`ratio_vs_sentence_transformers=<ours / theirs>`.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import torch
from sentence_transformers import SentenceTransformer

from sentemb_jax import SentenceEncoder
from sentemb_jax.data.files import default_data_dir, read_sts_pairs
from sentemb_jax.hub import packaged_minilm_path


def _load_sentences(data_dir: str | None) -> list[str]:
    s1, s2, _ = read_sts_pairs(os.path.join(data_dir or default_data_dir(), "stsb", "test.tsv"))
    return s1 + s2


def _worker(kind: str, model_dir: str, sentences: list[str], batch_size: int, threads: int, conn) -> None:
    if kind == "sentence_transformers":
        torch.set_num_threads(threads)
        model = SentenceTransformer(model_dir, device="cpu")
    else:
        model = SentenceEncoder.from_pretrained(model_dir)
    run = lambda: model.encode(sentences, batch_size=batch_size, show_progress_bar=False)  # noqa: E731
    run()  # warm-up: compiles every bucket shape / fills allocator caches
    conn.send("ready")
    while conn.recv() == "run":
        start = time.perf_counter()
        run()
        conn.send(time.perf_counter() - start)


def run_side_by_side(workers: dict[str, tuple], rounds: int, label: str = "sent/s", count: int = 1) -> dict[str, float]:
    """Start one process per (target, args) entry, then alternate them `rounds` times; median rates."""
    ctx = mp.get_context("spawn")
    conns, procs = {}, []
    for name, (target, args) in workers.items():
        parent, child = ctx.Pipe()
        p = ctx.Process(target=target, args=(*args, child), daemon=True)
        p.start()
        conns[name], procs = parent, procs + [p]
        if parent.recv() != "ready":
            raise RuntimeError(f"{name} worker failed to start")
    rates: dict[str, list[float]] = {n: [] for n in workers}
    try:
        for r in range(rounds):
            for name, conn in conns.items():
                conn.send("run")
                rates[name].append(count / conn.recv())
            print(f"round {r + 1}: " + "  ".join(f"{n}={rates[n][-1]:.1f} {label}" for n in workers), flush=True)
    finally:
        for conn in conns.values():
            conn.send("stop")
        for p in procs:
            p.join(timeout=30)
    return {n: statistics.median(v) for n, v in rates.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--model", default=None, help="model directory (default: the shipped all-MiniLM-L6-v2)")
    parser.add_argument("--data_dir", default=None)
    args = parser.parse_args(argv)

    model_dir = args.model or packaged_minilm_path()
    sentences = _load_sentences(args.data_dir)
    threads = os.cpu_count()  # XLA's CPU client uses every core; give torch the same
    common = (model_dir, sentences, args.batch_size, threads)
    med = run_side_by_side(
        {"sentemb_jax": (_worker, ("sentemb_jax", *common)),
         "sentence_transformers": (_worker, ("sentence_transformers", *common))},
        args.rounds, count=len(sentences),
    )
    print(f"model={model_dir} sentences={len(sentences)} batch_size={args.batch_size} threads={threads} rounds={args.rounds}")
    for n, v in med.items():
        print(f"{n}: {v:.1f} sentences/s (median)")
    print(f"ratio_vs_sentence_transformers={med['sentemb_jax'] / med['sentence_transformers']:.2f}")


if __name__ == "__main__":
    main()
