"""Queue-based distillation on the train loop: ConGen, SCT (self-supervised and distillation), and
ConGen's baselines L2, Dual-L2, SKD, CKD - one switch, `QueueDistillConfig.method`.

    python -m sentemb_jax.main --gin_file=gin/congen.gin --gin.MODEL_DIR="'/tmp/congen'"

Each batch holds two views of every sentence of a `sentences` task: view1 = the sentence
(ConGen's control view x1, the one the teacher embeds), view2 = its augmentation (the generalize
view x2, e.g. 10% word deletion). The teacher's view1 embeddings of the whole file are computed
once and cached on disk under a key of the teacher's weights and the file's texts (never reused
across teachers or data); `row_id` picks each batch's rows.

* congen: alpha CE(P_ref^T, P_con^S) + (1 - alpha) CE(P_ref^T, P_gen^S) over the teacher queue.
* l2: MSE(z_ref^T, z_con^S); dual_l2: + MSE(z_ref^T, z_gen^S); skd: + MSE(z_con^S, z_gen^S).
* ckd: InfoNCE of z_con^S against the teacher queue, the positive being z_ref^T (Wu et al. 2021).
* sct: an MLP projector on the student; references = the student's own encoder outputs under
  stop-gradient (identical weights, SCT Sec. 3.1), queues D1 / D2 of the two views' references,
  the cross-view KL of SCT eq. 2; queues start as random unit vectors.
* sct_distill: the teacher's view1 and view2 embeddings fill D1 / D2, and L_CD (eq. 4) is added
  to L_SCT (eq. 3). A view2 fixed per sentence (`fixed:word_deletion`, or a `column:` of
  back-translations as in the paper) is embedded once and cached like view1; a view2 drawn anew
  each epoch is embedded by the teacher (eval mode) inside the step.
The queue is FIFO inside the jitted step (sentemb_jax.methods.instance_queue): the batch's
teacher / reference embeddings go in first, then the distributions are taken over the queue
(ConGen Sec. 3: "dequeue the first m entries ... enqueue z_ref^T of each batch sample").
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import gin
from sentemb_jax import losses, partitioning
from sentemb_jax import validation as v
from sentemb_jax.data.tasks import sentence_texts, sentence_views, view_texts
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.methods import instance_queue
from sentemb_jax.methods.ensemble import EnsembleEncoder
from sentemb_jax.pooling import l2_normalize
from sentemb_jax.training import sharded
from sentemb_jax.training.step import apply_gradients, embed_packed, embed_side, side_features

log = logging.getLogger(__name__)
Array = jax.Array
METHODS = ("congen", "l2", "dual_l2", "skd", "ckd", "sct", "sct_distill", "ensemble")
_TEACHER_QUEUE = ("congen", "ckd")  # one queue of the teacher's view1 embeddings
_SCT = ("sct", "sct_distill")
_L2_BASELINES = ("l2", "dual_l2", "skd")
SIDES = ("view1", "view2")
HEADS = ("always", "when_widths_differ", "never")
REFERENCE_PASSES = ("separate", "online", "separate_no_dropout")


@gin.configurable(module="sentemb_jax")
@dataclasses.dataclass(frozen=True)
class QueueDistillConfig:
    """Defaults: ConGen's Table 7, MiniLM-L3 row (tau_T 0.05, tau_S 0.07, K 16384, lr 5e-4 in
    gin/congen.gin; alpha 0.5 from the CPU reference run) and SCT's Table 1 for BERT-Small (tau_ref 0.02,
    tau_theta 0.03, K 65536, projector expansion 10)."""

    method: str = "congen"
    teacher: str | tuple[str, ...] | None = None  # a model directory (several: their ensemble); not used by `sct`
    teacher_weights: tuple[float, ...] | None = None  # the ensemble's weights (default uniform)
    queue_size: int = 16384
    queue_init: str | None = None  # 'data' (teacher embeddings of random rows; ConGen) / 'random' (SCT); None: by method
    teacher_temperature: float = 0.05
    student_temperature: float = 0.07
    alpha: float = 0.5
    reference_temperature: float = 0.02  # SCT tau_ref
    online_temperature: float = 0.03  # SCT tau_theta
    projector_layers: int = 3  # SCT: blocks of Linear(u -> u*w) ReLU Linear(u*w -> u)
    projector_expansion: int = 10
    # SCT's reference f_ref = the student's own weights under stop-gradient. 'separate' (SCT section
    # 3.1, "the views are again encoded by f_ref", as the authors' code): a second, no-gradient pass
    # with its own dropout mask; 'online': the online pass's outputs (same mask, no extra pass; the
    # earlier default); 'separate_no_dropout': a second pass with dropout off.
    reference_pass: str = "separate"
    shard_queue_min_entries: int = instance_queue.SHARD_MIN_ENTRIES
    cache_dir: str | None = None  # teacher embeddings (default ~/.cache/sentemb_jax/teacher_embeddings)
    teacher_batch_size: int = 128
    # method 'ensemble' (sentemb_jax.methods.ensemble): lambda InfoNCE(tau) + (1 - lambda) regression.
    ensemble_infonce_weight: float = 0.1
    ensemble_temperature: float = 0.3
    ensemble_regression: str = "mae"  # mae (eq. 4) / mse / smooth_l1 / kl (Table 4)
    # L2 / Dual-L2 / SKD: False (default) compares unit vectors on both sides, as ConGen's section
    # 3.1 defines every z; True, the earlier behaviour, the student's output as the model gives it
    # against the unit-length cached teacher rows (the same for a student ending in Normalize).
    l2_on_raw_output: bool = False
    # ConGen's student head, Linear + tanh to the teacher's width (every method but SCT, whose student
    # has its projector h instead): 'always' as ConGen's section 4.1 (square when the widths agree),
    # 'when_widths_differ' (only to match the teacher's width), 'never' (the widths must agree).
    head: str = "when_widths_differ"

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"QueueDistillConfig.method {self.method!r}: choose from {METHODS}")
        # 'ensemble': the ensemble_distill job sets the teacher (its submodels) itself.
        if self.method not in ("sct", "ensemble") and not self.teacher:
            raise ValueError(f"QueueDistillConfig.method {self.method!r} needs a teacher (QueueDistillConfig.teacher)")
        if self.queue_init not in (None, "data", "random"):
            raise ValueError(f"QueueDistillConfig.queue_init {self.queue_init!r}: choose 'data' or 'random'")
        if self.queue_init == "data" and not self.teacher:
            raise ValueError("QueueDistillConfig.queue_init='data' fills the queue with a teacher's embeddings: "
                             "set QueueDistillConfig.teacher or use queue_init='random'")
        if self.ensemble_regression not in losses.REGRESSION_LOSSES:
            raise ValueError(f"QueueDistillConfig.ensemble_regression {self.ensemble_regression!r}: choose from "
                             f"{losses.REGRESSION_LOSSES}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"QueueDistillConfig.alpha={self.alpha}: must lie in [0, 1]")

        sel = "sentemb_jax.QueueDistillConfig"
        v.require_int(self.queue_size, sel, "queue_size", 1)
        for name in ("teacher_temperature", "student_temperature", "reference_temperature", "online_temperature",
                     "ensemble_temperature"):
            v.require_number(getattr(self, name), sel, name, 0, low_open=True)
        v.require_number(self.ensemble_infonce_weight, sel, "ensemble_infonce_weight", 0, 1)
        v.require_int(self.projector_layers, sel, "projector_layers", 0)
        v.require_int(self.projector_expansion, sel, "projector_expansion", 1)
        v.require_int(self.teacher_batch_size, sel, "teacher_batch_size", 1)
        v.require_int(self.shard_queue_min_entries, sel, "shard_queue_min_entries", 1)
        v.require_choice(self.head, HEADS, sel, "head")
        v.require_choice(self.reference_pass, REFERENCE_PASSES, sel, "reference_pass")
        if self.teacher_weights is not None:
            weights = self.teacher_weights
            teachers = (self.teacher,) if isinstance(self.teacher, str) else tuple(self.teacher or ())
            ok = isinstance(weights, (tuple, list)) and all(
                v._is_real(w) and w == w and 0 <= w < float("inf") for w in weights) and sum(weights) > 0
            if not ok or (teachers and len(weights) != len(teachers)):
                v.fail(weights, sel, "teacher_weights", f"must be None (uniform) or {len(teachers) or 'one per teacher'} "
                       "finite weights >= 0 with a positive sum, one per QueueDistillConfig.teacher")

    @property
    def needs_cached_teacher(self) -> bool:
        return self.method != "sct"

    @property
    def sides(self) -> tuple[str, ...]:
        """The views the student embeds: the ensemble is distilled on the sentences themselves."""
        return ("view1",) if self.method == "ensemble" else SIDES

    @property
    def queue_count(self) -> int:
        return 2 if self.method in _SCT else (1 if self.method in _TEACHER_QUEUE else 0)

    def student_head(self, width: int, teacher_width: int) -> int | None:
        """The width of the Linear + tanh head the student of `width` gets (None: no head) before it
        is compared with a teacher of `teacher_width` (`head`; SCT never: its projector is its head)."""
        if self.method in _SCT:
            return None
        if self.head == "never":
            if width != teacher_width:
                v.fail(self.head, "sentemb_jax.QueueDistillConfig", "head",
                       f"the student embeds in {width} dimensions and the teacher in {teacher_width}: it needs a head "
                       "to the teacher's width ('always' or 'when_widths_differ')")
            return None
        return teacher_width if self.head == "always" or width != teacher_width else None

    def make_method(self, sequence_length: int, seed: int = 0) -> QueueDistillMethod:
        """The train loop's method for this config (train(distill=...) calls it: the loop imports no method)."""
        return QueueDistillMethod(self, sequence_length, seed)


