"""The user docs (README.md and docs/*.md; not docs/notes/, a history log) against the repository.

* Every command the docs give - ```bash blocks, and inline code that starts with `python -m`,
  `.venv/bin/python -m` or `make` - names a module that exists, gin files that exist, gin keys a
  configurable or macro defines, flags the module's argument parser declares and Makefile targets.
  Each repository module the docs run answers --help.
* Relative links and repository paths in inline code exist.
* Each figure of the README's "What it reaches" table is in docs/RESULTS.md in a section that says
  when (a date) and where (one of RESULTS.md's machines) it was measured.
* No tracker issue numbers, working sessions or leased machines; the README names no commit and
  stays short.

Static checks (nothing of sentemb_jax imported here), plus one process that runs every module's
--help: about 30 s on 2 cores. Each failure names file:line.
"""
from __future__ import annotations

import ast
import functools
import glob
import importlib.machinery
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_PACKAGES = ("sentemb_jax", "lab")
README = "README.md"
RESULTS = "docs/RESULTS.md"
DOCS = [README] + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
README_MAX_LINES = 250
# Placeholders the docs use inside commands (`--gin_file=...`, `--gin.KEY=VALUE`, `--model M`).
PLACEHOLDER = re.compile(r"\.\.\.|<[^>]*>|^KEY$|^(FILE|DIR|ENV|M|N)$")
# Sections that name what no longer exists on purpose (old gin keys and files, for migrating).
HISTORY_SECTIONS = {("docs/ARCHITECTURE.md", "Renamed gin keys")}


def _read(rel: str) -> list[str]:
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read().splitlines()


@dataclass
class Command:
    where: str  # file:line
    words: list[str]

    @property
    def text(self) -> str:
        return " ".join(self.words)


@dataclass
class Doc:
    path: str
    lines: list[str]
    fences: list[tuple[str, int, list[str]]]  # (language, first line number of the content, content lines)
    prose: list[str]  # the lines with fenced blocks blanked out (line numbers kept)
    sections: list[str]  # per line: the title of the ## / ### section it is in


@functools.lru_cache(maxsize=None)
def load_doc(rel: str) -> Doc:
    lines = _read(rel)
    fences, prose, sections = [], [], []
    fence_lang, fence_start, fence_lines, title = None, 0, [], ""
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence_lang is None and stripped.startswith("```"):
            fence_lang, fence_start, fence_lines = stripped[3:].strip().lower(), number + 1, []
            prose.append("")
        elif fence_lang is not None and stripped.startswith("```"):
            fences.append((fence_lang, fence_start, fence_lines))
            fence_lang = None
            prose.append("")
        elif fence_lang is not None:
            fence_lines.append(line)
            prose.append("")
        else:
            heading = re.match(r"#{2,3}\s+(.*)", line)
            if heading:
                title = heading.group(1).strip()
            prose.append(line)
        sections.append(title)
    assert fence_lang is None, f"{rel}:{fence_start - 1}: code block never closed"
    return Doc(rel, lines, fences, prose, sections)


def inline_spans(doc: Doc) -> list[tuple[int, str]]:
    """(line number, text) of every inline code span outside fenced blocks; a span may run over a
    line break inside one paragraph (joined with a space)."""
    text = "\n".join(doc.prose)
    out = []
    for m in re.finditer(r"(`+)(.+?)\1", text, flags=re.DOTALL):
        body = m.group(2)
        if "\n\n" in body:
            continue
        out.append((text.count("\n", 0, m.start()) + 1, " ".join(body.split())))
    return out


UNPARSABLE: list[str] = []  # file:line of shell text shlex cannot split (an unclosed quote)


