"""Training throughput: our MiniLM in-batch softmax step vs sentence-transformers' MNRL, side by side.

    python -m sentemb_jax.benchmarks.train_throughput [--device cpu|gpu] [--fp32_matmul ieee|tf32] [--rounds 3]
        [--steps 8] [--batch_size N] [--bf16] [--with_unpacked] [--with_inline_input]

Both train all-MiniLM-L6-v2 on the same NLI entailment pairs (the first steps x batch_size of
nli/pairs.tsv), batch 64 (512 on a GPU), max length 64, AdamW lr 2e-5 (weight decay 0.01), temperature
0.05 (MNRL's scale 20). Ours is the train job's step, built by the run setup (training.setup), its
input (tokenising, packing, device_put) made on the train loop's input thread two batches ahead
(training.prefetch); --with_inline_input adds ours with the input made before each step instead.
Each lives in its own worker process (warmed up: every batch shape compiled / allocator warm);
rounds alternate, one implementation at a time. Prints pairs/s of both, model-FLOPs utilisation
against a matmul ceiling measured in this run on the same device (benchmarks.machine.matmul_ceiling,
in the row's dtype and float32 matmul mode) with the device's data-sheet peak beside it where known,
and last `ratio_vs_sentence_transformers=<x.xx>` (float32 against float32).
Model FLOPs: 6 x (non-embedding params) per real token, two sentences per pair (fwd + bwd).
--device gpu (the default where JAX's default backend is a GPU) runs both on the GPU (CUDA), every
process allocating GPU memory as it needs it; --fp32_matmul sets float32 matmuls of both sides alike
(GPU: ieee, the default, or tf32). --bf16 adds ours in bfloat16 (bf16 activations and matmuls, float32
parameters) against sentence-transformers under `torch.autocast(bfloat16)` (the same split).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from sentemb_jax.benchmarks.encode_throughput import check_torch_finds
from sentemb_jax.benchmarks.machine import (
    apply_jax_fp32_matmul,
    device_description,
    fp32_matmul_line,
    fp32_matmul_settings,
    gpu_memory_line,
    matmul_ceiling,
    numpy_matmul_gflops,
    select_benchmark_device,
    spec_peak,
    usable_cores,
)
from sentemb_jax.benchmarks.side_by_side import run_side_by_side, serve_rounds
from sentemb_jax.data.files import FileSpec, read_examples
from sentemb_jax.errors import UsageError
from sentemb_jax.hub import packaged_minilm_path
from sentemb_jax.methods.contrastive import Contrastive
from sentemb_jax.paths import default_data_dir
from sentemb_jax.tokenization import TRAIN_BUCKETS, Tokenizer
from sentemb_jax.training.config import DataConfig, EvalConfig, OptimizerConfig, RunConfig, ScheduleConfig, TowerConfig
from sentemb_jax.training.loop import PREFETCH_BATCHES
from sentemb_jax.training.prefetch import Prefetcher
from sentemb_jax.training.setup import setup_run

DEFAULT_BATCH_SIZE = {"cpu": 64, "gpu": 512}  # a GPU idles at 64 pairs a step; 512: a usual MNRL batch there


def _pairs_path(data_dir: str | None) -> str:
    return os.path.join(data_dir or default_data_dir(), "nli", "pairs.tsv")


def _pairs(data_dir: str | None, n: int) -> list[tuple[str, str]]:
    spec = FileSpec(_pairs_path(data_dir), {"anchor": "sentence1", "positive": "sentence2"}, keep={"label": ("entailment",)})
    rows = read_examples(spec)[:n]
    return [(r["anchor"], r["positive"]) for r in rows]


class _NoPosition:
    """The Prefetcher's source: these batches are a list, their position is not recorded."""

    def state_dict(self) -> dict:
        return {}


