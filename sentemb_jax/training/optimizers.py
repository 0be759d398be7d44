"""Optimisers (optax) with the schedules the papers use."""
from __future__ import annotations

import gin
import optax


@gin.configurable(module="sentemb_jax")
def learning_rate_schedule(peak: float = 1e-3, warmup_steps: int = 0, total_steps: int | None = None,
                           decay: str = "linear", warmup_fraction: float | None = None) -> optax.Schedule:
    """Linear warm-up to `peak`, then linear decay to 0 at `total_steps` (or constant).

    warmup_fraction: warm up over this share of `total_steps` instead of `warmup_steps`."""
    if decay not in ("linear", "constant"):
        raise ValueError(f"decay must be 'linear' or 'constant', got {decay!r}")
    if warmup_fraction is not None:
        if not total_steps or not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"warmup_fraction={warmup_fraction} needs total_steps and a value in [0, 1)")
        warmup_steps = int(warmup_fraction * total_steps)
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
                   multiply_by_parameter_scale: bool = False) -> optax.GradientTransformation:
    """Adafactor with t5x defaults (factored second moments, decay rate 0.8) or AdamW.

    Global-norm clipping (`clip_norm`) runs first; None disables it.
    """
    if name == "adafactor":
        opt = optax.adafactor(
            learning_rate, min_dim_size_to_factor=min_dim_size_to_factor, decay_rate=adafactor_decay_rate,
            multiply_by_parameter_scale=multiply_by_parameter_scale, clipping_threshold=None,
            weight_decay_rate=weight_decay or None, factored=True,
        )
    elif name == "adamw":
        opt = optax.adamw(learning_rate, weight_decay=weight_decay)
    else:
        raise ValueError(f"unknown optimizer {name!r} (adafactor, adamw)")
    return optax.chain(optax.clip_by_global_norm(clip_norm), opt) if clip_norm else opt
