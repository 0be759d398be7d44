"""MTEB 2's model protocols for our encoders: `MtebEncoder` (a `SentenceEncoder`) and
`MtebCrossEncoder` (a `CrossEncoder`).

MTEB 2 (tested with mteb 2.26.24) calls
`encode(inputs: DataLoader[BatchedInput], *, task_metadata, hf_split, hf_subset, prompt_type=None, **encode_kwargs)`
and `predict(inputs1, inputs2, *, task_metadata, hf_split, hf_subset, prompt_type=None, **encode_kwargs)`,
where each batch is a dict whose "text" is a list of strings, and reads `mteb_model_meta` (an
`mteb.ModelMeta`); `mteb.models.EncoderProtocol` / `CrossEncoderProtocol` are runtime-checkable.
`SentenceEncoder.encode` keeps sentence-transformers' contract (a list of strings; it also takes
MTEB 1.x's `task_name` / `prompt_type`, see encoding.py), so MTEB 2 gets these adapters:

    import mteb
    from sentemb_jax.evaluation.mteb_adapter import MtebEncoder
    results = mteb.evaluate(MtebEncoder(SentenceEncoder.from_pretrained(path)), tasks,
                            cache=mteb.ResultCache(out_dir))

Prompts follow MTEB's `SentenceTransformerEncoderWrapper`: of the model's `prompts` (its
name -> text table), the one MTEB's `get_prompt_name` picks for the task (task name + prompt type,
task name, task type + prompt type, task type, prompt type) is put before each text; with none, the
model's default prompt applies, as in `SentenceEncoder.encode`.

This module imports mteb (and, through it, torch) at the top: only MTEB users import it; nothing
else in the package does.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from mteb.models import ModelMeta
from mteb.models.abs_encoder import AbsEncoder, get_prompt_name
from mteb.models.model_meta import ScoringFunction
from mteb.types import PromptType

from sentemb_jax.cross_encoder import CrossEncoder
from sentemb_jax.encode_contract import check_inputs
from sentemb_jax.encoder import SentenceEncoder

FRAMEWORK = ["JAX"]


def batch_texts(inputs, where: str) -> list[str]:
    """The texts of an MTEB DataLoader (batches of {"text": [...], ...}), in order. A plain list of
    strings is returned as it is. Each batch's "text" is read by encode's input rule
    (`encode_contract.check_inputs`): a str is one text (a DataLoader with batch_size=None yields
    one row per batch; MTEB's own SentenceTransformer wrapper would take its characters as texts),
    a list / tuple / numpy array of str a batch; anything else raises InputTypeError."""
    if isinstance(inputs, (list, tuple)):
        return list(inputs)
    texts: list[str] = []
    for i, batch in enumerate(inputs):
        if not isinstance(batch, dict) or "text" not in batch:
            keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
            raise TypeError(f"{where}: expected MTEB batches with a 'text' column, got {keys} "
                            "(only text inputs are supported)")
        texts.extend(check_inputs(batch["text"], where, f"batch {i}['text']")[0])
    return texts


def _model_name(name: str | None, path: str | None, default: str) -> str:
    """A ModelMeta name (MTEB wants "organization/model"): the caller's, else sentemb_jax/<dir name>."""
    if name:
        return name
    if path:
        return f"sentemb_jax/{os.path.basename(os.path.normpath(path))}"
    return f"sentemb_jax/{default}"


def n_parameters(params) -> int:
    return int(sum(np.prod(np.shape(x)) for x in jax.tree_util.tree_leaves(params)))


def _embedding_parameters(params) -> int | None:
    """vocab x width of the token embedding table (MTEB's heuristic for n_embedding_parameters)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = "/".join(str(getattr(k, "key", k)) for k in path).lower()
        if ("word_embeddings" in names or "token_embedder" in names or "shared" in names) and np.ndim(leaf) == 2:
            return int(np.prod(np.shape(leaf)))
    return None


def _resolve_prompts(prompts: dict[str, str] | None) -> dict[str, str] | None:
    """MTEB's validation of a prompt table: keys that name no task, task type or prompt type are
    dropped with a warning, as SentenceTransformerEncoderWrapper does. An empty prompt stays: chosen,
    it means no prompt (not the default prompt), as there."""
    prompts = {k: v for k, v in (prompts or {}).items() if v is not None}
    if not prompts:
        return None
    valid, _ = AbsEncoder.validate_task_to_prompt_name(prompts, raise_for_invalid_keys=False)
    return valid or None


def _wrapped(model, kind: type, wrapper: str, kwargs: dict):
    """(the model, its path or None): `model` itself, or `kind.from_pretrained(model, **kwargs)` for a
    path (the loading keywords apply only then)."""
    path = None
    if isinstance(model, str):
        path = model
        model = kind.from_pretrained(model, **kwargs)
    elif kwargs:
        raise TypeError(f"{wrapper}: keyword(s) {sorted(kwargs)} apply only when loading from a path")
    if not isinstance(model, kind):
        raise TypeError(f"{wrapper} wraps a {kind.__name__} (or a path to one), got {type(model).__name__}")
    return model, path


class MtebEncoder:
    """A `SentenceEncoder` as MTEB 2's `EncoderProtocol`.

    `model`: a SentenceEncoder, or a path for `SentenceEncoder.from_pretrained` (MTEB's loader
    signature: `MtebEncoder(model_name, revision, device=...)`). `name`, `revision`, `languages`
    (["eng-Latn"], ...), `model_prompts` (name -> prompt text; default: the model's prompts) go to
    `mteb_model_meta` / the prompt choice."""

    def __init__(self, model: SentenceEncoder | str, revision: str | None = None, *, device: str | None = None,
                 name: str | None = None, languages: list[str] | None = None,
                 model_prompts: dict[str, str] | None = None, **kwargs: Any):
        model, path = _wrapped(model, SentenceEncoder, "MtebEncoder", kwargs)
        self.model = model
        self.model_prompts = _resolve_prompts(model.prompts if model_prompts is None else model_prompts)
        dim = model.get_sentence_embedding_dimension()
        if model.truncate_dim is not None:
            dim = min(dim, model.truncate_dim)
        self.mteb_model_meta = ModelMeta.create_empty(overwrites=dict(
            name=_model_name(name, path, type(model).__name__),
            revision=revision,
            loader=MtebEncoder,
            languages=languages,
            n_parameters=n_parameters(model.params),
            n_embedding_parameters=_embedding_parameters(model.params),
            max_tokens=model.max_seq_length,
            embed_dim=dim,
            similarity_fn_name=ScoringFunction.from_str(model.similarity_fn_name),
            framework=FRAMEWORK,
            use_instructions=any(self.model_prompts.values()) if self.model_prompts else False,
            model_type=["dense"],
        ))

    def prompt(self, task_metadata, prompt_type: PromptType | None) -> str | None:
        """The prompt text MTEB's rule picks for this task and prompt type (None: the model's default)."""
        name = get_prompt_name(self.model_prompts, task_metadata, prompt_type)
        return self.model_prompts.get(name) if name else None

    def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str,
               prompt_type: PromptType | None = None, **kwargs) -> np.ndarray:
        """float32 [n, dim] embeddings of the DataLoader's texts; `kwargs` (MTEB's encode_kwargs:
        batch_size, show_progress_bar, precision) go to SentenceEncoder.encode."""
        texts = batch_texts(inputs, "MtebEncoder.encode")
        return np.asarray(self.model.encode(texts, prompt=self.prompt(task_metadata, prompt_type), **kwargs))

    def similarity(self, embeddings1, embeddings2) -> np.ndarray:
        return np.asarray(self.model.similarity(np.asarray(embeddings1), np.asarray(embeddings2)))

    def similarity_pairwise(self, embeddings1, embeddings2) -> np.ndarray:
        return np.asarray(self.model.similarity_pairwise(np.asarray(embeddings1), np.asarray(embeddings2)))

    def __repr__(self) -> str:
        return f"MtebEncoder({self.model!r})"


class MtebCrossEncoder:
    """A `CrossEncoder` as MTEB 2's `CrossEncoderProtocol`: `predict` scores inputs1[i] with
    inputs2[i]. `query_prefix` / `passage_prefix` are put before the texts of inputs1 / inputs2 (as
    MTEB's CrossEncoderWrapper does); `activation` is CrossEncoder.predict's."""

    def __init__(self, model: CrossEncoder | str, revision: str | None = None, device: str | None = None, *,
                 name: str | None = None, languages: list[str] | None = None, query_prefix: str = "",
                 passage_prefix: str = "", activation: str = "sigmoid", **kwargs: Any):
        model, path = _wrapped(model, CrossEncoder, "MtebCrossEncoder", kwargs)
        self.model = model
        self.query_prefix, self.passage_prefix, self.activation = query_prefix, passage_prefix, activation
        self.mteb_model_meta = ModelMeta.create_empty(overwrites=dict(
            name=_model_name(name, path, type(model).__name__),
            revision=revision,
            loader=MtebCrossEncoder,
            languages=languages,
            n_parameters=n_parameters(model.params),
            n_embedding_parameters=_embedding_parameters(model.params),
            framework=FRAMEWORK,
            model_type=["cross-encoder"],
        ))

    def predict(self, inputs1, inputs2, *, task_metadata, hf_split: str, hf_subset: str,
                prompt_type: PromptType | None = None, batch_size: int = 32, show_progress_bar: bool | None = None,
                **kwargs) -> np.ndarray:
        """float [n] scores of the pairs (inputs1[i], inputs2[i])."""
        if kwargs:
            raise TypeError(f"MtebCrossEncoder.predict() got unexpected keyword argument(s) {sorted(kwargs)}")
        first = [self.query_prefix + t for t in batch_texts(inputs1, "MtebCrossEncoder.predict")]
        second = [self.passage_prefix + t for t in batch_texts(inputs2, "MtebCrossEncoder.predict")]
        if len(first) != len(second):
            raise ValueError(f"MtebCrossEncoder.predict: {len(first)} first inputs but {len(second)} second inputs")
        if not first:
            return np.zeros((0,), np.float32)
        scores = np.asarray(self.model.predict(list(zip(first, second)), batch_size=batch_size,
                                               activation=self.activation))
        return scores.reshape(len(first), -1)[:, 0] if scores.ndim == 2 and scores.shape[1] == 1 else scores

    def __repr__(self) -> str:
        return f"MtebCrossEncoder({self.model!r})"
