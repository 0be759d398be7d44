"""`SentenceEncoder`: load a Hugging Face or sentence-transformers directory and encode text.

    enc = SentenceEncoder.from_pretrained("path/to/all-MiniLM-L6-v2")
    emb = enc.encode(["A man is playing a guitar.", "Someone plays music."])  # [2, 384] float32
    enc.similarity(emb, emb)                                                   # [2, 2] cosine

`encode` keeps sentence-transformers' `SentenceTransformer.encode` contract (its keywords and
their semantics: sentemb_jax/encode_contract.py), and takes MTEB 1.x's `task_name` / `prompt_type`
(ignored), so it fits MTEB's custom-model protocol too.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from tqdm.auto import tqdm

from sentemb_jax import checkpoints, sharded_load, st_layout
from sentemb_jax import encode_contract as contract
from sentemb_jax.checkpoint_checks import staged_save
from sentemb_jax.errors import CheckpointError
from sentemb_jax.inference import (
    DeviceParams,
    chunk_texts,
    collect,
    compile_instead_of_run,
    default_batch_size,
    dispatch_length_sorted,
    dispatch_packed,
    params_for_compute,
    run_pipelined,
    shared_programs,
    warm_up_lengths,
)
from sentemb_jax.locking import DirectoryLock
from sentemb_jax.models import ModelConfig, family_of
from sentemb_jax.models.sentence import SentenceEmbedder, embedder_param_tree
from sentemb_jax.pooling import ENCDEC_FIRST, check_pooling_modes
from sentemb_jax.run_dir import BEST, CHECKPOINTS, ENCODER_JSON, checkpoint_manager
from sentemb_jax.tokenization import DEFAULT_BUCKETS, Tokenizer, check_ids_fit

log = logging.getLogger(__name__)

# Show a progress bar by default from this many sentences on.
_PROGRESS_MIN_SENTENCES = 2000


def _restore_state(manager, step: int):
    """A checkpoint's train state onto this host's first device, whatever topology wrote it."""
    meta = manager.item_metadata(step)["state"]
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
                                    getattr(meta, "tree", meta))
    return manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]


def _position_limit(cfg) -> int | None:
    """Tokens a backbone can take: its family's learned position table (None: relative positions
    only, as T5's)."""
    return family_of(cfg).position_limit(cfg)


def _within_positions(max_seq_length: int | None, cfg, path: str) -> int | None:
    """max_seq_length capped at the model's positions, as sentence-transformers caps it, and said:
    past the table the position lookup gives NaN embeddings."""
    limit = _position_limit(cfg)
    if max_seq_length is not None and max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
    if max_seq_length is not None and limit is not None and max_seq_length > limit:
        log.warning("%s: max_seq_length=%d is more than the model's %d positions; capped at %d",
                    path, max_seq_length, limit, limit)
        return limit
    return max_seq_length


def _stderr_is_terminal() -> bool:
    return bool(getattr(sys.stderr, "isatty", None) and sys.stderr.isatty())


def _last_hidden(module: SentenceEmbedder, input_ids, attention_mask):
    """The backbone's last hidden state [batch, length, hidden] (sentence-transformers' token_embeddings)."""
    return module.backbone.encode(input_ids, attention_mask, True, False)[0].astype(jnp.float32)


def _encode_programs(module: SentenceEmbedder) -> tuple:
    """encode's jitted programs: padded batches, packed rows, token embeddings."""
    return (jax.jit(lambda p, ids, mask: module.apply({"params": p}, ids, mask)),
            jax.jit(lambda p, a: module.apply({"params": p}, a["input_ids"], None, packing=a["packing"])),
            jax.jit(lambda p, ids, mask: module.apply({"params": p}, ids, mask, method=_last_hidden)))


