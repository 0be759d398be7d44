"""Deterministic, resumable batches of model features from a seqio task or mixture.

    pipe = InputPipeline("sentemb_nli_triples", batch_size=64, sequence_length=64, seed=0)
    for batch in pipe: ...                     # {"anchor_input_ids": [64, L], "anchor_attention_mask": ..., ...}
    state = pipe.state_dict()                  # saved with each checkpoint
    pipe.load_state_dict(state)                # resumes exactly after the last consumed batch

Epoch e of a task is the task's rows permuted with seed `seed + e`; each host reads its own
`seqio.ShardInfo` part of that order. Text features are padded to the longest sequence in the
batch rounded up to a bucket length (few compiled shapes), one text per row; the trainer can
pack them afterwards (`DataConfig.pack`, sentemb_jax.data.packing).
"""
from __future__ import annotations

import re
from typing import Iterator, Mapping, Sequence

import jax
import numpy as np
import seqio
import tensorflow as tf

from sentemb_jax.data.batching import to_model_batch
from sentemb_jax.data.prepared import PreparedSource
from sentemb_jax.data.prepared_corpus import check_kind, check_sequence_length
from sentemb_jax.data.sources import PREFIX
from sentemb_jax.data.tasks import (
    cut_ids,
    register_tasks,
    sentence_texts,
    sentence_views,
    task_files,
    truncate_ids,
    view_texts,
)
from sentemb_jax.errors import DataError, TrainingError
from sentemb_jax.paths import default_data_dir
from sentemb_jax.tokenization import DEFAULT_BUCKETS, TRAIN_BUCKETS


