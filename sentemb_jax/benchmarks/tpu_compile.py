"""Compile a config for a TPU slice with the TPU compiler - no TPU needed - and predict its step.

    python -m sentemb_jax.benchmarks.tpu_compile --topology v5e:8x8 --gin_file gin/st5_11b.gin
    python -m sentemb_jax.benchmarks.tpu_compile --topology v5e:2x2 --topology v4:2x2x1 \\
        --gin_file gin/st5_base.gin --gin_file gin/st5_large.gin --gin.sentemb_jax.DataConfig.batch_size=2048
    python -m sentemb_jax.benchmarks.tpu_compile --search --gin_file gin/st5_3b.gin   # smallest slice + mesh
    python -m sentemb_jax.benchmarks.tpu_compile --program encode --topology v3:2x2 --gin_file gin/st5_11b.gin \\
        --batch 1024

libtpu (`pip install libtpu==0.0.42.1`, in the `test` extra) gives the abstract devices of any
slice (`jax.experimental.topologies.get_topology_desc`); the program `sentemb_jax.main` would
run for the gin file (sentemb_jax/benchmarks/aot.py: the sharded train step with its optimizer,
mesh, dtype, scan and remat, on `jax.ShapeDtypeStruct`s - no weights) is lowered on a mesh of
them and compiled by the real TPU compiler. One row per (config, topology, mesh):

* HBM per chip from the compiled executable's memory analysis: arguments / temporaries / outputs
  not aliased to donated inputs, against the chip's HBM;
* FLOPs per chip per step: XLA's cost_analysis() counts a while loop (the scanned layers) once,
  so the matmuls are counted from the compiled HLO with each loop body's trip count
  (sentemb_jax/benchmarks/hlo.py) and the rest scaled by the same loop factor; beside it
  6 x N x tokens (N: matmul parameters);
* bytes accessed (cost_analysis as reported) and the bytes each chip sends per
  collective kind (all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute);
* a roofline step time max(FLOPs / peak, bytes / HBM bandwidth) + collective bytes / ICI
  bandwidth from tpu_slices.CHIPS (published per-chip figures), and from it MFU and examples/s.
Every step time, MFU and examples/s is PREDICTED BY THE COMPILER, NOT MEASURED.

Each config x topology x mesh compiles in its own process (`--in_process`: all in this one): the
TPU compiler can die on a signal (libtpu 0.0.42 overflows its stack on some shapes,
docs/scale.md); that compile gets a "not compiled" row naming the signal and a file with its
output, and the others still compile (a `--search` goes on to the next mesh).

Exit status: 0 all fit; 3 some config does not fit (the shortfall in GiB per chip is printed);
2 bad arguments (e.g. an unknown topology); 1 libtpu missing, or a compile's process died (the
other rows are still printed).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import sys
import tempfile
import time

from sentemb_jax.benchmarks import hlo
from sentemb_jax.benchmarks.tpu_slices import (
    GIB,
    INSTALL_HINT,
    SEARCH_TOPOLOGIES,
    Chip,
    LibtpuMissing,
    TopologyError,
    chip_of,
    generation,
    topology_devices,
)
from sentemb_jax.child_process import how_it_ended, keep_output, run_module
from sentemb_jax.errors import ConfigError, UsageError
from sentemb_jax.main import gin_bindings

PREDICTED = "predicted by the compiler, not measured"
# Kinds of more than one program (aot.build; their Program.kind): with isolation each compiles in its
# own process, so a compiler that dies on one still gives the other's row.
SEVERAL_PROGRAMS = {"trans_encoder": ("cross_step", "bi_step")}


class CompileFailed(RuntimeError):
    """A compile's child process failed other than by a signal, a bad config or not fitting."""


_OOM = re.compile(r"Used ([\d.]+)([GMK])? of ([\d.]+)([GMK])? hbm\. Exceeded hbm capacity by ([\d.]+)([GMK])?")
# The other form (temporaries alone exceed what is left): "... the total memory required for HLO
# temporaries (28.57G) exceeds available HBM (15.75G)." - a lower bound of the need (arguments not counted).
_OOM_TEMP = re.compile(r"required for HLO temporaries \(([\d.]+)([GMK])?\) exceeds available HBM \(([\d.]+)([GMK])?\)")


