"""TF SavedModel export: sentences in, L2-normalised embeddings out, tokenised inside the graph.

    python -m sentemb_jax.main --gin_file=gin/runs/export_savedmodel.gin --gin.MODEL_PATH="'runs/x/student'" \
        --gin.EXPORT_DIR="'/tmp/savedmodel'"

    m = tf.saved_model.load(dir)
    m.signatures["serving_default"](text=tf.constant(["a sentence", ...]))["embeddings"]    # [batch, dim]
    m.signatures["embed_ids"](input_ids=ids, attention_mask=mask)["embeddings"]
    m(tf.constant(["a sentence", ...]))[0]                                                   # [batch, dim]

    encoder = hub.KerasLayer(dir)              # tensorflow_hub (tf_keras), as Sentence-T5's TF Hub models
    (embeddings,) = encoder(tf.constant(["a sentence", ...]))

`__call__` takes a string tensor [batch] and returns a list of one tensor, the embeddings: the
calling convention of Sentence-T5's TF Hub models (`encoder(sentences)[0]`). The SavedModel also
has `variables` (the weights) and an empty `trainable_variables`, as TF Hub's reusable SavedModels:
it is for inference (hub.KerasLayer(dir, trainable=True) has nothing to train).

The model's forward is our Flax module converted with jax2tf (batch- and length-polymorphic),
its weights tf.Variables. The text signature tokenises with the same in-graph tokenizers as the
seqio pipeline (sentemb_jax.data.vocab: tensorflow-text WordPiece for BERT-family, whose ids equal
Hugging Face's; SentencePiece for T5), adds the special tokens, truncates to the model's max length
and pads to the batch's longest text.
"""
from __future__ import annotations

import logging
import os

import jax
import numpy as np

from sentemb_jax import validation
from sentemb_jax.dependencies import require_tensorflow
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.locking import DirectoryLock
from sentemb_jax.paths import is_remote
from sentemb_jax.pooling import l2_normalize
from sentemb_jax.st_layout import transformer_dir_of

log = logging.getLogger(__name__)


def export_savedmodel(model_path: str, out_dir: str, max_length: int | None = None, normalize: bool = True,
                      pooling: str | None = None, platforms: tuple[str, ...] = ("cpu",), overwrite: bool = False) -> str:
    """Write the SavedModel of the sentence encoder in `model_path` (HF / sentence-transformers
    directory; `pooling` as in SentenceEncoder.from_pretrained) to `out_dir`; returns out_dir.
    platforms: where the serialised model may run (jax2tf native serialisation), e.g.
    ("cpu", "cuda", "tpu") for a model served on accelerators too.
    overwrite: replace a non-empty out_dir (refused otherwise, before any work). The export is
    written to a temporary directory beside it and renamed into place: no mix of two exports; a
    second export into the same out_dir meanwhile is refused (`<out_dir>.sentemb.lock`, locking)."""
    validation.require_int(max_length, "sentemb_jax.export_savedmodel", "max_length", 1, allow_none=True,
                           none_means=" (the model's own)")
    require_tensorflow("sentemb_jax.export_savedmodel (a TF SavedModel)",
                       instead="export a sentence-transformers directory (SentenceEncoder.save) or ONNX without it")
    import tensorflow as tf  # lazy: the SavedModel export is where TensorFlow is the tool
    from jax.experimental import jax2tf  # lazy: imports TensorFlow

    from sentemb_jax.data.vocab import tokenizer_spec_for  # lazy: in-graph tokenisation (TensorFlow Text)

    # One writer: the export replaces out_dir whole (a rename), so its lock is a file beside it.
    with DirectoryLock(out_dir, "export directory", lock_path=None if is_remote(out_dir) else f"{out_dir.rstrip('/')}.sentemb.lock",
                       job="export_savedmodel"):
        if tf.io.gfile.exists(out_dir) and tf.io.gfile.listdir(out_dir) and not overwrite:
            raise ValueError(f"{out_dir}: not empty (an earlier export?); give export_savedmodel.overwrite=True "
                             "to replace it")
        _export(tf, jax2tf, tokenizer_spec_for, model_path, out_dir, max_length, normalize, pooling, platforms)
    return out_dir


