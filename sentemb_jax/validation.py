"""Checks of configured numbers, choices and paths, run at the top of each job before any work
(before a model is loaded, a file read or MODEL_DIR touched).

An invalid value is a `ConfigError` (a ValueError) that names the API argument it came from and
what is allowed; the job runner words the same place as the gin binding that set it, prints it
as `error: ...` and exits 2 (bad configuration):

    sentemb_jax.DataConfig(batch_size=0): must be an integer >= 1                 (the Python API)
    gin binding sentemb_jax.DataConfig.batch_size = 0: must be an integer >= 1    (from main)
    gin binding sentemb_jax.RunConfig.num_steps = %NUM_STEPS = -3: must be an integer >= 1

Paths built from configuration or from files we read (split names, task names, modules.json
entries, relative `DataConfig.files` entries) must stay under the root they are meant for
(`require_under`).
"""
from __future__ import annotations

import math
import numbers
import os

from sentemb_jax.errors import ConfigError


def fail(value, api: str, param: str, allowed: str) -> None:
    """ConfigError `API(param=value): allowed` (main: `gin binding API.param = value: allowed`)."""
    raise ConfigError(f"{{where}}: {allowed}", api=api, param=param, value=value)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def require_int(value, api: str, param: str, minimum: int | None = 1, maximum: int | None = None,
                allow_none: bool = False, none_means: str = "") -> None:
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
        fail(value, api, param, f"must be {allowed}")


def require_number(value, api: str, param: str, low: float | None = None, high: float | None = None,
                   low_open: bool = False, high_open: bool = False, allow_none: bool = False,
                   none_means: str = "") -> None:
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
        fail(value, api, param, f"must be {allowed}")


def require_bool(value, api: str, param: str) -> None:
    if not isinstance(value, bool):
        fail(value, api, param, "must be True or False")


def require_choice(value, choices, api: str, param: str) -> None:
    if not isinstance(value, (str, type(None), bool, int)) or value not in tuple(choices):
        fail(value, api, param, f"must be one of {tuple(choices)}")


def require_choices(values, choices, api: str, param: str) -> None:
    """A non-empty sequence whose items are all among `choices` (task lists: each also names files)."""
    items = [values] if isinstance(values, str) else values
    try:
        items = list(items)
    except TypeError:
        fail(values, api, param, f"must be a list of names from {tuple(choices)}")
    bad = [v for v in items if not isinstance(v, str) or v not in tuple(choices)]
    if bad or not items:
        fail(values, api, param, f"must be a non-empty list of names from {tuple(choices)}"
             + (f"; unknown: {bad}" if bad else ""))


def require_name(value, api: str, param: str, root: str) -> None:
    """A file-name part (e.g. a split: `<root>/<name>.tsv`): a non-empty string without a path
    separator or `..`, so the file it names stays under `root`."""
    if not isinstance(value, str) or not value or value in (".", "..") or "/" in value or os.sep in value \
            or (os.altsep and os.altsep in value) or "\0" in value:
        fail(value, api, param, f"must be a plain name (no '/' or '..'): it names a file under {root}")


def require_path(value, api: str, param: str, allow_none: bool = False) -> None:
    """A path string (None too when allow_none): not empty, no NUL character."""
    if allow_none and value is None:
        return
    if not isinstance(value, str) or not value or "\0" in value:
        fail(value, api, param, "must be a path (a non-empty string)" + (" or None" if allow_none else ""))


def expand_path(path):
    """`~` at the start of a local path expanded (gin strings are quoted: the shell leaves it), so
    `'~/runs/x'` is the home directory's, not a folder named `~` in the working directory."""
    return os.path.expanduser(path) if isinstance(path, str) and path.startswith("~") else path


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


PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
SEED_MAX = 2**31 - 1


def check_seed(seed, api: str, param: str = "seed") -> None:
    require_int(seed, api, param, 0, SEED_MAX)


def check_batch_size(value, api: str, param: str = "batch_size") -> None:
    require_int(value, api, param, 1)