def _bytes(value: str, unit: str | None) -> float:
    return float(value) * {"G": GIB, "M": 2**20, "K": 2**10, None: 1, "": 1}[unit]


def oom_need(text: str) -> dict:
    """The need per chip and the shortfall from the TPU compiler's out-of-memory message (either form;
    the temporaries-only form is a lower bound: at_least=True, against the HBM it says is available)."""
    m, t = _OOM.search(text), _OOM_TEMP.search(text)
    if m:
        return {"per_device": _bytes(m.group(1), m.group(2)), "shortfall": _bytes(m.group(5), m.group(6))}
    if t:
        need, available = _bytes(t.group(1), t.group(2)), _bytes(t.group(3), t.group(4))
        return {"per_device": need, "shortfall": need - available, "at_least": True, "hbm_available": available}
    return {}


def measure(program, topology: str, chip: Chip, num_slices: int = 1, hlo_dir: str | None = None,
            on_start=None) -> dict:
    """Compile one program; its row (a dict). A program the compiler cannot fit in HBM gives a row
    with fits=False and the shortfall the compiler reports. hlo_dir: also write the compiled HLO
    text there (one file per row; `python -m sentemb_jax.benchmarks.hlo FILE` breaks its FLOPs down).
    on_start(row): called with the row's description just before the compile."""
    mesh = dict(program.mesh.shape) if program.mesh is not None else {"data": 1, "fsdp": 1, "model": 1}
    devices = math.prod(mesh.values()) if program.mesh is not None else 1
    row = {"config": program.label, "kind": program.kind, "topology": topology, "num_slices": num_slices,
           "devices": devices, "chip": chip.name, "mesh": mesh, "params": program.params,
           "matmul_params": program.matmul_params, "batch": program.info["batch"], "length": program.info["length"],
           "sides": program.info["sides"], "dtype": program.info["dtype"], "scan": program.info["scan"],
           "remat": program.info["remat"], "method": program.info["method"], "notes": list(program.info["notes"]),
           "hbm_per_chip": chip.hbm_bytes}
    if on_start:
        on_start(row)
    started = time.perf_counter()
    try:
        compiled, seconds = program.compile()
    except Exception as e:  # the TPU compiler's out-of-memory is a JaxRuntimeError (RESOURCE_EXHAUSTED)
        text = str(e)
        if "RESOURCE_EXHAUSTED" not in text and _OOM.search(text) is None:
            raise
        row.update(fits=False, compile_s=time.perf_counter() - started, error=text.splitlines()[0][:400], **oom_need(text))
        return row
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    text = compiled.as_text()
    stats = hlo.analyze(text, devices)
    if hlo_dir:
        os.makedirs(hlo_dir, exist_ok=True)
        name = re.sub(r"[^\w.]+", "_", f"{program.label}_{topology}_{'x'.join(str(v) for v in mesh.values())}")
        row["hlo_file"] = os.path.join(hlo_dir, name + ".hlo.txt")
        with open(row["hlo_file"], "w") as f:
            f.write(text)
    per_device = mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
    row.update(
        fits=per_device <= chip.hbm_bytes, compile_s=seconds, arguments=mem.argument_size_in_bytes,
        temporaries=mem.temp_size_in_bytes, outputs_not_aliased=mem.output_size_in_bytes - mem.alias_size_in_bytes,
        per_device=per_device, shortfall=max(0.0, per_device - chip.hbm_bytes),
        flops_reported=float(cost.get("flops", 0.0)), bytes_reported=float(cost.get("bytes accessed", 0.0)),
        model_flops_per_chip=program.model_flops / devices, examples=program.examples)
    derive(row, stats, chip)
    return row


