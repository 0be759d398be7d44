"""Checks of configured numbers, choices and paths, run at the top of each job before any work
(before a model is loaded, a file read or MODEL_DIR touched).

An invalid value is a `ConfigError` (a ValueError) that names where it came from and what is
allowed; the job runner prints it as `error: ...` and exits 2 (bad configuration):

    gin binding sentemb_jax.train.batch_size = 0: must be an integer >= 1
    gin binding sentemb_jax.train.num_steps = %NUM_STEPS = -3: must be an integer >= 1
    sentemb_jax.train(batch_size=0): must be an integer >= 1          (given through the Python API)

Paths built from configuration or from files we read (split names, task names, modules.json
entries, relative `register_tasks.files` entries) must stay under the root they are meant for
(`require_under`).
"""
from __future__ import annotations

import math
import numbers
import os

import gin
from gin import config as gin_config
from sentemb_jax.errors import ConfigError  # noqa: F401 - re-exported

UNSET = object()


def bound_value(key: str):
    """The value gin binds at `key` (a macro resolved), UNSET when it cannot tell."""
    try:
        value = gin.query_parameter(key)
        for _ in range(20):
            if not (isinstance(value, gin_config.ConfigurableReference) and value.configurable.name == "macro"):
                return value
            value = gin.query_parameter(f"{value.scoped_selector.rsplit('/', 1)[0]}/gin.macro.value")
    except (ValueError, KeyError):
        pass
    return UNSET


def _same(a, b) -> bool:
    try:
        return a is b or (type(a) is type(b) and bool(a == b)) or (isinstance(a, float) and isinstance(b, float)
                                                                   and math.isnan(a) and math.isnan(b))
    except Exception:  # noqa: BLE001 - values that do not compare: trust the binding
        return True


def describe(value, selector: str, param: str, api: str | None = None) -> str:
    """`gin binding SELECTOR.PARAM = VALUE` when gin bound this value (with its macro:
    `... = %NUM_STEPS = 0`), else the API argument: `API(PARAM=VALUE)` (api defaults to selector)."""
    binding = gin_binding(selector, param)
    if binding is not None:
        key = binding.split(" = ", 1)[0]
        bound = bound_value(key)
        if bound is UNSET or _same(bound, value):
            return f"gin binding {binding} = {value!r}"
    return f"{api or selector}({param}={value!r})"


def fail(value, selector: str, param: str, allowed: str, api: str | None = None) -> None:
    raise ConfigError(f"{describe(value, selector, param, api)}: {allowed}")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def require_int(value, selector: str, param: str, minimum: int | None = 1, maximum: int | None = None,
                allow_none: bool = False, api: str | None = None, none_means: str = "") -> None:
    """An integer in [minimum, maximum] (None too when allow_none)."""
    if allow_none and value is None:
        return
    if minimum is not None and maximum is not None:
        allowed = f"an integer in [{minimum}, {maximum}]"
    elif minimum is not None:
        allowed = f"an integer >= {minimum}"
    else:
        allowed = f"an integer <= {maximum}" if maximum is not None else "an integer"
    if allow_none:
        allowed = f"None{none_means} or {allowed}"
    if not _is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        fail(value, selector, param, f"must be {allowed}", api)


def require_number(value, selector: str, param: str, low: float | None = None, high: float | None = None,
                   low_open: bool = False, high_open: bool = False, allow_none: bool = False,
                   api: str | None = None, none_means: str = "") -> None:
    """A finite real number within the bounds (open or closed); None too when allow_none."""
    if allow_none and value is None:
        return
    if low is not None and high is not None:
        allowed = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        allowed = f"a finite number {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        allowed = f"a finite number {'<' if high_open else '<='} {high:g}"
    else:
        allowed = "a finite number"
    if allow_none:
        allowed = f"None{none_means} or {allowed}"
    ok = _is_real(value) and math.isfinite(float(value))
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        fail(value, selector, param, f"must be {allowed}", api)


