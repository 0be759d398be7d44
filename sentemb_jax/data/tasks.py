"""seqio tasks and mixtures for every kind of training data, registered in one place.

    register_tasks(tokenizer_dir=..., data_dir=..., **DataConfig.task_options())

registers (names are `sentemb_<kind>`):

| task | features | file (under DATA_DIR, override with `files`) |
|---|---|---|
| `sentemb_commqa` | anchor (question), positive (answer) | qa/cqa_qatarliving.jsonl, label == Good |
| `sentemb_nli_triples` | anchor, positive, negative | nli/triples.tsv |
| `sentemb_nli_pairs` | anchor, positive | nli/pairs.tsv, label == entailment |
| `sentemb_sts_pairs` | sentence1, sentence2, score | stsb/{train,dev,test}.tsv (splits train/validation/test) |
| `sentemb_sentences` | view1, view2 (augmented views of one text, or its neighbour) | nli/sentences.tsv |
| `sentemb_qa_nli_pairs` (mixture) | anchor, positive | commqa + nli_pairs, by size |

and TFDS-backed tasks for users with prepared TFDS data: `sentemb_tfds_snli`,
`sentemb_tfds_multi_nli` (entailment pairs), `sentemb_tfds_stsb` (glue/stsb pairs + score),
`sentemb_tfds_qqp` (glue/qqp duplicate pairs).

Every example also carries `row_id` (its position among the file's accepted rows) so a bad
batch can be traced back to its source lines.

Every task is registered whether its files exist or not (the names stay the same); a missing file
stops only a job that reads that task: the jobs ask for their own tasks' files up front
(`register_tasks(require=...)`), and a task read anyway reports the file when it is first read.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from sentemb_jax.data import augment, prepared
from sentemb_jax.data.files import (
    ConcatRowIndex,
    FileSpec,
    RowIndex,
    neighbour_positions,
    read_rows,
)
from sentemb_jax.data.kinds import (
    COLUMN,
    DEFAULT_FILES,
    FIXED,
    MIXTURES,
    NEIGHBOUR,
    TEXT_FIELDS,
    check_task_options,
    precomputed_field,
)
from sentemb_jax.data.sources import PREFIX, FileRows, check_required, is_prepared, kind_specs, task_names
from sentemb_jax.data.vocab import TokenizerSpec, tokenizer_spec_for
from sentemb_jax.errors import ConfigError, DataError
from sentemb_jax.paths import default_data_dir
from sentemb_jax.preflight import require_model_dir
from sentemb_jax.tokenization import tokenizer_fingerprint

log = logging.getLogger(__name__)


class RowFileSource(seqio.DataSource):
    """A seqio source over validated TSV/JSONL files (one FileRows per split, data.sources: the order,
    the host sharding and the bad-row rules the TensorFlow-free reader has too)."""

    def __init__(self, specs: Mapping[str, FileSpec | Sequence[FileSpec]], on_bad_row: str = "error",
                 score_field: str | None = None, neighbour_of: str | None = None):
        """neighbour_of: a text field; each example also carries, as `neighbour`, that field of the
        row next to it in its file (files.neighbour_positions): the `neighbour` view's text."""
        # A split may be several files of the same columns, read as one (row ids run across them).
        self._rows = {k: FileRows(tuple(v) if isinstance(v, (list, tuple)) else v, on_bad_row, neighbour_of)
                      for k, v in specs.items()}
        self._neighbour_of = neighbour_of
        super().__init__(splits=list(specs), num_input_examples=None, caching_permitted=True, performs_internal_shuffling=True)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return True

    def rows(self, split: str) -> FileRows:
        if split not in self._rows:
            raise DataError(f"split {split!r} not available; this source has {sorted(self._rows)}")
        return self._rows[split]

    def list_shards(self, split: str) -> Sequence[str]:
        return self.rows(split).files

    def index(self, split: str) -> RowIndex | ConcatRowIndex:
        return self.rows(split).index

    def num_input_examples(self, split: str) -> int | None:
        return len(self._rows[split]) if split in self._rows and self._rows[split]._index is not None else None

    def describe(self, split: str, row_ids: Sequence[int]) -> list[str]:
        """`path:line` of row ids (what a bad batch came from)."""
        return self.rows(split).describe(row_ids)

    def row_order(self, split: str, shuffle: bool, seed: int | None, shard_info: seqio.ShardInfo | None) -> np.ndarray:
        shard = (shard_info.index, shard_info.num_shards) if shard_info is not None else None
        return self.rows(split).order(seed, shard, shuffle)

    def get_dataset(self, split: str = "train", shuffle: bool = True, seed: int | None = None,
                    shard_info: seqio.ShardInfo | None = None, *, sequence_length=None, use_cached=False, num_epochs=1):
        rows = self.rows(split)
        order = self.row_order(split, shuffle, seed, shard_info)
        spec = rows.first_spec
        signature = {f: tf.TensorSpec((), tf.string) for f in spec.fields if f != spec.score_field}
        if spec.score_field:
            signature[spec.score_field] = tf.TensorSpec((), tf.float32)
        signature["row_id"] = tf.TensorSpec((), tf.int64)
        if self._neighbour_of:
            signature[NEIGHBOUR] = tf.TensorSpec((), tf.string)

        return tf.data.Dataset.from_generator(lambda: rows.rows(order), output_signature=signature)


