"""The scaling-study job: a ladder of model sizes trained with one recipe, evaluated with one suite,
reported in one table and two plots (score against parameters and against training FLOPs).

    python -m sentemb_jax.main --gin_file=gin/runs/scaling_tiny_t5.gin --gin.MODEL_DIR="'runs/scaling_tiny_t5'"

A rung is a name, its gin files (architecture + model size, t5x's first two layers), optional extra
bindings and an optional start checkpoint; the recipe (task, steps, batch, schedule, optimizer) is
the same gin file(s) for every rung, parsed after the rung's. Each rung is trained by its own
`python -m sentemb_jax.main` process (its own gin configuration, memory and log):

    MODEL_DIR/config.gin, run.log     the ladder's
    MODEL_DIR/<rung>/                 the rung's train job (checkpoints, metrics.jsonl, run.log)
    MODEL_DIR/<rung>/model            its best tower by STS-B dev (sentence-transformers directory)
    MODEL_DIR/<rung>/eval/            the evaluation suite's results of that model
    MODEL_DIR/<rung>/rung.json        written last: a finished rung, reused by a rerun
    MODEL_DIR/results.md / .json, score_vs_params.png, score_vs_flops.png

Resumable: a rerun reuses finished rungs (rung.json) and continues an unfinished one from its last
checkpoint (the train job's own resume). Before any training, every rung is checked
(sentemb_jax.benchmarks.scaling_check, in its own process): its gin files exist, parse and build a
train step abstractly; with `compiler_topology` the step is compiled for that TPU slice by the TPU
compiler, one process per rung (it must fit; its FLOPs are reported beside the model count). Any
rung that fails is named with its reason and nothing is trained (exit 2).

Training FLOPs per rung: 6 x (non-embedding encoder params x real tokens + decoder params x texts)
- real tokens are the unpadded tokens the train loop counted (`tokens` in metrics.jsonl); an
encoder-decoder-first-token tower runs its decoder on one token per text. Beside it, the TPU
compiler's FLOPs per step x steps (every text padded to the sequence length: an upper bound).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import gin
from sentemb_jax import faults, preflight, validation
from sentemb_jax.child_process import run_module
from sentemb_jax.data import from_scratch
from sentemb_jax.errors import ConfigError, SentembError, TrainingError
from sentemb_jax.evaluation import plots
from sentemb_jax.evaluation.report import markdown_table
from sentemb_jax.evaluation.sts import STS_TASKS, TASK_LABELS
from sentemb_jax.evaluation.transfer import TRANSFER_TASKS
from sentemb_jax.jobs.evaluate import eval_transfer, sts_scores
from sentemb_jax.paths import default_data_dir
from sentemb_jax.run_dir import METRICS_JSONL, write_gin_config, write_results

log = logging.getLogger(__name__)
SELECTOR = "sentemb_jax.scaling_study"
RUNG_DONE = "rung.json"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclasses.dataclass(frozen=True)
class Rung:
    name: str
    gin_files: tuple[str, ...]
    bindings: tuple[str, ...] = ()
    init_from: str | None = None

    def spec(self) -> dict:
        return {"name": self.name, "gin_files": list(self.gin_files), "bindings": list(self.bindings),
                "init_from": self.init_from}


class RungStopped(SentembError):
    """A rung's train process stopped on a signal after checkpointing: rerun the ladder to continue."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def parse_rungs(rungs) -> list[Rung]:
    """Rung dicts from gin -> Rungs; a ConfigError naming `scaling_study.rungs[i]` and what is wrong."""
    where = f"gin binding {SELECTOR}.rungs"
    if not isinstance(rungs, (list, tuple)) or not rungs:
        raise ConfigError(f"{where}: give a non-empty list of rungs, e.g. [{{'name': 'base', 'gin_files': "
                          "['gin/architectures/dual_encoder.gin', 'gin/models/t5_base.gin']}]")
    out, seen = [], set()
    for i, rung in enumerate(rungs):
        at = f"{where}[{i}]"
        if not isinstance(rung, dict):
            raise ConfigError(f"{at} = {rung!r}: each rung is a dict with 'name' and 'gin_files'")
        unknown = sorted(set(rung) - {"name", "gin_files", "bindings", "init_from"})
        if unknown:
            raise ConfigError(f"{at}: unknown key(s) {unknown}; a rung has name, gin_files, bindings, init_from")
        name = rung.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
            raise ConfigError(f"{at}: name {name!r} must be a plain directory name (letters, digits, _ . -): "
                              "the rung trains under MODEL_DIR/<name>")
        if name in seen:
            raise ConfigError(f"{at}: name {name!r} is used by an earlier rung")
        seen.add(name)
        files, bindings = rung.get("gin_files"), rung.get("bindings", ())
        if not isinstance(files, (list, tuple)) or not files or not all(isinstance(f, str) and f for f in files):
            raise ConfigError(f"{at} ({name}): gin_files must be a non-empty list of gin file paths")
        if not isinstance(bindings, (list, tuple)) or not all(isinstance(b, str) and "=" in b for b in bindings):
            raise ConfigError(f"{at} ({name}): bindings must be a list of 'KEY = VALUE' strings")
        init_from = rung.get("init_from")
        if init_from is not None and not isinstance(init_from, str):
            raise ConfigError(f"{at} ({name}): init_from must be a model directory path or None")
        out.append(Rung(name, tuple(files), tuple(bindings), init_from))
    return out