def derive(row: dict, stats, chip: Chip) -> dict:
    """FLOPs, collectives and the roofline prediction of a row from its HLO statistics (also for
    `--reanalyze`: rows re-derived from the HLO files --hlo_dir kept)."""
    flops_reported, chips = row["flops_reported"], row["devices"]
    # cost_analysis counts each loop body once. Matmuls: counted per iteration from the HLO; the
    # rest (elementwise, reductions) scaled by the matmuls' loop factor (an upper estimate: some of
    # it is outside the loops). Tiny T5, scan_layers=True vs an unscanned compile: +2%.
    loop_factor = stats.matmul_flops / stats.matmul_flops_once if stats.matmul_flops_once else 1.0
    flops = stats.matmul_flops + max(0.0, flops_reported - stats.matmul_flops_once) * loop_factor
    # Bytes accessed as reported: on the tiny T5 the scanned compile's figure was within 15% of the
    # unscanned one (the loop reads its stacked weights and activations as whole arrays already).
    bytes_accessed = row["bytes_reported"]
    collective = sum(stats.collective_bytes.values())
    compute_s, hbm_s = flops / chip.peak_bf16, bytes_accessed / chip.hbm_bw
    ici_s = collective / chip.ici_bw
    step_s = max(compute_s, hbm_s) + ici_s
    model_flops = row["model_flops_per_chip"] * chips
    row.update(
        flops=flops, matmul_flops=stats.matmul_flops, matmul_flops_once=stats.matmul_flops_once,
        loop_trip_counts=sorted(set(stats.trip_counts.values())), bytes_accessed=bytes_accessed,
        collective_bytes=stats.collective_bytes, collective_counts=stats.collective_counts,
        largest_all_gather=stats.largest_all_gather,
        predicted={"compute_s": compute_s, "hbm_s": hbm_s, "ici_s": ici_s, "step_s": step_s,
                   "mfu": model_flops / (step_s * chips * chip.peak_bf16),
                   "examples_per_s": row.get("examples", row["batch"]) / step_s,
                   "bound": "compute" if compute_s >= hbm_s else "HBM", "note": PREDICTED})
    return row


def reanalyze(rows: list[dict]) -> list[dict]:
    """Rows of an earlier --json whose compiled HLO was kept (--hlo_dir), re-derived with this
    version's HLO reader (no recompile); rows without an HLO file are returned as they were."""
    for row in rows:
        if row.get("hlo_file") and "flops_reported" in row and os.path.exists(row["hlo_file"]):
            with open(row["hlo_file"]) as f:
                derive(row, hlo.analyze(f.read(), row["devices"]), chip_of(row["topology"]))
            row["reanalyzed"] = True
        elif not row.get("fits", True) and row.get("error") and "shortfall" not in row:
            row.update(oom_need(row["error"]))
    return rows


def fmt_row(r: dict) -> str:
    mesh = " x ".join(str(r["mesh"].get(k, 1)) for k in ("data", "fsdp", "model"))
    slices = f" x {r['num_slices']} slices" if r.get("num_slices", 1) > 1 else ""
    head = (f"| {r['config']} | {r['topology']}{slices} | {r['devices']} | {mesh} | {r['batch']} x {r['length']} | ")
    hbm = r["hbm_per_chip"] / GIB
    if r.get("crashed"):
        return head + f"not compiled: the compile's process {r['error']} | " + " | " * 8
    if "arguments" not in r:
        least = "at least " if r.get("at_least") else ""
        of = (f"{r['hbm_available'] / GIB:.2f} available" if r.get("hbm_available") else f"{hbm:.0f}")
        what = " (HLO temporaries alone)" if r.get("at_least") else ""
        return head + (f"does not fit: {least}{r.get('per_device', float('nan')) / GIB:.2f} GiB{what} of {of}, short "
                       f"{least}{r.get('shortfall', float('nan')) / GIB:.2f} GiB per chip | " + " | " * 8)
    c = r["collective_bytes"]
    p = r["predicted"]
    coll = " / ".join(f"{c[k] / 2**20:.0f}" for k in ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
                                                     "collective-permute"))
    return (head + f"{r['arguments'] / GIB:.2f} / {r['temporaries'] / GIB:.2f} / {r['outputs_not_aliased'] / GIB:.2f} | "
            f"**{r['per_device'] / GIB:.2f}** of {hbm:.0f} {'' if r['fits'] else 'NO'} | "
            f"{r['flops'] / 1e12:.2f} ({r['flops_reported'] / 1e12:.2f}) | {r['model_flops_per_chip'] / 1e12:.2f} | "
            f"{r['bytes_accessed'] / 1e9:.1f} | {coll} | {p['step_s'] * 1e3:.0f} ({p['bound']}) | "
            f"{p['mfu'] * 100:.0f}% | {p['examples_per_s']:.0f} | {r['compile_s']:.0f} |")