# ---------------------------------------------------------------------------------------------
# Preprocessors


TOKENIZE_BATCH = 256  # texts tokenized together (the in-graph tokenizers are ~10x faster on batches)


def tokenize_texts(dataset: tf.data.Dataset, output_features, sequence_length, *, tokenizer: TokenizerSpec):
    """Text features -> ids with the model's special tokens, truncated like HF to sequence_length.
    Tokenised TOKENIZE_BATCH examples at a time, then unbatched: the same examples in the same order."""

    def fn(ex):
        ex = dict(ex)
        for name in output_features:
            max_len = sequence_length[name] if sequence_length and sequence_length.get(name) else 512
            ex[name] = tokenizer.tokenize_batch_tf(ex[name], max_len)
        return ex

    return dataset.batch(TOKENIZE_BATCH).map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()


def make_views(dataset: tf.data.Dataset, *, text_field: str, views: Sequence[str], rate: float, seed_offset: int = 0):
    """One text -> view1, view2 (augmented per `views`); seeds come from seqio's map seed manager."""

    @seqio.map_over_dataset(num_seeds=len(views))
    def fn(ex, seeds):
        ex = dict(ex)
        for i, view in enumerate(views):
            field = precomputed_field(view)  # a text of its own, used unchanged
            source = ex[field or text_field]
            if view.startswith(FIXED):
                text = augment.apply_text_augmentation(view[len(FIXED):], source, rate,
                                                       augment.fixed_seed(ex["row_id"], i))
            else:
                text = augment.apply_text_augmentation("none" if field else view, source, rate, seeds[i])
            ex[f"view{i + 1}"] = text
        return ex

    return fn(dataset)


def sentence_views(task_name: str) -> tuple[tuple[str, ...], float]:
    """The (views, augment rate) a sentences task was registered with."""
    for step in seqio.get_mixture_or_task(task_name).preprocessors:
        if isinstance(step, functools.partial) and step.func is make_views:
            return tuple(step.keywords["views"]), float(step.keywords["rate"])
    raise ValueError(f"task {task_name!r} has no augmented views (not a sentences task)")


def sentence_texts(task_name: str) -> list[str]:
    """The `text` of every train row of a sentences task, in row order (the views' source)."""
    return [row["text"] for row in read_rows(seqio.get_mixture_or_task(task_name).source.index("train"))]


def view_texts(task_name: str, view_index: int, sentences: Sequence[str] | None = None) -> list[str] | None:
    """Every train row's text of view `view_index` (0 or 1) when it is the same in every epoch
    ('none', 'column:<name>', 'neighbour', 'fixed:<augmentation>'), in row order; None for a view
    drawn anew each epoch. sentences: sentence_texts(task_name), when the caller has read them already."""
    views, rate = sentence_views(task_name)
    view = views[view_index]
    if view.startswith(COLUMN):
        index = seqio.get_mixture_or_task(task_name).source.index("train")
        return [row[precomputed_field(view)] for row in read_rows(index)]
    if view not in ("none", NEIGHBOUR) and not view.startswith(FIXED):
        return None
    sentences = sentence_texts(task_name) if sentences is None else sentences
    if view == NEIGHBOUR:
        index = seqio.get_mixture_or_task(task_name).source.index("train")
        return [sentences[p] for p in neighbour_positions(index, np.arange(len(sentences)))]
    return list(sentences) if view == "none" else augment.fixed_view_texts(sentences, view, rate, view_index)


