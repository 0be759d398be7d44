"""Which XLA:CPU library runs a model's matrix products under each set of XLA flags, and how fast,
beside torch's product of the same shapes on the same cores (the machines differ).

    python -m lab.xla_dot_probe                  # MiniLM's products, FLAG_SETS
    python -m lab.xla_dot_probe --flags= --flags=--xla_cpu_use_onednn=true \\
        --shape 1536x384x384

Each flag set runs in its own process: XLA reads XLA_FLAGS when its backend starts, and some sets
kill XLA:CPU (the oneDNN dot fusion dies on SIGILL in MiniLM's forward on an AMD EPYC, jaxlib 0.10.2),
which is then a row saying so, not the end of the run. Per product: the fusion kinds in the compiled
HLO (`__ynn_fusion`: YNNPACK, `__onednn_fusion`: oneDNN, none: XLA's own / Eigen) and GFLOP/s over
`--calls` calls after one warm call, float32 and bfloat16 inputs with float32 results (as
models.common.accumulated_dot multiplies). The first line is the CPU model and its extensions."""
from __future__ import annotations

import argparse
import json
import re
import sys
import time

import jax
import jax.numpy as jnp
import torch

from sentemb_jax.benchmarks.machine import cpu_description, usable_cores
from sentemb_jax.child_process import run_module, what_went_wrong

# MiniLM-L6 (hidden 384, FFN 1536) on 1,536 tokens: a packed batch of 64 x 24 slots.
SHAPES = ["1536x384x384", "1536x384x1536", "1536x1536x384"]
FLAG_SETS = ["",
             "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=dot",
             "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_onednn=true "
             "--xla_cpu_experimental_onednn_fusion_type=dot",
             "--xla_cpu_experimental_ynn_fusion_type="]
DTYPES = ["float32", "bfloat16"]


def _shape(text: str) -> tuple[int, int, int]:
    if not re.fullmatch(r"\d+x\d+x\d+", text):
        raise argparse.ArgumentTypeError(f"{text!r}: want MxKxN, e.g. 1536x384x384")
    return tuple(int(v) for v in text.split("x"))


def _gflops(m: int, k: int, n: int, seconds: float) -> float:
    return 2 * m * k * n / seconds / 1e9


def jax_rows(shapes, calls: int) -> None:
    """In the child (started under its XLA_FLAGS; XLA reads them when its backend starts, at the first
    array): one JSON line per (shape, dtype)."""
    for m, k, n in shapes:
        for dtype in DTYPES:
            a, b = jnp.ones((m, k), dtype), jnp.ones((k, n), dtype)
            product = jax.jit(lambda a, b: jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                                                               preferred_element_type=jnp.float32))
            compiled = product.lower(a, b).compile()
            fusions = sorted(set(re.findall(r'"kind":"(__\w+)"', compiled.as_text())))
            compiled(a, b).block_until_ready()
            start = time.perf_counter()
            for _ in range(calls):
                out = compiled(a, b)
            out.block_until_ready()
            seconds = (time.perf_counter() - start) / calls
            print(json.dumps({"shape": [m, k, n], "dtype": dtype, "gflops": _gflops(m, k, n, seconds),
                              "fusions": fusions, "jax": jax.__version__}), flush=True)


def torch_rows(shapes, calls: int) -> list[dict]:
    torch.set_num_threads(usable_cores())
    rows = []
    for m, k, n in shapes:
        for dtype in DTYPES:
            a, b = torch.ones(m, k, dtype=getattr(torch, dtype)), torch.ones(k, n, dtype=getattr(torch, dtype))
            a @ b
            start = time.perf_counter()
            for _ in range(calls):
                a @ b
            rows.append({"shape": [m, k, n], "dtype": dtype, "torch": torch.__version__,
                         "gflops": _gflops(m, k, n, (time.perf_counter() - start) / calls)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flags", action="append", default=None, help="an XLA_FLAGS set (repeatable; write --flags=...; default FLAG_SETS)")
    parser.add_argument("--shape", action="append", type=_shape, default=None, help="MxKxN (repeatable; default SHAPES)")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--no_torch", action="store_true", help="leave out torch's rows")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # run the products under XLA_FLAGS
    args = parser.parse_args(argv)
    shapes = args.shape or [_shape(s) for s in SHAPES]
    if args.child:
        jax_rows(shapes, args.calls)
        return 0
    print(f"machine: {cpu_description()}", flush=True)
    shape_args = [a for m, k, n in shapes for a in ("--shape", f"{m}x{k}x{n}")]
    failed = 0
    for flags in args.flags if args.flags is not None else FLAG_SETS:
        done, died = run_module(__spec__.name, ["--child", "--calls", str(args.calls), *shape_args], "xla_dot_probe",
                                env={"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"})
        print(f"XLA_FLAGS='{flags}'")
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                print(f"  jax {r['jax']} {'x'.join(map(str, r['shape']))} {r['dtype']:8s} -> float32: "
                      f"{r['gflops']:7.1f} GFLOP/s, fusion: {', '.join(r['fusions']) or 'none'}")
        if done.returncode:
            failed += 1
            print(f"  its process {what_went_wrong(done, died)}")
    if not args.no_torch:
        for r in torch_rows(shapes, args.calls):
            print(f"  torch {r['torch']} {'x'.join(map(str, r['shape']))} {r['dtype']:8s}: {r['gflops']:7.1f} GFLOP/s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