@gin.configurable(module="sentemb_jax")
def from_scratch_inputs(out_dir: str = gin.REQUIRED, data_dir: str | None = None, vocab_size: int = 8192) -> dict:
    """A ladder's `prepare` for towers from scratch: the vocabulary and the NLI triples made (once)
    under `out_dir` (data.from_scratch), and the gin bindings each rung then reads them with."""
    data_dir = data_dir or default_data_dir()
    tokenizer_dir = from_scratch.train_tokenizer(os.path.join(out_dir, "tokenizer"), data_dir, vocab_size)
    triples = os.path.abspath(os.path.join(out_dir, "nli_triples_plus_pairs.tsv"))
    from_scratch.build_nli_triples(data_dir, triples)
    return {"TOKENIZER_DIR": os.path.abspath(tokenizer_dir), "sentemb_jax.DataConfig.files": {"nli_triples": triples}}


@gin.configurable(module="sentemb_jax")
def scaling_study(model_dir: str = gin.REQUIRED, rungs=gin.REQUIRED, recipe=gin.REQUIRED, bindings=(),
                  macros: dict | None = None, prepare=None, data_dir: str | None = None, compiler_topology: str | None = None,
                  transfer_tasks=None, title: str = "scaling study") -> dict:
    """Train and evaluate each rung (see the module docstring); returns {rung: row}.

    recipe: gin files parsed after each rung's (the training recipe every rung shares).
    bindings: 'KEY = VALUE' strings given to every rung's train process (after the recipe).
    macros: {NAME: value} given to every rung's train process as well, e.g. {'TOKENIZER_DIR': %TOKENIZER_DIR}.
    prepare: a callable run once, after the checks, returning more bindings as {KEY: value} (e.g.
      sentemb_jax.from_scratch_inputs: a vocabulary and training file made once).
    compiler_topology: e.g. 'v5e:2x2' - compile each rung's train step for that TPU slice in the
      check (libtpu; no TPU needed) and report the compiler's FLOPs beside the model count.
    transfer_tasks: also score SentEval transfer (e.g. ['MR', 'CR']) for each rung's model.
    """
    ladder = parse_rungs(rungs)
    recipe = _string_list(recipe, "recipe")
    bindings = _string_list(bindings, "bindings")
    if macros is not None and not (isinstance(macros, dict) and all(isinstance(k, str) for k in macros)):
        raise ConfigError(f"gin binding {SELECTOR}.macros = {macros!r}: give a dict {{NAME: value}}")
    if prepare is not None and not callable(prepare):
        raise ConfigError(f"gin binding {SELECTOR}.prepare = {prepare!r}: give a callable (@name, no parentheses)")
    data_dir = data_dir or default_data_dir()
    preflight.require_dir(data_dir, SELECTOR, "data_dir")
    for rung in ladder:
        if rung.init_from:
            preflight.require_model_dir(rung.init_from, SELECTOR, f"rungs[{rung.name}].init_from")
    described = check_rungs(ladder, recipe, bindings, compiler_topology)
    write_gin_config(model_dir, gin.config_str(), gin.markdown(gin.config_str()))  # as t5x, at the start; only once every rung passed its check
    given = {**(macros or {}), **(prepare() if prepare else {})}
    extra = [f"{key} = {value!r}" for key, value in given.items()]
    common = [*bindings, *extra, f"DATA_DIR = {data_dir!r}"]
    rows = {}
    for i, rung in enumerate(ladder):
        rows[rung.name] = run_rung(rung, described[rung.name], model_dir, recipe, common, data_dir, transfer_tasks)
        faults.after_rung(i + 1)  # tests only (SENTEMB_FAULT=after_rung:K): a kill between two rungs
    report(rows, model_dir, title, compiler_topology)
    return rows