def mask_spans(dataset: tf.data.Dataset, *, views: Sequence[str], rate: float, tokenizer: TokenizerSpec, mask_id: int):
    @seqio.map_over_dataset(num_seeds=len(views))
    def fn(ex, seeds):
        ex = dict(ex)
        for i, view in enumerate(views):
            if view == "span_masking":
                key = f"view{i + 1}"
                ex[key] = augment.span_masking(ex[key], rate, mask_id, seeds[i], len(tokenizer.prefix_ids), len(tokenizer.suffix_ids))
        return ex

    return fn(dataset)


def _mask_id(tokenizer: TokenizerSpec) -> int:
    vocab = tokenizer.vocabulary
    if isinstance(vocab, seqio.SentencePieceVocabulary):
        return vocab.vocab_size - 1  # <extra_id_0>, T5's first sentinel
    ids = getattr(vocab, "_ids", {})
    return ids.get("[MASK]", vocab.unk_id)


# ---------------------------------------------------------------------------------------------
# Registration


def cut_ids(ids: tf.RaggedTensor, max_len: int, suffix: Sequence[int]) -> tf.RaggedTensor:
    """A batch of id rows [batch, (len)] cut as tokenize_texts cuts to max_len: a row longer than
    max_len keeps its first max_len - len(suffix) ids and ends with the special suffix (all rows at
    once: no per-row graph call)."""
    s = len(suffix)
    if s == 0:
        return ids[:, :max_len]
    head, rest = ids[:, : max_len - s], ids[:, max_len - s:]
    long = ids.row_lengths() > max_len
    kept = rest[:, :s].to_tensor(0, shape=[None, s])  # a short row's own last ids (at most s of them)
    tail = tf.where(long[:, None], tf.constant(suffix, ids.dtype)[None, :], kept)
    tail = tf.RaggedTensor.from_tensor(tail, lengths=tf.where(long, tf.cast(s, ids.row_splits.dtype), rest.row_lengths()),
                                       row_splits_dtype=ids.row_splits.dtype)
    return tf.concat([head, tail], axis=1)


def truncate_ids(dataset: tf.data.Dataset, output_features, sequence_length, *, tokenizer: TokenizerSpec):
    """Ids tokenized ahead (a prepared corpus) -> cut like tokenize_texts to sequence_length: the
    text's pieces are cut, the special tokens kept (TOKENIZE_BATCH rows at a time)."""
    lengths = {name: sequence_length[name] if sequence_length and sequence_length.get(name) else 512 for name in output_features}

    def fn(batch):
        batch = dict(batch)
        for name, max_len in lengths.items():
            batch[name] = cut_ids(batch[name], max_len, tokenizer.suffix_ids)
        return batch

    return dataset.ragged_batch(TOKENIZE_BATCH).map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()


def _register(name: str, source: seqio.DataSource, text_fields: Sequence[str], tokenizer: TokenizerSpec,
              pre: Sequence = (), post: Sequence = (), tokenized: bool = False) -> str:
    """Task = source -> `pre` (on text) -> tokenisation (or, for ids tokenized ahead, truncation) -> `post` (on ids)."""
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    features = {f: seqio.Feature(tokenizer.vocabulary, add_eos=False, dtype=tf.int32) for f in text_fields}
    to_ids = functools.partial(truncate_ids if tokenized else tokenize_texts, tokenizer=tokenizer)
    seqio.TaskRegistry.add(
        name,
        source=source,
        preprocessors=[seqio.CacheDatasetPlaceholder(), *pre, to_ids, *post],
        output_features=features,
        shuffle_buffer_size=None,  # the source permutes all rows itself
    )
    return name


_UNSET = object()


