"""The scaling study's check of its rungs, before any training: every rung's gin files exist, parse
and build a train step with abstract shapes (no weights); with a TPU topology the step is also
compiled for that slice by the TPU compiler (it must fit HBM; its FLOPs per step are kept).

Run in its own process by `sentemb_jax.jobs.scaling` (parsing a rung's gin files replaces the
process's gin configuration, which the ladder's own job still needs; and it is a compile-only tool,
beside tpu_compile, which a job does not import):

    python -m sentemb_jax.benchmarks.scaling_check SPEC.json OUT.json

SPEC: {"rungs": [{"name", "gin_files", "bindings", "init_from"}], "recipe": [...], "bindings": [...],
"topology": "v5e:2x2" | null, "compile": true (false: build on the topology's devices only)}. OUT: one entry per rung, {"name", "error"} or its description.
"""
from __future__ import annotations

import json
import sys

import jax

from sentemb_jax.benchmarks import aot, tpu_compile, tpu_slices
from sentemb_jax.jobs.train import bound_train
from sentemb_jax.main import gin_file_exists

GIB = 2**30


def _architecture(pooling) -> str:
    pooling = tuple(pooling or ("mean",))
    return "encoder-decoder first token" if "encdec_first" in pooling else f"encoder-{pooling[0]}"


def describe_rung(rung: dict, recipe: list[str], bindings: list[str], topology: str | None,
                  compile_step: bool = True) -> dict:
    """Parameters, batch, steps and architecture of one rung's train step (built abstractly on the
    topology's devices, or on this host's); with a topology (and compile_step), the TPU compiler's
    figures. Raises with the reason when the rung does not build or (compiled) does not fit."""

    files = [*rung["gin_files"], *recipe]
    program = aot.train_program(files, [*bindings, *rung.get("bindings", [])], _devices(topology), label=rung["name"])
    config, _ = bound_train()
    steps = config.num_steps
    row = {"name": rung["name"], "architecture": _architecture(config.model.pooling or ("mean",)),
           "params": program.params, "matmul_params": program.matmul_params,
           "decoder_params": program.decoder_params, "batch": program.info["batch"],
           "length": program.info["length"], "sides": program.info["sides"],
           "num_steps": steps if isinstance(steps, int) else None, "layers": program.info["layers"],
           "dtype": program.info["dtype"], "padded_step_flops_6nd": program.model_flops}
    if topology and compile_step:
        measured = tpu_compile.measure(program, topology, tpu_slices.chip_of(topology))
        if not measured["fits"]:
            need = measured.get("per_device", float("nan")) / GIB
            raise ValueError(f"does not fit {topology}: the TPU compiler needs {need:.2f} GiB per chip of "
                             f"{measured['hbm_per_chip'] / GIB:.0f} (mesh {measured['mesh']})")
        row["compiled"] = {"topology": topology, "mesh": measured["mesh"], "devices": measured["devices"],
                           "per_chip_gib": measured["per_device"] / GIB,
                           "step_flops": measured["flops"] * measured["devices"],
                           "step_s_predicted": measured["predicted"]["step_s"], "compile_s": measured["compile_s"]}
    return row


def _devices(topology: str | None):
    return tpu_slices.topology_devices(topology) if topology else jax.devices()


def describe_rungs(spec: dict) -> list[dict]:
    """describe_rung for each rung; a rung that fails gives {"name", "error"} (the others still run,
    so one check names every bad rung)."""
    out = []
    for rung in spec["rungs"]:
        missing = [f for f in rung["gin_files"] + spec["recipe"] if not gin_file_exists(f)]
        if missing:
            out.append({"name": rung["name"], "error": f"{missing[0]}: no such gin file"})
            continue
        try:
            out.append(describe_rung(rung, spec["recipe"], spec["bindings"], spec.get("topology"),
                                     spec.get("compile", True)))
        except Exception as e:  # noqa: BLE001 - any failure to build is this rung's error, named
            message = str(e).split("\n  In call to configurable")[0].strip() or type(e).__name__
            out.append({"name": rung["name"], "error": f"does not build: {message}"})
    return out


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    rows = describe_rungs(spec)
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
