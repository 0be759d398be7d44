"""The prepare_corpus job: validate a large raw corpus once into ArrayRecord shards + a manifest.

    python -m sentemb_jax.main --gin_file=gin/runs/prepare_corpus.gin \
        --gin.INPUT="'raw/cqa-*.jsonl.gz'" --gin.OUTPUT="'/mnt/bucket/cqa'" [--gin.NUM_SHARDS=1024]

Training reads the result with `DataConfig.files = {'commqa': OUTPUT}` (data.prepared_corpus).
"""
from __future__ import annotations

import gin
from sentemb_jax import validation as v
from sentemb_jax.data import prepare as prep
from sentemb_jax.data.kinds import file_spec
from sentemb_jax.dependencies import require_tensorflow
from sentemb_jax.errors import DataError
from sentemb_jax.preflight import require_model_dir

SEL = "sentemb_jax.prepare_corpus"


@gin.configurable(module="sentemb_jax")
def prepare_corpus(inputs=gin.REQUIRED, output: str = gin.REQUIRED, kind: str = "commqa", num_shards: int | None = None,
                   on_bad_row: str = "error", dedup: bool = False, processes: int = 1, worker: tuple[int, int] = (0, 1),
                   prefix: str | None = None, verify: bool = False, labels=None, tokenizer_dir: str | None = None,
                   max_length: int = 128) -> dict:
    """inputs: a path, a glob or a list of them (TSV / JSONL, optionally .gz, on any tf.io.gfile filesystem).
    kind: which task's columns and rules (data.kinds.file_spec: commqa, nli_triples, nli_pairs, sts_pairs).
    num_shards: output shards (None: one per input file). worker: (k, n) - this run does shards j % n == k.
    labels: the label values kept (commqa: ('Good',), nli_pairs: ('entailment',)); None: the task's default.
    tokenizer_dir: also tokenize with this model's tokenizer (to max_length): training then reads ids, no
      tokenisation on the hosts (only a model with the same tokenizer reads the corpus).
    verify: check an existing corpus at `output` (every shard's sha256 against the manifest) and stop."""
    if verify:
        bad = prep.verify(output)
        if bad:
            raise DataError(f"{len(bad)} damaged shard(s): " + "; ".join(bad[:5]))
        print(f"{output}: every shard matches its manifest checksum")
        return {"verified": True}
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    if not inputs or not all(isinstance(p, str) and p for p in inputs):
        v.fail(inputs, SEL, "inputs", "must be a path / glob or a list of them")
    if not isinstance(output, str) or not output:
        v.fail(output, SEL, "output", "must be a directory path")
    v.require_choice(kind, ("commqa", "nli_triples", "nli_pairs", "sts_pairs"), SEL, "kind")
    v.require_choice(on_bad_row, ("error", "skip"), SEL, "on_bad_row")
    if num_shards is not None:
        v.require_int(num_shards, SEL, "num_shards", 1)
    v.require_int(processes, SEL, "processes", 1)
    v.require_int(max_length, SEL, "max_length", 3)
    if tokenizer_dir is not None:
        require_model_dir(tokenizer_dir, SEL, "tokenizer_dir")
        require_tensorflow(f"{SEL}.tokenizer_dir (a corpus of ids, tokenised in-graph as the seqio route does)",
                           instead="prepare a text corpus (tokenizer_dir=None) without it")
    if not (isinstance(worker, (tuple, list)) and len(worker) == 2 and all(isinstance(x, int) for x in worker)
            and 0 <= worker[0] < worker[1]):
        v.fail(worker, SEL, "worker", "must be (k, n) with 0 <= k < n")
    options = {}
    if labels is not None:
        options = {"commqa": {"commqa_labels": tuple(labels)}, "nli_pairs": {"nli_pair_labels": tuple(labels)}}.get(kind, {})
    spec = file_spec(kind, "", binding=f"{SEL}.inputs", **options)
    try:
        manifest = prep.prepare(spec, inputs, output, num_shards, on_bad_row=on_bad_row, dedup=dedup, processes=processes,
                                worker=tuple(worker), prefix=prefix or kind, kind=kind,
                                tokenizer_dir=tokenizer_dir, max_length=max_length)
    except DataError:
        raise
    except ValueError as e:  # num_shards against the input count
        v.fail(num_shards, SEL, "num_shards", str(e))
    if not manifest.get("complete", True):
        print(f"{output}: this worker's shards are written; {manifest['shards_done']} of {manifest['shards']} shards done "
              "(the manifest is written by the run that finds every shard done)")
        return manifest
    skipped = ", ".join(f"{manifest[f'skipped_{r}']} {r.replace('_', ' ')}" for r in
                        ("malformed", "filtered", "empty_text", "junk", "duplicate") if manifest[f"skipped_{r}"])
    print(f"{output}/manifest.json: {manifest['rows']} rows in {len(manifest['shards'])} shards"
          + (f"; skipped {skipped}" if skipped else ""))
    return {"rows": manifest["rows"], "shards": len(manifest["shards"])}