class Projector(nn.Module):
    """SCT's projector h: `layers` blocks of Linear(u -> u*w), ReLU, Linear(u*w -> u)."""

    layers: int = 3
    expansion: int = 10

    @nn.compact
    def __call__(self, x: Array) -> Array:
        width = x.shape[-1]
        for i in range(self.layers):
            x = nn.Dense(width * self.expansion, name=f"block{i}_up")(x)
            x = nn.Dense(width, name=f"block{i}_down")(nn.relu(x))
        return x


@flax.struct.dataclass
class DistillState:
    step: Array
    params: Any  # {"tower": student, ["projector": SCT's h]}
    opt_state: Any
    queues: tuple  # InstanceQueue per queue (0, 1 or 2)
    teacher: Any  # teacher params when the step runs the teacher (sct_distill), else None


def _embed(module: nn.Module, params, batch: dict, rng: Array, sides=SIDES, deterministic: bool = False) -> tuple:
    """The student's embeddings of each side, in order."""
    if "packed_input_ids" in batch:
        out = embed_packed(module, params, batch, rng, list(sides), deterministic=deterministic)
        return tuple(out[s] for s in sides)
    if deterministic:
        return tuple(module.apply({"params": params}, batch[f"{s}_input_ids"], batch[f"{s}_attention_mask"]) for s in sides)
    return tuple(embed_side(module, params, batch[f"{s}_input_ids"], batch[f"{s}_attention_mask"],
                            jax.random.fold_in(rng, i), None) for i, s in enumerate(sides))


