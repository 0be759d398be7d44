"""The one train loop (`run_loop`) and what it does around each step. Every method trains through
it: `training.trainer.train` (contrastive, ConGen / SCT / baselines, the ensemble student) and the
Trans-Encoder's phases (`methods.trans_encoder.fit_phase`). A caller gives it

* a `RunState`: the train state plus everything else a checkpoint holds (the batch source's
  position, the best score, the training time, skipped batches, the evaluations so far) and the
  periodic actions - log, evaluate, keep the best, write metrics, checkpoint, stop on a signal -
  each a method, so the loop body is the step plus a short list of them;
* a `Schedule` (when each action runs), a jitted step `(state, batch, rng) -> (state, metrics with
  'loss', 'grad_norm', 'finite')` and the function that turns a source batch into the step's batch.

The host does not wait for the device between steps: it counts steps itself, and the steps' finite
flags stay on the device until a point that reads the state anyway - logging, evaluation, a
checkpoint, a stop signal, the last step - where they are read in one transfer (`check_finite`).
While step N runs, a thread reads, packs and places the next batches, two ahead (training.prefetch;
JAX dispatches asynchronously, so the loop's own thread only queues steps);
a non-finite step stops the job at most `log_every` steps late, still naming its batch's source
lines, and before anything is evaluated or saved. Only `skip_nonfinite > 0` (a bad batch is skipped
and the next one must start from the state before it) reads the flag after every step.

A batch source iterates batches and has `state_dict()` / `load_state_dict()` (its position),
`name` and `describe(batch)` (where a batch came from, for the non-finite error): `data.pipeline.InputPipeline`
for seqio tasks, `methods.trans_encoder.PairBatches` for pseudo-labelled pairs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from typing import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from sentemb_jax import faults
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import Preempted, TrainingError, UndefinedScoreError
from sentemb_jax.evaluation.sts import StsbEvaluator
from sentemb_jax.paths import is_remote
from sentemb_jax.run_dir import CHECKPOINTS, TENSORBOARD, run_path, tensorboard_writer
from sentemb_jax.training import run_record
from sentemb_jax.training.preemption import StopSignals
from sentemb_jax.training.prefetch import Prefetcher

log = logging.getLogger(__name__)
PREFETCH_BATCHES = 2  # step batches prepared ahead of the step (training.prefetch)


def host_params(tree):
    """Numpy copies of (possibly multi-process, sharded) arrays: every process gets the whole tree."""
    if jax.process_count() > 1:
        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.device_get(tree)


def real_tokens(batch: dict) -> int:
    """Tokens that are not padding in a source batch: the sum of its `*_attention_mask` arrays,
    times the process count (each process holds its part of the global batch)."""
    local = sum(int(np.asarray(v).sum()) for k, v in batch.items() if k.endswith("attention_mask"))
    return local * jax.process_count()


def budget_spent(train_seconds: float, time_budget_s: float | None) -> bool:
    return bool(time_budget_s) and train_seconds >= time_budget_s


class StsDevEvaluator:
    """The run's STS-B dev score of the tower being trained (params gathered to the host). An
    evaluator of the loop is `evaluator(state.params) -> float` (higher is better) with `metric`
    (its key in metrics and checkpoints) and `label` (its name on the console)."""

    metric = "stsb_dev_spearman"
    label = "STS-B dev spearman"

    def __init__(self, encoder: SentenceEncoder, data_dir: str):
        self.encoder = encoder
        self.stsb = StsbEvaluator(data_dir, "dev")

    def __call__(self, params) -> float:
        """Spearman x 100 of the tower (`params["tower"]`); NaN, with a warning saying why, when the
        model gives no ranking (a collapsed model: every pair the same score) - a long run goes on
        and keeps its best."""
        self.encoder.params = host_params(params["tower"])
        try:
            return self.stsb(self.encoder)["spearman"]
        except UndefinedScoreError as e:
            log.warning("%s", e)
            return float("nan")


class MetricsWriter:
    """TensorBoard event files (tensorboardX) plus one JSON line per logged step in metrics.jsonl."""

    def __init__(self, model_dir: str, jsonl_path: str):
        self._writer = tensorboard_writer(run_path(model_dir, TENSORBOARD))  # gs:// works (google-cloud-storage)
        self._path = jsonl_path
        self._lines: list[str] | None = None  # a bucket has no append: the whole file is rewritten

    def write(self, step: int, metrics: dict) -> None:
        for k, v in metrics.items():
            if k != "step" and isinstance(v, (int, float)):
                self._writer.add_scalar(k, v, step)
        if not is_remote(self._path):
            with open(self._path, "a") as f:
                f.write(json.dumps(metrics) + "\n")
            return
        path = epath.Path(self._path)
        if self._lines is None:  # a resumed run keeps the lines written before
            self._lines = path.read_text().splitlines(keepends=True) if path.exists() else []
        self._lines.append(json.dumps(metrics) + "\n")
        path.write_text("".join(self._lines))

    def close(self) -> None:
        self._writer.close()


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When the loop's periodic actions run (steps count from 1; the last step does all of them)."""

    num_steps: int
    log_every: int = 10
    eval_every: int | None = None  # None: no evaluation during the run
    checkpoint_every: int = 100
    eval_at_start: bool = False  # score the untrained model before the first step
    checkpoint_at_eval: bool = False  # a checkpoint after every evaluation too (the Trans-Encoder's epoch ends)
    time_budget_s: float | None = None  # stop once this much training time (data + steps) has passed