def _split_shell(line: str, where: str) -> list[list[str]]:
    """Simple commands of a shell line: words, split at ; && || |; comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands, words = [], []
    try:
        tokens = list(lexer)
    except ValueError as e:
        UNPARSABLE.append(f"{where}: {e}: {line.strip()}")
        return []
    for token in tokens:
        if token and set(token) <= set(";&|"):
            commands.append(words)
            words = []
        else:
            words.append(token)
    commands.append(words)
    return [c for c in commands if c]


def _program(words: list[str]) -> list[str] | None:
    """The words from `python -m` / `make` on (leading VAR=value and `taskset -c N` dropped), or None."""
    words = [w.strip("[]") for w in words]
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    if words[:2] == ["taskset", "-c"]:
        words = words[3:]
    if not words:
        return None
    words = [w for w in words if w]
    if words[0] == "make" or (words[0].endswith(("python", "python3")) and words[1:2] == ["-m"] and len(words) > 2):
        return words
    return None


def doc_commands(rel: str) -> list[Command]:
    doc = load_doc(rel)
    out = []
    for lang, start, content in doc.fences:
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        logical, first = "", None
        for offset, line in enumerate(content):
            if first is None:
                first = start + offset
            if line.rstrip().endswith("\\"):
                logical += line.rstrip()[:-1] + " "
                continue
            logical += line
            for words in _split_shell(logical, f"{rel}:{first}"):
                words = _program(words)
                if words:
                    out.append(Command(f"{rel}:{first}", words))
            logical, first = "", None
    for number, span in inline_spans(doc):
        if re.match(r"(\.venv/bin/)?python3? -m |make \S", span):
            for words in _split_shell(span, f"{rel}:{number}"):
                words = _program(words)
                if words:
                    out.append(Command(f"{rel}:{number}", words))
    return out


ALL_COMMANDS = [c for rel in DOCS for c in doc_commands(rel)]
PYTHON_COMMANDS = [c for c in ALL_COMMANDS if c.words[0] != "make"]


def test_docs_give_commands():
    # The extraction itself: a regression here would make every check below pass vacuously.
    modules = {c.words[2] for c in PYTHON_COMMANDS}
    assert {"sentemb_jax.main", "sentemb_jax.benchmarks.tpu_compile", "sentemb_jax.benchmarks.encode_throughput"} <= modules
    assert any(c.words[:2] == ["make", "run"] for c in ALL_COMMANDS)
    assert len(PYTHON_COMMANDS) >= 40, len(PYTHON_COMMANDS)
    assert not UNPARSABLE, "shell text in the docs that does not parse:\n" + "\n".join(UNPARSABLE)


# ---------------------------------------------------------------------------------------------
# modules, files and flags


def module_spec(name: str):
    """The module's spec without importing anything: ours (sentemb_jax, lab) are looked up part by
    part on disk (importing sentemb_jax would import jax), others through importlib."""
    parts = name.split(".")
    if parts[0] not in REPO_PACKAGES:
        try:
            return importlib.util.find_spec(name)
        except ModuleNotFoundError:  # a parent package is missing
            return None
    spec, path = None, [REPO]
    for part in parts:
        if path is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(part, path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec


def _option_value(words: list[str], i: int, option: str) -> tuple[str | None, int]:
    """(value, next index) when words[i] is `--option=value` or `--option value`."""
    word = words[i]
    if word == option and i + 1 < len(words):
        return words[i + 1], i + 2
    if word.startswith(option + "="):
        return word[len(option) + 1:], i + 1
    return None, i + 1


def _is_placeholder(value: str) -> bool:
    return bool(PLACEHOLDER.search(value))


def _repo_file_exists(path: str) -> bool:
    return os.path.isfile(os.path.join(REPO, path))


@functools.lru_cache(maxsize=None)
def declared_flags(source_file: str) -> frozenset[str]:
    """The option strings of every add_argument call in a module (and in the repository modules it
    imports from, where its parser is built by a shared helper)."""
    with open(source_file, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    flags = {"-h", "--help"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in REPO_PACKAGES:
            spec = module_spec(node.module)
            if spec is not None and spec.origin and spec.origin.endswith(".py") and spec.origin != source_file:
                flags |= declared_flags_shallow(spec.origin)
    return frozenset(flags)


@functools.lru_cache(maxsize=None)
def declared_flags_shallow(source_file: str) -> frozenset[str]:
    with open(source_file, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return frozenset(a.value for node in ast.walk(tree)
                     if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
                     for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))


def _accepts_gin_bindings(source_file: str) -> bool:
    """Whether the module's command line takes --gin.KEY=VALUE (through sentemb_jax.main's
    gin_bindings, or by hand)."""
    with open(source_file, encoding="utf-8") as f:
        text = f.read()
    return bool(re.search(r"\bgin_bindings\(|startswith\([\"']--gin\.", text))


# ---------------------------------------------------------------------------------------------
# gin: configurables (name -> parameters) and macros, read from the sources and gin files


def _function_params(node: ast.FunctionDef) -> set[str]:
    args = node.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} - {"self", "cls"}


def _class_fields(node: ast.ClassDef) -> set[str]:
    fields = set()
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            fields.add(item.target.id)
        elif isinstance(item, ast.FunctionDef) and item.name == "__init__":
            fields |= _function_params(item)
    return fields


def _gin_decorator_name(node) -> tuple[bool, str | None]:
    """(decorated with gin.configurable, the name given to it if any)."""
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Attribute) and target.attr == "configurable":
            name = None
            if isinstance(deco, ast.Call) and deco.args and isinstance(deco.args[0], ast.Constant):
                name = deco.args[0].value
            return True, name
    return False, None


@functools.lru_cache(maxsize=None)
def gin_registry() -> tuple[dict[str, set[str]], set[str]]:
    """(configurable name -> its parameters, macros). A configurable is a function or class decorated
    with gin.configurable, or a name passed to gin.external_configurable (directly or through the
    tuples of jobs/configurables.py). Dataclass fields are inherited from base classes defined here."""
    defs: dict[str, list[tuple[set[str], list[str]]]] = {}  # name -> [(params, base names)], each definition
    decorated: dict[str, tuple[set[str], list[str]]] = {}  # registered name -> (params, base names)
    external: set[str] = set()
    for path in glob.glob(os.path.join(REPO, "sentemb_jax", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        tuples: dict[str, list[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                if isinstance(node, ast.FunctionDef):
                    definition = (_function_params(node), [])
                else:
                    definition = (_class_fields(node), [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                                                        for b in node.bases])
                defs.setdefault(node.name, []).append(definition)
                is_gin, name = _gin_decorator_name(node)
                if is_gin:
                    decorated[name or node.name] = definition
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
                names = [e.id if isinstance(e, ast.Name) else e.value.id
                         if isinstance(e, ast.Starred) and isinstance(e.value, ast.Name) else None
                         for e in node.value.elts]
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        tuples[target.id] = [n for n in names if n]
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "external_configurable" and node.args):
                arg = node.args[0]
                if isinstance(arg, ast.Name):
                    external.add(arg.id)
        # `for x in (*CONFIGS, *METHODS): gin.external_configurable(x, ...)`
        for node in ast.walk(tree):
            if isinstance(node, ast.For) and any(
                    isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "external_configurable" for n in ast.walk(node)):
                for n in ast.walk(node.iter):
                    if isinstance(n, ast.Name):
                        external.update(_expand(n.id, tuples))

    def params(definition: tuple[set[str], list[str]], seen: tuple[str, ...] = ()) -> set[str]:
        """A definition's parameters, with the fields of its base classes (every definition of a
        base's name: an external name defined twice gets the parameters of both)."""
        own, bases = definition
        out = set(own)
        for base in bases:
            if base not in seen:
                for base_definition in defs.get(base, []):
                    out |= params(base_definition, (*seen, base))
        return out

    configurables = {registered: params(definition) for registered, definition in decorated.items()}
    for name in external & defs.keys():
        configurables[name] = set().union(*(params(d, (name,)) for d in defs[name]))
    macros = set()
    for path in glob.glob(os.path.join(REPO, "gin", "**", "*.gin"), recursive=True):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        # a macro is set in a gin file, or used there (%NAME) for the command line to set
        macros |= set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*=", text, flags=re.MULTILINE))
        macros |= set(re.findall(r"%([A-Z][A-Z0-9_]*)\b", text))
    return configurables, macros


