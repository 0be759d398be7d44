"""The Method protocol: what a training method gives the run setup and the train loop.

    run = setup_run(config, ConGen(teacher="/path/to/teacher"))      # training.setup
    trainer.train(config, Contrastive(negative="negative"))

A method is an object injected beside the run config (gin: `sentemb_jax.train.method =
@sentemb_jax.ConGen()`, as t5x injects its model). The run setup builds everything else - mesh,
tower, optimizer, shardings, input - and asks the method for:

* `sides`: the texts of a batch (`<side>_input_ids` / `<side>_attention_mask` features);
* `prepare(context)`: what it needs before the step is built - a teacher, its embeddings of the
  task's texts (cached on disk); `context.abstract` (compile-only runs): shapes, no data read;
* `student_head(width)`: a projection head the tower gets (ConGen's Linear + tanh), or None;
* `init_params(width)`: trained parameters besides the tower (SCT's projector, a learnable
  temperature), and `init_extra(width)` / `extra_shardings(mesh)`: state that is not trained
  (queues, a teacher's params) - both checkpointed with the tower and the optimizer state;
* `batch_features(batch_size, sequence_length)`: the step's non-text inputs (e.g. the teacher's rows), for
  compile-only runs and the step-time benchmark; `model_batch(batch)`: a pipeline batch as the
  step takes it;
* `step(state, batch, rng, module=, optimizer=)`: one optimizer step, a pure function jitted by
  the setup with explicit shardings; it returns (state, metrics with 'loss' and 'grad_norm').

What is checkpointed: the whole TrainState (step, params, opt_state, extra). What is evaluated and
exported: `params["tower"]`. The smallest method is `methods/contrastive.py`.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any

import flax
import jax
import numpy as np

from sentemb_jax.training.config import record_of

Array = jax.Array


@flax.struct.dataclass
class TrainState:
    """Everything a step changes: `params` ({"tower": ..., and the method's own}), the optimizer
    state, and `extra`, the method's untrained state (None when it has none)."""

    step: Array
    params: Any
    opt_state: Any
    extra: Any = None


@dataclasses.dataclass
class MethodContext:
    """What `Method.prepare` may use. student: the SentenceEncoder being trained (params None in a
    compile-only run); source: the run's batch source (None when the job brings its own batches or
    nothing is read) - its `texts()`, `view_texts(i)` and `views` say what a sentences task holds;
    abstract: shapes only - no data read, no teacher run."""

    student: Any
    sequence_length: int
    seed: int
    source: Any = None
    abstract: bool = False


class Method(abc.ABC):
    """A training method (see the module docstring). Subclasses are dataclasses of their settings;
    `record()` is what MODEL_DIR/run_config.json keeps of them."""

    sides: tuple[str, ...] = ("anchor", "positive")

    def prepare(self, context: MethodContext) -> None:
        """Nothing to prepare by default."""

    def student_head(self, width: int) -> int | None:
        return None

    def init_params(self, width: int | None) -> dict:
        """Trained parameters besides the tower (replicated over the mesh); `width`: the tower's
        embedding width (None for a model that does not embed sentences, e.g. a cross-encoder)."""
        return {}

    def init_extra(self, width: int | None) -> Any:
        """Untrained state the step carries (host arrays); None for none."""
        return None

    def extra_shardings(self, mesh, abstract_extra) -> Any:
        """Shardings of `init_extra`'s state (default: replicated)."""
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        return jax.tree_util.tree_map(lambda _: replicated, abstract_extra)

    def batch_features(self, batch_size: int, sequence_length: int) -> dict[str, jax.ShapeDtypeStruct]:
        """The step's inputs besides the sides' ids and masks."""
        return {}

    def model_batch(self, batch: dict) -> dict:
        """A pipeline batch -> the step's batch: the sides' ids and masks."""
        return side_features(batch, self.sides)

    @abc.abstractmethod
    def step(self, state: TrainState, batch: dict, rng: Array, *, module, optimizer) -> tuple[TrainState, dict]:
        """One optimizer step (pure; jitted with explicit shardings by the run setup)."""

    def record(self) -> dict:
        return record_of(self)


def side_features(batch: dict, sides) -> dict:
    """The `<side>_input_ids` / `<side>_attention_mask` arrays of a pipeline batch (what a step takes)."""
    return {k: v for k, v in batch.items() if k.rsplit("_", 2)[0] in sides and k.endswith(("_input_ids", "_attention_mask"))}


def random_rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Unit-length float32 rows (random teacher embeddings for compile-only and timing runs)."""
    x = rng.standard_normal(shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)