HEADER = ("| config | topology | chips | mesh (data x fsdp x model) | batch x length | "
          "HBM per chip GiB: arguments / temporaries / outputs not aliased | per chip GiB of HBM | "
          "TFLOP per chip per step, loop-corrected (cost_analysis as reported) | 6 x N x tokens per chip TFLOP | "
          "GB accessed | MiB sent per chip: all-gather / reduce-scatter / all-reduce / all-to-all / collective-permute | "
          f"step ms ({PREDICTED}) | MFU ({PREDICTED}) | examples/s ({PREDICTED}) | compile s |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def split_config(config: str) -> list[str]:
    """'a.gin+b.gin' -> ['a.gin', 'b.gin'] (gin files combined into one config)."""
    return [f for f in config.split("+") if f]


def mesh_grid(chips: int, layers_hint: int | None = None) -> list[tuple[int, int]]:
    """(fsdp, model) pairs to try on `chips` devices (data = the rest): fsdp over all, then model
    parallel 2 / 4 / 8 with fsdp over the rest."""
    out = [(chips, 1)]
    for model in (2, 4, 8, 16):
        if model < chips and chips % model == 0:
            out.append((chips // model, model))
    return out


def run_programs(configs, topologies, bindings, program_kind, batch=None, length=None, num_slices=1,
                 meshes=None, on_row=None, hlo_dir=None, isolate=False, on_start=None, only_program=None) -> list[dict]:
    """The rows of each (topology, config, mesh). isolate: each program in its own process
    (_compile_in_child), so a compiler that dies on a signal gives that one a `crashed` row and the
    others still compile. only_program: of a kind with several programs, the one of that kind only."""
    if not isolate:
        from sentemb_jax.benchmarks import aot  # lazy: loads TF (seqio); a parent that only starts children stays quiet
    rows = []
    for topology in topologies:
        chip = chip_of(topology)
        devices = topology_devices(topology, num_slices)
        for config in configs:
            for mesh in meshes or [None]:
                if isolate:
                    for only in SEVERAL_PROGRAMS.get(program_kind, [None]):
                        for row in _compile_in_child(config, topology, bindings, program_kind, batch, length,
                                                     num_slices, mesh, hlo_dir, chip, len(devices), only):
                            rows.append(row)
                            if on_row:
                                on_row(row)
                    continue
                extra = list(bindings)
                if mesh is not None:
                    extra += ["sentemb_jax.MeshConfig.data = -1", f"sentemb_jax.MeshConfig.fsdp = {mesh[0]}",
                              f"sentemb_jax.MeshConfig.model = {mesh[1]}"]
                kwargs = {}
                if program_kind == "train":
                    if batch:
                        extra.append(f"sentemb_jax.DataConfig.batch_size = {batch}")
                    if length:
                        extra.append(f"sentemb_jax.DataConfig.sequence_length = {length}")
                elif program_kind in ("encode", "encode1"):
                    kwargs = {"batch_size": batch or 1024, "length": length or 128}
                for program in aot.build(program_kind, split_config(config), extra, devices, only_program, **kwargs):
                    row = measure(program, topology, chip, num_slices, hlo_dir, on_start)
                    rows.append(row)
                    if on_row:
                        on_row(row)
    return rows


def _compile_in_child(config, topology, bindings, program_kind, batch, length, num_slices, mesh, hlo_dir, chip,
                      devices, only_program=None) -> list[dict]:
    """run_programs for one (config, topology, mesh[, program]) in a child process (this command with
    --in_process): its rows; a child that dies on a signal adds a `crashed` row for the program it
    was compiling (its description, written just before the compile), its output kept in a file the
    row names."""
    with tempfile.TemporaryDirectory() as tmp:
        out, pending = os.path.join(tmp, "rows.json"), os.path.join(tmp, "pending.json")
        args = ["--in_process", "--topology", topology, "--gin_file", config, "--program", program_kind,
                "--num_slices", str(num_slices), "--json", out, "--pending", pending]
        args += [a for flag, v in (("--batch", batch), ("--length", length), ("--hlo_dir", hlo_dir)) if v
                 for a in (flag, str(v))]
        args += ["--mesh", f"{mesh[0]}x{mesh[1]}"] if mesh else []
        args += ["--only_program", only_program] if only_program else []
        args += [a for b in bindings for a in ("--binding", b)]
        tag = f"tpu_compile-{config}-{topology}{'-' + only_program if only_program else ''}"  # names the file a crash's output is kept in
        # The child only compiles: on a TPU VM too it must load libtpu while this process has it loaded.
        done, died = run_module("sentemb_jax.benchmarks.tpu_compile", args, tag, env={"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"})
        rows = _read_json(out) or []
        if died:
            row = _read_json(pending) or {
                "config": config, "kind": only_program or program_kind, "topology": topology, "num_slices": num_slices,
                "devices": devices, "chip": chip.name, "batch": batch or "?", "length": length or "?",
                "hbm_per_chip": chip.hbm_bytes,
                "mesh": {"data": devices // (mesh[0] * mesh[1]), "fsdp": mesh[0], "model": mesh[1]} if mesh else
                {"data": "?", "fsdp": "?", "model": "?"}}
            if not rows or rows[-1].get("config") != row["config"] or rows[-1].get("kind") != row.get("kind"):
                rows.append(dict(row, fits=False, crashed=True, error=died))
            return rows
        if done.returncode not in (0, 3):
            lines = done.stderr.strip().splitlines() or done.stdout.strip().splitlines()  # stdout: its rows
            said = [ln.removeprefix("error: ") for ln in lines if ln.startswith("error: ")]
            if done.returncode == 2 and said:  # a bad config or argument: its own one-line message
                raise ConfigError(said[-1])
            kept = keep_output(done, tag)  # e.g. a traceback: whole, in a file
            raise CompileFailed(f"{config} on {topology}: its compile's process {how_it_ended(done.returncode)}: "
                                f"{(said or lines or ['no output'])[-1]} (its output: {kept})")
        return rows


def _read_json(path: str):
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def search(configs, topologies_by_gen, bindings, batch=None, length=None, on_row=None, hlo_dir=None,
           isolate=False) -> dict:
    """For each config and generation: the smallest slice on which some mesh of the grid fits, and
    there the mesh with the lowest predicted step time."""
    choice = {}
    for config in configs:
        for gen, names in topologies_by_gen.items():
            for topology in names:
                chips = len(topology_devices(topology))
                rows = run_programs([config], [topology], bindings, "train", batch, length,
                                    meshes=mesh_grid(chips), on_row=on_row, hlo_dir=hlo_dir, isolate=isolate)
                fitting = [r for r in rows if r.get("fits")]
                if fitting:
                    best = min(fitting, key=lambda r: r["predicted"]["step_s"])
                    choice[(config, gen)] = best
                    break
            else:
                choice[(config, gen)] = None
    return choice


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", action="append", default=[], help="e.g. v5e:8x8, v4:2x2x4 (repeatable)")
    parser.add_argument("--gin_file", action="append", default=[],
                        help="a config (repeatable; 'a.gin+b.gin' combines files into one config)")
    parser.add_argument("--program", default="train", choices=["train", "encode", "encode1", "trans_encoder"],
                        help="train: the train step; encode: SentenceEncoder's function sharded over the mesh; "
                             "encode1: as SentenceEncoder.encode runs it (one device); trans_encoder: its two steps")
    parser.add_argument("--batch", type=int, default=None, help="global batch (DataConfig.batch_size / encode batch)")
    parser.add_argument("--length", type=int, default=None, help="sequence length")
    parser.add_argument("--num_slices", type=int, default=1, help="Multislice: slices joined over DCN (data axis)")
    parser.add_argument("--mesh", action="append", default=[], help="FSDPxMODEL to try (data = the rest), repeatable")
    parser.add_argument("--search", action="store_true",
                        help="smallest v4 and v5e slice (or --topology list) where a mesh of the grid fits, and its fastest mesh")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--in_process", action="store_true",
                        help="compile in this process (default: each config x topology x mesh in its own, so a "
                             "compiler crash names it and the rest still compile)")
    parser.add_argument("--only_program", default=None, help=argparse.SUPPRESS)  # the child's one program of several
    parser.add_argument("--pending", default=None, help=argparse.SUPPRESS)  # the child's row before its compile
    parser.add_argument("--binding", action="append", default=[], help=argparse.SUPPRESS)  # a gin line, verbatim
    parser.add_argument("--hlo_dir", default=None, help="also write each compiled HLO module's text here")
    parser.add_argument("--reanalyze", action="append", default=[],
                        help="a --json file of earlier rows: re-derive FLOPs / collectives / step from their kept "
                             "HLO files (no compile) and print the table (with --json: write them there)")
    return parser


def _print_choice(choice: dict) -> None:
    print(f"\nSmallest slice that fits, and its fastest mesh ({PREDICTED}):")
    for (config, gen), r in choice.items():
        if r is None:
            print(f"  {config} on {gen}: nothing in the searched slices fits")
        else:
            mesh = " x ".join(str(r["mesh"][k]) for k in ("data", "fsdp", "model"))
            print(f"  {config} on {gen}: {r['topology']} ({r['devices']} chips), mesh {mesh}: "
                  f"{r['per_device'] / GIB:.2f} GiB per chip, step {r['predicted']['step_s'] * 1e3:.0f} ms")


def main(argv=None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)

    bindings, unknown = gin_bindings(rest)
    bindings += args.binding
    if unknown:
        parser.error(f"unrecognised argument {unknown[0]!r} (bindings are --gin.KEY=VALUE)")
    if args.reanalyze:
        rows = []
        for path in args.reanalyze:
            with open(path) as f:
                rows += reanalyze(json.load(f))
        print(HEADER)
        for r in rows:
            print(fmt_row(r))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1, default=str)
        return 0
    if not args.gin_file:
        parser.error("give at least one --gin_file")
    if not args.topology and not args.search:
        parser.error("give --topology (or --search)")
    meshes = []
    for m in args.mesh:
        if not re.fullmatch(r"\d+x\d+", m):
            parser.error(f"--mesh {m!r}: want FSDPxMODEL, e.g. 8x8")
        meshes.append(tuple(int(x) for x in m.split("x")))
    rows: list[dict] = []

    def on_row(r):
        if len(rows) == 0:
            print(HEADER, flush=True)
        rows.append(r)
        print(fmt_row(r), flush=True)
        if args.json:  # as each row comes (a long search stopped half way keeps its rows)
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1, default=str)

    def on_start(r):
        with open(args.pending, "w") as f:
            json.dump(r, f, default=str)

    isolate = not args.in_process
    try:
        if importlib.util.find_spec("libtpu") is None:
            raise LibtpuMissing(INSTALL_HINT)
        for t in args.topology:  # bad names fail before any compile
            topology_devices(t, args.num_slices)
        if args.search:
            by_gen = {}
            for t in args.topology:
                by_gen.setdefault(generation(t), []).append(t)
            _print_choice(search(args.gin_file, by_gen or SEARCH_TOPOLOGIES, bindings, args.batch, args.length, on_row,
                                 args.hlo_dir, isolate))
        else:
            run_programs(args.gin_file, args.topology, bindings, args.program, args.batch, args.length,
                         args.num_slices, meshes or None, on_row, args.hlo_dir, isolate,
                         on_start if args.pending else None, args.only_program)
    except (LibtpuMissing, CompileFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except TopologyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ConfigError, UsageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if args.json and rows:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1, default=str)
    crashed = [r for r in rows if r.get("crashed")]
    short = [r for r in rows if not r.get("fits") and not r.get("crashed")]
    if short and not args.search:
        for r in short:
            mesh = " x ".join(str(r["mesh"].get(k, 1)) for k in ("data", "fsdp", "model"))
            least = "at least " if r.get("at_least") else ""
            of = f"{r['hbm_available'] / GIB:.2f} available" if r.get("hbm_available") else f"{r['hbm_per_chip'] / GIB:.0f}"
            print(f"does not fit: {r['config']} on {r['topology']} (mesh {mesh}) needs {least}"
                  f"{r.get('per_device', float('nan')) / GIB:.2f} GiB per chip of {of}: short by {least}"
                  f"{r.get('shortfall', float('nan')) / GIB:.2f} GiB per chip", file=sys.stderr)
    for r in crashed:
        mesh = " x ".join(str(r["mesh"].get(k, "?")) for k in ("data", "fsdp", "model"))
        print(f"not compiled: {r['config']} on {r['topology']} (mesh {mesh}): its compile's process {r['error']}",
              file=sys.stderr)
    return 1 if crashed else 3 if short and not args.search else 0


if __name__ == "__main__":
    sys.exit(main())