def _expand(name: str, tuples: dict[str, list[str]]) -> set[str]:
    if name in tuples:
        return {leaf for item in tuples[name] for leaf in _expand(item, tuples)}
    return {name}


def gin_binding_problem(binding: str) -> str | None:
    """Why `KEY=VALUE` (a --gin.KEY=VALUE of the docs) names something gin would not know, or None."""
    configurables, macros = gin_registry()
    key, _, value = binding.partition("=")
    key = key.strip()
    if _is_placeholder(key):
        return None
    problems = []
    selector = key.rsplit("/", 1)[-1]  # drop a gin scope
    if "." not in selector:
        if selector not in macros:
            problems.append(f"macro {selector} is set or used in no gin file")
    else:
        configurable, param = selector.rsplit(".", 1)
        module, _, name = configurable.rpartition(".")
        if module not in ("", "sentemb_jax"):
            problems.append(f"{configurable}: configurables are registered as sentemb_jax.<name>")
        elif name not in configurables:
            problems.append(f"{configurable} is not a gin configurable")
        elif param not in configurables[name]:
            problems.append(f"{configurable} has no parameter {param!r}")
    for ref in ([] if _is_placeholder(value) else re.findall(r"@([\w./]+)", value)):
        name = ref.rsplit("/", 1)[-1].removeprefix("sentemb_jax.")
        if name not in configurables:
            problems.append(f"@{ref} is not a gin configurable")
    return "; ".join(problems) or None


