"""What the train loop adds to a step, side by side in one run on one device: the bare jitted step
called back to back, the loop as it runs (the device's values read only at log points), and the
loop reading each step's finite flag (as with RunConfig.skip_nonfinite > 0, and as every step did
before the loop stopped waiting for the device). A trivial model - a few matmuls - with batches
made on the host each step (random ids, as a reader gives), so the figure is the loop's own cost
and how much host work it hides behind the device.

    python -m sentemb_jax.benchmarks.loop_overhead [--steps 200] [--width 256] [--device cpu|gpu]
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from sentemb_jax.benchmarks import machine
from sentemb_jax.training import loop
from sentemb_jax.training.method import TrainState


class _NoCheckpoints:
    """The loop's checkpoint manager, writing nothing: the benchmark times the loop, not orbax."""

    def save(self, *args, **kwargs):
        return True

    def wait_until_finished(self):
        pass

    def latest_step(self):
        return None


class _RandomIds:
    """Batches of random token ids made on the host, as a reader would hand them over."""

    name = "random ids"

    def __init__(self, batch: int, length: int, seed: int = 0):
        self.rng, self.batch, self.length = np.random.default_rng(seed), batch, length

    def __iter__(self):
        while True:
            yield {"ids": self.rng.integers(0, 1000, (self.batch, self.length), dtype=np.int32),
                   "ids_attention_mask": np.ones((self.batch, self.length), np.int32)}

    def state_dict(self):
        return {}

    def describe(self, batch):
        return "random ids"


def trivial_step(width: int):
    """A jitted step: an embedding lookup and two matmuls of `width`, a plain SGD update."""

    def step(state, batch, rng):
        def loss_fn(params):
            h = params["emb"][batch["ids"] % params["emb"].shape[0]]
            return jnp.mean(jnp.tanh(h @ params["w1"]) @ params["w2"])

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        params = jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, state.params, grads)
        grad_norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
        return state.replace(step=state.step + 1, params=params), \
            {"loss": loss, "grad_norm": grad_norm, "finite": jnp.isfinite(loss) & jnp.isfinite(grad_norm)}

    return jax.jit(step)


def _state(width: int, device):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"emb": jax.random.normal(keys[0], (1024, width)) * 0.02,
              "w1": jax.random.normal(keys[1], (width, width)) / width ** 0.5,
              "w2": jax.random.normal(keys[2], (width, 1)) / width ** 0.5}
    return jax.device_put(TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=None), device)


def time_bare(step, width, device, batches, steps: int) -> float:
    """Seconds per step of the jitted step called back to back, synchronised once at the end."""
    state, rng, it = _state(width, device), jax.random.PRNGKey(0), iter(batches)
    state, out = step(state, jax.device_put(next(it), device), rng)  # compile
    jax.block_until_ready(out)
    started = time.perf_counter()
    for _ in range(steps):
        state, out = step(state, jax.device_put(next(it), device), rng)
    jax.block_until_ready((state, out))
    return (time.perf_counter() - started) / steps


def time_loop(step, width, device, batches, steps: int, log_every: int, read_every_step: bool) -> float:
    """Seconds per step of `loop.run_loop` over the same step (compiled already)."""
    state = _state(width, device)
    schedule = loop.Schedule(num_steps=steps, log_every=log_every, checkpoint_every=steps)
    run = loop.RunState(state, "", batches, schedule, _NoCheckpoints(), skip_nonfinite=int(read_every_step))
    started = time.perf_counter()
    loop.run_loop(run, step, lambda b: jax.device_put(b, device), jax.random.PRNGKey(0))
    jax.block_until_ready(run.state)
    return (time.perf_counter() - started) / steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--log_every", type=int, default=10)
    parser.add_argument("--device", choices=("cpu", "gpu", "tpu"), default=None, help="default: what JAX finds")
    args = parser.parse_args(argv)
    device = machine.select_devices(args.device)[0]
    step = trivial_step(args.width)
    kinds = {"bare step": lambda b: time_bare(step, args.width, device, b, args.steps),
             "loop, reads at log points": lambda b: time_loop(step, args.width, device, b, args.steps,
                                                               args.log_every, False),
             "loop, reads every step": lambda b: time_loop(step, args.width, device, b, args.steps,
                                                            args.log_every, True)}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for fn in kinds.values():  # warm-up: compile and first-touch, not timed
        fn(_RandomIds(args.batch_size, args.length))
    for r in range(args.rounds):  # alternated, so drift hits every kind alike
        for kind, fn in kinds.items():
            times[kind].append(fn(_RandomIds(args.batch_size, args.length, seed=r)))
    bare = statistics.median(times["bare step"])
    print(f"device: {machine.device_description([device])}; {args.steps} steps x {args.rounds} rounds, "
          f"batch {args.batch_size} x {args.length}, width {args.width}, log every {args.log_every}")
    for kind, t in times.items():
        med = statistics.median(t)
        print(f"{kind:28s} {med * 1e3:8.3f} ms/step (min {min(t) * 1e3:.3f}, max {max(t) * 1e3:.3f}); "
              f"over the bare step {(med - bare) * 1e3:+.3f} ms, {med / bare:.3f}x")


if __name__ == "__main__":
    main()