def _jax_run(model_dir: str, batches, settings: dict, pack: bool, bf16: bool, steps: int, batch_size: int,
             prefetch: bool = True):
    """The train job's own step, built by the run setup: AdamW at a constant 2e-5, weight decay 0.01 and
    no gradient clipping, as torch.optim.AdamW's defaults on the other side. bf16: the backbone computes
    in bfloat16 (its parameters stay float32). prefetch: the host work (tokenising, packing,
    device_put) on the train loop's input thread, PREFETCH_BATCHES ahead (training.prefetch); else
    inline before each step, as sentence-transformers' loop does it."""
    apply_jax_fp32_matmul(settings)
    tower = TowerConfig(init_from=model_dir, config_overrides={"dtype": "bfloat16"} if bf16 else None)
    config = RunConfig(model_dir="/unused", num_steps=steps, model=tower,
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
            if not prefetch:
                for b in batches:
                    state, metrics = train_run.step_fn(state, features(b), rng)
                return float(metrics["loss"])  # waits for the device
            feeder = Prefetcher(_NoPosition(), iter(batches), features, PREFETCH_BATCHES)
            try:
                for _, prepared in feeder:
                    state, metrics = train_run.step_fn(state, prepared, rng)
            finally:
                feeder.close()
        return float(metrics["loss"])
    return run


def _worker(kind: str, model_dir: str, pairs, batch_size: int, steps: int, threads: int, pack: bool, bf16: bool,
            settings: dict, prefetch: bool, conn) -> None:
    """One row's process. settings: fp32_matmul_settings (the device and float32 matmul mode of both sides)."""
    batches = [pairs[i : i + batch_size] for i in range(0, steps * batch_size, batch_size)]
    if kind == "sentence_transformers":
        from sentemb_jax.benchmarks import torch_side  # lazy: torch and sentence-transformers (6 s), in their worker only
        run = torch_side.mnrl_train_run(model_dir, batches, settings, threads, bf16)
    else:
        run = _jax_run(model_dir, batches, settings, pack, bf16, steps, batch_size, prefetch)
    start = time.perf_counter()
    run()  # warm-up: the first round from cold (ours: compiles)
    conn.send(("ready", {"first_call_s": time.perf_counter() - start}))
    serve_rounds(conn, run)


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "gpu"), default=None,
                        help="where both sides run (default: a GPU where JAX's default backend is one, else the CPU)")
    parser.add_argument("--fp32_matmul", choices=("ieee", "tf32"), default=None,
                        help="float32 matmuls of both sides on a GPU (default: ieee; the CPU has ieee only)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=None,
                        help=f"pairs a step (default: {DEFAULT_BATCH_SIZE['cpu']} on the CPU, {DEFAULT_BATCH_SIZE['gpu']} on a GPU)")
    parser.add_argument("--bf16", action="store_true", help="also ours in bfloat16 against sentence-transformers "
                        "under torch.autocast(bfloat16)")
    parser.add_argument("--model", default=None, help="model directory (default: the shipped all-MiniLM-L6-v2)")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--with_unpacked", action="store_true", help="also time our step without sequence packing")
    parser.add_argument("--with_inline_input", action="store_true", help="also time ours with its input made inline "
                        "before each step (as sentence-transformers does) instead of on the input thread")
    args = parser.parse_args(argv)
    try:
        if args.steps < 1 or (args.batch_size is not None and args.batch_size < 1):
            raise UsageError(f"--steps {args.steps} --batch_size {args.batch_size}: each at least 1")
        device, devices = select_benchmark_device(args.device)
        check_torch_finds(device, devices)
        settings = fp32_matmul_settings(device, args.fp32_matmul)
    except UsageError as e:
        parser.error(str(e))  # exit 2, before any work (no model loaded, no worker started)
    args.batch_size = args.batch_size or DEFAULT_BATCH_SIZE[device]
    return args, device, devices, settings


def _mfu_lines(med: dict, startup: dict, flops_per_pair: float, device, settings: dict) -> list[str]:
    """Each row's rate and MFU against the matmul ceiling measured now on `device` in the row's dtype and
    float32 mode (after the rounds: the workers have freed the device), the spec peak beside it."""
    lines = []
    for dtype in ("float32", "bfloat16"):
        rows = [n for n in med if ("bf16" in n) == (dtype == "bfloat16")]
        if not rows:
            continue
        precision = settings["ceiling_precision"] if dtype == "float32" else "default"
        ceiling, peak = matmul_ceiling(device, dtype, precision), spec_peak(device, dtype, precision)
        mode = f", fp32 matmul {settings['label']}" if dtype == "float32" else ""
        lines.append(f"{dtype} matmul ceiling (JAX, {device.platform}, this run{mode}): {ceiling / 1e12:.3f} TFLOP/s; "
                     + (f"spec peak {peak / 1e12:.0f} TFLOP/s" if peak else "no spec peak known for this device"))
        for n in rows:
            achieved = med[n] * flops_per_pair
            vs_peak = f", {achieved / peak * 100:.1f}% of the spec peak" if peak else ""
            lines.append(f"{n}: {med[n]:.1f} pairs/s (median), MFU {achieved / ceiling * 100:.1f}%{vs_peak}; "
                         f"first round from cold {startup[n]['first_call_s']:.1f} s")
    return lines