def test_gin_check_catches_typos():
    assert gin_binding_problem("sentemb_jax.DataConfig.batch_size=64") is None
    assert gin_binding_problem("stage1/sentemb_jax.DataConfig.task='nli'") is None
    assert gin_binding_problem("MODEL_DIR='runs/x'") is None
    assert gin_binding_problem("METHOD=@sentemb_jax.Triplet") is None
    assert gin_binding_problem("sentemb_jax.Triplet.margin=0.3") is None  # a field inherited from Contrastive's class
    assert gin_binding_problem("sentemb_jax.DataConfig.batch_sise=64")
    assert gin_binding_problem("sentemb_jax.DataConfg.batch_size=64")
    assert gin_binding_problem("MODEL_DRI='runs/x'")
    assert gin_binding_problem("METHOD=@sentemb_jax.Triplett")


def test_gin_keys_in_prose_exist():
    """Inline `--gin.KEY=VALUE` and `sentemb_jax.Configurable.param[ = value]` outside commands: the
    same check as a command's bindings (a dotted name that is no configurable, such as a module
    path, is left alone)."""
    configurables, _ = gin_registry()
    failures = []
    for rel in DOCS:
        doc = load_doc(rel)
        for number, span in inline_spans(doc):
            if (rel, doc.sections[number - 1]) in HISTORY_SECTIONS:
                continue
            binding = None
            if span.startswith("--gin."):
                binding = span[len("--gin."):]
            else:
                m = re.match(r"^(?:\w+/)?sentemb_jax\.(\w+)\.(\w+)(?:\s*=\s*(.*))?$", span)
                if m and m.group(1) in configurables:
                    binding = f"sentemb_jax.{m.group(1)}.{m.group(2)}={m.group(3) or ''}"
            problem = binding and gin_binding_problem(binding)
            if problem:
                failures.append(f"{rel}:{number}: `{span}`: {problem}")
    assert not failures, "gin keys in the docs that gin would not know:\n" + "\n".join(failures)