def require_choice(value, choices, selector: str, param: str, api: str | None = None) -> None:
    if not isinstance(value, (str, type(None), bool, int)) or value not in tuple(choices):
        fail(value, selector, param, f"must be one of {tuple(choices)}", api)


def require_choices(values, choices, selector: str, param: str, api: str | None = None) -> None:
    """A non-empty sequence whose items are all among `choices` (task lists: each also names files)."""
    items = [values] if isinstance(values, str) else values
    try:
        items = list(items)
    except TypeError:
        fail(values, selector, param, f"must be a list of names from {tuple(choices)}", api)
    bad = [v for v in items if not isinstance(v, str) or v not in tuple(choices)]
    if bad or not items:
        fail(values, selector, param, f"must be a non-empty list of names from {tuple(choices)}"
             + (f"; unknown: {bad}" if bad else ""), api)


def require_name(value, selector: str, param: str, root: str, api: str | None = None) -> None:
    """A file-name part (e.g. a split: `<root>/<name>.tsv`): a non-empty string without a path
    separator or `..`, so the file it names stays under `root`."""
    if not isinstance(value, str) or not value or value in (".", "..") or "/" in value or os.sep in value \
            or (os.altsep and os.altsep in value) or "\0" in value:
        fail(value, selector, param, f"must be a plain name (no '/' or '..'): it names a file under {root}", api)


def is_under(path: str, root: str) -> bool:
    """Whether `path` (relative to `root`, or absolute) lies under `root`, lexically (no `..` out)."""
    full = os.path.normpath(os.path.join(root, path))
    root = os.path.normpath(root)
    return full == root or full.startswith(root.rstrip(os.sep) + os.sep)


def require_under(path: str, root: str, what: str, error=ConfigError) -> str:
    """`root/path`, normalised; `error` naming `what` (the entry) and the root when a relative
    `path` would leave `root` (`..`) or when `path` is absolute and not under it."""
    if not isinstance(path, str) or "\0" in path:
        raise error(f"{what}: must be a path string, got {path!r}")
    if not is_under(path, root):
        raise error(f"{what}: leaves its root {os.path.normpath(root)} "
                    f"(resolves to {os.path.normpath(os.path.join(root, path))})")
    return os.path.normpath(os.path.join(root, path))


# ---------------------------------------------------------------------------------------------
# Jobs


TRAIN = "sentemb_jax.train"
PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
SEED_MAX = 2**31 - 1


def check_seed(seed, selector: str, param: str = "seed", api: str | None = None) -> None:
    require_int(seed, selector, param, 0, SEED_MAX, api=api)


def check_batch_size(value, selector: str, param: str = "batch_size", api: str | None = None) -> None:
    require_int(value, selector, param, 1, api=api)


# Where a value came from: its gin binding (with the macro it came from), for error messages.


def gin_binding(selector: str, param: str) -> str | None:
    """`selector.param` as gin bound it in the active scope (with the macro it came from:
    `sentemb_jax.eval_sts.data_dir = %DATA_DIR`), or None when gin does not bind it."""
    scopes = gin.current_scope()
    for i in range(len(scopes), -1, -1):  # innermost scope first, as gin resolves it
        key = "/".join([*scopes[:i], f"{selector}.{param}"])
        try:
            value = gin.query_parameter(key)
        except (ValueError, KeyError):
            continue
        if isinstance(value, gin_config.ConfigurableReference) and value.configurable.name == "macro":
            return f"{key} = %{value.scoped_selector.rsplit('/', 1)[0]}"
        return key
    return None


def source(selector: str, param: str) -> str:
    """`set by gin binding X = %MACRO` for an error message; `selector.param` when gin does not bind it."""
    binding = gin_binding(selector, param)
    return f"set by gin binding {binding}" if binding else f"{selector}.{param}"


def via(selector: str, param: str) -> str:
    return f" ({source(selector, param)})"
