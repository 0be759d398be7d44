"""What the command line knows of gin: the parsed bindings (through gin's finalize hook, its public
view of the configuration), their type check, and the binding behind a value an error names.

The library raises errors that name API arguments (`sentemb_jax.DataConfig(batch_size=0): must be
an integer >= 1`); `reword` gives the same error in the words of the gin files that set the value:
`gin binding sentemb_jax.DataConfig.batch_size = 0: must be an integer >= 1`.
"""
from __future__ import annotations

import difflib
import math
import os
import re
import types
import typing

from gin.config import ConfigurableReference, register_finalize_hook  # gin.config's public names

import gin
from sentemb_jax.errors import SentembError, UsageError

UNSET = object()
_CONFIG: dict = {}  # (scope, selector) -> {param: value}: the dict gin's finalize hooks are given


@register_finalize_hook
def _keep_config(config: dict) -> None:
    """gin passes its configuration to finalize hooks; keep a reference (it is the live dict)."""
    global _CONFIG
    _CONFIG = config


def _expanded(value):
    """`value` with every string that starts with `~` (`'~/runs/x'`, in a list, tuple or dict too)
    expanded to the home directory; the same object when nothing changes."""
    if isinstance(value, str):
        return os.path.expanduser(value) if value.startswith("~") else value
    if isinstance(value, (list, tuple)):
        items = [_expanded(v) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
    if isinstance(value, dict):
        items = {k: _expanded(v) for k, v in value.items()}
        return value if all(items[k] is value[k] for k in value) else type(value)(items)
    return value


@register_finalize_hook
def _expand_home(config: dict) -> dict:
    """`~` in a configured path means the home directory: gin strings are quoted, so the shell never
    expands it, and `MODEL_DIR='~/x'` would otherwise create a folder named `~` in the working
    directory. The one place a configured path is resolved: every bound string starting with `~`
    (a macro's value, a parameter, an entry of a list / dict), rebound expanded when gin finalizes."""
    updates = {}
    for (scope, selector), params in config.items():
        for param, value in params.items():
            new = _expanded(value)
            if new is not value:
                updates[(scope, selector, param)] = new
    return updates


def parsed() -> dict:
    """(scope, selector) -> {param: value} of the configuration parsed last (finalized)."""
    return _CONFIG


def _is_macro(value) -> bool:
    return isinstance(value, ConfigurableReference) and value.configurable.name == "macro"


def _macro_name(value) -> str:
    return value.scoped_selector.rsplit("/", 1)[0]


def resolve(value, depth: int = 0):
    """A bound value with its macros (%NAME) followed to their values (references stay references)."""
    while _is_macro(value) and depth < 20:
        value = _CONFIG.get((_macro_name(value), "gin.macro"), {}).get("value", UNSET)
        depth += 1
    return value


def bound_value(key: str):
    """The value gin binds at `key` (a macro resolved), UNSET when it cannot tell."""
    try:
        return resolve(gin.query_parameter(key))
    except (ValueError, KeyError):
        return UNSET


def _same(a, b) -> bool:
    try:
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
        return a is b or (type(a) is type(b) and bool(a == b)) or (
            isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    except Exception:  # noqa: BLE001 - values that do not compare: trust the binding
        return True


def binding_of(api: str, param: str, value=UNSET) -> str | None:
    """`KEY` or `KEY = %MACRO` of the gin binding that set `api.param` (to `value`, when several
    scopes bind it), None when no binding does."""
    found = []
    for (scope, selector), params in sorted(_CONFIG.items(), key=lambda kv: (len(kv[0][0]), kv[0])):
        if selector != api or param not in params:
            continue
        raw = params[param]
        key = "/".join([*([scope] if scope else []), f"{selector}.{param}"])
        found.append((f"{key} = %{_macro_name(raw)}" if _is_macro(raw) else key, resolve(raw)))
    if not found:
        return None
    if value is not UNSET:
        for text, bound in found:
            if _same(bound, value):
                return text
        if len(found) > 1:
            return None
    return found[0][0]


def reword(error: SentembError) -> str:
    """The error's message with its place as the gin binding that set it (the API argument when no
    binding did: a default, or a value a job computed)."""
    if error.api is None or error.param is None:
        return str(error)
    binding = binding_of(error.api, error.param, error.value if error.has_value and not error.key else UNSET)
    if binding is None:
        return str(error)
    if error.key:  # an entry of a mapping: `KEY['entry']`, its macro (if any) after
        key, _, macro = binding.partition(" = ")
        binding = f"{key}{error.key}" + (f" (in %{macro.lstrip('%')})" if macro else "")
    if error.source or not error.has_value:
        return error.render(f"set by gin binding {binding}")
    return error.render(f"gin binding {binding} = {error.value!r}")


_UNSET_MACRO = re.compile(r"No bindings specified for '([^']+)/gin\.macro'")
MODEL_HINT = ("run files and recipes name no model: give a model file before them, e.g. "
              "--gin_file=gin/models/minilm_l6.gin (gin/models/ lists them)")


def short_gin_error(error: Exception) -> str:
    """gin's parse error in one line: a macro used but never set is named (with, for MODEL, where
    models come from) instead of gin's dump of the whole configuration."""
    text = str(error)
    unset = _UNSET_MACRO.search(text)
    if unset:
        name = unset.group(1)
        if name == "MODEL":
            return f"macro MODEL is used but not set: {MODEL_HINT}"
        if name == "MODEL_PATH":
            return ("macro MODEL_PATH is used but not set: give the model directory (--gin.MODEL_PATH=\"'/path'\") or a "
                    "model file before the run file (e.g. --gin_file=gin/models/minilm_l6.gin)")
        return f"macro {name} is used but not set (set it: --gin.{name}=...)"
    text = text.split("\n  In file", 1)[0] if len(text) > 2000 else text
    return _one_line(text)


_GIN_LOCATION = re.compile(r"\n  In (?:file \"([^\"]*)\", line (\d+)|bindings string line (\d+))\n(    [^\n]*)?")


def _one_line(text: str) -> str:
    """gin's `  In file "x.gin", line 3` / `  In bindings string line 1` lines (and the line they
    quote) folded into the message, so that the error stays the console's last line:
    `...: message (x.gin, line 3: binding)`."""
    places = []

    def keep(match) -> str:
        quoted = (match.group(4) or "").strip()
        where = f"{match.group(1)}, line {match.group(2)}" if match.group(1) is not None else "--gin. binding"
        places.append(f"{where}: {quoted}" if quoted else where)
        return ""

    head = _GIN_LOCATION.sub(keep, text).strip()
    head = " ".join(line.strip() for line in head.splitlines() if line.strip())
    return f"{head} ({'; in '.join(places)})" if places else head


_SIMPLE = {int: "int", float: "float", str: "str", bool: "bool", type(None): "None"}


def _fits(value, hint) -> bool | None:
    """Whether `value` fits a simple annotation (int, float, str, bool, None and unions of
    them); None when the annotation is not one we check (containers, classes, Any...)."""
    if hint in _SIMPLE:
        if hint is float:
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if hint is int:
            return isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        fits = [_fits(value, h) for h in typing.get_args(hint)]
        return None if any(f is None for f in fits) and not any(fits) else any(bool(f) for f in fits)
    return None


def _hint_name(hint) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_hint_name(h) for h in typing.get_args(hint))
    return _SIMPLE.get(hint, getattr(hint, "__name__", str(hint)))


def _hints(selector: str) -> dict:
    try:
        target = gin.get_configurable(selector)
        if isinstance(target, type):
            return typing.get_type_hints(target)
        return typing.get_type_hints(getattr(target, "__wrapped__", target))
    except Exception:  # noqa: BLE001 - annotations we cannot evaluate are not checked
        return {}


def binding_type_errors() -> list[str]:
    """Each gin binding whose value does not fit its parameter's simple annotation, as
    `selector.param = value: expected T` (a typo like batch_size='128' is caught before the job
    starts, not deep inside it). References (@f, @f()) are not checked; macros by their value."""
    errors = []
    for (_, selector), params in sorted(_CONFIG.items(), key=lambda kv: str(kv[0])):
        if selector == "gin.macro":
            continue
        hints = _hints(selector)
        for param, value in params.items():
            value = resolve(value)
            if param in hints and not isinstance(value, ConfigurableReference) and value is not UNSET \
                    and _fits(value, hints[param]) is False:
                errors.append(f"{selector}.{param} = {value!r}: expected {_hint_name(hints[param])}")
    return errors


def full_name(name: str) -> str:
    """The registered selector of a configurable named `name` (`evaluate_stsb` -> `sentemb_jax.evaluate_stsb`)."""
    for candidate in (name, f"sentemb_jax.{name}"):
        try:
            gin.get_configurable(candidate)
        except (ValueError, KeyError):
            continue
        return candidate if "." in candidate else f"sentemb_jax.{candidate}"
    return name


def suggest_job(value) -> str:
    """The registered job a string names (`evaluate_stsb` -> `sentemb_jax.evaluate_stsb`)."""
    if isinstance(value, str):
        name = value.strip().lstrip("@").rstrip("()").strip()
        for candidate in (f"sentemb_jax.{name}", name):
            try:
                gin.get_configurable(candidate)
                return candidate
            except (ValueError, KeyError):
                continue
    return "sentemb_jax.<job>, e.g. @sentemb_jax.evaluate_stsb"


# ---------------------------------------------------------------------------------------------
# The gin files as text: include cycles and macros set on the command line that nothing reads.

_INCLUDE = re.compile(r"""^[ \t]*include[ \t]+(['"])(.+?)\1""", re.M)
# Strings and comments are matched (and skipped) so that a `%` inside them is not a macro reference.
_TOKENS = re.compile(r"""'''.*?'''|\"\"\".*?\"\"\"|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|#[^\n]*"""
                     r"|%([A-Za-z_][\w.]*(?:/[A-Za-z_][\w.]*)*)", re.S)
MACROS_READ_BY_CODE = frozenset({"MODEL_DIR", "MODEL"})  # main (the log's place), the train job (its model)


def find_gin_file(name: str, prefixes) -> str | None:
    """Where gin finds `name` (as gin.parse_config_file does: absolute as given, else the first
    search prefix that holds it); None when none does (gin's own error names it)."""
    candidates = [name] if os.path.isabs(name) else [os.path.join(p, name) for p in prefixes]
    return next((c for c in candidates if os.path.isfile(c)), None)


def read_gin_files(files, prefixes) -> list[str]:
    """The text of every gin file `files` reach through their includes (each once). An include
    cycle is a UsageError naming the chain as written (`a.gin -> b.gin -> a.gin`): gin itself
    recurses until Python's recursion limit and prints each step of the chain."""
    texts, done = [], set()

    def visit(name: str, path: str, chain: list) -> None:
        real = os.path.realpath(path)
        stack = [r for r, _ in chain]
        if real in stack:
            names = [n for _, n in chain[stack.index(real):]] + [name]
            raise UsageError("gin configuration error: include cycle: " + " -> ".join(names)
                             + " (a file includes itself through these includes; remove one of them)")
        if real in done:
            return
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            return  # gin reports an unreadable file
        texts.append(text)
        for match in _INCLUDE.finditer(text):
            found = find_gin_file(match.group(2), prefixes)
            if found:
                visit(match.group(2), found, chain + [(real, name)])
        done.add(real)

    for name in files:
        found = find_gin_file(name, prefixes)
        if found:
            visit(name, found, [])
    return texts


def macro_references(texts) -> set[str]:
    """Every `%NAME` in gin text (not inside a string or a comment)."""
    return {m.group(1) for text in texts for m in _TOKENS.finditer(text) if m.group(1)}


def unread_macros(bindings, texts) -> list[str]:
    """Each `--gin.NAME=VALUE` (a macro: no `.` in its key) that no `%NAME` in the gin files or the
    other bindings reads, nor the code (MACROS_READ_BY_CODE): a typo such as NUM_STEP for NUM_STEPS
    would otherwise run with the file's value, silently. The message suggests the close name."""
    read = macro_references([*texts, *bindings]) | MACROS_READ_BY_CODE
    problems = []
    for binding in bindings:
        key = binding.split("=", 1)[0].strip()
        if not key or "." in key or key in read or key.rsplit("/", 1)[-1] in read:
            continue
        close = difflib.get_close_matches(key, sorted(read), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}? (--gin.{close[0]}=...)" if close else ""
        problems.append(f"--gin.{key}=... sets macro {key}, but nothing reads it (no %{key} in the gin files or "
                        f"bindings){hint}")
    return problems


_EXPRESSION = re.compile(r"^[\d\s.eE()]*\d[\d\s.eE()]*[-+*/%][\d\s.eE()+\-*/%]*$")


def unparseable_binding(binding: str) -> str:
    """The error for a `--gin.KEY=VALUE` whose value gin cannot parse: the binding named, and how
    to write a string (quoted inside the shell's quotes) or a number (gin computes nothing)."""
    key, _, value = (part.strip() for part in binding.partition("="))
    why = ("gin computes no expressions: write the number itself" if _EXPRESSION.match(value)
           else "a string must be quoted")
    return (f"gin configuration error: --gin.{key}={value}: cannot parse the value {value} ({why}; a gin value is "
            f"a Python literal - a number, a 'quoted string', a list, a dict, None, True, False - a @reference or "
            f"a %MACRO; a string on the command line is quoted twice: --gin.{key}=\"'{value}'\")")