def register_tasks(
    tokenizer_dir: str | None = _UNSET,
    data_dir: str | None = None,
    files: Mapping[str, str | Sequence[str] | Mapping[str, str | Sequence[str]]] | None = None,
    on_bad_row: str = "error",
    views: Sequence[str] = ("none", "none"),
    augment_rate: float = 0.1,
    sentence_column: str = "sentence",
    view_columns: Sequence[str] = (),
    nli_pair_labels: Sequence[str] = ("entailment",),
    commqa_labels: Sequence[str] = ("Good",),
    sts_score_range: tuple[float, float] = (0.0, 5.0),
    kinds: Sequence[str] = tuple(DEFAULT_FILES),
    clean: bool = False,
    window_shards: int = 16,
    on_bad_shard: str = "error",
    require: Sequence[str] | bool = (),
    model_dir: str | None = _UNSET,
) -> dict[str, str]:
    """Register the file-backed tasks (and the QA+NLI mixture); returns kind -> task name.

    files: kind -> a path, or split -> path; a list of paths (same columns) is read as one
    split, row ids running across the files in order (e.g. NLI + wiki sentences).
    clean: drop junk sentences from the `sentences` task (data.files.is_junk_text), counted.

    require: the kinds (or the mixture 'qa_nli_pairs') whose files must exist now, True for every
      kind registered: a missing one is a DataError naming its path and the gin bindings that
      produced it, before anything is registered or read. The other tasks are registered all the
      same; a missing file of theirs is reported when (if ever) the task is read.
    tokenizer_dir: the model directory whose tokenizer the tasks use (`model_dir`, its name before
      the layout change, is still accepted). None: only the checks (arguments, `require`); nothing
      is registered and no tokenizer is loaded; returns the names the call would register.

    Row validation happens when a split is first read.

    A `files` entry may be a glob (its files, sorted, read as one split), a path on any
    tf.io.gfile filesystem (gs://...), gzip-compressed (.gz), or a prepared corpus (a directory
    with a manifest.json written by sentemb_jax.data.prepare; read without indexing its rows:
    window_shards = shards whose rows are shuffled together, on_bad_shard = 'error' or 'skip' a
    missing / truncated shard; see data.prepared).
    """
    data_dir = data_dir or default_data_dir()
    tokenizer_dir = _tokenizer_dir(tokenizer_dir, model_dir)
    check_task_options(files=files, on_bad_row=on_bad_row, on_bad_shard=on_bad_shard, window_shards=window_shards,
                       augment_rate=augment_rate, sts_score_range=sts_score_range, views=views)
    files = dict(files or {})
    views = tuple(views)
    options = dict(commqa_labels=commqa_labels, nli_pair_labels=nli_pair_labels, sts_score_range=sts_score_range,
                   sentence_column=sentence_column, view_columns=view_columns, clean=clean)
    specs_of = kind_specs(data_dir, files, kinds, **options)
    check_required(specs_of, data_dir, tuple(kinds) if require is True else tuple(require or ()))
    if tokenizer_dir is None:
        return task_names(kinds)
    if not os.path.isdir(tokenizer_dir):
        require_model_dir(tokenizer_dir, "sentemb_jax.TowerConfig", "tokenizer_dir")
    tokenizer = tokenizer_spec_for(tokenizer_dir)
    names = {}
    for kind in kinds:
        specs = specs_of[kind]
        source = _source(kind, specs, on_bad_row, views, window_shards, on_bad_shard)
        pre, post = [], []
        if kind == "sentences":
            pre = [functools.partial(make_views, text_field="text", views=views, rate=augment_rate)]
            if "span_masking" in views:
                post = [functools.partial(mask_spans, views=views, rate=augment_rate, tokenizer=tokenizer,
                                          mask_id=_mask_id(tokenizer))]
        tokenized = isinstance(source, prepared.PreparedSource) and _check_tokenized(source, kind, tokenizer_dir)
        name = _register(PREFIX + kind, source, TEXT_FIELDS[kind], tokenizer, pre, post, tokenized)
        names[kind] = name
    for kind, parts in MIXTURES.items():
        if set(parts) <= set(names):
            mixture = PREFIX + kind
            if mixture in seqio.MixtureRegistry.names():
                seqio.MixtureRegistry.remove(mixture)
            seqio.MixtureRegistry.add(mixture, [names[p] for p in parts], default_rate=_size_rate)
            names[kind] = mixture
    return names


def _source(kind: str, specs: Mapping, on_bad_row: str, views: Sequence[str], window_shards: int,
            on_bad_shard: str) -> seqio.DataSource:
    """RowFileSource over validated files, or PreparedSource when every split is a prepared corpus."""
    if not is_prepared(specs, kind):
        return RowFileSource(specs, on_bad_row, neighbour_of="text" if kind == "sentences" and NEIGHBOUR in views else None)
    return prepared.PreparedSource({split: spec.path for split, spec in specs.items()}, window_shards, on_bad_shard)


