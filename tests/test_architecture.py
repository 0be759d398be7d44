"""The package's import structure (docs/ARCHITECTURE.md): no import cycle, imports inside functions
included; each layer imports only layers below it; the few imports inside functions say why."""
from __future__ import annotations

import ast
import os
import re

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sentemb_jax")

# The layers, bottom first (docs/ARCHITECTURE.md). A module may import its own layer and the ones
# below; a package's __init__ belongs to the layer of its modules.
LAYERS = [
    ("errors", ["sentemb_jax.errors"]),
    ("config checks", ["sentemb_jax.paths", "sentemb_jax.validation", "sentemb_jax.preflight", "sentemb_jax.dependencies"]),
    ("core", ["sentemb_jax.pooling", "sentemb_jax.losses", "sentemb_jax.partitioning", "sentemb_jax.distributed"]),
    ("models", ["sentemb_jax.models"]),
    ("io", ["sentemb_jax.checkpoints", "sentemb_jax.checkpoint_checks", "sentemb_jax.tokenization", "sentemb_jax.run_dir",
            "sentemb_jax.hub", "sentemb_jax.child_process", "sentemb_jax.host", "sentemb_jax.compile_cache",
            "sentemb_jax.locking", "sentemb_jax.faults", "sentemb_jax.st_layout", "sentemb_jax.xla_options",
            "sentemb_jax.sharded_load"]),
    ("data", ["sentemb_jax.data"]),
    ("inference", ["sentemb_jax.inference", "sentemb_jax.encoder", "sentemb_jax.encode_contract", "sentemb_jax.cross_encoder",
                   "sentemb_jax.export", "sentemb_jax.onnx_export"]),
    ("evaluation", ["sentemb_jax.evaluation"]),
    ("training", ["sentemb_jax.training"]),
    ("methods", ["sentemb_jax.methods"]),
    ("jobs", ["sentemb_jax.jobs"]),
    ("command line", ["sentemb_jax.main", "sentemb_jax.console", "sentemb_jax.configuration"]),
    ("tools", ["sentemb_jax.benchmarks"]),
]
# Imports inside a function are allowed only with a reason on the line (`# lazy: why`) - an
# optional heavy dependency, or what the command line must import only after the console has
# taken over stderr, TensorFlow where it is the tool (jobs run without it) - and only this many in
# the package (scikit-learn and matplotlib among them: 1.3 s and 0.5 s that every job process paid;
# benchmarks.torch_side: the 6 s of torch and sentence-transformers, in their own worker only; the
# XLA options, which import jax, read by the command line after the console has taken stderr).
MAX_LAZY_IMPORTS = 38
LAZY_REASON = re.compile(r"#\s*lazy:\s*\S")