def distill_loss(cfg: QueueDistillConfig, z1: Array, z2: Array, queues: tuple, teacher: tuple | None,
                 reference: tuple | None) -> Array:
    """The method's loss from the student's views (projected for SCT), the updated queues, the
    teacher's (view1[, view2]) and the reference's (view1, view2) embeddings."""
    m = cfg.method
    if m == "congen":
        return losses.congen_loss(teacher[0], z1, z2, queues[0].values, cfg.teacher_temperature,
                                  cfg.student_temperature, cfg.alpha)
    if m == "ckd":
        return losses.contrastive_distillation_loss(instance_queue.slots_of_last(queues[0], z1.shape[0]), z1, queues[0].values,
                                                    cfg.student_temperature)
    if m == "ensemble":
        return losses.ensemble_distillation_loss(z1, teacher[0], cfg.ensemble_infonce_weight, cfg.ensemble_temperature,
                                                 cfg.ensemble_regression)
    if m in _L2_BASELINES:
        loss = losses.mse_loss(z1, teacher[0])
        if m in ("dual_l2", "skd"):
            loss = loss + losses.mse_loss(z2, teacher[0])
        if m == "skd":
            loss = loss + losses.mse_loss(z1, z2)
        return loss
    d1, d2 = queues[0].values, queues[1].values
    loss = losses.sct_loss(z1, z2, *reference, d1, d2, cfg.reference_temperature, cfg.online_temperature)
    if m == "sct_distill":
        loss = loss + losses.sct_loss(z1, z2, *teacher, d1, d2, cfg.reference_temperature, cfg.online_temperature)
    return loss