def _check_tokenized(source: prepared.PreparedSource, kind: str, tokenizer_dir: str) -> bool:
    """Whether a prepared corpus holds ids; a corpus tokenized by another tokenizer is refused."""
    made_by = source.tokenizer()
    if made_by is None:
        return False
    if made_by["fingerprint"] != tokenizer_fingerprint(tokenizer_dir):
        raise DataError(f"{source.list_shards(list(source.splits)[0])[0].rsplit('/', 1)[0]}: the {kind!r} corpus was tokenized with the "
                        f"tokenizer of {made_by.get('source')!r}, not this model's ({tokenizer_dir}): prepare it again "
                        "with prepare_corpus.tokenizer_dir set to this model, or without tokenizer_dir (text)")
    return True


def _size_rate(task: seqio.Task) -> float:
    """Mixing rate proportional to a task's (validated or prepared) train rows."""
    source = task.source
    return float(len(source.rows("train")) if isinstance(source, RowFileSource) else source.num_input_examples("train"))


# ---------------------------------------------------------------------------------------------
# TFDS-backed tasks


def _tfds_pairs(dataset, *, first: str, second: str, label: str | None = None, keep_label=None, score: str | None = None):
    if keep_label is not None:
        dataset = dataset.filter(lambda ex: tf.equal(ex[label], keep_label))

    def fn(ex):
        out = {"anchor" if score is None else "sentence1": ex[first], "positive" if score is None else "sentence2": ex[second]}
        if score is not None:
            out["score"] = tf.cast(ex[score], tf.float32)
        return out

    return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


TFDS_TASKS = {
    "tfds_snli": ("snli:1.1.0", dict(first="premise", second="hypothesis", label="label", keep_label=0)),
    "tfds_multi_nli": ("multi_nli:1.1.0", dict(first="premise", second="hypothesis", label="label", keep_label=0)),
    "tfds_stsb": ("glue/stsb:2.0.0", dict(first="sentence1", second="sentence2", score="label")),
    "tfds_qqp": ("glue/qqp:2.0.0", dict(first="question1", second="question2", label="label", keep_label=1)),
}


def _tokenizer_dir(tokenizer_dir, model_dir) -> str | None:
    """tokenizer_dir, or the same value given by its old name `model_dir` (keys users wrote)."""
    if tokenizer_dir is not _UNSET and model_dir is not _UNSET and tokenizer_dir != model_dir:
        raise ConfigError(f"register_tasks: tokenizer_dir={tokenizer_dir!r} and model_dir={model_dir!r} (its old name) "
                          "differ; give tokenizer_dir only")
    value = tokenizer_dir if tokenizer_dir is not _UNSET else model_dir
    if value is _UNSET:
        raise ConfigError("register_tasks: tokenizer_dir is required (the model directory whose tokenizer the tasks use)")
    return value


def task_files(task_name: str) -> list[str]:
    """The data files a (file-backed) task or mixture reads for training; TFDS tasks have none here."""
    provider = seqio.get_mixture_or_task(task_name)
    tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
    return [path for t in tasks if isinstance(t.source, RowFileSource) for path in t.source.list_shards("train")]


def register_tfds_tasks(tokenizer_dir: str | None = _UNSET, tfds_data_dir: str | None = None,
                        kinds: Sequence[str] = tuple(TFDS_TASKS), model_dir: str | None = _UNSET) -> dict[str, str]:
    """Tasks over prepared TFDS datasets (entailment pairs, STS-B pairs + score, QQP duplicates);
    tokenizer_dir as for register_tasks (`model_dir` still accepted)."""
    tokenizer = tokenizer_spec_for(_tokenizer_dir(tokenizer_dir, model_dir))
    names = {}
    for kind in kinds:
        tfds_name, mapping = TFDS_TASKS[kind]
        fields = ("sentence1", "sentence2") if "score" in mapping else ("anchor", "positive")
        source = seqio.TfdsDataSource(tfds_name=tfds_name, tfds_data_dir=tfds_data_dir)
        name = PREFIX + kind
        if name in seqio.TaskRegistry.names():
            seqio.TaskRegistry.remove(name)
        seqio.TaskRegistry.add(
            name, source=source,
            preprocessors=[functools.partial(_tfds_pairs, **mapping), seqio.CacheDatasetPlaceholder(),
                           functools.partial(tokenize_texts, tokenizer=tokenizer)],
            output_features={f: seqio.Feature(tokenizer.vocabulary, add_eos=False, dtype=tf.int32) for f in fields},
            shuffle_buffer_size=10_000,
        )
        names[kind] = name
    return names
