"""Input pipeline throughput vs what a MiniLM training step consumes, on this machine.

    python -m sentemb_jax.benchmarks.data_throughput [--batch_size 64] [--batches 200] [--steps 20]

1. The seqio pipeline for NLI entailment pairs (in-graph WordPiece, bucketed padding) is timed
   alone over `--batches` batches (after its first batch, so file validation is excluded).
2. A jitted all-MiniLM-L6-v2 AdamW step with the in-batch softmax loss (two dropout passes,
   one per side) is timed on `--steps` of those batches, each shape compiled beforehand.
Prints batches/s of both and, last, `pipeline_over_step=<x.x>` (the issue asks for >= 5).
"""
from __future__ import annotations

import argparse
import itertools
import time

import jax
import optax

from sentemb_jax import SentenceEncoder
from sentemb_jax.data.pipeline import InputPipeline
from sentemb_jax.data.tasks import register_tasks
from sentemb_jax.hub import packaged_minilm_path
from sentemb_jax.losses import in_batch_softmax_loss
from sentemb_jax.paths import default_data_dir


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--sequence_length", type=int, default=64)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--data_dir", default=None)
    args = parser.parse_args(argv)

    model_dir = packaged_minilm_path()
    names = register_tasks(tokenizer_dir=model_dir, data_dir=args.data_dir or default_data_dir(), kinds=("nli_pairs",))
    pipe = iter(InputPipeline(names["nli_pairs"], batch_size=args.batch_size, sequence_length=args.sequence_length, seed=0))
    next(pipe)  # validation of the file and pipeline start-up
    start = time.perf_counter()
    batches = list(itertools.islice(pipe, args.batches))
    pipeline_rate = len(batches) / (time.perf_counter() - start)

    enc = SentenceEncoder.from_pretrained(model_dir)
    module, optimizer = enc.module, optax.adamw(2e-5)

    def loss_fn(params, batch, rng):
        r1, r2 = jax.random.split(rng)
        embed = lambda side, r: module.apply(  # noqa: E731
            {"params": params}, batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"], False, rngs={"dropout": r})
        return in_batch_softmax_loss(embed("anchor", r1), embed("positive", r2), temperature=0.05)

    @jax.jit
    def step(params, opt_state, batch, rng):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, rng)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    model_batches = [{k: v for k, v in b.items() if k.endswith(("_input_ids", "_attention_mask"))} for b in batches[: args.steps]]
    params, opt_state, rng = enc.params, optimizer.init(enc.params), jax.random.PRNGKey(0)
    for b in model_batches:  # compile every shape first
        params, opt_state, loss = step(params, opt_state, b, rng)
    jax.block_until_ready(loss)
    start = time.perf_counter()
    for i, b in enumerate(model_batches):
        params, opt_state, loss = step(params, opt_state, b, jax.random.fold_in(rng, i))
    jax.block_until_ready(loss)
    step_rate = len(model_batches) / (time.perf_counter() - start)

    print(f"batch_size={args.batch_size} sequence_length={args.sequence_length} devices={jax.devices()}")
    print(f"input pipeline: {pipeline_rate:.1f} batches/s ({pipeline_rate * args.batch_size:.0f} pairs/s, {len(batches)} batches)")
    print(f"MiniLM train step: {step_rate:.2f} batches/s ({step_rate * args.batch_size:.0f} pairs/s, {len(model_batches)} steps)")
    print(f"pipeline_over_step={pipeline_rate / step_rate:.1f}")


if __name__ == "__main__":
    main()