def command_problems(command: Command) -> list[str]:
    words = command.words
    if words[0] == "make":
        targets = makefile_targets()
        return [f"make target {t!r} is not in the Makefile" for t in words[1:] if not t.startswith("-") and "=" not in t
                and t not in targets]
    module = words[2] if len(words) > 2 else ""
    spec = module_spec(module)
    if spec is None:
        return [f"module {module!r} not found"]
    ours = module.split(".")[0] in REPO_PACKAGES
    source = spec.origin if ours else None
    if ours and spec.submodule_search_locations:  # a package run with -m: its __main__
        source = os.path.join(spec.submodule_search_locations[0], "__main__.py")
        if not os.path.isfile(source):
            return [f"{module} is a package without __main__.py"]
    problems = []
    args = words[3:]
    i = 0
    while i < len(args):
        word = args[i]
        if _is_placeholder(word) or not word.startswith("-") or not ours:
            i += 1
            continue
        gin_file, j = _option_value(args, i, "--gin_file")
        if word == "--gin_file" or word.startswith("--gin_file="):
            if "--gin_file" not in declared_flags(source):
                problems.append(f"{module} declares no flag --gin_file")
            for path in (gin_file or "").split("+"):
                if path and not _is_placeholder(path) and not _repo_file_exists(path):
                    problems.append(f"--gin_file {path}: no such file")
            i = j
            continue
        if word.startswith("--gin."):
            if not _accepts_gin_bindings(source):
                problems.append(f"{module} takes no --gin.KEY=VALUE bindings")
            else:
                problem = gin_binding_problem(word[len("--gin."):])
                if problem:
                    problems.append(f"{word}: {problem}")
            i += 1
            continue
        flag = word.split("=", 1)[0]
        if flag not in declared_flags(source):
            problems.append(f"{module} declares no flag {flag}")
        i += 1
    return problems


@functools.lru_cache(maxsize=None)
def makefile_targets() -> frozenset[str]:
    targets = set()
    for line in _read("Makefile"):
        m = re.match(r"^([\w.$()/-]+(?:\s+[\w.$()/-]+)*)\s*:(?!=)", line)
        if m:
            targets |= set(m.group(1).split())
    return frozenset(targets)


def test_doc_commands_name_what_exists():
    failures = [f"{c.where}: `{c.text}`: {p}" for c in ALL_COMMANDS for p in command_problems(c)]
    assert not failures, "commands in the docs that would fail:\n" + "\n".join(failures)


def test_command_check_catches_drift():
    def problems(text):
        return command_problems(Command("x:1", shlex.split(text)))

    assert problems("python -m sentemb_jax.main --gin_file=gin/default.gin") == []
    assert problems("python -m sentemb_jax.benchmarks.tpu_compile --topology v5e:4x4 --gin_file gin/st5_11b.gin") == []
    assert problems("python -m sentemb_jax.benchmarks.tpu_compile --gin_file gin/st5_11b.gin "
                    "--gin.sentemb_jax.MeshConfig.fsdp=2") == []
    assert problems("python -m sentemb_jax.main --gin_file=gin/defualt.gin")
    assert problems("python -m sentemb_jax.benchmarks.tpu_compile --gin_file gin/st5_11b.gin --gin.sentemb_jax.MeshConfig.fsdpp=2")
    assert problems("python -m sentemb_jax.benchmarks.memory_check --gin.sentemb_jax.MeshConfig.fsdp=2")  # takes --gin KEY=VALUE
    assert problems("python -m sentemb_jax.benchmarks.tpu_compile --topologie v5e:4x4 --gin_file gin/st5_11b.gin")
    assert problems("python -m sentemb_jax.benchmarks.no_such_tool")
    assert problems("python -m lab.experiments.no_such_experiment")
    assert problems("make no_such_target")


