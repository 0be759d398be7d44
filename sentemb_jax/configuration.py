"""What the command line knows of gin: the parsed bindings (through gin's finalize hook, its public
view of the configuration), their type check, and the binding behind a value an error names.

The library raises errors that name API arguments (`sentemb_jax.DataConfig(batch_size=0): must be
an integer >= 1`); `reword` gives the same error in the words of the gin files that set the value:
`gin binding sentemb_jax.DataConfig.batch_size = 0: must be an integer >= 1`.
"""
from __future__ import annotations

import math
import re
import types
import typing

from gin.config import ConfigurableReference, register_finalize_hook  # gin.config's public names

import gin
from sentemb_jax.errors import SentembError

UNSET = object()
_CONFIG: dict = {}  # (scope, selector) -> {param: value}: the dict gin's finalize hooks are given


@register_finalize_hook
def _keep_config(config: dict) -> None:
    """gin passes its configuration to finalize hooks; keep a reference (it is the live dict)."""
    global _CONFIG
    _CONFIG = config


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
    return text.split("\n  In file", 1)[0] if len(text) > 2000 else text


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