def _export(tf, jax2tf, tokenizer_spec_for, model_path, out_dir, max_length, normalize, pooling, platforms) -> None:
    encoder = SentenceEncoder.from_pretrained(model_path, pooling=pooling, max_seq_length=max_length)
    spec = tokenizer_spec_for(transformer_dir_of(model_path))
    length = encoder.max_seq_length
    module = encoder.module

    def embed(params, ids, mask):
        out = module.apply({"params": params}, ids, mask).astype(np.float32)
        return l2_normalize(out) if normalize else out

    params = jax.device_get(encoder.params)
    tf_embed = jax2tf.convert(embed, polymorphic_shapes=[None, "(b, l)", "(b, l)"], native_serialization_platforms=tuple(platforms))
    variables = tf.nest.map_structure(tf.Variable, params)
    prefix = tf.constant(spec.prefix_ids, tf.int32)
    suffix = tf.constant(spec.suffix_ids, tf.int32)
    budget = length - len(spec.prefix_ids) - len(spec.suffix_ids)

    class Exported(tf.Module):
        variables = trainable_variables = None  # attributes here (tf.Module has properties): TF Hub reads them

        def __init__(self):
            super().__init__()
            self.params = variables  # tracked: saved with the graph
            self.variables = tf.nest.flatten(variables)
            self.trainable_variables = []
            # The WordPiece lookup table is a TF resource the text signature captures: tracked, so
            # the SavedModel saves (and re-creates) it. SentencePiece keeps its model in the op.
            self.vocab_table = getattr(spec.vocabulary, "table", None)

        # autograph=False: autograph would rewrite jax2tf's Python (jax internals) line by line;
        # nothing here branches on a tensor. Export 36 s -> 3 s for a tiny T5, same SavedModel outputs.
        @tf.function(autograph=False, input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids"),
                                                       tf.TensorSpec([None, None], tf.int32, name="attention_mask")])
        def embed_ids(self, input_ids, attention_mask):
            return {"embeddings": tf_embed(self.params, input_ids, attention_mask)}

        @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, text):
            body = spec.vocabulary.encode_tf(text)  # ragged [batch, pieces]
            body = tf.cast(body[:, :budget], tf.int32)
            n = tf.shape(text)[0]
            ids = tf.concat([tf.RaggedTensor.from_tensor(tf.tile(prefix[None], [n, 1])), body,
                             tf.RaggedTensor.from_tensor(tf.tile(suffix[None], [n, 1]))], axis=1)
            mask = tf.ones_like(ids)
            ids = ids.to_tensor(default_value=spec.pad_id)
            mask = mask.to_tensor(default_value=0)
            return {"embeddings": tf_embed(self.params, ids, mask)}

        @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def __call__(self, text):
            return [self.serve(text)["embeddings"]]

    exported = Exported()
    staging = f"{out_dir.rstrip('/')}.tmp-{os.getpid()}"
    tf.saved_model.save(exported, staging, signatures={"serving_default": exported.serve, "embed_ids": exported.embed_ids})
    _replace_dir(staging, out_dir)
    log.info("SavedModel of %s (max length %d, dim %d) written to %s", model_path, length,
             encoder.get_sentence_embedding_dimension(), out_dir)


def _replace_dir(staging: str, out_dir: str) -> None:
    """Move a finished export into place; an earlier one is moved aside first and deleted after."""
    import tensorflow as tf  # lazy: imported by the export before this runs (tf.io.gfile: any filesystem)

    aside = None
    if tf.io.gfile.exists(out_dir):
        aside = f"{out_dir.rstrip('/')}.old-{os.getpid()}"
        tf.io.gfile.rename(out_dir, aside)
    tf.io.gfile.rename(staging, out_dir)
    if aside:
        tf.io.gfile.rmtree(aside)


