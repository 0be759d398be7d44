"""The data_summary job: register the tasks, validate each file, show one batch of each."""
from __future__ import annotations

import gin
from sentemb_jax import validation
from sentemb_jax.data import tasks as data_tasks
from sentemb_jax.data.pipeline import InputPipeline


@gin.configurable(module="sentemb_jax")
def data_summary(batch_size: int = 64, sequence_length: int = 128, seed: int = 0) -> dict:
    """Register the tasks (gin: sentemb_jax.data.register_tasks.*), validate each file, show a batch.
    Every task is this job's: a missing file of any (all named at once) stops it before any is read."""
    validation.check_batch_size(batch_size, "sentemb_jax.data_summary")
    validation.require_int(sequence_length, "sentemb_jax.data_summary", "sequence_length", 2)
    validation.check_seed(seed, "sentemb_jax.data_summary")
    names = data_tasks.register_tasks(require=True)
    summary = {}
    for kind, name in names.items():
        pipe = InputPipeline(name, batch_size=batch_size, sequence_length=sequence_length, seed=seed)
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
