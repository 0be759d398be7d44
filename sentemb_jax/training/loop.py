"""What the train loop (sentemb_jax.training.trainer.train) does around each step: the run's
mutable state (train state, best score, training time, skipped batches) and the periodic actions -
log, evaluate, checkpoint, stop on a signal - each a method, so the loop body is the step plus
a short list of them.
"""
from __future__ import annotations

import json
import logging
import math
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from tensorboardX import SummaryWriter

from sentemb_jax.data.files import source_lines
from sentemb_jax.data.pipeline import InputPipeline
from sentemb_jax.data.tasks import RowFileSource
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import Preempted, TrainingError, UndefinedScoreError
from sentemb_jax.evaluation.sts import StsbEvaluator
from sentemb_jax.paths import is_remote
from sentemb_jax.run_dir import CHECKPOINTS, TENSORBOARD, run_path

log = logging.getLogger(__name__)


def host_params(tree):
    """Numpy copies of (possibly multi-process, sharded) arrays: every process gets the whole tree."""
    if jax.process_count() > 1:
        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.device_get(tree)


def budget_spent(train_seconds: float, time_budget_s: float | None) -> bool:
    return bool(time_budget_s) and train_seconds >= time_budget_s


class StsDevEvaluator:
    """The run's STS-B dev score of the tower being trained (params gathered to the host)."""

    def __init__(self, encoder: SentenceEncoder, data_dir: str):
        self.encoder = encoder
        self.stsb = StsbEvaluator(data_dir, "dev")

    def __call__(self, tower_params) -> float:
        """Spearman x 100; NaN, with a warning saying why, when the model gives no ranking (a
        collapsed model: every pair the same score) - a long run goes on and keeps its best."""
        self.encoder.params = host_params(tower_params)
        try:
            return self.stsb(self.encoder)["spearman"]
        except UndefinedScoreError as e:
            log.warning("%s", e)
            return float("nan")


class MetricsWriter:
    """TensorBoard event files (tensorboardX) plus one JSON line per logged step in metrics.jsonl."""

    def __init__(self, model_dir: str, jsonl_path: str):
        self._writer = SummaryWriter(run_path(model_dir, TENSORBOARD))  # gs:// works (google-cloud-storage)
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


def batch_sources(pipeline: InputPipeline, batch: dict, limit: int = 8) -> str:
    """`path:line` of a batch's first rows (row ids when the source has no line index)."""
    rows = np.asarray(batch.get("row_id", []))[:limit].tolist()
    source = getattr(pipeline.provider, "source", None)  # a mixture has none (its row ids are per task)
    lines = source_lines(source.index(pipeline.split), rows) if isinstance(source, RowFileSource) else [f"row {r}" for r in rows]
    more = len(np.asarray(batch.get("row_id", []))) - len(rows)
    return ", ".join(lines) + (f" and {more} more" if more > 0 else "")