class BestCheckpoint:
    """Keeps the best train state in an orbax manager (MODEL_DIR/best): the train job's keeper. A
    keeper is `save(state, score)` (called on a new best) and `wait_until_finished()`."""

    def __init__(self, manager):
        self.manager = manager

    def save(self, state, score: float) -> None:
        self.manager.save(int(state.step), args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=True)

    def wait_until_finished(self) -> None:
        self.manager.wait_until_finished()


def restore_run(manager, target, model_dir: str, error: type[Exception]):
    """(state, data) of the newest checkpoint that restores - `data` is what RunState.save wrote
    besides the state - or (None, {}) for a new run (damaged newer steps moved aside: run_record)."""
    _, restored = run_record.restore_newest_good(manager, lambda s: manager.restore(s, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore())), model_dir, error)
    return (None, {}) if restored is None else (restored["state"], restored["data"])


class RunState:
    """The loop's state between steps and the actions it takes on it. Everything a checkpoint holds
    besides the train state - the batch source's position, the best score, the training time, the
    skipped batches, the evaluations - lives here, so a resumed run continues exactly.

    resumed: the checkpoint's data (`restore_run`), {} for a new run. keeper: what keeps the best
    state (BestCheckpoint, or a method's own; `self.best` is the best score); writer: a MetricsWriter or None (other processes)."""

    def __init__(self, state, model_dir: str, batches, schedule: Schedule, manager, *, keeper=None, writer=None,
                 evaluator=None, bar=None, batch_size: int = 1, skip_nonfinite: int = 0,
                 skip_setting: str = "RunConfig.skip_nonfinite", resumed: dict | None = None):
        resumed = resumed or {}
        self.state, self.model_dir, self.batches, self.schedule, self.manager = state, model_dir, batches, schedule, manager
        self.keeper, self.writer, self.evaluator, self.bar = keeper, writer, evaluator, bar
        self.batch_size, self.skip_nonfinite, self.skip_setting = batch_size, skip_nonfinite, skip_setting
        self.best = resumed.get("best")
        self.train_seconds = float(resumed.get("train_seconds", 0.0))
        self.skipped = int(resumed.get("skipped_batches", 0))
        # Real (unpadded) tokens of every side of the accepted batches: the N x tokens of 6 N D.
        self.tokens = int(resumed.get("tokens", 0))
        self.evaluations: list[dict] = list(resumed.get("evaluations", []))
        self.iterator = iter(batches)
        self.prefetcher: Prefetcher | None = None
        self.metrics: dict = {}
        self.bad_in_a_row = 0
        self.tick = time.perf_counter()
        # The host's step count: reading state.step would wait for the step under way.
        self.step = int(state.step)
        # (step, its metrics on the device, its source batch) of the steps whose finite flag is unread.
        self.unchecked: list[tuple[int, dict, dict]] = []

    def out_of_time(self) -> bool:
        return budget_spent(self.train_seconds, self.schedule.time_budget_s)

    def start_input(self, device_batch: Callable[[dict], dict], depth: int = PREFETCH_BATCHES) -> None:
        """The step's batches from now on prepared `depth` ahead on a thread (training.prefetch)."""
        self.prefetcher = Prefetcher(self.batches, self.iterator, device_batch, depth)

    def next_batch(self) -> tuple[dict, dict]:
        """(the source batch, the step's batch made of it by start_input's device_batch)."""
        try:
            return next(self.prefetcher)
        except StopIteration:
            raise TrainingError(f"{self.batches.name} ran out of data at step {self.step}") from None

    def input_state(self) -> dict:
        """The input's position after the batch the last step took (not the batches prepared ahead)."""
        return self.prefetcher.state_dict() if self.prefetcher is not None else self.batches.state_dict()

    def accept(self, state, out: dict, batch: dict, started: float) -> bool:
        """Take the step's state without waiting for it. With skip_nonfinite > 0 the finite flag is
        read now: False for a non-finite loss / gradient (the state is then the one before: the
        batch is skipped and counted, or the job stops when no more bad batches in a row are
        allowed); otherwise the flag is kept for `check_finite`."""
        self.state = state
        if self.skip_nonfinite and not bool(out["finite"]):
            self.bad_in_a_row += 1
            if self.bad_in_a_row > self.skip_nonfinite:
                self._stop_nonfinite(self.step + 1, out, batch)
            self.skipped += 1
            log.warning("skipped batch %d (%s at step %d; state unchanged): %s", self.skipped, _nonfinite(out),
                        self.step + 1, self.batches.describe(batch))
            self.train_seconds += time.perf_counter() - started
            return False
        self.bad_in_a_row = 0
        self.step += 1
        if not self.skip_nonfinite:
            self.unchecked.append((self.step, out, batch))
        self.tokens += real_tokens(batch)
        self.train_seconds += time.perf_counter() - started
        return True

    def check_finite(self) -> None:
        """Reads the finite flags of the steps since the last check in one transfer (the wait for
        those steps counts as training time); the first non-finite one stops the job, naming its
        batch's sources, before anything of it is logged, evaluated or saved."""
        if not self.unchecked:
            return
        started = time.perf_counter()
        flags = jax.device_get([out["finite"] for _, out, _ in self.unchecked])
        self.train_seconds += time.perf_counter() - started
        unchecked, self.unchecked = self.unchecked, []
        for (step, out, batch), finite in zip(unchecked, flags):
            if not finite:
                self._stop_nonfinite(step, out, batch)

    def _stop_nonfinite(self, step: int, out: dict, batch: dict) -> None:
        if self.skip_nonfinite:
            why = f"{self.bad_in_a_row} bad batches in a row, {self.skip_setting}={self.skip_nonfinite}"
        else:
            why = f"{self.skip_setting}=N skips up to N bad batches in a row"
        raise TrainingError(f"{_nonfinite(out)} at step {step}; batch from {self.batches.describe(batch)}. Nothing "
                            f"of this step was saved (last checkpoint: step {self.manager.latest_step()}) ({why})")

    def log(self, out: dict) -> None:
        out = {k: float(v) for k, v in jax.device_get(out).items() if k != "finite"}
        if self.skipped:
            out["skipped_batches"] = self.skipped
        rate = self.schedule.log_every * self.batch_size / (time.perf_counter() - self.tick)
        self.tick = time.perf_counter()
        self.metrics = {"step": self.step, **out, "pairs_per_s": rate, "train_seconds": self.train_seconds,
                        "tokens": self.tokens}
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{out['loss']:.4f}", pairs_s=f"{rate:.0f}")

    def evaluate(self, out: dict | None = None, untrained: bool = False) -> None:
        """The evaluator's score of the current params, recorded in `evaluations` with the step's
        loss; a new best is given to the keeper (not the untrained model's score, taken before the
        first step with Schedule.eval_at_start)."""
        step, score, name = self.step, self.evaluator(self.state.params), self.evaluator.metric
        self.metrics = {**self.metrics, "step": step, "train_seconds": self.train_seconds, "tokens": self.tokens, name: score}
        label = f"step {step}: {self.evaluator.label} {score:.2f}"
        if untrained:
            self._write(f"{label} (untrained)")
            return
        self.evaluations.append({"step": step, "loss": float(out["loss"]) if out else None, name: score,
                                 "train_seconds": self.train_seconds})
        if not math.isnan(score) and (self.best is None or score > self.best[name]):
            self.best = {"step": step, name: score}
            if self.keeper is not None:
                self.keeper.save(self.state, score)
        best = f" (best {self.best[name]:.2f} at {self.best['step']})" if self.best else ""
        self._write(label + best)

    def _write(self, line: str) -> None:
        (self.bar.write if self.bar is not None else log.info)(line)

    def write_metrics(self) -> None:
        if self.writer is not None and self.metrics.get("step") == self.step:  # process 0 only
            self.writer.write(self.step, self.metrics)

    def save(self) -> None:
        self.manager.save(self.step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(self.state),
            data=ocp.args.JsonSave({"input": self.input_state(), "best": self.best,
                                    "train_seconds": self.train_seconds, "skipped_batches": self.skipped,
                                    "tokens": self.tokens,
                                    "evaluations": self.evaluations})), force=True)

    def stop_if_requested(self, signum: int | None, saved: bool) -> None:
        """SIGTERM (preemption) / Ctrl-C: this step is checkpointed, then the job stops (Preempted)."""
        if signum:
            if not saved:
                self.check_finite()  # nothing non-finite is saved
                self.save()
            self.manager.wait_until_finished()
            raise Preempted(signum, self.step, run_path(self.model_dir, CHECKPOINTS))

    def close(self) -> None:
        """After the loop, however it ended: no checkpoint write left half done, the input's
        iterator closed (its prefetch thread / tf.data iterator released now, not at exit)."""
        if self.prefetcher is not None:
            self.prefetcher.close()  # stops its thread, then closes the iterator
        close_iterator = getattr(self.iterator, "close", None)
        if close_iterator is not None:
            close_iterator()
        if self.bar is not None:
            self.bar.close()
        self.manager.wait_until_finished()
        if self.keeper is not None:
            self.keeper.wait_until_finished()
        if self.writer is not None:
            self.writer.close()


