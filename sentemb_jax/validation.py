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

UNSET = object()


class ConfigError(ValueError):
    """A configured number, choice or path outside what it allows (the runner exits 2)."""


def _bound_value(key: str):
    """The value gin binds at `key` (a macro resolved), UNSET when it cannot tell."""
    from gin import config as gin_config

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
    from sentemb_jax.preflight import gin_binding

    binding = gin_binding(selector, param)
    if binding is not None:
        key = binding.split(" = ", 1)[0]
        bound = _bound_value(key)
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


def check_train_config(args: dict) -> None:
    """Every number and choice of `sentemb_jax.train(**args)`, its ContrastiveConfig and the
    optimizer gin configures for it (make_optimizer / learning_rate_schedule): before any work."""
    a = args.get
    check_batch_size(a("batch_size"), TRAIN)
    require_int(a("num_steps"), TRAIN, "num_steps", 1)
    require_int(a("sequence_length"), TRAIN, "sequence_length", 2)
    require_int(a("checkpoint_every"), TRAIN, "checkpoint_every", 1)
    require_int(a("keep_checkpoints"), TRAIN, "keep_checkpoints", 1)
    require_int(a("eval_every"), TRAIN, "eval_every", 1, allow_none=True, none_means=" (no evaluation)")
    require_int(a("log_every"), TRAIN, "log_every", 1)
    require_number(a("time_budget_s"), TRAIN, "time_budget_s", 0, low_open=True, allow_none=True,
                   none_means=" (no budget)")
    check_seed(a("seed"), TRAIN)
    require_int(a("skip_nonfinite"), TRAIN, "skip_nonfinite", 0)
    require_int(a("init_layers"), TRAIN, "init_layers", 1, allow_none=True, none_means=" (every layer)")
    if a("prng_impl") is not None:
        require_choice(a("prng_impl"), PRNG_IMPLS, TRAIN, "prng_impl")
    if not isinstance(a("task"), str) or not a("task"):
        fail(a("task"), TRAIN, "task", "must be a task name (a string, e.g. 'nli_triples')")
    if a("pooling") is not None:
        from sentemb_jax.pooling import POOLING_MODES, check_pooling_modes

        try:
            check_pooling_modes(a("pooling"))
        except (ValueError, TypeError):
            fail(a("pooling"), TRAIN, "pooling", f"must be None (the model's own) or modes from {POOLING_MODES}")
    contrastive = a("contrastive")
    if contrastive is not None and a("distill") is None:
        check_contrastive(contrastive)
    check_positions(a("sequence_length"), a("init_from"), TRAIN, "sequence_length")
    from sentemb_jax.partitioning import make_mesh
    from sentemb_jax.training.optimizers import make_optimizer

    make_optimizer()  # its gin bindings (learning rate, schedule, clipping) checked now, not after the model loads
    make_mesh()  # its axis sizes against the devices, likewise


def check_positions(length, model_dir, selector: str, param: str) -> None:
    """A length past the position table of a BERT-family `model_dir` (read from its config.json
    only; nothing loaded) is refused: those tokens would get NaN embeddings. T5: no table."""
    if not model_dir or not isinstance(model_dir, str) or "://" in model_dir or not os.path.isdir(model_dir):
        return  # a missing directory is reported by the preflight checks
    import json

    from sentemb_jax.encoder import transformer_dir_of

    try:
        with open(os.path.join(transformer_dir_of(model_dir), "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        positions = int(cfg["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # no table (T5) or an unreadable config: reported when the model loads
    if str(cfg.get("model_type", "")).startswith("t5"):
        return
    limit = positions - (int(cfg.get("pad_token_id", 1)) + 1 if cfg.get("model_type") == "roberta" else 0)
    if _is_int(length) and length > limit:
        fail(length, selector, param, f"must be an integer in [2, {limit}]: {model_dir} has {limit} positions "
             "(longer texts would get NaN embeddings)")


def check_contrastive(cfg) -> None:
    sel = "sentemb_jax.ContrastiveConfig"
    require_number(getattr(cfg, "temperature", 0.05), sel, "temperature", 0, low_open=True)
    require_number(getattr(cfg, "label_smoothing", 0.0), sel, "label_smoothing", 0, 1, high_open=True)
    require_int(getattr(cfg, "chunk_size", None), sel, "chunk_size", 1, allow_none=True, none_means=" (whole batch)")


def check_run_job() -> None:
    """`run.job` must be a reference to a job, `@sentemb_jax.evaluate_stsb` (checked before it runs:
    `@job()` would run it while the arguments of `run` are read, a string is not a job)."""
    from gin import config as gin_config

    key = next((k for k in ("run.job", "sentemb_jax.main.run.job", "__main__.run.job")
                if _bound_value(k) is not UNSET), None)
    if key is None:
        return  # unbound: gin's "Required bindings" message
    try:
        raw = gin.query_parameter(key)
    except (ValueError, KeyError):
        return
    value = _bound_value(key)
    if isinstance(value, gin_config.ConfigurableReference):
        if value.evaluate:
            name = _full_name(value.configurable.name)
            raise ConfigError(f"gin binding run.job = @{name}(): the parentheses would run the job while run's "
                             f"arguments are read; write run.job = @{name} (no parentheses)")
        return
    if callable(value):
        return
    shown = f"{key} = %{raw.scoped_selector.rsplit('/', 1)[0]}" if isinstance(raw, gin_config.ConfigurableReference) else key
    raise ConfigError(f"gin binding {shown} = {value!r} is a {type(value).__name__}, not a job: "
                     f"write run.job = @{_suggest_job(value)} (a reference to the job, with @)")


def _full_name(name: str) -> str:
    from gin import config as gin_config

    try:
        return gin_config._REGISTRY.get_match(name).selector
    except Exception:  # noqa: BLE001
        return name


def _suggest_job(value) -> str:
    """The registered configurable a string names (`evaluate_stsb` -> `sentemb_jax.evaluate_stsb`)."""
    from gin import config as gin_config

    if isinstance(value, str):
        name = value.strip().lstrip("@").rstrip("()").strip()
        for candidate in (name, f"sentemb_jax.{name}"):
            try:
                return gin_config._REGISTRY.get_match(candidate).selector
            except Exception:  # noqa: BLE001
                continue
    return "sentemb_jax.<job>, e.g. @sentemb_jax.evaluate_stsb"