def _string_list(value, param: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"gin binding {SELECTOR}.{param} = {value!r}: give a list of strings")
    return list(value)


def check_rungs(ladder: list[Rung], recipe: list[str], bindings: list[str], topology: str | None) -> dict:
    """Every rung described by sentemb_jax.benchmarks.scaling_check; a ConfigError naming each rung that
    does not build (or fit, or crashes the compiler), before any training.

    Without a topology, one process checks all rungs. With one, each rung's compile runs in its own
    process: the TPU compiler can die on a signal (libtpu 0.0.42 overflows its stack on some shapes,
    docs/scale.md), which must name that rung and still let the others be checked."""
    log.info("checking %d rungs%s", len(ladder), f" (each compiled for {topology} by the TPU compiler)" if topology else "")
    groups = [[r] for r in ladder] if topology else [ladder]
    rows = {}
    for group in groups:
        rows.update(_run_check(group, recipe, bindings, topology))
    bad = [f"rung {name!r} ({', '.join(next(r.gin_files for r in ladder if r.name == name))}): {row['error']}"
           for name, row in rows.items() if "error" in row]
    if bad:
        raise ConfigError(f"{len(bad)} of {len(ladder)} rungs cannot run, nothing trained:\n  " + "\n  ".join(bad))
    for row in rows.values():
        fits = f", {row['compiled']['per_chip_gib']:.2f} GiB per chip on {topology}" if "compiled" in row else ""
        log.info("rung %s: %s, %s parameters%s", row["name"], row["architecture"], _count(row["params"]), fits)
    return rows


def _run_check(group: list[Rung], recipe: list[str], bindings: list[str], topology: str | None) -> dict:
    """{name: row} from one scaling_check process over `group`; a process that dies on a signal gives
    each of its rungs an error row (a failure to start or to write rows is a TrainingError)."""
    spec = {"rungs": [r.spec() for r in group], "recipe": recipe, "bindings": bindings, "topology": topology}
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        done, died = run_module("sentemb_jax.benchmarks.scaling_check", [spec_path, out_path],
                                f"rung_check-{group[0].name}")
        log.debug("rung check output (%s):\n%s", ", ".join(r.name for r in group), done.stdout + done.stderr)
        if died:  # its output (a crash's trace) is kept where the user is told, not on the console
            died = f"its check process{' (build and TPU compile)' if topology else ''} {died}"
            return {r.name: {"name": r.name, "error": died} for r in group}
        if done.returncode != 0 or not os.path.isfile(out_path):
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise TrainingError(f"the rung check (python -m sentemb_jax.benchmarks.scaling_check) failed: {tail[0]}")
        with open(out_path) as f:
            return {r["name"]: r for r in json.load(f)}


def _count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


