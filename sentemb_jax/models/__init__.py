"""Flax backbones, one module per family (T5; BERT, RoBERTa and MiniLM; MPNet), each with its
Hugging Face names and config translation (models.family)."""
from sentemb_jax.models import bert, mpnet, t5
from sentemb_jax.models.bert import Bert, BertConfig
from sentemb_jax.models.family import Family, SequenceClassifier
from sentemb_jax.models.mpnet import MPNet, MPNetConfig
from sentemb_jax.models.t5 import T5, T5Config

FAMILIES: tuple[Family, ...] = (t5.FAMILY, bert.FAMILY, mpnet.FAMILY)
ModelConfig = T5Config | BertConfig | MPNetConfig
MODEL_TYPES = {model_type: family for family in FAMILIES for model_type in family.model_types}


def family_of(config) -> Family:
    """The family of a backbone config."""
    for family in FAMILIES:
        if type(config) is family.config_type:
            return family
    raise TypeError(f"unknown backbone config {type(config).__name__}")


def family_for(model_type) -> Family | None:
    """The family that reads config.json's `model_type` (None: no family does)."""
    return MODEL_TYPES.get(model_type)


def build_model(config: ModelConfig):
    """The Flax module for a backbone config."""
    return family_of(config).module_type(config)


__all__ = ["Bert", "BertConfig", "MPNet", "MPNetConfig", "T5", "T5Config", "ModelConfig", "FAMILIES", "Family",
           "SequenceClassifier", "family_of", "family_for", "build_model"]