def embedding_norm(cfg: QueueDistillConfig):
    """What the loss sees of each embedding: unit length (ConGen section 3.1 and eq. 1, SCT: "all
    encoder outputs are normalized"), also for models without a Normalize module; as the model
    gives it for the ensemble's regression (methods/ensemble.py) and, when asked, the L2 baselines."""
    as_given = cfg.method == "ensemble" or (cfg.method in _L2_BASELINES and cfg.l2_on_raw_output)
    return (lambda x: x) if as_given else l2_normalize


def distill_step(state: DistillState, batch: dict, rng: Array, *, module: nn.Module, optimizer,
                 cfg: QueueDistillConfig, teacher_module: nn.Module | None = None):
    """One optimizer step of the configured method; the queues are updated in the same step."""
    rng = jax.random.fold_in(rng, state.step)
    norm = embedding_norm(cfg)
    teacher = None
    if cfg.needs_cached_teacher:
        teacher = (norm(batch["teacher_view1"].astype(jnp.float32)),)
    if cfg.method == "sct_distill":
        if "teacher_view2" in batch:  # a view fixed per sentence ('fixed:' / 'column:'): cached like view1
            view2 = batch["teacher_view2"]
        else:  # drawn anew each epoch: the teacher embeds it here
            view2 = teacher_module.apply({"params": state.teacher}, batch["view2_input_ids"], batch["view2_attention_mask"])
        teacher = (teacher[0], jax.lax.stop_gradient(norm(view2.astype(jnp.float32))))
    projector = Projector(cfg.projector_layers, cfg.projector_expansion)
    separate_reference = None
    if cfg.method in _SCT and cfg.reference_pass != "online":
        # f_ref's own pass: no gradient, and (unless switched off) its own dropout mask, drawn from
        # an rng no online side uses (those take fold_in(rng, 0 / 1)).
        no_dropout = cfg.reference_pass == "separate_no_dropout"
        separate_reference = jax.lax.stop_gradient(_embed(module, state.params["tower"], batch, jax.random.fold_in(rng, 2**20),
                                                          cfg.sides, deterministic=no_dropout))

    def loss_fn(params):
        embedded = [norm(e) for e in _embed(module, params["tower"], batch, rng, cfg.sides)]
        e1, e2 = embedded[0], (embedded[1] if len(embedded) > 1 else None)
        queues, reference = state.queues, None
        if cfg.method in _TEACHER_QUEUE:
            queues = (instance_queue.enqueue(queues[0], teacher[0]),)
        if cfg.method in _SCT:
            # References: the student's own encoder outputs (identical weights), no gradient.
            reference = (e1, e2) if separate_reference is None else separate_reference
            reference = tuple(jax.lax.stop_gradient(norm(r)) for r in reference)
            source = teacher if cfg.method == "sct_distill" else reference
            queues = (instance_queue.enqueue(queues[0], source[0]), instance_queue.enqueue(queues[1], source[1]))
            e1 = l2_normalize(projector.apply({"params": params["projector"]}, e1))
            e2 = l2_normalize(projector.apply({"params": params["projector"]}, e2))
        return distill_loss(cfg, e1, e2, queues, teacher, reference), queues

    (loss, queues), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    return apply_gradients(state.replace(queues=queues), loss, grads, optimizer)