def run_rung(rung: Rung, described: dict, model_dir: str, recipe: list[str], common: list[str], data_dir: str,
             transfer_tasks) -> dict:
    """Train (or continue) one rung in its own process, evaluate its kept model, write rung.json."""
    rung_dir = os.path.join(model_dir, rung.name)
    done = os.path.join(rung_dir, RUNG_DONE)
    if os.path.isfile(done):
        with open(done) as f:
            row = json.load(f)
        log.info("rung %s: finished earlier (%s), reused", rung.name, done)
        if "compiled" in described:  # this check compiled it (e.g. a topology added on a rerun): its figure
            row.update(compiled=described["compiled"], train_flops_compiler=described["compiled"]["step_flops"] * row["steps"])
        return row
    kept = os.path.join(rung_dir, "model")
    own = [f"MODEL_DIR = {rung_dir!r}", f"sentemb_jax.train.export_dir = {kept!r}"]
    if rung.init_from:
        own.append(f"sentemb_jax.TowerConfig.init_from = {rung.init_from!r}")
    wall = _train_process(rung, [*rung.gin_files, *recipe], [*common, *rung.bindings, *own], rung_dir)
    history = _read_metrics(rung_dir)
    last = history[-1]
    curve = [m for m in history if "stsb_dev_spearman" in m]
    best = max(curve, key=lambda m: m["stsb_dev_spearman"]) if curve else {}
    scores = _evaluate(kept, os.path.join(rung_dir, "eval"), data_dir, transfer_tasks)
    steps = int(last["step"])
    texts = steps * described["batch"] * described["sides"]
    encoder = described["matmul_params"] - described["decoder_params"]
    row = {**described, "steps": steps, "tokens": int(last.get("tokens", 0)), "texts": texts,
           "train_flops": 6.0 * (encoder * int(last.get("tokens", 0)) + described["decoder_params"] * texts),
           "train_flops_compiler": described["compiled"]["step_flops"] * steps if "compiled" in described else None,
           "wall_s": wall, "train_seconds": last.get("train_seconds"),
           "stsb_dev": best.get("stsb_dev_spearman"), "best_step": best.get("step"), **scores}
    with open(done + ".tmp", "w") as f:
        json.dump(row, f, indent=1)
    os.replace(done + ".tmp", done)
    log.info("rung %s: STS-B dev %.2f (step %s), STS avg %.2f, %.1f min", rung.name, row["stsb_dev"] or float("nan"),
             row["best_step"], row["sts"].get("avg") or float("nan"), wall / 60)
    return row


