"""The TensorFlow-free input route: batches of a kind's files or prepared corpus, tokenised by the
model's Hugging Face tokenizer, with the seqio pipeline's contract (data.pipeline.InputPipeline):

* the same rows in the same order (data.sources: one permutation per epoch by seed + epoch, host h
  of H reading every H-th row; a prepared corpus's windows), the same bad-row / bad-shard rules;
* the same batch layout (data.batching.to_model_batch: bucket lengths, `row_id`, a score);
* the same resume state (`state_dict` / `load_state_dict`: epoch and step, checked against the
  task, seed and global batch), so a resumed run continues at the next batch;
* batches prepared ahead on a thread while the device runs the step (`prefetch`).

Where the routes differ, by design: a view drawn anew each epoch (`word_deletion`, `random_crop`,
`span_masking`, and their `fixed:` forms) draws its words with numpy (data.views), not with
TensorFlow's stateless ops - the same rate and distribution, other words of each sentence; and
mixtures (`qa_nli_pairs`) and TFDS tasks read through seqio only. Tasks without such views (NLI
triples and pairs, CommQA, STS pairs, `none` / `column:` / `neighbour` views) give the same batches
array for array on both routes.
"""
from __future__ import annotations

import concurrent.futures
import itertools
from typing import Iterator, Mapping, Sequence

import numpy as np

from sentemb_jax.data import views as view_ops
from sentemb_jax.data.batching import id_matrix, to_model_batch
from sentemb_jax.data.kinds import COLUMN, FIXED, MIXTURES, NEIGHBOUR, TEXT_FIELDS, precomputed_field
from sentemb_jax.data.prepared_corpus import check_kind, check_sequence_length
from sentemb_jax.data.sources import PREFIX, FileRows, PreparedRows, is_prepared, task_specs
from sentemb_jax.errors import DataError
from sentemb_jax.paths import default_data_dir
from sentemb_jax.tokenization import DEFAULT_BUCKETS, Tokenizer, tokenizer_fingerprint