class InputPipeline:
    def __init__(
        self,
        task: str,
        batch_size: int,
        sequence_length: int | Mapping[str, int],
        seed: int = 0,
        split: str = "train",
        shuffle: bool = True,
        shard_info: seqio.ShardInfo | tuple[int, int] | None = None,
        num_epochs: int | None = None,
        drop_remainder: bool = True,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        same_length: bool = False,
    ):
        if isinstance(shard_info, tuple):  # (this process's index, processes)
            shard_info = seqio.ShardInfo(*shard_info)
        self.provider = seqio.get_mixture_or_task(task)
        self.text_features = tuple(self.provider.output_features)
        if isinstance(sequence_length, int):
            sequence_length = {f: sequence_length for f in self.text_features}
        self.sequence_length = dict(sequence_length)
        self.task, self.batch_size, self.seed, self.split = task, batch_size, seed, split
        self.shuffle, self.shard_info, self.num_epochs = shuffle, shard_info, num_epochs
        self.drop_remainder, self.buckets, self.same_length = drop_remainder, tuple(buckets), same_length
        self.pad_id = int(next(iter(self.provider.output_features.values())).vocabulary.pad_id)
        self.epoch = 0
        self.step_in_epoch = 0
        self._is_mixture = isinstance(self.provider, seqio.Mixture)

    @property
    def name(self) -> str:
        return f"task {self.task!r}"

    # What a method reads of a sentences task (the TensorFlow-free reader has the same).
    @property
    def views(self) -> tuple[str, ...]:
        return sentence_views(self.task)[0]

    def texts(self) -> list[str]:
        return sentence_texts(self.task)

    def view_texts(self, view_index: int, texts=None) -> list[str] | None:
        return view_texts(self.task, view_index, texts)

    def data_files(self) -> list[str]:
        return task_files(self.task)

    def describe(self, batch: Mapping[str, np.ndarray], limit: int = 8) -> str:
        """`path:line` of a batch's first rows (row ids when the source has no line index)."""
        row_ids = np.asarray(batch.get("row_id", []))
        rows = row_ids[:limit].tolist()
        source = getattr(self.provider, "source", None)  # a mixture has none (its row ids are per task)
        describe = getattr(source, "describe", None)  # RowFileSource: path:line; PreparedSource: shard #record
        lines = describe(self.split, rows) if describe else [f"row {r}" for r in rows]
        more = len(row_ids) - len(rows)
        return ", ".join(lines) + (f" and {more} more" if more > 0 else "")

    # Resumption state (JSON-serialisable); checked against this pipeline's settings.
    def state_dict(self) -> dict:
        return {"task": self.task, "seed": self.seed, "batch_size": self.batch_size,
                "shard": [self.shard_info.index, self.shard_info.num_shards] if self.shard_info else None,
                "epoch": self.epoch, "step_in_epoch": self.step_in_epoch}

    def load_state_dict(self, state: Mapping) -> None:
        """Resume at `state`'s position. A state saved by another number of processes (shards) is
        taken when the global batch (batch_size x shards) is the same: step k of an epoch then
        covers the same rows of the global order (each shard reads every num_shards-th row)."""
        mine = self.state_dict()
        for key in ("task", "seed"):
            if state.get(key) != mine[key]:
                raise ValueError(f"input state was saved with {key}={state.get(key)!r}, this pipeline has {mine[key]!r}")
        if (state.get("batch_size"), state.get("shard")) != (mine["batch_size"], mine["shard"]):
            theirs, ours = _global_batch(state), _global_batch(mine)
            if self._is_mixture or theirs != ours:
                raise ValueError(f"input state was saved with batch_size={state.get('batch_size')!r} x shard="
                                 f"{state.get('shard')!r} (global batch {theirs}), this pipeline has batch_size="
                                 f"{mine['batch_size']!r} x shard={mine['shard']!r} (global batch {ours})"
                                 + (" (a mixture resumes only with the same sharding)" if self._is_mixture else ""))
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])

    def _dataset(self, epoch: int) -> tf.data.Dataset:
        # A prepared corpus starts at the resume position itself (computed, not read and skipped);
        # every batch before it was full, so it is step x batch examples in, whatever drop_remainder.
        source = getattr(self.provider, "source", None)
        seek = isinstance(source, PreparedSource)
        if seek:
            source.start_at = self.step_in_epoch * self.batch_size  # set each time: the source is shared
        suffix = self._ids_only_cut()
        if suffix is not None:
            # Ids tokenized ahead and nothing else to do per example: cut, measure and pad whole
            # batches (what the seqio route below does one example at a time, ~5x slower).
            ds = source.get_dataset(self.split, shuffle=self.shuffle, seed=self.seed + epoch, shard_info=self.shard_info)
            ds = ds.ragged_batch(self.batch_size, drop_remainder=self.drop_remainder)
            ds = ds.map(lambda batch: self._cut_and_pad(batch, suffix), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        else:
            # No in-memory caching: it would ask TFDS for split sizes and freeze a shuffled order.
            ds = self.provider.get_dataset(
                sequence_length=self.sequence_length, split=self.split, shuffle=self.shuffle, seed=self.seed + epoch,
                shard_info=self.shard_info, num_epochs=None if self._is_mixture else 1, use_cached=False,
                trim_output_features=True, try_in_mem_cache=False,
            )
            features = self.text_features

            def add_lengths(ex):
                ex = dict(ex)
                for f in features:
                    ex[f"{f}_length"] = tf.size(ex[f])
                return ex

            ds = ds.map(add_lengths, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            # Zero padding here; to_model_batch re-pads with the model's pad id from the lengths.
            ds = ds.padded_batch(self.batch_size, drop_remainder=self.drop_remainder)
        if self.shard_info and self.shard_info.num_shards > 1 and not self._is_mixture:
            # Shards differ by up to one row: every shard stops after the global number of full
            # batches, so all processes take the same number of steps per epoch.
            index = getattr(self.provider.source, "index", None)
            rows = len(index(self.split)) if index else self.provider.num_input_examples(self.split)
            if rows:
                ds = ds.take(rows // (self.batch_size * self.shard_info.num_shards) - (self.step_in_epoch if seek else 0))
        return ds.skip(0 if seek else self.step_in_epoch).prefetch(tf.data.AUTOTUNE)

    def _ids_only_cut(self) -> tuple[int, ...] | None:
        """The special suffix ids when this task is a prepared corpus of ids whose only step is the
        cut to length (truncate_ids); None otherwise (text, augmentation, mixtures: seqio's route)."""
        if self._is_mixture or not isinstance(getattr(self.provider, "source", None), PreparedSource):
            return None
        steps = [p for p in self.provider.preprocessors if not isinstance(p, seqio.CacheDatasetPlaceholder)]
        if len(steps) != 1 or getattr(steps[0], "func", None) is not truncate_ids:
            return None
        return tuple(steps[0].keywords["tokenizer"].suffix_ids)

    def _cut_and_pad(self, batch: Mapping[str, tf.Tensor], suffix: tuple[int, ...]) -> dict[str, tf.Tensor]:
        out = dict(batch)
        for f in self.text_features:
            ids = cut_ids(batch[f], self.sequence_length[f], suffix)
            out[f], out[f"{f}_length"] = ids.to_tensor(0), tf.cast(ids.row_lengths(), tf.int32)
        return out

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        while self.num_epochs is None or self.epoch < self.num_epochs:
            fresh_epoch = self.step_in_epoch == 0
            for batch in _reraise_data_errors(self._dataset(self.epoch).as_numpy_iterator()):
                self.step_in_epoch += 1
                yield to_model_batch(batch, self.text_features, self.pad_id, self.buckets, self.same_length)
            if fresh_epoch and self.step_in_epoch == 0 and self.drop_remainder:
                raise DataError(self._cannot_fill_a_batch())  # else: empty epochs forever (a hang)
            if self._is_mixture:  # an endless mixed stream has no epochs
                return
            self.epoch += 1
            self.step_in_epoch = 0


    def _cannot_fill_a_batch(self) -> str:
        source = getattr(self.provider, "source", None)
        files = ", ".join(source.list_shards(self.split)) if source is not None else f"mixture {self.task!r}"
        index = getattr(source, "index", None)
        rows = len(index(self.split)) if index else None
        part = (f" (this process reads every {self.shard_info.num_shards}-th row: shard {self.shard_info.index})"
                if self.shard_info and self.shard_info.num_shards > 1 else "")
        counted = f"{rows} usable rows" if rows is not None else "too few rows"
        return (f"{files}: {counted}{part} cannot fill one batch of batch_size={self.batch_size} "
                f"({self.split!r} split of {self.task!r}; incomplete batches are dropped): lower the batch size "
                "(DataConfig.batch_size) or add data")


def _reraise_data_errors(batches: Iterator) -> Iterator:
    """A DataError raised inside tf.data (a damaged shard read by the prepared source) arrives
    wrapped in a TF error: raise it again as itself, its message only."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except tf.errors.OpError as e:
            found = re.search(r"DataError: (.+)", e.message)
            if found is None:
                raise
            raise DataError(found.group(1).strip()) from None
        yield batch


def _global_batch(state: Mapping) -> int:
    shard = state.get("shard")
    return int(state.get("batch_size") or 0) * (int(shard[1]) if shard else 1)


def register_task(data, tokenizer_dir: str) -> str:
    """Register the tasks of a DataConfig's files (tokenised as `tokenizer_dir`'s tokenizer); the
    registered name of its task."""
    names = register_tasks(tokenizer_dir=tokenizer_dir, data_dir=data.data_dir or default_data_dir(), **data.task_options())
    if data.task not in names:
        raise TrainingError(f"DataConfig.task {data.task!r} unknown; registered: {sorted(names)}")
    found = seqio.get_mixture_or_task(names[data.task])
    for task in getattr(found, "tasks", [found]):
        if isinstance(task.source, PreparedSource):
            kind = task.name.removeprefix(PREFIX)
            for split in task.source.splits:
                corpus = task.source.corpus(split)
                check_kind(corpus.manifest.get("kind"), corpus.directory, kind)
            check_sequence_length(task.source.tokenizer(), task.name, kind, data.sequence_length)
    return names[data.task]


def task_pipeline(task: str, data, fixed_padding: bool) -> InputPipeline:
    """This process's part of each global batch of a DataConfig's task (every process_count-th row
    of the global order); fixed_padding: every text padded to the sequence length."""
    processes = jax.process_count()
    return InputPipeline(task, batch_size=data.batch_size // processes, sequence_length=data.sequence_length,
                         seed=data.seed, buckets=(data.sequence_length,) if fixed_padding else TRAIN_BUCKETS,
                         same_length=data.same_length or fixed_padding,
                         shard_info=(jax.process_index(), processes) if processes > 1 else None)