def _train_process(rung: Rung, files: list[str], bindings: list[str], rung_dir: str) -> float:
    """`python -m sentemb_jax.main` for the rung; its lines relayed as ours, prefixed with the rung's
    name; SIGTERM / Ctrl-C forwarded (it checkpoints and stops). Returns the wall seconds of all its
    attempts (kept in <rung>/wall.json across reruns)."""
    cmd = [sys.executable, "-m", "sentemb_jax.main", *[f"--gin_file={f}" for f in files]]
    cmd += [f"--gin.{b.split('=', 1)[0].strip()}={b.split('=', 1)[1].strip()}" for b in bindings]
    log.info("rung %s: training (%s)", rung.name, " ".join(files))
    log.debug("rung %s: %s", rung.name, " ".join(cmd))
    os.makedirs(rung_dir, exist_ok=True)
    wall_file = os.path.join(rung_dir, "wall.json")
    before = 0.0
    if os.path.isfile(wall_file):
        with open(wall_file) as f:
            before = json.load(f)["wall_s"]
    started = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    forward = {s: signal.signal(s, lambda signum, _f: child.send_signal(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        lines = []
        for line in child.stdout:
            line = line.rstrip()
            if line:
                lines.append(line)
                log.info("  [%s] %s", rung.name, line)
        code = child.wait()
    finally:
        for s, handler in forward.items():
            signal.signal(s, handler)
    wall = before + time.perf_counter() - started
    with open(wall_file, "w") as f:
        json.dump({"wall_s": wall}, f)
    if code >= 128:  # stopped by a signal after checkpointing (or killed): a rerun continues it
        raise RungStopped(f"rung {rung.name!r}: {lines[-1] if lines else 'stopped'}; rerun the ladder to continue "
                          f"it from its checkpoint", code)
    if code != 0:
        raise TrainingError(f"rung {rung.name!r} failed (exit {code}): {lines[-1] if lines else 'no output'} "
                            f"(its log: {os.path.join(rung_dir, 'run.log')})")
    return wall


def _read_metrics(rung_dir: str) -> list[dict]:
    with open(os.path.join(rung_dir, METRICS_JSONL)) as f:
        return [json.loads(line) for line in f if line.strip()]


def _evaluate(kept: str, eval_dir: str, data_dir: str, transfer_tasks) -> dict:
    """The suite every rung gets: the STS table (STS12-16, STS-B test, SICK-R), transfer if asked."""
    if not os.path.isdir(kept):
        raise TrainingError(f"{kept}: the rung's train job kept no model (does its recipe evaluate STS-B dev "
                            "and export the best tower? EvalConfig.every / sentemb_jax.train.export_dir)")
    scores = {"sts": sts_scores(kept, eval_dir, data_dir)}
    if transfer_tasks:
        validation.require_choices(transfer_tasks, TRANSFER_TASKS, SELECTOR, "transfer_tasks")
        scores["transfer"] = eval_transfer(model_path=kept, model_dir=eval_dir, data_dir=data_dir,
                                           tasks=tuple(transfer_tasks))["transfer"]
    return scores


def report(rows: dict, model_dir: str, title: str, topology: str | None) -> str:
    """results.md / results.json and the two plots; the table printed."""
    tasks = [t for t in (*STS_TASKS, "avg") if any(r["sts"].get(t) is not None for r in rows.values())]
    header = ["rung", "architecture", "params", "non-emb params", "steps", "real tokens", "train FLOPs (6ND)",
              *([f"compiler FLOPs ({topology}, padded)"] if topology else []), "wall min", "STS-B dev",
              *[TASK_LABELS.get(t, "Avg" if t == "avg" else t) for t in tasks]]
    transfer = sorted({t for r in rows.values() for t in r.get("transfer", {}) if t != "avg"})
    header += transfer
    body = []
    for name, r in rows.items():
        body.append([name, r["architecture"], _count(r["params"]), _count(r["matmul_params"]), str(r["steps"]),
                     _count(r["tokens"]), f"{r['train_flops']:.3g}",
                     *([f"{r['train_flops_compiler']:.3g}" if r.get("train_flops_compiler") else "-"] if topology else []),
                     f"{r['wall_s'] / 60:.1f}", _fmt(r["stsb_dev"]), *[_fmt(r["sts"].get(t)) for t in tasks],
                     *[_fmt(r.get("transfer", {}).get(t)) for t in transfer]])
    table = markdown_table(header, body)
    note = ("STS: Spearman x 100 of the rung's best checkpoint by STS-B dev; training FLOPs 6 x (non-embedding "
            "encoder params x real tokens + decoder params x texts)"
            + (f"; compiler FLOPs: the TPU compiler's count of one step on {topology} (every text padded to the "
               "sequence length) x steps" if topology else "") + ".")
    markdown = f"# {title}\n\n{table}\n\n{note}\n"
    print("\n" + table + "\n\n" + note)
    write_results(model_dir, {"rungs": rows}, markdown)
    by_arch: dict[str, dict[str, list]] = {"params": {}, "flops": {}}
    for name, r in rows.items():
        if r["stsb_dev"] is None:
            continue
        by_arch["params"].setdefault(r["architecture"], []).append((r["params"], r["stsb_dev"], name))
        by_arch["flops"].setdefault(r["architecture"], []).append((r["train_flops"], r["stsb_dev"], name))
    for kind, xlabel in (("params", "parameters (tower)"), ("flops", "training FLOPs (6 x N x real tokens)")):
        path = plots.plot_lines_logx(by_arch[kind], os.path.join(model_dir, f"score_vs_{kind}.png"),
                                     f"{title}: STS-B dev", xlabel, "STS-B dev Spearman x 100")
        log.info("wrote %s", path)
    log.info("wrote %s", os.path.join(model_dir, "results.md"))
    return markdown


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}"