# ------------------------------------------------------------------------------------------------
# Teacher embeddings, cached on disk.


def params_fingerprint(params) -> str:
    """sha256 over every parameter's path, shape, dtype and bytes: the teacher's identity."""
    h = hashlib.sha256()
    for path, leaf in sorted(jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0], key=lambda x: str(x[0])):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.shape}|{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def texts_fingerprint(texts) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


def cached_teacher_embeddings(teacher, texts: list[str], cache_dir: str | None, batch_size: int = 128) -> np.ndarray:
    """teacher.encode(texts, normalize_embeddings=True) ([N, D] float32, unit rows), read from /
    written to `cache_dir` under a key of the teacher (weights, pooling, max length) and the texts."""
    cache_dir = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "sentemb_jax", "teacher_embeddings")
    identity = {"params": params_fingerprint(teacher.params), "module": repr(teacher.module),
                "max_length": teacher.max_seq_length, "texts": texts_fingerprint(texts), "rows": len(texts)}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    path = os.path.join(cache_dir, f"teacher_{key}.npy")
    if os.path.isfile(path):
        out = np.load(path, allow_pickle=False)
        if out.shape[0] == len(texts):
            log.info("teacher embeddings from the cache %s", path)
            return _checked_finite(out, path)
        log.warning("%s: %d rows for %d texts; recomputing", path, out.shape[0], len(texts))
    # Unit vectors whatever the teacher's modules (what the cache has always held: encode normalised
    # by default before it followed sentence-transformers' normalize_embeddings=False).
    out = _checked_finite(np.asarray(teacher.encode(texts, batch_size=batch_size, show_progress_bar=None,
                                                    normalize_embeddings=True), np.float32),
                          "the teacher's embeddings")
    os.makedirs(cache_dir, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}.npy"
    np.save(tmp, out)
    os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    with open(os.path.join(cache_dir, f"teacher_{key}.json"), "w") as f:
        json.dump(identity, f, indent=1)
    return out


def _checked_finite(rows: np.ndarray, where: str) -> np.ndarray:
    bad = np.flatnonzero(~np.isfinite(rows).all(axis=1))
    if len(bad):
        raise ValueError(f"{where}: {len(bad)} row(s) hold NaN / inf (rows {bad[:8].tolist()}); a corrupted cache file "
                         "can be deleted (it is recomputed)")
    return rows


# ------------------------------------------------------------------------------------------------
# The train loop's hooks (sentemb_jax.training.trainer.train(distill=...)).


