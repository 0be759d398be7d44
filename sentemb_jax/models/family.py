"""What a backbone family is: the one object through which the rest of the package meets it.

Each family module (`t5`, `bert`, `mpnet`) owns its config class, its Flax modules, and a
`FAMILY = Family(...)`: which config.json `model_type`s it reads and how (`config_from_hf`,
`hf_config_of`), its Hugging Face tensor names (`hf_name_map`), its position limit and layer
count, its default poolings and its pair input for cross-encoders, its *ForSequenceClassification
layouts, and which config.json fields must hold what (`config_fields`, read by
`checkpoint_checks.check_hf_config` before any tensor). `sentemb_jax.models` lists the families;
encoders, checkpoints, checks and exporters ask `family_of(config)` and never test a config's
class (tests/test_architecture.py greps for it). Adding a family: docs/ARCHITECTURE.md.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

Path = tuple[str, ...]
NameMap = dict[str, tuple[Path, bool]]  # HF tensor name -> (our param path, layers unstacked; transpose?)


def strip_base_prefix(name: str, prefixes: tuple[str, ...]) -> str:
    """A *For... checkpoint's base-model tensor name (`bert.encoder...`) as the base model's own."""
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def token_id(hf_config, name: str, default: int) -> int:
    """A token id of transformers' config, `default` where it is unset (None)."""
    value = getattr(hf_config, name, None)
    return default if value is None else int(value)


@dataclasses.dataclass(frozen=True)
class ConfigFields:
    """config.json fields and what they must hold (checkpoint_checks.check_hf_config)."""

    sizes: tuple[str, ...] = ()  # positive integers
    token_ids: tuple[str, ...] = ()  # integers in [0, vocab_size)
    dropouts: tuple[str, ...] = ()  # probabilities in [0, 1)
    epsilons: tuple[str, ...] = ()  # numbers > 0
    # (hidden, heads): hidden must be a multiple of heads (BERT-style layouts derive the head size)
    divisible: tuple[str, str] | None = None
    # Problems beyond the per-field ones (a list of phrases; [] when consistent).
    check: Callable[[dict], list[str]] = lambda hf: []


@dataclasses.dataclass(frozen=True)
class SequenceClassifier:
    """A one-logit *ForSequenceClassification layout: `architecture` in config.json, the base
    model's tensors under `prefix`, the head as `dense` (tanh) then `out` (to the logit).
    `head_from_pooler`: a new head starts from the checkpoint's pooler (BERT does; RoBERTa's and
    MPNet's heads are new)."""

    architecture: str
    prefix: str
    dense: str
    out: str
    head_from_pooler: bool = False


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    config_type: type
    module_type: type
    model_types: tuple[str, ...]  # config.json model_type values read as this family
    # (config.json dict, transformers' config of it, tensor names in the weights) -> our config
    config_from_hf: Callable[[dict, Any, frozenset], Any]
    hf_config_of: Callable[[Any], dict]  # our config -> a config.json that reads back as it
    hf_name_map: Callable[[Any], NameMap]
    layers_field: str  # the encoder's layer count: the same field name in our config and config.json
    config_fields: ConfigFields
    position_limit: Callable[[Any], int | None] = lambda cfg: None  # tokens a text may have; None: no table
    base_prefixes: tuple[str, ...] = ()  # the base model's prefix in *ForMaskedLM ... checkpoints
    # regex of the tensors a file of this config may hold that are no parameters (buffers, tied copies)
    ignored_tensors: Callable[[Any], str] = lambda cfg: r"^$"
    head_tensors: str | None = None  # regex: task heads of *For... checkpoints, ignored with a warning
    # Poolings beyond the token / layer poolers this config can give (sentemb_jax.pooling).
    extra_poolings: Callable[[Any], tuple[str, ...]] = lambda cfg: ()
    default_pooling: tuple[str, ...] = ("mean",)
    cross_pooling: str = "pooler"  # a new cross-encoder head's pooling
    cross_poolings: tuple[str, ...] = ("first", "mean", "pooler")
    # A pair as one text (T5 has no pair template), else the tokenizer's pair template and token types.
    pair_format: str | None = None
    sequence_classifiers: dict[str, SequenceClassifier] = dataclasses.field(default_factory=dict)

    def layers(self, cfg) -> int:
        return getattr(cfg, self.layers_field)

    def first_layers(self, cfg, layers: int):
        """`cfg` with its first `layers` encoder layers; the config.json field has the same name."""
        return dataclasses.replace(cfg, **{self.layers_field: layers})
