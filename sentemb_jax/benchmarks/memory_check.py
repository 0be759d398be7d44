"""Will a config's train step fit? Compile it ahead of time on a simulated mesh and read XLA's
memory analysis - no weights are allocated (params, optimizer state and batch are abstract).

    python -m sentemb_jax.benchmarks.memory_check                    # the 3B and 11B configs (docs/scale.md)
    python -m sentemb_jax.benchmarks.memory_check --configs gin/st5_3b.gin --devices 8

Each config is compiled exactly as `sentemb_jax.main` would run it: its gin file (mesh, fsdp,
scan, remat, dtype, batch size, sequence length, optimizer), the sharded step of
sentemb_jax.training.sharded with its explicit in/out shardings (built by benchmarks/aot.py, the
same program `sentemb_jax.benchmarks.tpu_compile` gives the TPU compiler), on `--devices` simulated CPU
devices (the process re-executes itself with XLA_FLAGS set, before jax starts). Per-device bytes
= arguments (this device's shard of params + optimizer state + batch) + temporaries (activations,
gradients) + outputs not aliased to donated inputs. The CPU compiler's buffer assignment stands
in for the TPU's: same sharding, same program; TPU fusion usually needs less temporary memory.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from sentemb_jax.benchmarks.aot import train_program

# config -> simulated devices; data takes what the gin file's fsdp x model leaves (11B: fsdp 4 x
# model 4 on 64 devices, data 4). Each file's mesh and its TPU figures: docs/scale.md.
DEFAULT_CONFIGS = {"gin/st5_3b.gin": 8, "gin/st5_3b_encdec.gin": 8, "gin/st5_11b.gin": 64, "gin/st5_11b_encdec.gin": 64}
TPU_V3_HBM = 16 * 2**30


def measure(gin_file: str, bindings: list[str]) -> dict:
    """Compile `gin_file`'s train step on this process's devices; bytes per device. The program is
    the one sentemb_jax.benchmarks.tpu_compile compiles for a TPU slice (benchmarks/aot.py)."""
    program = train_program([gin_file], bindings, label=gin_file)
    compiled, seconds = program.compile()
    mem = compiled.memory_analysis()
    per_device = mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
    info = program.info
    return {"config": gin_file, "params": program.params, "mesh": dict(program.mesh.shape), "batch": info["batch"],
            "length": info["length"], "dtype": info["dtype"], "scan": info["scan"], "remat": info["remat"],
            "arguments": mem.argument_size_in_bytes, "temp": mem.temp_size_in_bytes, "outputs": mem.output_size_in_bytes,
            "aliased": mem.alias_size_in_bytes, "per_device": per_device, "compile_s": seconds}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="*", default=list(DEFAULT_CONFIGS))
    parser.add_argument("--devices", type=int, default=None, help="simulated devices (default: per config)")
    parser.add_argument("--gin", action="append", default=[], help="extra binding KEY=VALUE")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # one config, devices already set in XLA_FLAGS
        print("RESULT " + json.dumps(measure(args.configs[0], args.gin)), flush=True)
        return
    rows = []
    for gin_file in args.configs:
        devices = args.devices or DEFAULT_CONFIGS.get(gin_file, 8)
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
        cmd = [sys.executable, "-m", "sentemb_jax.benchmarks.memory_check", "--child", "--configs", gin_file,
               *[x for b in args.gin for x in ("--gin", b)]]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"{gin_file}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(lines[0][len("RESULT "):]))
        print_row(rows[-1], header=len(rows) == 1)


def print_row(r: dict, header: bool) -> None:
    gib = 2**30
    if header:
        print("| config | params | mesh (data x fsdp x model) | batch x length | dtype / scan / remat | "
              "arguments GiB | temporaries GiB | outputs (not aliased) GiB | per device GiB | fits 16 GiB | compile s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    mesh = " x ".join(str(r["mesh"][k]) for k in ("data", "fsdp", "model"))
    print(f"| {r['config']} | {r['params'] / 1e9:.2f} B | {mesh} | {r['batch']} x {r['length']} | "
          f"{r['dtype']} / {r['scan']} / {r['remat']} | {r['arguments'] / gib:.2f} | {r['temp'] / gib:.2f} | "
          f"{(r['outputs'] - r['aliased']) / gib:.2f} | **{r['per_device'] / gib:.2f}** | "
          f"{'yes' if r['per_device'] <= TPU_V3_HBM else 'NO'} | {r['compile_s']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