# Every repository module the docs run (tools, lab scripts, the job runner) is run with --help: it
# proves the module imports and builds its parser. All in one process (`runpy`, as `python -m` runs
# them), so that jax, TensorFlow and torch are imported once: about 15 s on 2 cores, where one
# process per module took 70 s.
HELP_SCRIPT = r"""
import contextlib, io, json, runpy, sys, traceback
sys.path.insert(0, sys.argv[1])
for module in sys.argv[2:]:
    sys.argv = [module, "--help"]
    out, code, error = io.StringIO(), 0, ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        code, error = 1, traceback.format_exc().strip().splitlines()[-1]
    print("HELP " + json.dumps({"module": module, "code": code, "usage": "usage" in out.getvalue().lower(),
                                "error": error}), file=sys.__stdout__, flush=True)
"""
HELP_TIMEOUT_S = 180


def _doc_modules() -> list[str]:
    """The repository modules the docs run that build an argparse parser (a module without one,
    such as lab.experiments.robustness_table, would run its work on --help)."""
    modules = sorted({c.words[2] for c in PYTHON_COMMANDS if c.words[2].split(".")[0] in REPO_PACKAGES})
    out = []
    for module in modules:
        spec = module_spec(module)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            with open(spec.origin, encoding="utf-8") as f:
                if "ArgumentParser(" in f.read():
                    out.append(module)
    return out


def _help_alone(module: str, env: dict) -> tuple[int, str]:
    """`python -m module --help` in its own process: (exit code, last line of its output)."""
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    return proc.returncode, lines[-1] if lines else ""


def test_doc_modules_answer_help():
    modules = _doc_modules()
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", HELP_SCRIPT, REPO, *modules], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=HELP_TIMEOUT_S)
    answers = {r["module"]: r for r in (json.loads(l[5:]) for l in proc.stdout.splitlines() if l.startswith("HELP "))}
    failures = []
    for module in modules:
        where = next(c.where for c in PYTHON_COMMANDS if c.words[2] == module)
        answer = answers.get(module)
        if answer is not None and answer["code"] == 0 and answer["usage"]:
            continue
        # Not answered in the shared process (or a module there left state that breaks the next):
        # ask it in a process of its own before calling it a failure.
        code, last = _help_alone(module, env)
        if code != 0:
            failures.append(f"{where}: python -m {module} --help exited {code}: {last}")
    assert not failures, "modules the docs run that do not start:\n" + "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# links and paths

REPO_PATH = re.compile(r"^(?:gin|docs|sentemb_jax|tests|lab|tpu)/[\w./*{},\[\]-]*\.(?:gin|md|py|sh|png|txt|json|toml)$")


def _path_exists(rel_to_repo: str) -> bool:
    """True when the path (with shell-style {a,b}, [_opt] and * patterns) names existing files."""
    brace = re.search(r"\{([^{}]*)\}", rel_to_repo)
    if brace:
        return all(_path_exists(rel_to_repo[:brace.start()] + alt + rel_to_repo[brace.end():])
                   for alt in brace.group(1).split(","))
    optional = re.search(r"\[([^\[\]]*)\]", rel_to_repo)
    if optional:
        return all(_path_exists(rel_to_repo[:optional.start()] + alt + rel_to_repo[optional.end():])
                   for alt in ("", optional.group(1)))
    if "*" in rel_to_repo:
        return bool(glob.glob(os.path.join(REPO, rel_to_repo)))
    return os.path.exists(os.path.join(REPO, rel_to_repo))


def test_links_and_paths_exist():
    failures = []
    for rel in DOCS:
        doc = load_doc(rel)
        base = os.path.dirname(rel)
        for number, line in enumerate(doc.prose, 1):
            code_free = re.sub(r"`[^`]*`", "", line)
            for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", code_free):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue
                path = os.path.normpath(os.path.join(base, target.split("#", 1)[0]))
                if not os.path.exists(os.path.join(REPO, path)):
                    failures.append(f"{rel}:{number}: link ({target}): {path} does not exist")
        for number, span in inline_spans(doc):
            if (rel, doc.sections[number - 1]) in HISTORY_SECTIONS:
                continue
            for word in span.split():
                word = word.strip("'\",;:()")
                if REPO_PATH.match(word) and not _path_exists(word):
                    failures.append(f"{rel}:{number}: `{word}` does not exist")
    assert not failures, "\n".join(failures)