def special_ids(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """(prefix, suffix) special ids the tokenizer adds around a text ([CLS] / [SEP] for BERT; - / EOS for T5)."""
    empty = tokenizer.hf("", add_special_tokens=True)["input_ids"]
    one = tokenizer.hf("a", add_special_tokens=True)["input_ids"]
    k = 0
    while k < min(len(empty), len(one)) and empty[k] == one[k]:
        k += 1
    return list(empty[:k]), list(empty[k:])


def cut(ids: Sequence[int], max_len: int, suffix: Sequence[int]) -> list[int]:
    """Ids tokenised ahead, cut as the tokenizer truncates: the text's pieces cut, the suffix kept."""
    ids = list(ids)
    if len(ids) <= max_len:
        return ids
    return ids[: max_len - len(suffix)] + list(suffix) if suffix else ids[:max_len]


class NumpyBatches:
    """Batches of one split of a kind (see the module docstring); iterate it, like InputPipeline."""

    def __init__(self, kind: str, rows: FileRows | PreparedRows, tokenizer: Tokenizer, batch_size: int,
                 sequence_length: int, seed: int = 0, shard: tuple[int, int] | None = None,
                 buckets: Sequence[int] = DEFAULT_BUCKETS, same_length: bool = False, views: Sequence[str] = ("none", "none"),
                 augment_rate: float = 0.1, shuffle: bool = True, num_epochs: int | None = None, drop_remainder: bool = True,
                 prefetch: int = 2):
        self.kind, self.rows, self.task = kind, rows, PREFIX + kind
        self.text_features = TEXT_FIELDS[kind]
        self.tokenizer = Tokenizer(tokenizer.hf, sequence_length, lowercase=tokenizer.lowercase, source_dir=tokenizer.source_dir)
        self.batch_size, self.sequence_length, self.seed, self.shard = batch_size, sequence_length, seed, shard
        self.buckets, self.same_length, self.views, self.augment_rate = tuple(buckets), same_length, tuple(views), augment_rate
        self.shuffle, self.num_epochs, self.drop_remainder, self.prefetch = shuffle, num_epochs, drop_remainder, prefetch
        self.pad_id = self.tokenizer.pad_id
        self.prefix_ids, self.suffix_ids = special_ids(self.tokenizer)
        self.mask_id = self._mask_id()
        self.epoch = 0
        self.step_in_epoch = 0
        self._order: tuple[int, np.ndarray] | None = None

    @property
    def name(self) -> str:
        return f"task {self.task!r}"

    # ------------------------------------------------------------------ the contract of InputPipeline

    def state_dict(self) -> dict:
        return {"task": self.task, "seed": self.seed, "batch_size": self.batch_size,
                "shard": list(self.shard) if self.shard else None, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch}

    def load_state_dict(self, state: Mapping) -> None:
        """Resume at `state`'s position (a state of another process count resumes when the global
        batch is the same: step k of an epoch covers the same rows of the global order)."""
        mine = self.state_dict()
        for key in ("task", "seed"):
            if state.get(key) != mine[key]:
                raise ValueError(f"input state was saved with {key}={state.get(key)!r}, this reader has {mine[key]!r}")
        theirs = int(state.get("batch_size") or 0) * (int(state["shard"][1]) if state.get("shard") else 1)
        ours = self.batch_size * (self.shard[1] if self.shard else 1)
        if theirs != ours:
            raise ValueError(f"input state was saved with a global batch of {theirs}, this reader has {ours}")
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])

    def describe(self, batch: Mapping[str, np.ndarray], limit: int = 8) -> str:
        """`path:line` (or `shard #record`) of a batch's first rows."""
        row_ids = np.asarray(batch.get("row_id", []))
        lines = self.rows.describe(row_ids[:limit].tolist())
        more = len(row_ids) - len(lines)
        return ", ".join(lines) + (f" and {more} more" if more > 0 else "")

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="input") as pool:
            while self.num_epochs is None or self.epoch < self.num_epochs:
                epoch, count = self.epoch, self._batches_in_epoch()
                if count == 0:
                    raise DataError(self._cannot_fill_a_batch())  # else: empty epochs forever (a hang)
                ahead = []
                steps = iter(range(self.step_in_epoch, count))
                for b in itertools.islice(steps, self.prefetch):
                    ahead.append(pool.submit(self._batch, epoch, b))
                while ahead:
                    batch = ahead.pop(0).result()
                    for b in itertools.islice(steps, 1):
                        ahead.append(pool.submit(self._batch, epoch, b))
                    self.step_in_epoch += 1
                    yield batch
                self.epoch, self.step_in_epoch = epoch + 1, 0

    # ------------------------------------------------------------------ one batch

    def _host_rows(self) -> int:
        if isinstance(self.rows, PreparedRows):
            return self.rows.host_rows(self.shard)
        return len(self._epoch_order(self.epoch))

    def _batches_in_epoch(self) -> int:
        rows = self._host_rows()
        if self.shard and self.shard[1] > 1:
            # Hosts differ by up to one row: every host stops after the global number of full batches.
            return len(self.rows) // (self.batch_size * self.shard[1])
        return rows // self.batch_size if self.drop_remainder else -(-rows // self.batch_size)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, self.rows.order(self.seed + epoch, self.shard, self.shuffle))
        return self._order[1]

    def _examples(self, epoch: int, b: int) -> list[dict]:
        start, stop = b * self.batch_size, (b + 1) * self.batch_size
        if isinstance(self.rows, PreparedRows):
            shards, records = self.rows.positions(start, stop, self.seed + epoch, self.shard, self.shuffle)
            return self.rows.corpus.examples(shards, records)
        return list(self.rows.rows(self._epoch_order(epoch)[start:stop]))

    def _batch(self, epoch: int, b: int) -> dict[str, np.ndarray]:
        examples = self._examples(epoch, b)
        out = {"row_id": np.asarray([e["row_id"] for e in examples], np.int64)}
        if any("score" in e for e in examples):
            out["score"] = np.asarray([e["score"] for e in examples], np.float32)
        for i, name in enumerate(self.text_features):
            out[name], out[f"{name}_length"] = id_matrix(self._ids(examples, name, i, epoch))
        return to_model_batch(out, self.text_features, self.pad_id, self.buckets, self.same_length)

    def _ids(self, examples: list[dict], name: str, view_index: int, epoch: int) -> list[list[int]]:
        """The ids of one text feature of the batch: tokenised (a view made first), or ids cut to length."""
        if self.kind != "sentences":
            values = [e[name] for e in examples]
            if values and not isinstance(values[0], str):  # a prepared corpus of ids
                return [cut(v, self.sequence_length, self.suffix_ids) for v in values]
            return self.tokenizer.tokenize(values)
        view = self.views[view_index]
        texts = [self._view_text(e, view, view_index, epoch) for e in examples]
        ids = self.tokenizer.tokenize(texts)
        if view == "span_masking":
            ids = [view_ops.span_masking(x, self.augment_rate, self.mask_id,
                                         view_ops.view_rng(self.seed, epoch, e["row_id"], view_index),
                                         len(self.prefix_ids), len(self.suffix_ids)) for x, e in zip(ids, examples)]
        return ids

    def _view_text(self, example: dict, view: str, view_index: int, epoch: int) -> str:
        field = precomputed_field(view)
        if field:  # column:<name> / neighbour: a text of its own, used unchanged
            return example[field]
        if view.startswith(FIXED):
            return view_ops.apply_text_augmentation(view[len(FIXED):], example["text"], self.augment_rate,
                                                    view_ops.fixed_rng(example["row_id"], view_index))
        return view_ops.apply_text_augmentation(view, example["text"], self.augment_rate,
                                                view_ops.view_rng(self.seed, epoch, example["row_id"], view_index))

    def _mask_id(self) -> int:
        hf = self.tokenizer.hf
        if getattr(hf, "mask_token_id", None) is not None:
            return int(hf.mask_token_id)
        sentinel = hf.convert_tokens_to_ids("<extra_id_0>")  # T5's first sentinel
        return int(sentinel) if sentinel is not None else int(hf.unk_token_id or 0)

    def _cannot_fill_a_batch(self) -> str:
        part = (f" (this process reads every {self.shard[1]}-th row: shard {self.shard[0]})"
                if self.shard and self.shard[1] > 1 else "")
        return (f"{', '.join(self.rows.files)}: {len(self.rows)} usable rows{part} cannot fill one batch of "
                f"batch_size={self.batch_size} ({self.task!r}; incomplete batches are dropped): lower the batch size "
                "(DataConfig.batch_size) or add data")

    # ------------------------------------------------------------------ what methods read of the task

    def texts(self) -> list[str]:
        """The `text` of every row of a sentences task, in row order (the views' source)."""
        return [row["text"] for row in self.rows.rows(np.arange(len(self.rows)))]

    def data_files(self) -> list[str]:
        """The files this reader reads (fingerprinted in the run record)."""
        return [] if isinstance(self.rows, PreparedRows) else list(self.rows.files)

    def view_texts(self, view_index: int, texts: Sequence[str] | None = None) -> list[str] | None:
        """Every row's text of view `view_index` when it is the same in every epoch ('none',
        'column:<name>', 'neighbour', 'fixed:<augmentation>'), in row order; None for a view drawn
        anew each epoch."""
        view = self.views[view_index]
        if view.startswith(COLUMN) or view == NEIGHBOUR:
            field = precomputed_field(view)
            return [row[field] for row in self.rows.rows(np.arange(len(self.rows)))]
        if view != "none" and not view.startswith(FIXED):
            return None
        texts = self.texts() if texts is None else list(texts)
        return texts if view == "none" else view_ops.fixed_view_texts(texts, view, self.augment_rate, view_index)


