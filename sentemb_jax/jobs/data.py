"""The data_summary job: register the tasks, validate each file, show one batch of each."""
from __future__ import annotations

import gin
from sentemb_jax import preflight
from sentemb_jax.dependencies import require_tensorflow
from sentemb_jax.paths import default_data_dir
from sentemb_jax.training.config import DataConfig


@gin.configurable(module="sentemb_jax")
def data_summary(tokenizer_dir: str = gin.REQUIRED, data: DataConfig = gin.REQUIRED) -> dict:
    """Register the tasks of `data`'s files (sentemb_jax.DataConfig.*) with the tokenizer of
    `tokenizer_dir`, validate each file, show a batch of each (DataConfig's batch size, length,
    seed). Every task is this job's: a missing file of any (all named at once) stops it before any
    is read."""
    preflight.require_model_dir(tokenizer_dir, "sentemb_jax.data_summary", "tokenizer_dir")
    require_tensorflow("sentemb_jax.data_summary (it shows each seqio task's batch)")
    from sentemb_jax.data import tasks as data_tasks  # lazy: seqio / TensorFlow
    from sentemb_jax.data.pipeline import InputPipeline  # lazy: seqio / TensorFlow

    names = data_tasks.register_tasks(tokenizer_dir=tokenizer_dir, data_dir=data.data_dir or default_data_dir(),
                                      require=True, **data.task_options())
    summary = {}
    for kind, name in names.items():
        pipe = InputPipeline(name, batch_size=data.batch_size, sequence_length=data.sequence_length, seed=data.seed)
        batch = next(iter(pipe))
        shapes = {k: list(v.shape) for k, v in batch.items()}
        provider = pipe.provider
        rows = None
        if hasattr(provider, "source") and hasattr(provider.source, "index"):
            index = provider.source.index("train")
            rows = len(index)
            print(index.summary)
        summary[kind] = {"task": name, "rows": rows, "batch": shapes}
        print(f"{name}: {shapes}")
    return summary
