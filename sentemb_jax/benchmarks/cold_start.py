"""A new process's start, with and without the persistent compilation cache (sentemb_jax.compile_cache):
what a server scaled out or a restarted job waits for before its first answer.

    python -m sentemb_jax.benchmarks.cold_start [--rounds 3] [--model DIR] [--data_dir DIR]

Each round starts two fresh processes one after the other, alternating which goes first: one
without a cache, one with a cache that an earlier process filled (a first, priming process, shown
as its own row). Each loads all-MiniLM-L6-v2, encodes STS-B test once (the first call: it compiles
the shapes it needs) and then runs `warm_up(64)` (every other bucket shape, what a server does at
load), encodes once more (steady) and loads the model a second time in the same process to encode
again (a reload shares the first load's programs). Medians over rounds; the ratio is the time
without the cache over the time with it."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import jax

from sentemb_jax.benchmarks.machine import cpu_description, keep_jax_on_cpu_and_compiling
from sentemb_jax.child_process import run_module, what_went_wrong
from sentemb_jax.compile_cache import cache_hits, enable_compilation_cache
from sentemb_jax.data.files import read_sts_pairs
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.hub import packaged_minilm_path
from sentemb_jax.paths import default_data_dir

STAGES = ("load_s", "first_encode_s", "warm_up_s")


def child(model_dir: str, data_dir: str | None, cache: str | None) -> dict:
    """In a fresh process: the seconds of each stage, the encode's own steady time, cache hits."""
    hits = cache_hits()
    if cache:
        enable_compilation_cache(cache)
    else:  # without: also none a JAX_COMPILATION_CACHE_DIR in the environment would set
        jax.config.update("jax_enable_compilation_cache", False)
    s1, s2, _ = read_sts_pairs(os.path.join(data_dir or default_data_dir(), "stsb", "test.tsv"))
    start = time.perf_counter()
    encoder = SentenceEncoder.from_pretrained(model_dir)
    times = {"load_s": time.perf_counter() - start}
    start = time.perf_counter()
    encoder.encode(s1 + s2, batch_size=64)
    times["first_encode_s"] = time.perf_counter() - start
    start = time.perf_counter()
    encoder.warm_up(64)
    times["warm_up_s"] = time.perf_counter() - start
    start = time.perf_counter()
    encoder.encode(s1 + s2, batch_size=64)
    times["steady_encode_s"] = time.perf_counter() - start
    # The model loaded again in the same process (the next checkpoint to score): encoders of one
    # architecture share their programs, so its first encode compiles nothing.
    hits_before = len(hits)
    again = SentenceEncoder.from_pretrained(model_dir)
    start = time.perf_counter()
    again.encode(s1 + s2, batch_size=64)
    times["reload_first_encode_s"] = time.perf_counter() - start
    return {**times, "cache_hits": hits_before}


def _start(args, cache: str | None) -> dict:
    extra = ["--model", args.model] + (["--data_dir", args.data_dir] if args.data_dir else [])
    done, died = run_module(__spec__.name, ["--child", *extra, *(["--cache", cache] if cache else [])], "cold_start")
    if done.returncode:
        raise SystemExit(f"error: a cold-start process {what_went_wrong(done, died)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _line(name: str, rows: list[dict]) -> str:
    med = {k: statistics.median(r[k] for r in rows) for k in (*STAGES, "steady_encode_s", "reload_first_encode_s", "cache_hits")}
    return (f"{name}: from_pretrained {med['load_s']:.2f} s, first encode {med['first_encode_s']:.2f} s, warm_up() "
            f"{med['warm_up_s']:.2f} s (steady encode {med['steady_encode_s']:.2f} s; a second load's first encode "
            f"{med['reload_first_encode_s']:.2f} s; {med['cache_hits']:.0f} cache hits)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=None, help="model directory (default: the shipped all-MiniLM-L6-v2)")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.model, args.data_dir, args.cache)), flush=True)
        return 0
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: want >= 1")
    keep_jax_on_cpu_and_compiling()
    args.model = args.model or packaged_minilm_path()
    print(f"machine: {cpu_description()}", flush=True)
    with tempfile.TemporaryDirectory() as cache:
        priming = _start(args, cache)
        print(_line("priming (fills the cache)", [priming]), flush=True)
        rows = {"without cache": [], "with the cache": []}
        for r in range(args.rounds):
            order = ["without cache", "with the cache"][:: 1 if r % 2 == 0 else -1]
            for name in order:
                rows[name].append(_start(args, cache if name == "with the cache" else None))
            print(f"round {r + 1}: " + "  ".join(f"{n}={rows[n][-1]['first_encode_s'] + rows[n][-1]['warm_up_s']:.2f} s"
                                                  for n in order), flush=True)
        entries = sum(len(files) for _, _, files in os.walk(cache))
    for name, got in rows.items():
        print(_line(name, got))
    for stage in STAGES:
        a, b = (statistics.median(r[stage] for r in rows[n]) for n in rows)
        print(f"{stage}: without / with the cache = {a / b:.2f}")
    total = [statistics.median(r["first_encode_s"] + r["warm_up_s"] for r in rows[n]) for n in rows]
    print(f"first encode + warm_up: {total[0]:.2f} s -> {total[1]:.2f} s ({total[0] / total[1]:.2f}x); "
          f"{entries} cache entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
