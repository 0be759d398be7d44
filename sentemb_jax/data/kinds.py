"""The kinds of training data, their files and views - what a DataConfig may name, checked
without reading anything (and without TensorFlow: the data readers import it, this does not).

| kind | features | file (under DATA_DIR, override with DataConfig.files) |
|---|---|---|
| `commqa` | anchor (question), positive (answer) | qa/cqa_qatarliving.jsonl, label == Good |
| `nli_triples` | anchor, positive, negative | nli/triples.tsv |
| `nli_pairs` | anchor, positive | nli/pairs.tsv, label == entailment |
| `sts_pairs` | sentence1, sentence2, score | stsb/{train,dev,test}.tsv |
| `sentences` | view1, view2 (two views of one text) | nli/sentences.tsv |
| `qa_nli_pairs` (mixture) | anchor, positive | commqa + nli_pairs, by size |

Views of the `sentences` task (data.augment makes them):
* `none`, `word_deletion`, `random_crop` (on text), `span_masking` (on token ids);
* `column:<name>`: a precomputed view read from an extra column (e.g. back-translations);
* `neighbour`: the next sentence of the same file;
* `fixed:<augmentation>`: the augmentation drawn once per sentence (the same in every epoch).
"""
from __future__ import annotations

from typing import Sequence

from sentemb_jax import validation as v
from sentemb_jax.data.files import FileSpec

API = "sentemb_jax.DataConfig"  # the settings of the data readers come from a DataConfig

DEFAULT_FILES: dict[str, str | dict[str, str]] = {
    "commqa": "qa/cqa_qatarliving.jsonl",
    "nli_triples": "nli/triples.tsv",
    "nli_pairs": "nli/pairs.tsv",
    "sts_pairs": {"train": "stsb/train.tsv", "validation": "stsb/dev.tsv", "test": "stsb/test.tsv"},
    "sentences": "nli/sentences.tsv",
}
MIXTURES = {"qa_nli_pairs": ("commqa", "nli_pairs")}  # mixture -> the kinds it draws from
TEXT_FIELDS = {"commqa": ("anchor", "positive"), "nli_triples": ("anchor", "positive", "negative"),
               "nli_pairs": ("anchor", "positive"), "sts_pairs": ("sentence1", "sentence2"), "sentences": ("view1", "view2")}

TEXT_AUGMENTATIONS = ("none", "word_deletion", "random_crop")
ID_AUGMENTATIONS = ("span_masking",)
FIXED = "fixed:"
COLUMN = "column:"
NEIGHBOUR = "neighbour"


def precomputed_field(view: str) -> str | None:
    """The example field that holds a view's own text, used unchanged ('column:<name>' -> name,
    'neighbour' -> 'neighbour'); None for a view made from the row's text."""
    if view.startswith(COLUMN):
        return view[len(COLUMN):]
    return NEIGHBOUR if view == NEIGHBOUR else None


def check_view(name: str) -> str:
    if isinstance(name, str):
        if name.startswith(COLUMN) and len(name) > len(COLUMN):
            return name
        if name.startswith(FIXED) and name[len(FIXED):] in TEXT_AUGMENTATIONS:
            return name
        if name == NEIGHBOUR or name in TEXT_AUGMENTATIONS + ID_AUGMENTATIONS:
            return name
    raise ValueError(f"unknown view {name!r}; known: {TEXT_AUGMENTATIONS + ID_AUGMENTATIONS}, 'column:<name>', "
                     f"{NEIGHBOUR!r} or 'fixed:<one of {TEXT_AUGMENTATIONS}>'")


def check_task_options(*, files=None, on_bad_row="error", on_bad_shard="error", window_shards=16, augment_rate=0.1,
                       sts_score_range=(0.0, 5.0), views=("none", "none"), api: str = API) -> None:
    """The file readers' settings (DataConfig's): a bad one is a ConfigError naming it, before any file is read."""
    v.require_choice(on_bad_row, ("error", "skip"), api, "on_bad_row")
    v.require_choice(on_bad_shard, ("error", "skip"), api, "on_bad_shard")
    v.require_int(window_shards, api, "window_shards", 1)
    v.require_number(augment_rate, api, "augment_rate", 0, 1, high_open=True)
    low_high = tuple(sts_score_range) if isinstance(sts_score_range, (tuple, list)) else ()
    if len(low_high) != 2 or not all(v._is_real(x) and x == x and abs(x) != float("inf") for x in low_high) \
            or not low_high[0] < low_high[1]:
        v.fail(sts_score_range, api, "sts_score_range", "must be (low, high), two finite numbers with low < high")
    unknown = sorted(set(dict(files or {})) - set(DEFAULT_FILES))
    if unknown:
        v.fail(files, api, "files", f"unknown kind(s) {unknown}; known: {sorted(DEFAULT_FILES)}")
    if isinstance(views, str) or len(tuple(views)) != 2:
        v.fail(views, api, "views", "must be two views, e.g. ('none', 'word_deletion')")
    for view in views:
        try:
            check_view(view)
        except ValueError as e:
            v.fail(views, api, "views", str(e))


def file_spec(kind: str, path: str, binding: str | None = None, *, commqa_labels: Sequence[str] = ("Good",),
              nli_pair_labels: Sequence[str] = ("entailment",), sts_score_range: tuple[float, float] = (0.0, 5.0),
              sentence_column: str = "sentence", view_columns: Sequence[str] = (), clean: bool = False) -> FileSpec:
    """What a file of `kind` must hold and how its columns become the task's features (the
    validated-file path and the preparation command read files of a kind by the same rules)."""
    if kind == "commqa":
        return FileSpec(path, {"anchor": ("question_title", "question_body"), "positive": "answer"},
                        keep={"label": tuple(commqa_labels)}, binding=binding)
    if kind == "nli_triples":
        return FileSpec(path, {"anchor": "anchor", "positive": "positive", "negative": "negative"}, binding=binding)
    if kind == "nli_pairs":
        return FileSpec(path, {"anchor": "sentence1", "positive": "sentence2"}, keep={"label": tuple(nli_pair_labels)},
                        binding=binding)
    if kind == "sts_pairs":
        return FileSpec(path, {"sentence1": "sentence1", "sentence2": "sentence2", "score": "score"},
                        score_field="score", score_range=tuple(sts_score_range), binding=binding)
    if kind == "sentences":
        return FileSpec(path, {"text": sentence_column, **{c: c for c in view_columns}},
                        text_fields=("text", *view_columns), binding=binding, clean=clean)
    raise ValueError(f"unknown kind {kind!r}; known: {sorted(DEFAULT_FILES)}")
