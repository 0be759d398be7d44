"""Flax backbones (T5, BERT-family) and their Hugging Face checkpoint mapping."""
from sentemb_jax.models.bert import Bert, BertConfig
from sentemb_jax.models.t5 import T5, T5Config

ModelConfig = T5Config | BertConfig


def build_model(config: ModelConfig):
    """The Flax module for a backbone config."""
    if isinstance(config, T5Config):
        return T5(config)
    if isinstance(config, BertConfig):
        return Bert(config)
    raise TypeError(f"unknown backbone config {type(config).__name__}")


__all__ = ["Bert", "BertConfig", "T5", "T5Config", "ModelConfig", "build_model"]