def numpy_batches(data, tokenizer: Tokenizer, shard: tuple[int, int] | None, buckets: Sequence[int],
                  same_length: bool) -> NumpyBatches:
    """The reader of a DataConfig's task (its files, views and rules) for this process's `shard`."""
    if data.task in MIXTURES:
        raise DataError(f"DataConfig.task {data.task!r} is a mixture, which reads through seqio: set "
                        "DataConfig.reader='seqio' (it needs TensorFlow)")
    specs = task_specs(data, data.data_dir or default_data_dir())
    if "train" not in specs:
        raise DataError(f"DataConfig.task {data.task!r}: no 'train' split among its files ({sorted(specs)})")
    if is_prepared(specs, data.task):
        rows = PreparedRows(specs["train"].path, data.window_shards, data.on_bad_shard)
        check_tokenized(rows, data.task, tokenizer, data.sequence_length)
    else:
        neighbour = "text" if data.task == "sentences" and NEIGHBOUR in data.views else None
        rows = FileRows(specs["train"], data.on_bad_row, neighbour)
    return NumpyBatches(data.task, rows, tokenizer, data.batch_size // (shard[1] if shard else 1), data.sequence_length,
                        seed=data.seed, shard=shard, buckets=buckets, same_length=same_length, views=data.views,
                        augment_rate=data.augment_rate)


def check_tokenized(rows: PreparedRows, kind: str, tokenizer: Tokenizer, sequence_length: int | None = None) -> None:
    """A prepared corpus is read only as the kind it was prepared as; one of ids only by a model with
    the tokenizer it was tokenized with, at a sequence length its ids were not cut below."""
    check_kind(rows.corpus.manifest.get("kind"), rows.corpus.directory, kind)
    made_by = rows.corpus.tokenizer()
    check_sequence_length(made_by, rows.corpus.directory, kind, sequence_length)
    if made_by is None or tokenizer.source_dir is None:
        return
    if made_by["fingerprint"] != tokenizer_fingerprint(tokenizer.source_dir):
        raise DataError(f"{rows.corpus.directory}: the {kind!r} corpus was tokenized with the tokenizer of "
                        f"{made_by.get('source')!r}, not this model's ({tokenizer.source_dir}): prepare it again with "
                        "prepare_corpus.tokenizer_dir set to this model, or without tokenizer_dir (text)")
