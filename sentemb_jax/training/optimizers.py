"""Optimisers (optax) with the schedules the papers use."""
from __future__ import annotations

import contextlib
import contextvars

import optax

import gin
from sentemb_jax import validation as v

_RUN_STEPS: contextvars.ContextVar[int | None] = contextvars.ContextVar("run_steps", default=None)


@contextlib.contextmanager
def schedule_spans(num_steps: int):
    """Within it, a learning_rate_schedule whose total_steps is unbound lasts `num_steps`: the train
    job builds its optimizer inside `schedule_spans(train.num_steps)`, so a gin file binds the
    number of steps once (an explicit learning_rate_schedule.total_steps still wins)."""
    token = _RUN_STEPS.set(num_steps)
    try:
        yield
    finally:
        _RUN_STEPS.reset(token)


def run_optimizer(num_steps: int) -> optax.GradientTransformation:
    """make_optimizer() as gin configures it, its schedule lasting `num_steps` unless gin binds
    learning_rate_schedule.total_steps: what the train job (and its checks) build."""
    with schedule_spans(num_steps):  # gin evaluates @learning_rate_schedule() when make_optimizer is called
        return make_optimizer()


@gin.configurable(module="sentemb_jax")
def learning_rate_schedule(peak: float = 1e-3, warmup_steps: int = 0, total_steps: int | None = None,
                           decay: str = "linear", warmup_fraction: float | None = None) -> optax.Schedule:
    """Linear warm-up to `peak`, then linear decay to 0 at `total_steps` (or constant).

    warmup_fraction: warm up over this share of `total_steps` instead of `warmup_steps`.
    total_steps None: the run's train.num_steps inside the train job (`schedule_spans`).
    Each value is checked (ConfigError naming its gin binding or argument and the allowed range)."""
    sel = "sentemb_jax.learning_rate_schedule"
    if total_steps is None:
        total_steps = _RUN_STEPS.get()
    v.require_choice(decay, ("linear", "constant"), sel, "decay")
    v.require_number(peak, sel, "peak", 0, low_open=True)
    v.require_int(warmup_steps, sel, "warmup_steps", 0)
    v.require_int(total_steps, sel, "total_steps", 1, allow_none=True, none_means=" (constant after warm-up)")
    v.require_number(warmup_fraction, sel, "warmup_fraction", 0, 1, high_open=True, allow_none=True)
    if decay == "linear" and total_steps is None:
        v.fail(total_steps, sel, "total_steps", "linear decay needs total_steps (an integer >= 1)")
    if warmup_fraction is not None:
        if not total_steps:
            v.fail(warmup_fraction, sel, "warmup_fraction", "needs total_steps (an integer >= 1)")
        warmup_steps = int(warmup_fraction * total_steps)
    elif total_steps is not None and warmup_steps > total_steps:
        v.fail(warmup_steps, sel, "warmup_steps", f"must be <= total_steps ({total_steps})")
    after = optax.constant_schedule(peak)
    if decay == "linear":
        if not total_steps:
            raise ValueError("linear decay needs total_steps")
        after = optax.linear_schedule(peak, 0.0, max(total_steps - warmup_steps, 1))
    if warmup_steps:
        return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup_steps), after], [warmup_steps])
    return after


@gin.configurable(module="sentemb_jax")
def make_optimizer(name: str = "adafactor", learning_rate: optax.ScalarOrSchedule = 1e-3, clip_norm: float | None = 1.0,
                   weight_decay: float = 0.0, adafactor_decay_rate: float = 0.8, min_dim_size_to_factor: int = 128,
                   multiply_by_parameter_scale: bool = False,
                   clipping_threshold: float | None = None) -> optax.GradientTransformation:
    """Adafactor (factored second moments, decay rate 0.8) or AdamW.

    The Adafactor defaults here are not t5x's: multiply_by_parameter_scale False (steps of lr,
    not lr x the parameter's RMS) and clipping_threshold None (no update clipping), kept so that the
    configs that do not bind them train as before. t5x's Adafactor (Sentence-T5) has True and 1.0:
    gin/optimizers/adafactor_t5x.gin, included by gin/st5_*.gin.
    Global-norm clipping of the gradient (`clip_norm`) runs first; None disables it.
    clipping_threshold: Adafactor's update clipping (its update's RMS capped at this), > 0 or None.
    learning_rate: a finite number >= 0 (0 freezes the parameters: a stage that only restores), or a
      schedule (`@sentemb_jax.learning_rate_schedule()`).
    Each value is checked (ConfigError naming its gin binding or argument and the allowed range).
    """
    sel = "sentemb_jax.make_optimizer"
    v.require_choice(name, ("adafactor", "adamw"), sel, "name")
    if not callable(learning_rate) and not (v._is_real(learning_rate) and 0 <= learning_rate < float("inf")):
        v.fail(learning_rate, sel, "learning_rate",
               "must be a finite number >= 0 or a schedule (e.g. @sentemb_jax.learning_rate_schedule())")
    v.require_number(clip_norm, sel, "clip_norm", 0, low_open=True, allow_none=True, none_means=" (no clipping)")
    v.require_number(weight_decay, sel, "weight_decay", 0)
    v.require_number(adafactor_decay_rate, sel, "adafactor_decay_rate", 0, 1, low_open=True)
    v.require_int(min_dim_size_to_factor, sel, "min_dim_size_to_factor", 1)
    v.require_number(clipping_threshold, sel, "clipping_threshold", 0, low_open=True, allow_none=True,
                     none_means=" (no update clipping)")
    if name == "adafactor":
        opt = optax.adafactor(
            learning_rate, min_dim_size_to_factor=min_dim_size_to_factor, decay_rate=adafactor_decay_rate,
            multiply_by_parameter_scale=multiply_by_parameter_scale, clipping_threshold=clipping_threshold,
            weight_decay_rate=weight_decay or None, factored=True,
        )
    elif name == "adamw":
        opt = optax.adamw(learning_rate, weight_decay=weight_decay)
    else:
        raise ValueError(f"unknown optimizer {name!r} (adafactor, adamw)")
    return optax.chain(optax.clip_by_global_norm(clip_norm), opt) if clip_norm else opt