@functools.lru_cache(maxsize=None)
def headings(rel: str) -> tuple[str, ...]:
    """The titles of a markdown file's headings, lower case, code marks dropped."""
    return tuple(line.lstrip("#").strip().replace("`", "").lower() for line in load_doc(rel).prose
                 if re.match(r"#{1,6}\s", line))


def _resolve_doc(name: str, from_doc: str) -> str | None:
    for candidate in (os.path.join(os.path.dirname(from_doc), name), name, os.path.join("docs", name)):
        candidate = os.path.normpath(candidate)
        if os.path.isfile(os.path.join(REPO, candidate)):
            return candidate
    return None


# `[RESULTS.md](RESULTS.md), "Encode throughput"`, `RESULTS.md, "Start-up"` (one title or several,
# joined by "," / "and"), `the README's Benchmarks section`, `see "Evaluation" above`.
SECTION_AFTER_FILE = re.compile(r"\b([\w./-]*\.md)(?:\]\([^)]*\))?,\s+((?:\"[^\"]+\"(?:,\s+|\s+and\s+)?)+)")
SECTION_OF_README = re.compile(r"\bREADME's\s+([A-Z][\w /-]*?)\s+section\b")
SECTION_HERE = re.compile(r"\"([^\"]+)\"\s+(?:above|below)\b")


