"""The real train step of a config, timed on the local accelerator.

    python -m sentemb_jax.benchmarks.step_time --gin_file gin/models/minilm_l6.gin --gin_file gin/runs/minilm_nli.gin \
        [--gin.KEY=VALUE ...] [--program train|cross_step|bi_step|ensemble_student] [--mesh DATA,FSDP,MODEL] \
        [--device cpu|gpu|tpu] [--steps 20] [--warmup 3] [--xla_options NAME,...] [--profile DIR] [--json FILE]

The step is the one the trainer runs: built by the run setup (training.setup.setup_run through
benchmarks.aot, as the compile-only tools build it) - the gin file's mesh, tower, method, optimizer,
precision and shardings, jitted with the state donated - fed random ids of the configured shapes
(every text the full sequence length, unpacked). After `--warmup` steps (compile and first runs),
`--steps` steps are timed one by one, the device synchronised before every clock read. Printed:
the device; the median step time with its spread (min - max); examples/s and tokens/s; the model
FLOPs per step (6 x N x tokens for the matmul parameters N, plus attention's 12 x layers x length x
width per token, as the scaling study counts); MFU against a matmul ceiling measured in this run on
this device in the step's dtype and precision, and against the device's spec peak where known; the
peak device memory (`memory_stats()`) beside the compiler's `memory_analysis()` of the same step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Sequence

import jax
import numpy as np

from sentemb_jax import partitioning
from sentemb_jax.benchmarks import aot, profile_table
from sentemb_jax.benchmarks.machine import device_description, matmul_ceiling, select_devices, spec_peak
from sentemb_jax.errors import SentembError, UsageError
from sentemb_jax.training.setup import Run
from sentemb_jax.xla_options import apply_xla_options

PROGRAMS = ("train", "cross_step", "bi_step", "ensemble_student")


def build_run(program: str, gin_files: Sequence[str], bindings: Sequence[str], devices) -> tuple[Run, list[str]]:
    """The run whose step `program` names, built abstractly by the run setup on `devices`."""
    if program == "train":
        return aot.train_run(gin_files, bindings, devices)
    if program == "ensemble_student":
        return aot.ensemble_student_run(gin_files, bindings, devices), []
    (kind, run), = aot.trans_encoder_runs(gin_files, bindings, devices, only=program)
    return run, ["pairs unpacked"]


def attention_flops_per_token(module, length: int) -> float:
    """Training FLOPs of self-attention per token (QK^T and AV, forward and backward: 12 x layers x
    length x heads x head width), which 6 x N leaves out; encoder layers only (a Sentence-T5
    decoder runs one token per text)."""
    cfg = module.backbone_config
    layers = int(getattr(cfg, "num_layers", 0) or getattr(cfg, "num_hidden_layers", 0))
    heads = int(getattr(cfg, "num_heads", 0) or getattr(cfg, "num_attention_heads", 0))
    head_width = int(getattr(cfg, "d_kv", 0) or (getattr(cfg, "hidden_size", 0) // max(heads, 1)))
    return 12.0 * layers * length * heads * head_width


def matmul_dtype(run: Run) -> str:
    dtype = getattr(run.module.backbone_config, "dtype", "float32")
    return str(np.dtype(dtype)) if not isinstance(dtype, str) else dtype


PROFILED_STEPS = 3


def time_step(run: Run, steps: int, warmup: int, profile_dir: str | None = None) -> dict:
    """Warm-up, then `steps` steps timed one at a time (median, spread); the step's compiled memory;
    with `profile_dir`, PROFILED_STEPS more steps under the profiler, summarised by op class."""
    state = run.initial_state()
    host = run.random_batch(seed=0)
    batch = partitioning.shard_batch(host, run.mesh)
    rng = run.rng()
    with run.context():
        compiled = run.step_fn.lower(state, batch, rng).compile()
        for _ in range(warmup):
            state, out = run.step_fn(state, batch, rng)
        jax.block_until_ready((state, out))
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            state, out = run.step_fn(state, batch, rng)
            jax.block_until_ready((state, out))
            times.append(time.perf_counter() - started)
        profile = None
        if profile_dir:
            with jax.profiler.trace(profile_dir, create_perfetto_trace=True):
                for _ in range(PROFILED_STEPS):
                    state, out = run.step_fn(state, batch, rng)
                jax.block_until_ready((state, out))
            with open(os.path.join(profile_dir, profile_table.HLO_FILE), "w", encoding="utf-8") as f:
                f.write(compiled.as_text())  # what the op classes read (and a later offline summary)
            profile = profile_table.summarise(profile_dir, PROFILED_STEPS)
    loss = float(out["loss"])
    if not np.isfinite(loss):
        raise SentembError(f"the timed step's loss is {loss}: the numbers would be a broken step's")
    memory = compiled.memory_analysis()
    compiled_bytes = None
    if memory is not None:
        compiled_bytes = int(sum(getattr(memory, f"{k}_size_in_bytes", 0) for k in ("argument", "output", "temp"))
                             - getattr(memory, "alias_size_in_bytes", 0))
    stats = run.mesh.devices.flat[0].memory_stats() or {}
    return {"times": times, "loss": loss, "compiled_bytes": compiled_bytes,
            "peak_bytes": stats.get("peak_bytes_in_use"), "profile": profile}


def measure(program: str, gin_files: Sequence[str], bindings: Sequence[str], devices, steps: int, warmup: int,
            profile_dir: str | None = None) -> dict:
    run, notes = build_run(program, gin_files, bindings, devices)
    timed = time_step(run, steps, warmup, profile_dir)
    prog = aot.program_of(run, " + ".join(gin_files), program, notes)
    data = run.config.data
    tokens = prog.tokens  # every side, padded length
    flops = prog.model_flops + (attention_flops_per_token(run.module, data.sequence_length) * tokens
                                if prog.train else 0.0)
    median = statistics.median(timed["times"])
    dtype = matmul_dtype(run)
    precision = run.config.matmul_precision
    ceiling = matmul_ceiling(devices[0], dtype, precision)
    peak = spec_peak(devices[0], dtype, precision)
    return {
        "program": program, "gin_files": list(gin_files), "bindings": list(bindings), "device": device_description(devices),
        "mesh": dict(run.mesh.shape), "method": type(run.method).__name__, "dtype": dtype, "matmul_precision": precision,
        "batch": data.batch_size, "sequence_length": data.sequence_length, "sides": prog.info["sides"],
        "params": prog.params, "steps": steps, "warmup": warmup,
        "median_s": median, "min_s": min(timed["times"]), "max_s": max(timed["times"]),
        "examples_per_s": prog.examples / median, "tokens_per_s": tokens / median, "model_flops": flops,
        "achieved_tflops": flops / median / 1e12, "ceiling_tflops": ceiling / 1e12,
        "mfu_vs_ceiling": flops / median / ceiling, "spec_peak_tflops": peak / 1e12 if peak else None,
        "mfu_vs_spec": flops / median / peak if peak else None,
        "peak_device_bytes": timed["peak_bytes"], "compiled_bytes": timed["compiled_bytes"], "loss": timed["loss"],
        "notes": notes, "profile": timed["profile"],
    }


def _gib(x) -> str:
    return "n/a" if x is None else f"{x / 2**30:.2f} GiB"


def report_lines(r: dict) -> list[str]:
    spec = (f", {100 * r['mfu_vs_spec']:.1f}% of the spec peak {r['spec_peak_tflops']:.0f} TFLOP/s"
            if r["mfu_vs_spec"] is not None else " (no spec peak known for this device)")
    return [
        f"{r['program']}: {' + '.join(r['gin_files'])}{' ' + ' '.join(r['bindings']) if r['bindings'] else ''}",
        f"  device {r['device']}; mesh {r['mesh']}; {r['method']}, {r['dtype']}, matmul precision {r['matmul_precision']}; "
        f"batch {r['batch']} x {r['sequence_length']} tokens x {r['sides']} side(s); {r['params'] / 1e6:.1f}M params",
        f"  step {1e3 * r['median_s']:.2f} ms median ({1e3 * r['min_s']:.2f} - {1e3 * r['max_s']:.2f} ms over {r['steps']} "
        f"steps after {r['warmup']} warm-up); {r['examples_per_s']:.1f} examples/s, {r['tokens_per_s']:.0f} tokens/s",
        f"  model FLOPs {r['model_flops'] / 1e12:.3f} TFLOP/step: {r['achieved_tflops']:.2f} TFLOP/s = "
        f"{100 * r['mfu_vs_ceiling']:.1f}% of the measured matmul ceiling {r['ceiling_tflops']:.2f} TFLOP/s{spec}",
        f"  memory: peak on device {_gib(r['peak_device_bytes'])}; compiler's memory_analysis {_gib(r['compiled_bytes'])}",
        *([f"  XLA options: {', '.join(r['xla_options'])} ({' '.join(r['xla_flags'])})"] if r.get("xla_options") else []),
        *(f"  note: {n}" for n in r["notes"]),
        *(["  profile by op class:", *(f"  {line}" for line in profile_table.table_lines(r["profile"]))]
          if r.get("profile") else []),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sentemb_jax.benchmarks.step_time", description=__doc__.split("\n")[0])
    parser.add_argument("--gin_file", action="append", required=True)
    parser.add_argument("--program", choices=PROGRAMS, default="train")
    parser.add_argument("--mesh", default=None, help="DATA,FSDP,MODEL (default: the gin file's MeshConfig)")
    parser.add_argument("--device", choices=("cpu", "gpu", "tpu"), default=None, help="default: what JAX finds")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the result as JSON to this file")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help=f"also trace {PROFILED_STEPS} steps into DIR and print them by op class (benchmarks.profile_table)")
    parser.add_argument("--xla_options", default="", help="named XLA GPU options, comma-separated (sentemb_jax.xla_options)")
    args, rest = parser.parse_known_args(argv)
    options = tuple(o for o in args.xla_options.split(",") if o)
    flags = apply_xla_options(options, os.path.dirname(os.path.abspath(args.json or "step_time.json")), where="--xla_options")
    bindings = []
    for item in rest:
        if not item.startswith("--gin."):
            raise UsageError(f"unknown argument {item!r} (gin bindings are --gin.KEY=VALUE)")
        bindings.append(item[len("--gin."):])
    if args.steps < 1 or args.warmup < 1:
        raise UsageError("--steps and --warmup must be >= 1 (the first step compiles)")
    if args.mesh:
        try:
            data, fsdp, model = (int(x) for x in args.mesh.split(","))
        except ValueError:
            raise UsageError(f"--mesh {args.mesh!r}: give DATA,FSDP,MODEL, e.g. 1,1,1 or -1,4,1") from None
        bindings += [f"sentemb_jax.MeshConfig.data = {data}", f"sentemb_jax.MeshConfig.fsdp = {fsdp}",
                     f"sentemb_jax.MeshConfig.model = {model}"]
    devices = select_devices(args.device)
    result = {**measure(args.program, args.gin_file, bindings, devices, args.steps, args.warmup, args.profile),
              "xla_options": list(options), "xla_flags": flags}
    print("\n".join(report_lines(result)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SentembError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
