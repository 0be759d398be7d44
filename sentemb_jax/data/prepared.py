"""A prepared corpus read as a seqio source (the corpus itself - manifest, order, shards - is
data.prepared_corpus, which the TensorFlow-free reader reads too).
"""
from __future__ import annotations

import json
from typing import Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from sentemb_jax.data.prepared_corpus import READ_CHUNK, PreparedCorpus
from sentemb_jax.errors import DataError


class PreparedSource(seqio.DataSource):
    """A seqio source over prepared corpora (one per split); see the module docstring for the order.

    `start_at` (set by InputPipeline before `get_dataset` when it resumes): the number of this
    host's examples of the epoch already consumed; the dataset begins right after them.
    """

    def __init__(self, paths: Mapping[str, str], window_shards: int = 16, on_bad_shard: str = "error"):
        self._paths = dict(paths)
        self._window_shards, self._on_bad_shard = window_shards, on_bad_shard
        self._corpora: dict[str, PreparedCorpus] = {}
        self.start_at = 0
        super().__init__(splits=list(paths), num_input_examples=None, caching_permitted=True,
                         performs_internal_shuffling=True)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return True

    def corpus(self, split: str) -> PreparedCorpus:
        if split not in self._paths:
            raise DataError(f"split {split!r} not available; this source has {sorted(self._paths)}")
        if split not in self._corpora:
            self._corpora[split] = PreparedCorpus(self._paths[split], self._window_shards, self._on_bad_shard)
        return self._corpora[split]

    def list_shards(self, split: str) -> Sequence[str]:
        return self.corpus(split).files

    def num_input_examples(self, split: str) -> int:
        return len(self.corpus(split))

    def describe(self, split: str, row_ids: Sequence[int]) -> list[str]:
        return self.corpus(split).describe(row_ids)

    def tokenizer(self) -> dict | None:
        """The tokenizer every split was tokenized with (fingerprint, max_length), None for text; a
        split tokenized differently from the others is a DataError."""
        found = {split: self.corpus(split).manifest.get("tokenizer") for split in self._paths}
        kinds = {json.dumps(t and {k: t[k] for k in ("fingerprint", "max_length")}, sort_keys=True) for t in found.values()}
        if len(kinds) > 1:
            raise DataError(f"prepared corpora {sorted(self._paths.values())}: splits tokenized differently ({found})")
        return next(iter(found.values()))

    def get_dataset(self, split: str = "train", shuffle: bool = True, seed: int | None = None,
                    shard_info: seqio.ShardInfo | None = None, *, sequence_length=None, use_cached=False, num_epochs=1):
        corpus = self.corpus(split)
        seed = 0 if seed is None else int(seed)
        index, hosts = (shard_info.index, shard_info.num_shards) if shard_info else (0, 1)
        plan = corpus.plan(seed)
        spec = {f: tf.io.RaggedFeature(tf.int64) if t == "ids" else tf.io.FixedLenFeature([], tf.float32 if t == "float" else tf.string)
                for f, t in corpus.features.items()}

        def locate(k):  # this host's example numbers -> global positions -> (shard, record), as the reader does
            positions = index + k * hosts
            if not shuffle:
                shard = np.searchsorted(corpus.starts[1:], positions, side="right")
                return shard.astype(np.int64), (positions - corpus.starts[shard]).astype(np.int64)
            shard, record = corpus.locate(positions, seed, plan)
            return shard.astype(np.int64), record.astype(np.int64)

        def lookup(k):
            shard, record = tf.numpy_function(locate, [k], (tf.int64, tf.int64), stateful=False)
            return tf.reshape(shard, [-1]), tf.reshape(record, [-1])

        def read(shard, record):  # one Python call per chunk (the reader cache is not thread-safe: sequential)
            return shard, record, tf.numpy_function(corpus.read, [shard, record], tf.string, stateful=False)

        def parse(shard, record, records):
            examples = tf.io.parse_example(tf.reshape(records, [-1]), spec)
            examples = {f: tf.cast(x, tf.int32) if x.dtype == tf.int64 else x for f, x in examples.items()}  # ids
            examples["row_id"] = tf.gather(tf.constant(corpus.starts), shard) + record
            return examples

        mine = max(0, -(-(len(corpus) - index) // hosts))
        ds = tf.data.Dataset.range(min(self.start_at, mine), mine).batch(READ_CHUNK)
        ds = ds.map(lookup).map(read)
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.unbatch()