def _modules() -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _target(name: str) -> str | None:
    """The sentemb_jax module an imported dotted name lives in (None: not ours)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: str):
    """(line, target module, inside a function, source line) for each import of a sentemb_jax module."""
    source = open(path, encoding="utf-8").read()
    lines = source.splitlines()
    tree = ast.parse(source)
    in_function = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        targets = {_target(n) for n in names if n.startswith("sentemb_jax")} - {None, module}
        # `from sentemb_jax.x import y` names x.y first: keep the deepest module only.
        targets = {t for t in targets if not any(o != t and o.startswith(t + ".") for o in targets)}
        for t in targets:
            yield node.lineno, t, id(node) in in_function, lines[node.lineno - 1]
    for node in ast.walk(tree):  # function-level imports of anything (third-party too) for the count
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) in in_function:
            yield node.lineno, None, True, " ".join(lines[node.lineno - 1:node.end_lineno])


def _graph() -> dict[str, set[str]]:
    graph = {m: set() for m in MODULES}
    for m, path in MODULES.items():
        for _, target, _, _ in _imports(m, path):
            if target:
                graph[m].add(target)
        # Importing a.b.c runs a/__init__ and a/b/__init__ first: a real edge, unless the package
        # is the module's own (a package's __init__ re-exporting its modules is its facade).
        parts = m.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent in MODULES and parent != "sentemb_jax" and not m.startswith(parent + "."):
                graph[m].add(parent)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), facade edges dropped."""
    def facade(a, b):  # a package importing its own submodule, and that submodule's edge back
        return b.startswith(a + ".") or a.startswith(b + ".")

    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if facade(v, w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _layer(module: str) -> int:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    if module == "sentemb_jax":
        return len(LAYERS)  # the package facade: loads its exports lazily, on first use
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py LAYERS (add it there and to "
                         "docs/ARCHITECTURE.md)")


def test_every_module_has_a_layer():
    for m in MODULES:
        _layer(m)


def test_no_import_cycle_counting_imports_inside_functions():
    assert _cycles(_graph()) == []


def test_layers_only_import_downwards():
    wrong = []
    for m, path in MODULES.items():
        if m == "sentemb_jax":
            continue
        for line, target, _, text in _imports(m, path):
            if target and target != "sentemb_jax" and _layer(target) > _layer(m):
                wrong.append(f"{path}:{line}: {LAYERS[_layer(m)][0]} imports {LAYERS[_layer(target)][0]}: {text.strip()}")
    assert wrong == []


def test_imports_inside_functions_are_few_and_say_why():
    lazy = [(path, line, text) for m, path in MODULES.items() for line, target, inside, text in _imports(m, path)
            if inside and target is None]
    unexplained = [f"{os.path.relpath(p, PACKAGE)}:{n}: {t.strip()}" for p, n, t in lazy if not LAZY_REASON.search(t)]
    assert unexplained == []
    assert len(lazy) <= MAX_LAZY_IMPORTS


def test_the_checker_sees_a_cycle_through_a_function_level_import(tmp_path):
    """The checks above would pass vacuously if the walker missed imports inside functions."""
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from sentemb_jax.main import run  # lazy: test\n")
    found = list(_imports("sentemb_jax.errors", str(a)))
    assert ("sentemb_jax.main", True) in {(t, inside) for _, t, inside, _ in found}
    graph = {"x": {"y"}, "y": {"x"}, "z": set()}
    assert _cycles(graph) == [["x", "y"]]


@pytest.mark.parametrize("module", ["sentemb_jax.data.files", "sentemb_jax.evaluation.sts", "sentemb_jax.errors"])
def test_low_layers_do_not_load_the_models(module):
    """`import sentemb_jax.data.files` does not load Flax models (the package facade is lazy)."""
    import subprocess
    import sys

    code = f"import sys, {module}; print('sentemb_jax.models' in sys.modules, 'sentemb_jax.encoder' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


@pytest.mark.parametrize("module", ["sentemb_jax.data.files", "sentemb_jax.evaluation.sts", "sentemb_jax.encoder",
                                    "sentemb_jax.benchmarks.encode_throughput", "sentemb_jax.benchmarks.train_throughput"])
def test_encoding_and_local_files_do_not_load_tensorflow(module, tmp_path):
    """Encoding, evaluating and the two benchmarks never import TensorFlow (a 3 s import that prints
    native start-up lines on stderr): `data.storage` imports it for paths with a scheme only."""
    import subprocess
    import sys

    local = tmp_path / "rows.txt"
    local.write_bytes(b"a\nb\n")
    code = (f"import sys, {module}; from sentemb_jax.data import storage; "
            f"assert storage.read_bytes({str(local)!r}) == b'a\\nb\\n' and storage.exists({str(local)!r}); "
            f"print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False"]
    assert "cudart_stub" not in out.stderr and "port.cc" not in out.stderr  # TensorFlow's start-up lines


@pytest.mark.parametrize("module", ["sentemb_jax.benchmarks.encode_throughput", "sentemb_jax.benchmarks.train_throughput"])
def test_the_benchmarks_run_without_the_onnx_extra_and_load_torch_in_its_worker_only(module):
    """The JAX and sentence-transformers rows need no ONNX runtime: jax2onnx, ONNX Runtime and
    OpenVINO (the optional `onnx` extra) load for `encode_throughput --onnx` only. Nor does the
    module (what its JAX worker and a CPU run's parent load) import torch or sentence-transformers
    (6 s): benchmarks.torch_side does, in the sentence-transformers worker."""
    import subprocess
    import sys

    code = (f"import sys, {module}; "
            f"print([m for m in ('sentemb_jax.onnx_export', 'jax2onnx', 'onnxruntime', 'openvino', 'torch', "
            f"'sentence_transformers', 'sentemb_jax.benchmarks.torch_side') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[]"]


MAX_FUNCTION_LINES = 100  # code lines (a docstring is not counted): one screen to read


def _code_lines(node: ast.AST) -> int:
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def test_no_function_is_longer_than_a_screen():
    long = []
    for name, path in _modules().items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(node) > MAX_FUNCTION_LINES:
                long.append(f"{name}.{node.name}: {_code_lines(node)} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines of code: {long}"


def _sources() -> dict[str, str]:
    out = {}
    for name, path in _modules().items():
        with open(path, encoding="utf-8") as f:
            out[name] = f.read()
    return out


def test_one_train_loop_and_one_program_builder():
    """training.loop.run_loop is the only train loop, called by the trainer alone (and the benchmark
    of the loop's own cost; the train job, the
    distillation jobs and the Trans-Encoder's phases all train through trainer.fit); a train step is
    jitted in training.sharded.jit_train_step, called by training.setup.setup_run alone - the
    trainer, the compile-only tools, the step-time benchmark and the scaling check build their
    programs through setup_run. No other module steps a StopSignals context, checkpoints a train
    state itself, or donates a state to a jitted step."""
    sources = _sources()
    callers = sorted(n for n, src in sources.items() if re.search(r"\brun_loop\(", src) and n != "sentemb_jax.training.loop")
    # benchmarks.loop_overhead times the loop itself around a trivial step, beside the bare step.
    assert callers == ["sentemb_jax.benchmarks.loop_overhead", "sentemb_jax.training.trainer"]
    stepping = sorted(n for n, src in sources.items() if "StopSignals()" in src or "StandardSave(" in src)
    assert stepping == ["sentemb_jax.training.loop"], stepping
    builders = sorted(n for n, src in sources.items() if re.search(r"\bjit_train_step\(", src) and n != "sentemb_jax.training.sharded")
    assert builders == ["sentemb_jax.training.setup"], builders
    donating = sorted(n for n, src in sources.items() if "donate_argnums" in src)
    assert donating == ["sentemb_jax.training.sharded"], donating  # a second way to build a step shows here
    setup_users = sorted(n for n, src in sources.items() if re.search(r"\bsetup_run\(", src) and n != "sentemb_jax.training.setup")
    assert {"sentemb_jax.training.trainer", "sentemb_jax.benchmarks.aot"} <= set(setup_users), setup_users


# gin is the command line's: main, its gin helpers (configuration), the jobs (gin-configurable
# functions and the registry of what gin files may name) and the tools that parse gin files as main
# does (benchmarks). The library below them neither imports gin nor asks it anything.
GIN_EDGE = ("sentemb_jax.main", "sentemb_jax.configuration", "sentemb_jax.jobs", "sentemb_jax.benchmarks")


def test_gin_stays_at_the_edge():
    touching = sorted(n for n, src in _sources().items() if re.search(r"^\s*(import gin|from gin)\b", src, re.M))
    outside = [n for n in touching if not n.startswith(GIN_EDGE)]
    assert outside == [], outside


# Private APIs of the libraries we build on: each use needs its reason here.
PRIVATE_API = re.compile(r"(\._CONFIG\b|\._REGISTRY\b|jax\._src|orbax\.checkpoint\._src|ocp\._src|from orbax\.checkpoint\._src)")
PRIVATE_API_ALLOWED: dict[str, str] = {
    "sentemb_jax": "jax._src.xla_bridge._backends: whether jax's backend has started when jax was imported before us "
                   "(then JAX_PLATFORMS=cpu no longer takes effect); no public API says so without starting it",
    "sentemb_jax.xla_options": "jax._src.xla_bridge.backends_are_initialized: XLA_FLAGS set after the "
                               "backend started would silently do nothing; no public API says so",
    "sentemb_jax.faults": "orbax.checkpoint._src.path.atomicity: test-only fault injection kills the process "
                                   "inside orbax's rename of a finished checkpoint; orbax has no public hook there",
}


def test_no_private_api_of_gin_jax_or_orbax():
    found = [f"{n}: {m.group(0)}" for n, src in _sources().items() for m in PRIVATE_API.finditer(src)
             if n not in PRIVATE_API_ALLOWED]
    assert found == [], found


def test_no_reexport_shims():
    """A name is imported from the module that defines it: no `# re-exported` imports kept for old
    import paths."""
    shims = [f"{n}: {line.strip()}" for n, src in _sources().items() for line in src.splitlines()
             if re.search(r"#\s*noqa: F401 - re-exported", line)]
    assert shims == [], shims


FAMILY_CONFIGS = ("T5Config", "BertConfig", "MPNetConfig")
# a model_type compared with a literal (a lookup in a table the families fill is no branch)
MODEL_TYPE_TEST = re.compile(r"""model_type["']?\)?\s*(==|!=|in|not in)\s*[("'\[]|\.startswith\(["'](t5|bert|roberta|mpnet)""")


def test_no_family_branches_outside_models():
    """What differs between backbone families lives in each family's module (models.family): no
    isinstance test on a family config, and no test of a config's model_type, outside models/."""
    branches = []
    for name, path in MODULES.items():
        if name.startswith("sentemb_jax.models"):
            continue
        source = open(path, encoding="utf-8").read()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                named = {getattr(c, "id", None) or getattr(c, "attr", None) for c in classes}
                if named & set(FAMILY_CONFIGS):
                    branches.append(f"{name}:{node.lineno}: isinstance(..., {', '.join(sorted(named))})")
        for number, line in enumerate(source.splitlines(), 1):
            if MODEL_TYPE_TEST.search(line):
                branches.append(f"{name}:{number}: {line.strip()}")
    assert branches == []


def test_the_family_check_sees_a_branch(tmp_path):
    """The test above would pass vacuously if its patterns missed the forms branches take."""
    assert MODEL_TYPE_TEST.search('if hf.get("model_type") == "bert":')
    assert MODEL_TYPE_TEST.search('if str(cfg.get("model_type", "")).startswith("t5"):')
    assert MODEL_TYPE_TEST.search('if model_type in ("t5", "mt5"):')
    assert not MODEL_TYPE_TEST.search("if model_type not in checkpoints.SEQUENCE_CLASSIFIERS:")
    tree = ast.parse("isinstance(cfg, (T5Config, models.BertConfig))")
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call))
    assert {getattr(c, "id", None) or getattr(c, "attr", None) for c in call.args[1].elts} == {"T5Config", "BertConfig"}