class RunState:
    """The train loop's state between steps and the actions it takes on it. Everything a
    checkpoint holds besides the train state - the input position, the best score, the training
    time, the skipped batches - lives here, so a resumed run continues exactly."""

    def __init__(self, state, model_dir: str, pipeline: InputPipeline, manager, best_manager, writer,
                 evaluator, bar, batch_size: int, log_every: int, skip_nonfinite: int, time_budget_s: float | None,
                 best=None, train_seconds: float = 0.0, skipped: int = 0):
        self.state, self.model_dir, self.pipeline = state, model_dir, pipeline
        self.manager, self.best_manager, self.writer, self.evaluator, self.bar = manager, best_manager, writer, evaluator, bar
        self.batch_size, self.log_every, self.skip_nonfinite, self.time_budget_s = batch_size, log_every, skip_nonfinite, time_budget_s
        self.best, self.train_seconds, self.skipped = best, train_seconds, skipped
        self.batches = iter(pipeline)
        self.metrics: dict = {}
        self.bad_in_a_row = 0
        self.tick = time.perf_counter()

    @property
    def step(self) -> int:
        return int(self.state.step)

    def out_of_time(self) -> bool:
        return budget_spent(self.train_seconds, self.time_budget_s)

    def next_batch(self, task: str) -> dict:
        try:
            return next(self.batches)
        except StopIteration:
            raise TrainingError(f"task {task!r} ran out of data at step {self.step}") from None

    def accept(self, state, out: dict, batch: dict, started: float, before: int) -> bool:
        """Take the step's state; False for a non-finite loss / gradient (the state is then the one
        before: the batch is skipped and counted, or the job stops when train.skip_nonfinite allows
        no more bad batches in a row). `before`: the step the state was at."""
        self.state = state
        if not bool(out["finite"]):
            where = batch_sources(self.pipeline, batch)
            what = f"non-finite loss / gradient (loss {float(out['loss'])}, grad norm {float(out['grad_norm'])})"
            self.bad_in_a_row += 1
            if self.bad_in_a_row > self.skip_nonfinite:
                why = f"{self.bad_in_a_row} bad batches in a row, train.skip_nonfinite={self.skip_nonfinite}" \
                    if self.skip_nonfinite else "train.skip_nonfinite=N skips up to N bad batches in a row"
                raise TrainingError(f"{what} at step {before + 1}; batch from {where}. Nothing of this step was "
                                    f"saved (last checkpoint: step {self.manager.latest_step()}) ({why})")
            self.skipped += 1
            log.warning("skipped batch %d (%s at step %d; state unchanged): %s", self.skipped, what, before + 1, where)
            self.train_seconds += time.perf_counter() - started
            return False
        self.bad_in_a_row = 0
        self.train_seconds += time.perf_counter() - started
        return True

    def log(self, out: dict) -> None:
        out = {k: float(v) for k, v in jax.device_get(out).items() if k != "finite"}
        if self.skipped:
            out["skipped_batches"] = self.skipped
        rate = self.log_every * self.batch_size / (time.perf_counter() - self.tick)
        self.tick = time.perf_counter()
        self.metrics = {"step": self.step, **out, "pairs_per_s": rate, "train_seconds": self.train_seconds}
        self.bar.set_postfix(loss=f"{out['loss']:.4f}", pairs_s=f"{rate:.0f}")

    def evaluate(self, untrained: bool = False) -> None:
        """STS-B dev of the current tower; a new best is kept in MODEL_DIR/best (not the untrained
        model's score, taken before the first step with train.eval_at_start)."""
        step, score = self.step, self.evaluator(self.state.params["tower"])
        self.metrics = {**self.metrics, "step": step, "train_seconds": self.train_seconds, "stsb_dev_spearman": score}
        if untrained:
            self.bar.write(f"step {step}: STS-B dev spearman {score:.2f} (untrained)")
            return
        if not math.isnan(score) and (self.best is None or score > self.best["stsb_dev_spearman"]):
            self.best = {"step": step, "stsb_dev_spearman": score}
            self.best_manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(self.state)), force=True)
        best = f" (best {self.best['stsb_dev_spearman']:.2f} at {self.best['step']})" if self.best else ""
        self.bar.write(f"step {step}: STS-B dev spearman {score:.2f}{best}")

    def write_metrics(self) -> None:
        if self.writer is not None and self.metrics.get("step") == self.step:  # process 0 only
            self.writer.write(self.step, self.metrics)

    def save(self) -> None:
        self.manager.save(self.step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(self.state),
            data=ocp.args.JsonSave({"input": self.pipeline.state_dict(), "best": self.best,
                                    "train_seconds": self.train_seconds, "skipped_batches": self.skipped})), force=True)

    def stop_if_requested(self, signum: int | None, saved: bool) -> None:
        """SIGTERM (preemption) / Ctrl-C: this step is checkpointed, then the job stops (Preempted)."""
        if signum:
            if not saved:
                self.save()
            self.manager.wait_until_finished()
            raise Preempted(signum, self.step, run_path(self.model_dir, CHECKPOINTS))

    def close(self) -> None:
        """After the loop, however it ended: no checkpoint write left half done."""
        self.bar.close()
        self.manager.wait_until_finished()
        self.best_manager.wait_until_finished()