class QueueDistillMethod:
    """What the canonical train loop needs to run a queue-distillation method."""

    def __init__(self, cfg: QueueDistillConfig, sequence_length: int, seed: int = 0):
        self.cfg = cfg
        self.sides = cfg.sides
        self.seed = seed
        self.sequence_length = sequence_length
        self.teacher = None
        self.teacher_rows = None  # [N, D]: the teacher's view1 embedding of every row of the task
        self.teacher_rows2 = None  # [N, D]: its view2 embeddings (sct_distill, when view2 is fixed per row)

    def prepare(self, task_name: str, student) -> None:
        """Load the teacher; embed (or read from the cache) every training sentence (view1, and for
        sct_distill view2 when the task fixes it per sentence)."""
        cfg = self.cfg
        if isinstance(cfg.teacher, (list, tuple)):
            self.teacher = EnsembleEncoder.from_paths(cfg.teacher, cfg.teacher_weights, max_seq_length=self.sequence_length)
        elif cfg.teacher:
            self.teacher = SentenceEncoder.from_pretrained(cfg.teacher, max_seq_length=self.sequence_length)
            if cfg.method in _SCT and self.teacher.get_sentence_embedding_dimension() != student.get_sentence_embedding_dimension():
                raise ValueError(f"{cfg.method}: the teacher ({self.teacher.get_sentence_embedding_dimension()}-d) and the "
                                 f"student ({student.get_sentence_embedding_dimension()}-d) must embed in one space")
            if cfg.method == "sct_distill" and self.teacher.tokenizer.hf.get_vocab() != student.tokenizer.hf.get_vocab():
                raise ValueError("sct_distill runs the teacher on the student's token ids: they need one vocabulary")
        if self.teacher is not None:  # head='never' with other widths fails here, before the teacher embeds the data
            self.student_projection(student.get_sentence_embedding_dimension())
        if cfg.needs_cached_teacher or cfg.queue_init == "data":
            if self.teacher is None:
                raise ValueError(f"QueueDistillConfig.method {cfg.method!r}: no teacher (the ensemble_distill job gives "
                                 "'ensemble' its submodels; elsewhere set QueueDistillConfig.teacher)")
            sentences = sentence_texts(task_name)  # read once: both views are made from them
            texts = view_texts(task_name, 0, sentences)
            if texts is None:
                raise ValueError(f"{cfg.method}: the teacher's view1 embeddings are computed once, so view1 must be the "
                                 f"same in every epoch; task {task_name!r} draws it anew ({sentence_views(task_name)[0][0]!r}). "
                                 "Use 'none', 'fixed:<augmentation>', 'neighbour' or 'column:<name>' (register_tasks.views)")
            self.teacher_rows = cached_teacher_embeddings(self.teacher, texts, cfg.cache_dir, cfg.teacher_batch_size)
        if cfg.method == "sct_distill":
            texts2 = view_texts(task_name, 1, sentences)
            if texts2 is not None:
                self.teacher_rows2 = cached_teacher_embeddings(self.teacher, texts2, cfg.cache_dir, cfg.teacher_batch_size)
            else:
                log.info("sct_distill: view2 %r is drawn anew each epoch: the teacher embeds it in every step "
                         "(a 'fixed:' view is embedded once)", sentence_views(task_name)[0][1])

    @property
    def online_teacher(self) -> bool:
        """Whether the step runs the teacher (sct_distill with a view2 drawn anew each epoch)."""
        return self.cfg.method == "sct_distill" and self.teacher_rows2 is None

    def student_projection(self, width: int) -> int | None:
        """The width of ConGen's student head (Linear + tanh) for a student of `width`, None for none
        (`QueueDistillConfig.head`). The teacher's width: the loaded teacher's, else that of its cached
        rows (the AOT compile sets only their shape)."""
        if self.teacher is not None:
            target = self.teacher.get_sentence_embedding_dimension()
        elif self.teacher_rows is not None:
            target = self.teacher_rows.shape[1]
        else:
            return None
        return self.cfg.student_head(width, target)

    def model_batch(self, batch: dict) -> dict:
        out = side_features(batch, self.sides)
        if self.cfg.needs_cached_teacher:
            out["teacher_view1"] = self.teacher_rows[np.asarray(batch["row_id"])]
        if self.teacher_rows2 is not None:
            out["teacher_view2"] = self.teacher_rows2[np.asarray(batch["row_id"])]
        return out

    def _initial_queues(self, dim: int) -> tuple:
        cfg = self.cfg
        rng = np.random.default_rng(self.seed)
        init = cfg.queue_init or ("random" if cfg.method in _SCT else "data")
        out = []
        for _ in range(cfg.queue_count):
            if init == "data":
                rows = self.teacher_rows
                pick = rng.choice(len(rows), cfg.queue_size, replace=cfg.queue_size > len(rows))
                values = rows[pick]
            else:
                values = instance_queue.random_unit_rows(rng, cfg.queue_size, dim)
            out.append(instance_queue.new_queue(values))
        return tuple(out)

    def build_step(self, module: nn.Module, optimizer, mesh: Mesh, example: dict, rules=partitioning.LOGICAL_AXIS_RULES,
                   skip_nonfinite: bool = False):
        """(jitted step with explicit in/out shardings, abstract state, state shardings)."""
        cfg = self.cfg
        ids, mask = example["view1_input_ids"][:1], example["view1_attention_mask"][:1]
        replicated = NamedSharding(mesh, P())
        tower, tower_sh = sharded.tower_shardings(module, ids, mask, mesh, rules)
        abstract_params, param_shardings = {"tower": tower}, {"tower": tower_sh}
        dim = jax.eval_shape(lambda p: module.apply({"params": p}, ids, mask), tower).shape[-1]
        if cfg.method in _SCT:
            proj = jax.eval_shape(lambda: Projector(cfg.projector_layers, cfg.projector_expansion).init(
                jax.random.PRNGKey(0), jnp.zeros((1, dim))))["params"]
            abstract_params["projector"] = proj
            param_shardings["projector"] = jax.tree_util.tree_map(lambda _: replicated, proj)
        abstract_opt, opt_shardings = sharded.optimizer_shardings(optimizer, abstract_params, param_shardings, mesh)
        queue_dim = self.teacher_rows.shape[1] if self.teacher_rows is not None else dim
        abstract_queues = tuple(instance_queue.InstanceQueue(values=jax.ShapeDtypeStruct((cfg.queue_size, queue_dim), jnp.float32),
                                                 pointer=jax.ShapeDtypeStruct((), jnp.int32))
                                for _ in range(cfg.queue_count))
        queue_shardings = tuple(instance_queue.queue_sharding(mesh, cfg.queue_size, cfg.shard_queue_min_entries)
                                for _ in range(cfg.queue_count))
        teacher_module, abstract_teacher, teacher_shardings = None, None, None
        if self.online_teacher:
            teacher_module = self.teacher.module
            abstract_teacher, teacher_shardings = sharded.tower_shardings(teacher_module, ids, mask, mesh, rules)
        abstract = DistillState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params, opt_state=abstract_opt,
                                queues=abstract_queues, teacher=abstract_teacher)
        shardings = DistillState(step=replicated, params=param_shardings, opt_state=opt_shardings, queues=queue_shardings,
                                 teacher=teacher_shardings)
        self._dim = dim
        step = sharded.jit_train_step(functools.partial(distill_step, module=module, optimizer=optimizer, cfg=cfg,
                                                        teacher_module=teacher_module), shardings, mesh, skip_nonfinite)
        return step, abstract, shardings

    def initial_state(self, tower_params, optimizer, shardings: DistillState) -> DistillState:
        cfg = self.cfg
        params = {"tower": tower_params}
        if cfg.method in _SCT:
            params["projector"] = Projector(cfg.projector_layers, cfg.projector_expansion).init(
                jax.random.PRNGKey(self.seed + 1), jnp.zeros((1, self._dim)))["params"]
        copy = jax.jit(lambda p: jax.tree_util.tree_map(jnp.copy, p), out_shardings=shardings.params)
        params = copy(params)
        opt_state = jax.jit(optimizer.init, out_shardings=shardings.opt_state)(params)
        queues = tuple(jax.device_put(q, s) for q, s in zip(self._initial_queues(self._dim), shardings.queues))
        teacher = jax.device_put(self.teacher.params, shardings.teacher) if self.online_teacher else None
        return DistillState(step=jax.device_put(jnp.zeros((), jnp.int32), shardings.step), params=params,
                            opt_state=opt_state, queues=queues, teacher=teacher)