def main(argv=None):
    args, device, devices, settings = _parse(argv)
    print(f"machine: {device_description(devices)}", flush=True)
    print(f"device: {device} (sentence-transformers on torch {settings['torch_device']}); {fp32_matmul_line(settings)}",
          flush=True)
    if device == "gpu":
        print(gpu_memory_line(), flush=True)
    model_dir = args.model or packaged_minilm_path()
    pairs = _pairs(args.data_dir, args.steps * args.batch_size)
    if len(pairs) < args.steps * args.batch_size:  # short or empty batches would time something else
        sys.exit(f"error: {_pairs_path(args.data_dir)}: {len(pairs)} entailment pairs, fewer than --steps {args.steps} "
                 f"x --batch_size {args.batch_size}")
    tok = Tokenizer.from_pretrained(model_dir, max_length=64)
    real_tokens_per_pair = sum(len(tok.tokenize([a])[0]) + len(tok.tokenize([b])[0]) for a, b in pairs) / len(pairs)
    non_embedding_params = 22.7e6 - 30522 * 384 - 512 * 384 - 2 * 384  # all-MiniLM-L6-v2
    flops_per_pair = 6 * non_embedding_params * real_tokens_per_pair
    threads = usable_cores()  # XLA's CPU client uses every core it may; give torch the same
    common = (model_dir, pairs, args.batch_size, args.steps, threads)
    rows = {"sentemb_jax": ("sentemb_jax", True, False), "sentence_transformers": ("sentence_transformers", False, False)}
    if args.with_unpacked:
        rows["sentemb_jax_unpacked"] = ("sentemb_jax", False, False)
    if args.bf16:
        rows.update(sentemb_jax_bf16=("sentemb_jax", True, True),
                    sentence_transformers_autocast_bf16=("sentence_transformers", False, True))
    workers = {n: (_worker, (kind, *common, pack, bf16, settings, True)) for n, (kind, pack, bf16) in rows.items()}
    if args.with_inline_input:
        workers["sentemb_jax_inline_input"] = (_worker, ("sentemb_jax", *common, True, False, settings, False))
    startup: dict = {}
    try:
        med = run_side_by_side(workers, args.rounds, label="pairs/s", count=len(pairs), startup=startup,
                               start_together=device == "gpu")
    except RuntimeError as e:  # a worker that failed or died: named, the last line, exit 1
        sys.exit(f"error: {e}")
    print(f"batch_size={args.batch_size} steps/round={args.steps} threads={threads} real tokens/pair={real_tokens_per_pair:.1f}")
    if device == "cpu":  # what MFU was measured against before the JAX ceiling (docs/RESULTS.md's older rows)
        print(f"float32 matmul (numpy, 2048^2, this run): {numpy_matmul_gflops():.0f} GFLOP/s")
    print("\n".join(_mfu_lines(med, startup, flops_per_pair, devices[0], settings)))
    if args.bf16:
        print(f"sentemb_jax_bf16 / sentence_transformers_autocast_bf16 = "
              f"{med['sentemb_jax_bf16'] / med['sentence_transformers_autocast_bf16']:.2f}")
    if args.with_inline_input:
        print(f"sentemb_jax / sentemb_jax_inline_input = {med['sentemb_jax'] / med['sentemb_jax_inline_input']:.2f} "
              "(input on the input thread / made before each step)")
    print(f"ratio_vs_sentence_transformers={med['sentemb_jax'] / med['sentence_transformers']:.2f}")


if __name__ == "__main__":
    main()