class SentenceEncoder(contract.ModelSettings):
    """A sentence embedding model: tokenizer + Flax SentenceEmbedder + params, with
    sentence-transformers' model-level settings (prompts, default_prompt_name, similarity_fn_name,
    truncate_dim: `encode_contract.ModelSettings`) and its `similarity` / `similarity_pairwise`."""

    params = DeviceParams()

    def __init__(self, module: SentenceEmbedder, params: dict, tokenizer: Tokenizer, hf_config: dict | None = None,
                 **settings):
        self.module = module
        self.params = params
        self.tokenizer = tokenizer
        self.hf_config = hf_config or {}
        self._init_settings(**settings)
        self._embed, self._embed_packed, self._tokens = shared_programs(_encode_programs, module)
        # encode's batching: True (default), texts packed end to end in rows (sentemb_jax.inference):
        # the padded path's embeddings within 1e-5, fewer token slots, faster on every CPU measured
        # (docs/RESULTS.md); False, length-sorted batches padded to a bucket.
        self.packed = True
        # Texts encode tokenises at a time, the next chunk while the device runs this one
        # (inference.run_pipelined); None: inference.chunk_texts' default (an accelerator: 4,096
        # or 8 batches; the CPU: all in one).
        self.texts_per_chunk: int | None = None

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        pooling: str | Sequence[str] | None = None,
        normalize: bool | None = None,
        max_seq_length: int | None = None,
        dtype: Any = None,
        allow_pickle: bool = False,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
        similarity_fn_name: str | None = None,
        truncate_dim: int | None = None,
        read_backbone: bool = True,
        **config_overrides,
    ) -> "SentenceEncoder":
        """Load a Hugging Face model directory or a sentence-transformers directory.

        sentence-transformers' modules.json is honoured (Transformer, Pooling, Dense, Normalize);
        arguments given here override it. A plain HF directory defaults to mean pooling.
        prompts, default_prompt_name, similarity_fn_name, truncate_dim: as SentenceTransformer's;
        those given here win over config_sentence_transformers.json's (prompts: name by name).
        read_backbone=False (safetensors weights only; not for a run directory): the backbone's params
        are jax.ShapeDtypeStruct leaves made from config.json and the file headers, no tensor read
        (every header check made); the train setup reads them into the mesh's shardings, each device
        its own slice (sharded_load.load_backbone). The tokenizer and the Dense projection load as usual.
        """
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise CheckpointError(f"{path}: no such model directory")
        if os.path.isfile(os.path.join(path, ENCODER_JSON)):  # a run: the settings of the model it started from
            encoder = cls.from_run(path, max_seq_length=max_seq_length)
            encoder._init_settings(prompts, default_prompt_name, similarity_fn_name, truncate_dim,
                                   encoder.include_prompt, config=encoder._settings())
            return encoder
        st_config = contract.read_st_config(path)
        layout = st_layout.read_layout(path)
        if dtype is not None:
            config_overrides.setdefault("dtype", jnp.dtype(dtype))
        if read_backbone:
            cfg, backbone_params, hf = checkpoints.load_hf_checkpoint(
                layout.transformer_dir, allow_pickle=allow_pickle, **config_overrides
            )
        else:  # shapes only: a model larger than one host's memory is never read whole
            cfg, backbone_params, hf = sharded_load.abstract_checkpoint(layout.transformer_dir, **config_overrides)
        modes = check_pooling_modes(pooling if pooling is not None else (layout.pooling or family_of(cfg).default_pooling))
        if ENCDEC_FIRST in modes and ENCDEC_FIRST not in family_of(cfg).extra_poolings(cfg):
            raise CheckpointError(f"{path}: pooling {ENCDEC_FIRST!r} needs a T5 checkpoint with a decoder")
        projection, proj_dim, proj_bias, proj_act = None, None, False, None
        if len(layout.dense_dirs) > 1:
            raise CheckpointError(f"{path}: more than one Dense module is not supported")
        if layout.dense_dirs:
            width = _pooled_width(cfg, modes)
            projection, proj_dim, proj_bias, proj_act = st_layout.read_dense(layout.dense_dirs[0], width, allow_pickle)
        module = SentenceEmbedder(
            backbone_config=cfg, pooling=modes, projection_dim=proj_dim, projection_bias=proj_bias,
            projection_activation=proj_act, normalize=layout.normalize if normalize is None else normalize,
        )
        tokenizer = Tokenizer.from_pretrained(
            layout.transformer_dir, max_length=_within_positions(layout.max_seq_length if max_seq_length is None else max_seq_length, cfg, path),
            buckets=buckets, lowercase=layout.lowercase,
        )
        check_ids_fit(tokenizer, cfg.vocab_size, layout.transformer_dir)
        if tokenizer.max_length > (_position_limit(cfg) or tokenizer.max_length):  # the tokenizer's own default
            tokenizer = Tokenizer(tokenizer.hf, _position_limit(cfg), buckets, tokenizer.lowercase, tokenizer.source_dir)
        return cls(module, embedder_param_tree(backbone_params, projection), tokenizer, hf, prompts=prompts,
                   default_prompt_name=default_prompt_name, similarity_fn_name=similarity_fn_name,
                   truncate_dim=truncate_dim, include_prompt=layout.include_prompt, config=st_config)

    @classmethod
    def from_run(cls, run_dir: str, which: str = "best", max_seq_length: int | None = None) -> "SentenceEncoder":
        """The tower of a training run (its MODEL_DIR): the best checkpoint by STS-B dev
        (`which='best'`, falling back to the latest) or the latest one, on the architecture the
        run recorded in MODEL_DIR/encoder.json (the model it started from, layers kept, head)."""
        arch = st_layout.read_json(os.path.join(run_dir, ENCODER_JSON))
        if not arch.get("init_from"):
            raise CheckpointError(f"{run_dir}: a run trained from scratch records no model directory to rebuild its "
                                  "tower from; export it with sentemb_jax.train.export_dir (a sentence-transformers directory)")
        encoder = cls.from_pretrained(arch["init_from"], pooling=arch.get("pooling"), max_seq_length=max_seq_length,
                                      **arch.get("config_overrides", {}))
        if arch.get("init_layers"):
            encoder = encoder.first_layers(arch["init_layers"])
        if arch.get("projection_dim"):
            module = encoder.module.clone(projection_dim=arch["projection_dim"], projection_bias=True,
                                          projection_activation=arch.get("projection_activation"))
            encoder = cls(module, None, encoder.tokenizer, encoder.hf_config, **encoder._settings())
        restored, damaged = None, []
        for kind in (BEST, CHECKPOINTS) if which == "best" else (CHECKPOINTS,):
            manager = checkpoint_manager(run_dir, kind, create=False,
                                         item_handlers={"state": ocp.StandardCheckpointHandler()})
            for step in sorted(manager.all_steps(), reverse=True):  # a damaged newest one: the one before
                try:
                    restored = _restore_state(manager, step)
                    break
                except Exception as e:  # noqa: BLE001 - orbax / TensorStore raise many kinds for a damaged step
                    damaged.append(f"{kind}/{step}")
                    log.warning("%s/%s/%d cannot be restored (%s); trying the one before", run_dir, kind, step,
                                str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
            if restored is not None:
                break
        if restored is None:
            raise CheckpointError(f"{run_dir}: no checkpoint under {run_dir}/best or {run_dir}/checkpoints"
                                  + (f" that can be restored (damaged: {', '.join(damaged)})" if damaged else ""))
        tower = restored["params"]["tower"]
        if encoder.params is not None:
            want = jax.tree_util.tree_structure(encoder.params)
            if jax.tree_util.tree_structure(tower) != want:
                raise CheckpointError(f"{run_dir}/{kind}/{step}: its tower does not match the architecture in {ENCODER_JSON}")
        encoder.params = jax.tree_util.tree_map(np.asarray, tower)
        log.info("tower of %s: %s step %d", run_dir, kind, step)
        return encoder

    @property
    def config(self) -> ModelConfig:
        return self.module.backbone_config

    @property
    def max_seq_length(self) -> int:
        return self.tokenizer.max_length

    def get_sentence_embedding_dimension(self) -> int:
        if self.module.projection_dim:
            return self.module.projection_dim
        return _pooled_width(self.config, self.module.pooling)

    # ------------------------------------------------------------------ encoding

    def encode(
        self,
        sentences: str | Sequence[str],
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        output_value: str | None = "sentence_embedding",
        precision: str = "float32",
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        device: Any = None,
        normalize_embeddings: bool | None = None,
        truncate_dim: int | None = None,
        pool: None = None,
        chunk_size: None = None,
        normalize: bool | None = None,
        **kwargs,
    ):
        """Embeddings of `sentences` in their order, as sentence-transformers' SentenceTransformer.encode
        (6.2.0) gives them: by default float32 [n, dim] numpy (a single str gives [dim]). The model's
        own modules run first (Pooling, Dense, and Normalize when modules.json has one); then:

        prompt_name / prompt: `prompt` (or `self.prompts[prompt_name]`, else the default prompt
            name's) is put before each sentence; `prompt` wins over `prompt_name`; an unknown
            prompt_name raises, naming the prompts there are.
        batch_size: texts per forward pass (sorted by token length so that each batch pads little;
            packed, the default batching, a block of batch_size x 24 token slots). Default (None):
            64 on the CPU (sentence-transformers' default), 1,024 on a GPU or other accelerator
            (`jax.default_backend() != 'cpu'`). There texts are tokenised in chunks (the attribute
            `texts_per_chunk`, default max(4,096, 8 batches)), the next while the device runs the
            current one; on the CPU all at once unless `texts_per_chunk` is set.
        show_progress_bar: True / False; None (default): a bar for 2,000+ texts on a terminal.
        output_value: 'sentence_embedding', or 'token_embeddings' (a list of [tokens_i, hidden]
            arrays, the backbone's last hidden state up to each text's last token; truncate_dim,
            normalize_embeddings and convert_to_* do not apply). Others (None) raise.
        truncate_dim: keep the first truncate_dim dimensions (default: self.truncate_dim), before
            normalize_embeddings normalises.
        normalize_embeddings: L2-normalise the (truncated) embeddings; default False.
            `normalize` is its older name (the same switch); both given must agree.
        precision: 'float32', 'int8', 'uint8', 'binary' or 'ubinary', quantised as
            sentence_transformers.quantize_embeddings does with no calibration: int8 / uint8
            ranges from the embeddings of this call (so one text cannot be quantised to int8).
        convert_to_tensor: one JAX array; else convert_to_numpy: one numpy array; else a list of
            JAX arrays (one per text).
        device: accepted and ignored (JAX places the computation on its default device).
        pool, chunk_size: multi-process encoding, not supported (only None).
        task_name, prompt_type: MTEB 1.x's protocol keywords, accepted and ignored.
        Any other keyword raises TypeError. An empty list gives [0, dim] (sentence-transformers: [0]).

        sentences: a str (or {'text': str}) gives one embedding; a list, a tuple or a numpy array of
            them gives [n, dim]; anything else (a set, bytes, a generator, a dict of other keys)
            raises InputTypeError, a TypeError and a ValueError, as sentence-transformers raises
            (`encode_contract.check_inputs`). truncate_dim above the embedding dimension keeps every
            dimension, with a warning.
        """
        where = "SentenceEncoder.encode"
        contract.check_keywords(kwargs, pool, chunk_size, where)
        texts, single = contract.check_inputs(sentences, where)
        batch_size = contract.check_batch_size(default_batch_size() if batch_size is None else batch_size, where)
        normalize = contract.resolve_normalize(normalize_embeddings, normalize, where)
        precision = contract.check_options(output_value, precision, convert_to_numpy, convert_to_tensor,
                                           show_progress_bar, where)
        truncate_dim = contract.check_truncate_dim(
            self.truncate_dim if truncate_dim is None else truncate_dim, where,
            dim=self.get_sentence_embedding_dimension() if output_value == "sentence_embedding" else None)
        texts = contract.with_prompt(texts, self, prompt, prompt_name, where)
        # Default: a bar for long inputs on a terminal only (a log file gets no carriage-return frames).
        show = (len(texts) >= _PROGRESS_MIN_SENTENCES and _stderr_is_terminal()) if show_progress_bar is None \
            else show_progress_bar
        if output_value == "token_embeddings":
            return contract.finish_token_embeddings(self._token_embeddings(texts, batch_size, show), precision, single)
        return contract.finish_sentence_embeddings(
            self._sentence_embeddings(texts, batch_size, show), truncate_dim=truncate_dim, normalize=normalize,
            precision=precision, convert_to_numpy=convert_to_numpy, convert_to_tensor=convert_to_tensor, single=single)

    def _sentence_embeddings(self, texts: list[str], batch_size: int, show: bool) -> np.ndarray:
        """float32 [len(texts), dim]: the model's output (its Normalize module included)."""
        dim = self.get_sentence_embedding_dimension()
        if not texts:
            return np.zeros((0, dim), np.float32)
        params, few = params_for_compute(self), len(texts) < batch_size
        return run_pipelined(texts, self.tokenizer.tokenize, chunk_texts(batch_size, self.texts_per_chunk),
                             lambda ids, final: self._dispatch(ids, batch_size, params, few, final), (dim,), show, "encode")

    def _embed_token_lists(self, ids: list[list[int]], batch_size: int, compile_only: bool = False) -> np.ndarray:
        pending, _ = self._dispatch(ids, batch_size, params_for_compute(self), len(ids) < batch_size, True, compile_only)
        return collect(pending, len(ids), (self.get_sentence_embedding_dimension(),))

    def _dispatch(self, ids: list[list[int]], batch_size: int, params, few: bool, final: bool, compile_only: bool = False):
        """One chunk's blocks (packed) or batches (padded) dispatched, not fetched: (pending results,
        indices held back for the next chunk), as inference.dispatch_packed gives them."""
        embed_packed, embed_padded = self._embed_packed, self._embed
        if compile_only:
            embed_packed, embed_padded = compile_instead_of_run(embed_packed), compile_instead_of_run(embed_padded)
        if self.packed and all(ids):
            return dispatch_packed(ids, batch_size, lambda arrays: embed_packed(params, jax.device_put(arrays)),
                                   self.tokenizer.pad_id, buckets=self.tokenizer.buckets, few=few, final=final)

        def embed(chunk, rows):
            return embed_padded(params, *self._padded_on_device([ids[i] for i in chunk], rows))

        return dispatch_length_sorted([len(x) for x in ids], batch_size, embed, few=few, final=final,
                                      buckets=self.tokenizer.buckets)

    def _padded_on_device(self, token_lists: list[list[int]], rows: int):
        """(input_ids, attention_mask) of `token_lists` padded to `rows` rows, put on the device."""
        batch = self.tokenizer.pad(token_lists, batch_size=rows)
        return jax.device_put((batch["input_ids"], batch["attention_mask"]))

    def warm_up(self, batch_size: int | None = None, max_length: int | None = None, run: bool = False) -> int:
        """Compile encode's shapes before the first call (JAX compiles each new shape on first use):
        full batches of `batch_size` (default: encode's, 64 on the CPU, 1,024 on an accelerator) at
        every bucket up to `max_length` (default: the model's), in the
        current batching (`packed` or padded). Returns how many lengths were warmed. Afterwards an
        encode call with that batch size runs at steady-state speed from its first batch (packed:
        except texts longer than inference.PACK_ROW_LENGTH (64) tokens in a bucket other than their block's longest).
        It compiles without running (`inference.compile_instead_of_run`): MiniLM at batch 64 in 8.7 s
        instead of 30 s (AMD EPYC, 2 cores). The first run of each executable then still costs
        ~0.1 s more than the next; `run=True` also runs every shape once, to pay that too."""
        batch_size = default_batch_size() if batch_size is None else batch_size
        lengths = warm_up_lengths(self.tokenizer, max_length)
        for n in lengths:
            self._embed_token_lists([[self.tokenizer.pad_id] * n] * batch_size, batch_size, compile_only=not run)
        return len(lengths)

    def _token_embeddings(self, texts: list[str], batch_size: int, show: bool) -> list[np.ndarray]:
        """float32 [tokens_i, hidden] per text: the backbone's last hidden state over the text's tokens."""
        if not texts:
            return []
        ids = self.tokenizer.tokenize(texts)
        order = np.argsort([-len(x) for x in ids], kind="stable")
        rows = batch_size if len(ids) >= batch_size else 1 << (len(ids) - 1).bit_length()
        out: list[np.ndarray] = [None] * len(ids)  # type: ignore[list-item]
        params = params_for_compute(self)
        for start in tqdm(range(0, len(ids), batch_size), desc="encode", disable=not show, unit="batch"):
            chunk = order[start : start + batch_size]
            hidden = np.asarray(self._tokens(params, *self._padded_on_device([ids[i] for i in chunk], rows)))
            for row, i in enumerate(chunk):
                out[i] = hidden[row, : len(ids[i])]
        return out

    def first_layers(self, layers: int) -> "SentenceEncoder":
        """This model with only its first `layers` encoder layers (layer dropping: a student
        initialised from its teacher, as ConGen / SCT's students)."""
        cfg = self.config
        family = family_of(cfg)
        have = family.layers(cfg)
        if not 0 < layers <= have:
            raise ValueError(f"first_layers({layers}): the model has {have} encoder layers")
        if getattr(cfg, "scan_layers", False):
            raise ValueError("first_layers: unsupported for scanned layers (load with scan_layers=False)")
        backbone = dict(self.params["backbone"])
        stack = {k: v for k, v in backbone["encoder"].items()
                 if not (k.startswith("layers_") and int(k.split("_")[1]) >= layers)}
        backbone["encoder"] = stack
        # The HF config names the field as our configs do (family.layers_field).
        return SentenceEncoder(self.module.clone(backbone_config=family.first_layers(cfg, layers)),
                               {**self.params, "backbone": backbone}, self.tokenizer,
                               {**self.hf_config, family.layers_field: layers},
                               **self._settings())

    # ------------------------------------------------------------------ saving

    def save_pretrained(self, out_dir: str) -> None:
        """A sentence-transformers directory (Transformer at the root, Pooling, Dense, Normalize, and
        config_sentence_transformers.json with the prompts, default_prompt_name, similarity_fn_name
        and truncate_dim) that `SentenceEncoder.from_pretrained` and sentence-transformers load.
        One writer at a time: `out_dir/.sentemb.lock` is held while it is written (locking); written
        aside, then moved in (staged_save): an interrupted save leaves `out_dir` as it was."""
        os.makedirs(out_dir, exist_ok=True)
        with DirectoryLock(out_dir, "export directory", job="save_pretrained"):
            staged_save(out_dir, self._save_pretrained)

    def _save_pretrained(self, out_dir: str) -> None:
        params = jax.device_get(self.params)
        checkpoints.save_hf_checkpoint(out_dir, self.config, params["backbone"],
                                       self.hf_config or checkpoints.hf_config_of(self.config))  # {}: from scratch
        self.tokenizer.save_pretrained(out_dir)
        st_layout.write_json(os.path.join(out_dir, "sentence_bert_config.json"),
                    {"max_seq_length": self.max_seq_length, "do_lower_case": self.tokenizer.lowercase})
        legacy = dict((name, key) for key, name in st_layout.ST_LEGACY_POOLING)
        width = _pooled_width(self.config, self.module.pooling)
        pooling = {"word_embedding_dimension": self.config.hidden_size}
        if all(m in legacy for m in self.module.pooling) and len(self.module.pooling) == len(set(self.module.pooling)):
            pooling.update({key: name in self.module.pooling for key, name in st_layout.ST_LEGACY_POOLING})
        else:
            pooling["pooling_mode"] = list(self.module.pooling)
        if not self.include_prompt:
            pooling["include_prompt"] = False
        modules = [("", "sentence_transformers.models.Transformer"), ("1_Pooling", "sentence_transformers.models.Pooling")]
        st_layout.write_json(os.path.join(out_dir, "1_Pooling", "config.json"), pooling)
        if self.module.projection_dim:
            dense_dir = os.path.join(out_dir, "2_Dense")
            act = {v: k for k, v in st_layout.ST_ACTIVATIONS.items()}[self.module.projection_activation]
            st_layout.write_json(os.path.join(dense_dir, "config.json"), {
                "in_features": width, "out_features": self.module.projection_dim,
                "bias": self.module.projection_bias, "activation_function": act})
            proj = params["projection"]
            tensors = {"linear.weight": np.asarray(proj["kernel"], np.float32).T}
            if self.module.projection_bias:
                tensors["linear.bias"] = np.asarray(proj["bias"], np.float32)
            checkpoints.write_safetensors(os.path.join(dense_dir, checkpoints.SAFETENSORS_FILE), tensors)
            modules.append(("2_Dense", "sentence_transformers.models.Dense"))
        if self.module.normalize:
            os.makedirs(os.path.join(out_dir, f"{len(modules)}_Normalize"), exist_ok=True)
            modules.append((f"{len(modules)}_Normalize", "sentence_transformers.models.Normalize"))
        st_layout.write_json(os.path.join(out_dir, "modules.json"),
                    [{"idx": i, "name": str(i), "path": path, "type": kind} for i, (path, kind) in enumerate(modules)])
        st_layout.write_json(os.path.join(out_dir, contract.ST_CONFIG), self._st_config())

    def __repr__(self) -> str:
        c = self.config
        return (f"SentenceEncoder({type(c).__name__}, pooling={self.module.pooling}, dim={self.get_sentence_embedding_dimension()}, "
                f"max_seq_length={self.max_seq_length})")


def _pooled_width(cfg: ModelConfig, modes: Sequence[str]) -> int:
    return cfg.hidden_size * len(tuple(modes))
