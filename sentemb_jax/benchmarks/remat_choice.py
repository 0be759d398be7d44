"""The rematerialisation a config's train step needs on a device, from the compiler's memory figure.

    python -m sentemb_jax.benchmarks.remat_choice --gin_file gin/st5_large.gin --target v5e:2x2 --target gpu:80
    python -m sentemb_jax.benchmarks.remat_choice --gin_file gin/st5_3b.gin --target v5e:2x2 --target gpu:80 --json out.json

The step is compiled, without weights, under each policy of models.common.REMAT_POLICIES - 'none'
(keep every activation), 'dots' (keep the weight matmuls' outputs, recompute the rest), 'full'
(recompute each layer) - and the choice is the first, least recompute, whose bytes per device
(arguments + temporaries + outputs not aliased) leave `--headroom` (default 10%) of the device's
memory free. A TPU target is a topology (v5e:2x2): the TPU compiler (libtpu, no TPU needed) on the
gin file's mesh. A GPU target is `gpu:GB` (gpu:80 an 80 GB H100 / A100, gpu:141 an H200): one GPU,
the mesh 1 x 1 x 1, the program as a GPU gets it (bf16 products; models.common.dense_product)
compiled by the TPU compiler for one chip, standing in for the GPU's, which needs the GPU; where it
exceeds the chip, the need its out-of-memory message gives. The accelerator report measures the
GPU's own peak beside its compiler's. Each compile runs in its own process.
The last line: `choice <target>=<policy>` per target (`none fits` when even 'full' does not).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

from sentemb_jax.benchmarks import tpu_compile
from sentemb_jax.benchmarks.tpu_slices import TopologyError, chip_of, topology_devices
from sentemb_jax.child_process import run_module
from sentemb_jax.models.common import REMAT_POLICIES

GIB = 2**30
_GPU = re.compile(r"gpu:(\d+(?:\.\d+)?)")
STAND_IN = "v5p:2x2x1"  # one of its chips (95 GiB of HBM) compiles the one-GPU program


def remat_binding(config_class: str, policy: str) -> str:
    return f"sentemb_jax.{config_class}.remat = '{policy}'"


def compiled_rows(gin_file: str, topology: str, one_chip: bool, bindings: list[str], config_class: str) -> list[dict]:
    """One row per policy: the bytes per device the TPU compiler gives (its out-of-memory message's
    need where it does not fit the chip), each compile in its own process."""
    one = ["sentemb_jax.MeshConfig.data = 1", "sentemb_jax.MeshConfig.fsdp = 1", "sentemb_jax.MeshConfig.model = 1"]
    rows = []
    for policy in REMAT_POLICIES:
        args = ["--child", topology, "--gin_file", gin_file, *(["--one_chip"] if one_chip else []),
                *[x for b in [*bindings, *(one if one_chip else []), remat_binding(config_class, policy)]
                  for x in ("--gin", b)]]
        done, died = run_module("sentemb_jax.benchmarks.remat_choice", args, f"remat_choice-{policy}",
                                env={"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"})
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        result = json.loads(lines[0][len("RESULT "):]) if lines else {}
        last = (done.stderr.strip().splitlines() or ["no result"])[-1]
        rows.append({"policy": policy, "per_device": result.get("per_device"),
                     "at_least": result.get("at_least", False), "step_s_predicted": result.get("step_s"),
                     "error": None if result else f"compile failed: {died or last}"})
    return rows


def compile_one(topology: str, gin_file: str, one_chip: bool, bindings: list[str]) -> dict:
    from sentemb_jax.benchmarks import aot  # lazy: the child only (the run setup loads TensorFlow through seqio)

    devices = topology_devices(topology)
    program = aot.train_program(tpu_compile.split_config(gin_file), bindings, devices[:1] if one_chip else devices,
                                label=gin_file)
    row = tpu_compile.measure(program, topology, chip_of(topology))
    return {"per_device": row.get("per_device"), "at_least": bool(row.get("at_least")),
            "step_s": None if one_chip else (row.get("predicted") or {}).get("step_s")}


def choose(rows: list[dict], headroom: float) -> str:
    for row in rows:
        if row["per_device"] is not None and not row["at_least"] and row["per_device"] <= (1 - headroom) * row["memory"]:
            return row["policy"]
    return "none fits"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gin_file", required=True)
    parser.add_argument("--target", action="append", default=[], help="a TPU topology (v5e:2x2) or gpu:GB (gpu:80)")
    parser.add_argument("--gin", action="append", default=[], help="extra binding KEY=VALUE")
    parser.add_argument("--config_class", default="T5Config", choices=("T5Config", "BertConfig"))
    parser.add_argument("--headroom", type=float, default=0.1)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--child", metavar="TOPOLOGY", help=argparse.SUPPRESS)
    parser.add_argument("--one_chip", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # one compile; its row for the parent
        print("RESULT " + json.dumps(compile_one(args.child, args.gin_file, args.one_chip, args.gin)), flush=True)
        return 0
    if not args.target:
        parser.error("--target: give at least one (a TPU topology such as v5e:2x2, or gpu:80)")
    if not os.path.isfile(args.gin_file):
        parser.error(f"--gin_file {args.gin_file}: no such file")
    if not 0 <= args.headroom < 1:
        parser.error(f"--headroom {args.headroom}: must be in [0, 1)")
    for target in args.target:
        if not _GPU.fullmatch(target):
            try:
                chip_of(target)
            except TopologyError as e:
                parser.error(f"--target {target}: {e}")
    results, choices, compiled = {}, [], {}
    for target in args.target:
        gpu = _GPU.fullmatch(target)
        # one GPU: the program as a GPU gets it, compiled by the TPU compiler for one chip; every GPU
        # target shares those compiles (only the memory it is held against differs)
        key = (STAND_IN, True) if gpu else (target, False)
        if key not in compiled:
            compiled[key] = compiled_rows(args.gin_file, *key, args.gin, args.config_class)
        memory = float(gpu.group(1)) * 1e9 if gpu else chip_of(target).hbm_bytes
        rows = [{**row, "memory": memory} for row in compiled[key]]
        results[target] = rows
        print(f"{args.gin_file} on {target} ({rows[0]['memory'] / GIB:.1f} GiB per device, "
              f"{'the TPU compiler for one chip standing in' if gpu else 'TPU compiler, the gin file mesh'}):")
        for row in rows:
            need = "failed" if row["per_device"] is None else \
                f"{'>= ' if row['at_least'] else ''}{row['per_device'] / GIB:.2f} GiB"
            step = f", step {row['step_s_predicted']:.2f} s predicted" if row.get("step_s_predicted") else ""
            print(f"  remat {row['policy']:<4}  {need}{step}{'  ' + row['error'][:160] if row.get('error') else ''}")
        choices.append(f"{target}={choose(rows, args.headroom)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gin_file": args.gin_file, "headroom": args.headroom, "targets": results}, f, indent=1)
    print("choice " + " ".join(choices))
    return 0


if __name__ == "__main__":
    sys.exit(main())