def _nonfinite(out: dict) -> str:
    return f"non-finite loss / gradient (loss {float(out['loss'])}, grad norm {float(out['grad_norm'])})"


def run_loop(run: RunState, step_fn, device_batch: Callable[[dict], dict], rng, context=None) -> None:
    """The loop: a step, then the periodic actions (log, evaluate, write metrics, checkpoint, stop
    on a signal) as `run.schedule` says. `device_batch` turns a source batch into the step's batch
    (a method's features, packing, placement on the mesh); `context` is entered around the loop
    (e.g. the mesh's activation-sharding rules)."""
    sched = run.schedule
    if run.evaluator and sched.eval_at_start and run.step == 0:
        faults.in_phase("eval_at_start")  # tests only (SENTEMB_FAULT=sigterm_in:eval_at_start)
        run.evaluate(untrained=True)
        run.write_metrics()
    faults.install()  # tests only: SENTEMB_FAULT places a kill deterministically
    try:
        run.start_input(device_batch)
        with context or contextlib.nullcontext(), StopSignals() as stop_signals:
            # A rerun of a run that already spent its budget stops at once (it does not take a step more).
            while run.step < sched.num_steps and not run.out_of_time():
                started = time.perf_counter()
                batch, placed = run.next_batch()
                state, out = step_fn(run.state, placed, rng)  # donates run.state; returns at once
                if not run.accept(state, out, batch, started):
                    continue
                step, out_of_time = run.step, run.out_of_time()
                last = step == sched.num_steps or out_of_time
                logged = step % sched.log_every == 0 or last
                evaluated = bool(run.evaluator) and (step % sched.eval_every == 0 or last)
                saved = step % sched.checkpoint_every == 0 or last or (evaluated and sched.checkpoint_at_eval)
                if logged or evaluated or saved:  # each reads the state: the flags first
                    run.check_finite()
                if logged:
                    run.log(out)
                if evaluated:
                    run.evaluate(out)
                run.write_metrics()
                if saved:
                    run.save()
                if run.bar is not None:
                    run.bar.update(1)
                faults.after_step(step, run.manager.wait_until_finished)  # tests only (SENTEMB_FAULT)
                run.stop_if_requested(stop_signals.requested(), saved)
                if out_of_time:
                    log.info("time budget of %.0f s of training reached at step %d", sched.time_budget_s, step)
                    break
    finally:  # an error stops the loop, not a checkpoint write already under way
        run.close()
