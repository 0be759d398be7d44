"""The optimizer (optax) and learning-rate schedule of a run, from its OptimizerConfig and ScheduleConfig."""
from __future__ import annotations

import optax

from sentemb_jax.training.config import OptimizerConfig, ScheduleConfig


def learning_rate_schedule(schedule: ScheduleConfig, num_steps: int) -> optax.Schedule:
    """Linear warm-up to `peak`, then linear decay to 0 at the schedule's last step (or constant)."""
    warmup, total = schedule.steps(num_steps)
    after = optax.constant_schedule(schedule.peak)
    if schedule.decay == "linear":
        after = optax.linear_schedule(schedule.peak, 0.0, max(total - warmup, 1))
    if warmup:
        return optax.join_schedules([optax.linear_schedule(0.0, schedule.peak, warmup), after], [warmup])
    return after


def make_optimizer(optimizer: OptimizerConfig, schedule: ScheduleConfig, num_steps: int) -> optax.GradientTransformation:
    """Adafactor (factored second moments) or AdamW at the schedule's learning rate, after global-norm
    clipping of the gradient (`clip_norm`; None: none)."""
    lr = learning_rate_schedule(schedule, num_steps)
    if optimizer.name == "adafactor":
        opt = optax.adafactor(
            lr, min_dim_size_to_factor=optimizer.min_dim_size_to_factor, decay_rate=optimizer.adafactor_decay_rate,
            multiply_by_parameter_scale=optimizer.multiply_by_parameter_scale,
            clipping_threshold=optimizer.clipping_threshold, weight_decay_rate=optimizer.weight_decay or None,
            factored=True,
        )
    else:
        opt = optax.adamw(lr, weight_decay=optimizer.weight_decay)
    return optax.chain(optax.clip_by_global_norm(optimizer.clip_norm), opt) if optimizer.clip_norm else opt