def test_section_references_exist():
    failures = []
    for rel in DOCS:
        text = "\n".join(load_doc(rel).prose)
        refs = []  # (offset, file, title)
        for m in SECTION_AFTER_FILE.finditer(text):
            target = _resolve_doc(m.group(1), rel)
            if target is not None:
                refs += [(m.start(), target, t) for t in re.findall(r"\"([^\"]+)\"", m.group(2))]
        refs += [(m.start(), README, m.group(1)) for m in SECTION_OF_README.finditer(text)]
        refs += [(m.start(), rel, m.group(1)) for m in SECTION_HERE.finditer(text)]
        for offset, target, title in refs:
            wanted = " ".join(title.split()).replace("`", "").lower()
            if not any(h.startswith(wanted) for h in headings(target)):
                failures.append(f"{rel}:{text.count(chr(10), 0, offset) + 1}: {target} has no section {title!r}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# the README's figures against docs/RESULTS.md

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def results_machines() -> list[str]:
    """The machine names RESULTS.md defines at its top (`**name** = ...`), each by its lead (the
    part before a comma: 'x86_64', 'AMD EPYC', 'EPYC capped at AVX2', 'Intel Xeon AMX')."""
    text = "\n".join(_read(RESULTS))
    head = text.split("\n## ", 1)[0]
    names = re.findall(r"\*\*([^*]+)\*\*\s*=", head)
    assert names, f"{RESULTS}: no machine definitions (**name** = ...) before the first section"
    return [n.split(",")[0].strip() for n in names]


def _names_machine(text: str, machines: list[str]) -> bool:
    return any(m in text for m in machines)


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def readme_figures() -> list[tuple[int, str, str]]:
    """(line, method, figure) of each number in the `ours` column under "## What it reaches"."""
    lines = _read(README)
    start = next(i for i, l in enumerate(lines) if l.strip() == "## What it reaches")
    out, header = [], None
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if header is not None:
                break
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if set(line) <= set("|-: "):
            continue
        ours = cells[header.index("ours")].replace("**", "")
        for figure in re.findall(r"\d+(?:\.\d+)?", ours):
            out.append((i + 1, cells[0], figure))
    assert header and "ours" in header, f"{README}: no table with an 'ours' column under '## What it reaches'"
    return out


def results_sections() -> list[tuple[int, str, list[tuple[int, str]]]]:
    """(heading line, heading, [(line, text)]) of each ## / ### section of RESULTS.md."""
    sections, current = [], None
    for number, line in enumerate(_read(RESULTS), 1):
        if re.match(r"#{2,3}\s", line):
            current = (number, line.lstrip("#").strip(), [])
            sections.append(current)
        elif current is not None:
            current[2].append((number, line))
    return sections


def measured_where(figure: str) -> list[str]:
    """file:line of each place in RESULTS.md that gives `figure` with a date and a machine."""
    machines = results_machines()
    pattern = re.compile(r"(?<![\d.])" + re.escape(figure) + r"(?![\d])")
    found = []
    for heading_line, heading, body in results_sections():
        measured_lines = [t for _, t in body if t.startswith("Measured")]
        line_ok = any(DATE.search(t) and _names_machine(t, machines) for t in measured_lines)
        header = None
        for number, text in body:
            if not text.startswith("|"):
                header = None
                if line_ok and pattern.search(text):
                    found.append(f"{RESULTS}:{number}")
                continue
            cells = _cells(text)
            if header is None:
                header = [c.lower() for c in cells]
                continue
            if not pattern.search(text):
                continue
            if line_ok:
                found.append(f"{RESULTS}:{number}")
            elif "measured" in header and len(cells) == len(header):
                cell = cells[header.index("measured")]
                if DATE.search(cell) and (_names_machine(cell, machines) or _names_machine(heading, machines)):
                    found.append(f"{RESULTS}:{number}")
    return found


def test_readme_figures_are_measured_in_results():
    figures = readme_figures()
    assert len(figures) >= 8, figures
    failures = [f"{README}:{line}: {method}: {figure} is in no section of {RESULTS} that says when (a date) and on which "
                f"machine ({', '.join(results_machines())}) it was measured"
                for line, method, figure in figures if not measured_where(figure)]
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# what user docs must not say

FORBIDDEN = [
    (re.compile(r"\bissues?\s*#?\s*\d+|\bissue\s*#", re.IGNORECASE), "a tracker issue"),
    (re.compile(r"(?<![\w&/#])#\d+\b"), "a tracker issue number"),
    (re.compile(r"\bsessions?\b", re.IGNORECASE), "a working session"),
    (re.compile(r"\bleas(?:e|es|ed|ing)\b|\brented\b|\brental\b", re.IGNORECASE), "a leased or rented machine"),
]


@functools.lru_cache(maxsize=None)
def git_commits() -> tuple[str, ...] | None:
    try:
        proc = subprocess.run(["git", "log", "--all", "--format=%H"], cwd=REPO, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return tuple(proc.stdout.split()) if proc.returncode == 0 else None


def test_docs_name_no_issues_sessions_or_leases():
    failures = []
    for rel in DOCS:
        for number, line in enumerate(load_doc(rel).lines, 1):
            for pattern, what in FORBIDDEN:
                for m in pattern.finditer(line):
                    failures.append(f"{rel}:{number}: {what}: {m.group(0)!r}")
    assert not failures, "\n".join(failures)


def test_readme_names_no_commit_and_is_short():
    lines = _read(README)
    assert len(lines) <= README_MAX_LINES, f"{README}: {len(lines)} lines, at most {README_MAX_LINES}"
    commits = git_commits()
    if commits is None:
        pytest.skip("no git history to tell commit hashes from other hex words")
    failures = []
    for number, line in enumerate(lines, 1):
        for word in re.findall(r"\b[0-9a-f]{7,40}\b", line):
            if re.search(r"[a-f]", word) and re.search(r"\d", word) and any(c.startswith(word) for c in commits):
                failures.append(f"{README}:{number}: commit {word}")
    assert not failures, "the README names commits (docs/RESULTS.md records them):\n" + "\n".join(failures)
