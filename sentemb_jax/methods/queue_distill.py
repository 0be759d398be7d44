"""Queue-based distillation: ConGen, SCT (self-supervised and distillation), ConGen's baselines
(L2, Dual-L2, SKD, CKD) and the ensemble's student - one method object each, one step function.

    python -m sentemb_jax.main --gin_file=gin/congen.gin --gin.MODEL_DIR="'/tmp/congen'"

Each batch holds two views of every sentence of a `sentences` task: view1 = the sentence
(ConGen's control view x1, the one the teacher embeds), view2 = its augmentation (the generalize
view x2, e.g. 10% word deletion). The teacher's view1 embeddings of the whole file are computed
once and cached on disk (methods.teacher_cache); `row_id` picks each batch's rows.

* ConGen: alpha CE(P_ref^T, P_con^S) + (1 - alpha) CE(P_ref^T, P_gen^S) over the teacher queue.
* L2Distillation: MSE(z_ref^T, z_con^S) ('l2'); 'dual_l2': + MSE(z_ref^T, z_gen^S); 'skd': + MSE(z_con^S, z_gen^S).
* ContrastiveDistillation (CKD): InfoNCE of z_con^S against the teacher queue, the positive being z_ref^T.
* SCT: an MLP projector on the student; references = the student's own encoder outputs under
  stop-gradient (identical weights, SCT Sec. 3.1), queues D1 / D2 of the two views' references,
  the cross-view KL of SCT eq. 2; queues start as random unit vectors. With a teacher (SCT
  distillation): the teacher's view1 and view2 embeddings fill D1 / D2, and L_CD (eq. 4) is added
  to L_SCT (eq. 3). A view2 fixed per sentence is embedded once and cached like view1; a view2
  drawn anew each epoch is embedded by the teacher (eval mode) inside the step.
* EnsembleStudent: lambda InfoNCE + (1 - lambda) regression to an ensemble's embeddings
  (methods.ensemble; the ensemble_distill job sets its teacher).
The queue is FIFO inside the jitted step (methods.instance_queue): the batch's teacher / reference
embeddings go in first, then the distributions are taken over the queue (ConGen Sec. 3).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sentemb_jax import losses
from sentemb_jax import validation as v
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.methods import instance_queue
from sentemb_jax.methods.ensemble import EnsembleEncoder
from sentemb_jax.methods.teacher_cache import cached_teacher_embeddings
from sentemb_jax.pooling import l2_normalize
from sentemb_jax.training import sharded
from sentemb_jax.training.method import Method, MethodContext, TrainState, random_rows, side_features
from sentemb_jax.training.step import apply_gradients, embed_packed, embed_side

log = logging.getLogger(__name__)
Array = jax.Array
_TEACHER_QUEUE = ("congen", "ckd")  # one queue of the teacher's view1 embeddings
_SCT = ("sct", "sct_distill")
_L2_BASELINES = ("l2", "dual_l2", "skd")
SIDES = ("view1", "view2")
HEADS = ("always", "when_widths_differ", "never")
REFERENCE_PASSES = ("separate", "online", "separate_no_dropout")
_ABSTRACT_ROWS = 4096  # random teacher rows a compile-only / timing run stands in for the cached ones


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


def _embed(module: nn.Module, params, batch: dict, rng: Array, sides=SIDES, deterministic: bool = False) -> tuple:
    """The student's embeddings of each side, in order."""
    if "packed_input_ids" in batch:
        out = embed_packed(module, params, batch, rng, list(sides), deterministic=deterministic)
        return tuple(out[s] for s in sides)
    if deterministic:
        return tuple(module.apply({"params": params}, batch[f"{s}_input_ids"], batch[f"{s}_attention_mask"]) for s in sides)
    return tuple(embed_side(module, params, batch[f"{s}_input_ids"], batch[f"{s}_attention_mask"],
                            jax.random.fold_in(rng, i), None) for i, s in enumerate(sides))


class QueueDistill(Method):
    """The shared machinery of the queue-distillation methods; a subclass is a dataclass of its
    settings and says which `kind` of loss it is. Settings every kind reads through `getattr` with
    the defaults below (a kind without a field never uses it)."""

    kind = "congen"
    teacher: Any = None
    teacher_weights: tuple | None = None
    queue_size: int = 16384
    queue_init: str | None = None
    head: str = "when_widths_differ"
    cache_dir: str | None = None
    teacher_batch_size: int = 128
    shard_queue_min_entries: int = instance_queue.SHARD_MIN_ENTRIES

    def _check_common(self) -> None:
        api = f"sentemb_jax.{type(self).__name__}"
        v.require_int(self.queue_size, api, "queue_size", 1)
        v.require_int(self.teacher_batch_size, api, "teacher_batch_size", 1)
        v.require_int(self.shard_queue_min_entries, api, "shard_queue_min_entries", 1)
        v.require_choice(self.head, HEADS, api, "head")
        v.require_choice(self.queue_init, (None, "data", "random"), api, "queue_init")
        if self.kind not in ("sct", "ensemble") and not self.teacher:
            v.fail(self.teacher, api, "teacher", "needs a teacher model directory (several: their ensemble)")
        if self.queue_init == "data" and not self.teacher:
            v.fail(self.queue_init, api, "queue_init", "'data' fills the queue with a teacher's embeddings: give a "
                   "teacher or use 'random'")
        if isinstance(self.teacher, list):
            self.teacher = tuple(self.teacher)
        if self.teacher_weights is not None:
            weights = self.teacher_weights
            teachers = (self.teacher,) if isinstance(self.teacher, str) else tuple(self.teacher or ())
            ok = isinstance(weights, (tuple, list)) and all(
                v._is_real(w) and w == w and 0 <= w < float("inf") for w in weights) and sum(weights) > 0
            if not ok or (teachers and len(weights) != len(teachers)):
                v.fail(weights, api, "teacher_weights", f"must be None (uniform) or {len(teachers) or 'one per teacher'} "
                       "finite weights >= 0 with a positive sum, one per teacher")
        self._teacher, self._rows, self._rows2, self._seed, self._width = None, None, None, 0, None

    # -------------------------------------------------------------- what the kinds differ in

    @property
    def needs_cached_teacher(self) -> bool:
        return self.kind != "sct"

    @property
    def sides(self) -> tuple[str, ...]:
        """The views the student embeds: the ensemble is distilled on the sentences themselves."""
        return ("view1",) if self.kind == "ensemble" else SIDES

    @property
    def queue_count(self) -> int:
        return 2 if self.kind in _SCT else (1 if self.kind in _TEACHER_QUEUE else 0)

    @property
    def online_teacher(self) -> bool:
        """Whether the step runs the teacher (SCT with a teacher, its view2 drawn anew each epoch)."""
        return self.kind == "sct_distill" and self._rows2 is None

    def embedding_norm(self):
        """What the loss sees of each embedding: unit length (ConGen section 3.1 and eq. 1, SCT: "all
        encoder outputs are normalized"), also for models without a Normalize module; as the model
        gives it for the ensemble's regression (methods/ensemble.py) and, when asked, the L2 baselines."""
        as_given = self.kind == "ensemble" or (self.kind in _L2_BASELINES and getattr(self, "on_raw_output", False))
        return (lambda x: x) if as_given else l2_normalize

    def loss(self, z1: Array, z2: Array, queues: tuple, teacher: tuple | None, reference: tuple | None) -> Array:
        """The kind's loss from the student's views (projected for SCT), the updated queues, the
        teacher's (view1[, view2]) and the reference's (view1, view2) embeddings."""
        raise NotImplementedError

    # -------------------------------------------------------------- preparing the teacher

    def student_head(self, width: int) -> int | None:
        """The width of ConGen's student head (Linear + tanh) for a student of `width`, None for none:
        'always' as ConGen's section 4.1, 'when_widths_differ' (to match the teacher's width),
        'never' (the widths must agree). SCT never: its projector is its head."""
        if self.kind in _SCT:
            return None
        if self._teacher is not None:
            target = self._teacher.get_sentence_embedding_dimension()
        elif self._rows is not None:
            target = self._rows.shape[1]
        else:
            return None
        if self.head == "never":
            if width != target:
                v.fail(self.head, f"sentemb_jax.{type(self).__name__}", "head",
                       f"the student embeds in {width} dimensions and the teacher in {target}: it needs a head "
                       "to the teacher's width ('always' or 'when_widths_differ')")
            return None
        return target if self.head == "always" or width != target else None

    def _load_teacher(self, student, sequence_length: int) -> None:
        if isinstance(self.teacher, (list, tuple)):
            self._teacher = EnsembleEncoder.from_paths(self.teacher, self.teacher_weights, max_seq_length=sequence_length)
        elif self.teacher:
            self._teacher = SentenceEncoder.from_pretrained(self.teacher, max_seq_length=sequence_length)
            name = type(self).__name__
            if self.kind in _SCT and self._teacher.get_sentence_embedding_dimension() != student.get_sentence_embedding_dimension():
                raise ValueError(f"{name}: the teacher ({self._teacher.get_sentence_embedding_dimension()}-d) and the "
                                 f"student ({student.get_sentence_embedding_dimension()}-d) must embed in one space")

    def _check_online_teacher_vocabulary(self, student) -> None:
        """A teacher that runs inside the step (view2 drawn anew each epoch) reads the student's token
        ids: they need one vocabulary. A teacher whose embeddings are cached tokenises its own texts."""
        if self._teacher.tokenizer.hf.get_vocab() != student.tokenizer.hf.get_vocab():
            raise ValueError("SCT with a teacher and a view2 drawn anew each epoch runs the teacher on the student's "
                             "token ids: they need one vocabulary (a 'fixed:' view2 is embedded once, by the teacher's "
                             "own tokenizer)")

    def prepare(self, context: MethodContext) -> None:
        """Load the teacher; embed (or read from the cache) every training sentence (view1, and for
        SCT with a teacher view2 when the task fixes it per sentence). A compile-only run takes random rows
        of the teacher's width instead."""
        self._seed = context.seed
        self._load_teacher(context.student, context.sequence_length)
        if self._teacher is not None:  # head='never' with other widths fails here, before the teacher embeds the data
            self.student_head(context.student.get_sentence_embedding_dimension())
        if not (self.needs_cached_teacher or self.queue_init == "data"):
            return
        stand_in = context.abstract and self.kind == "ensemble"  # timing / compile: an ensemble of the student's width
        if self._teacher is None and not stand_in:
            raise ValueError(f"{type(self).__name__}: no teacher (the ensemble_distill job gives the student its "
                             "submodels; elsewhere set its teacher)")
        if context.abstract or context.source is None:
            dim = (self._teacher or context.student).get_sentence_embedding_dimension()
            self._rows = random_rows(np.random.default_rng(context.seed), (_ABSTRACT_ROWS, dim))
            if self.kind == "sct_distill":
                self._rows2 = self._rows
            return
        source = context.source
        sentences = source.texts()  # read once: both views are made from them
        texts = source.view_texts(0, sentences)
        if texts is None:
            raise ValueError(f"{type(self).__name__}: the teacher's view1 embeddings are computed once, so view1 must be "
                             f"the same in every epoch; {source.name} draws it anew ({source.views[0]!r}). Use 'none', "
                             "'fixed:<augmentation>', 'neighbour' or 'column:<name>' (DataConfig.views)")
        texts2 = source.view_texts(1, sentences) if self.kind == "sct_distill" else None
        if self.kind == "sct_distill" and texts2 is None and isinstance(self._teacher, SentenceEncoder):  # before it embeds
            self._check_online_teacher_vocabulary(context.student)
        self._rows = cached_teacher_embeddings(self._teacher, texts, self.cache_dir, self.teacher_batch_size)
        if self.kind == "sct_distill":
            if texts2 is not None:
                self._rows2 = cached_teacher_embeddings(self._teacher, texts2, self.cache_dir, self.teacher_batch_size)
            else:
                log.info("SCT distillation: view2 %r is drawn anew each epoch: the teacher embeds it in every step "
                         "(a 'fixed:' view is embedded once)", source.views[1])

    # -------------------------------------------------------------- the state and the batch

    def init_params(self, width: int) -> dict:
        self._width = width
        if self.kind not in _SCT:
            return {}
        return {"projector": Projector(self.projector_layers, self.projector_expansion).init(
            jax.random.PRNGKey(self._seed + 1), jnp.zeros((1, width)))["params"]}

    def _queue_dim(self, width: int) -> int:
        return self._rows.shape[1] if self._rows is not None else width

    def init_extra(self, width: int) -> dict:
        rng = np.random.default_rng(self._seed)
        init = self.queue_init or ("random" if self.kind in _SCT else "data")
        queues = []
        for _ in range(self.queue_count):
            if init == "data":
                pick = rng.choice(len(self._rows), self.queue_size, replace=self.queue_size > len(self._rows))
                values = self._rows[pick]
            else:
                values = instance_queue.random_unit_rows(rng, self.queue_size, self._queue_dim(width))
            queues.append(instance_queue.new_queue(values))
        return {"queues": tuple(queues), "teacher": self._teacher.params if self.online_teacher else None}

    def extra_shardings(self, mesh, abstract_extra) -> dict:
        queues = tuple(instance_queue.queue_sharding(mesh, self.queue_size, self.shard_queue_min_entries)
                       for _ in range(self.queue_count))
        teacher = None
        if self.online_teacher:
            ones = np.ones((1, 8), np.int32)
            teacher = sharded.tower_shardings(self._teacher.module, ones, ones, mesh)[1]
        return {"queues": queues, "teacher": teacher}

    def batch_features(self, batch_size: int, sequence_length: int) -> dict[str, jax.ShapeDtypeStruct]:
        out = {}
        if self.needs_cached_teacher:
            out["teacher_view1"] = jax.ShapeDtypeStruct((batch_size, self._rows.shape[1]), jnp.float32)
        if self._rows2 is not None:
            out["teacher_view2"] = jax.ShapeDtypeStruct((batch_size, self._rows2.shape[1]), jnp.float32)
        return out

    def model_batch(self, batch: dict) -> dict:
        out = side_features(batch, self.sides)
        if self.needs_cached_teacher:
            out["teacher_view1"] = self._rows[np.asarray(batch["row_id"])]
        if self._rows2 is not None:
            out["teacher_view2"] = self._rows2[np.asarray(batch["row_id"])]
        return out

    # -------------------------------------------------------------- the step

    def step(self, state: TrainState, batch: dict, rng: Array, *, module, optimizer):
        """One optimizer step of the method; the queues are updated in the same step."""
        rng = jax.random.fold_in(rng, state.step)
        norm = self.embedding_norm()
        kind = self.kind
        teacher = (norm(batch["teacher_view1"].astype(jnp.float32)),) if self.needs_cached_teacher else None
        if kind == "sct_distill":
            if "teacher_view2" in batch:  # a view fixed per sentence ('fixed:' / 'column:'): cached like view1
                view2 = batch["teacher_view2"]
            else:  # drawn anew each epoch: the teacher embeds it here
                view2 = self._teacher.module.apply({"params": state.extra["teacher"]}, batch["view2_input_ids"],
                                                   batch["view2_attention_mask"])
            teacher = (teacher[0], jax.lax.stop_gradient(norm(view2.astype(jnp.float32))))
        separate_reference = None
        if kind in _SCT and self.reference_pass != "online":
            # f_ref's own pass: no gradient, and (unless switched off) its own dropout mask, drawn from
            # an rng no online side uses (those take fold_in(rng, 0 / 1)).
            no_dropout = self.reference_pass == "separate_no_dropout"
            separate_reference = jax.lax.stop_gradient(_embed(module, state.params["tower"], batch, jax.random.fold_in(rng, 2**20),
                                                              self.sides, deterministic=no_dropout))

        def loss_fn(params):
            embedded = [norm(e) for e in _embed(module, params["tower"], batch, rng, self.sides)]
            e1, e2 = embedded[0], (embedded[1] if len(embedded) > 1 else None)
            queues, reference = state.extra["queues"], None
            if kind in _TEACHER_QUEUE:
                queues = (instance_queue.enqueue(queues[0], teacher[0]),)
            if kind in _SCT:
                # References: the student's own encoder outputs (identical weights), no gradient.
                reference = (e1, e2) if separate_reference is None else separate_reference
                reference = tuple(jax.lax.stop_gradient(norm(r)) for r in reference)
                source = teacher if kind == "sct_distill" else reference
                queues = (instance_queue.enqueue(queues[0], source[0]), instance_queue.enqueue(queues[1], source[1]))
                projector = Projector(self.projector_layers, self.projector_expansion)
                e1 = l2_normalize(projector.apply({"params": params["projector"]}, e1))
                e2 = l2_normalize(projector.apply({"params": params["projector"]}, e2))
            return self.loss(e1, e2, queues, teacher, reference), queues

        (loss, queues), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        return apply_gradients(state.replace(extra={**state.extra, "queues": queues}), loss, grads, optimizer)


# ------------------------------------------------------------------------------------------------
# The methods (gin: sentemb_jax.train.method = @sentemb_jax.ConGen(), ...)


@dataclasses.dataclass
class ConGen(QueueDistill):
    """ConGen (Limkonchotiwat et al. 2022). Defaults: its Table 7, MiniLM-L3 row (tau_T 0.05,
    tau_S 0.07, K 16384); alpha 0.5 from the PyTorch reference run of this teacher / student pair."""

    kind = "congen"
    teacher: Any = None  # a model directory (several: their ensemble)
    teacher_weights: tuple | None = None  # the ensemble's weights (default uniform)
    queue_size: int = 16384
    queue_init: str | None = None  # 'data' (default: teacher rows) or 'random'
    teacher_temperature: float = 0.05
    student_temperature: float = 0.07
    alpha: float = 0.5
    head: str = "when_widths_differ"
    cache_dir: str | None = None  # teacher embeddings (default ~/.cache/sentemb_jax/teacher_embeddings)
    teacher_batch_size: int = 128
    shard_queue_min_entries: int = instance_queue.SHARD_MIN_ENTRIES

    def __post_init__(self):
        self._check_common()
        api = "sentemb_jax.ConGen"
        v.require_number(self.teacher_temperature, api, "teacher_temperature", 0, low_open=True)
        v.require_number(self.student_temperature, api, "student_temperature", 0, low_open=True)
        v.require_number(self.alpha, api, "alpha", 0, 1)

    def loss(self, z1, z2, queues, teacher, reference):
        return losses.congen_loss(teacher[0], z1, z2, queues[0].values, self.teacher_temperature,
                                  self.student_temperature, self.alpha)


@dataclasses.dataclass
class ContrastiveDistillation(QueueDistill):
    """CKD (Wu et al. 2021): InfoNCE of the student's view1 against the teacher queue, the positive
    being the teacher's embedding of the same sentence (ConGen's baseline)."""

    kind = "ckd"
    teacher: Any = None
    teacher_weights: tuple | None = None
    queue_size: int = 16384
    queue_init: str | None = None
    student_temperature: float = 0.07
    head: str = "when_widths_differ"
    cache_dir: str | None = None
    teacher_batch_size: int = 128
    shard_queue_min_entries: int = instance_queue.SHARD_MIN_ENTRIES

    def __post_init__(self):
        self._check_common()
        v.require_number(self.student_temperature, "sentemb_jax.ContrastiveDistillation", "student_temperature", 0,
                         low_open=True)

    def loss(self, z1, z2, queues, teacher, reference):
        return losses.contrastive_distillation_loss(instance_queue.slots_of_last(queues[0], z1.shape[0]), z1,
                                                    queues[0].values, self.student_temperature)


@dataclasses.dataclass
class L2Distillation(QueueDistill):
    """ConGen's regression baselines: 'l2' MSE(z_ref^T, z_con^S), 'dual_l2' + MSE(z_ref^T, z_gen^S),
    'skd' + MSE(z_con^S, z_gen^S). on_raw_output: the student's output as the model gives it against
    the unit-length teacher rows (default: unit vectors on both sides, as ConGen's section 3.1)."""

    variant: str = "l2"
    teacher: Any = None
    teacher_weights: tuple | None = None
    on_raw_output: bool = False
    head: str = "when_widths_differ"
    cache_dir: str | None = None
    teacher_batch_size: int = 128

    def __post_init__(self):
        v.require_choice(self.variant, _L2_BASELINES, "sentemb_jax.L2Distillation", "variant")
        v.require_bool(self.on_raw_output, "sentemb_jax.L2Distillation", "on_raw_output")
        self._check_common()

    @property
    def kind(self) -> str:
        return self.variant

    def loss(self, z1, z2, queues, teacher, reference):
        loss = losses.mse_loss(z1, teacher[0])
        if self.variant in ("dual_l2", "skd"):
            loss = loss + losses.mse_loss(z2, teacher[0])
        if self.variant == "skd":
            loss = loss + losses.mse_loss(z1, z2)
        return loss


@dataclasses.dataclass
class SCT(QueueDistill):
    """SCT (Limkonchotiwat et al. 2023). Self-supervised without a teacher; with one (SCT
    distillation, its eq. 3 + 4) the teacher's view embeddings fill the queues and L_CD is added.
    Defaults: its Table 1 for BERT-Small (tau_ref 0.02, tau_theta 0.03, K 65536, projector expansion
    10). reference_pass: f_ref = the student's weights under stop-gradient - 'separate' (its own
    no-gradient pass with its own dropout mask, as the authors' code), 'online' (the online pass's
    outputs), 'separate_no_dropout'. With a teacher, view2 fixed per sentence ('fixed:...') is
    embedded once and cached; drawn anew each epoch, the teacher embeds it in every step (it must
    share the student's vocabulary)."""

    teacher: Any = None
    queue_size: int = 65536
    queue_init: str | None = None  # default 'random'
    reference_temperature: float = 0.02
    online_temperature: float = 0.03
    projector_layers: int = 3
    projector_expansion: int = 10
    reference_pass: str = "separate"
    cache_dir: str | None = None
    teacher_batch_size: int = 128
    shard_queue_min_entries: int = instance_queue.SHARD_MIN_ENTRIES

    def __post_init__(self):
        self._check_common()
        api = "sentemb_jax.SCT"
        v.require_number(self.reference_temperature, api, "reference_temperature", 0, low_open=True)
        v.require_number(self.online_temperature, api, "online_temperature", 0, low_open=True)
        v.require_int(self.projector_layers, api, "projector_layers", 0)
        v.require_int(self.projector_expansion, api, "projector_expansion", 1)
        v.require_choice(self.reference_pass, REFERENCE_PASSES, api, "reference_pass")

    @property
    def kind(self) -> str:
        return "sct_distill" if self.teacher else "sct"

    def loss(self, z1, z2, queues, teacher, reference):
        d1, d2 = queues[0].values, queues[1].values
        loss = losses.sct_loss(z1, z2, *reference, d1, d2, self.reference_temperature, self.online_temperature)
        if self.kind == "sct_distill":
            loss = loss + losses.sct_loss(z1, z2, *teacher, d1, d2, self.reference_temperature, self.online_temperature)
        return loss


@dataclasses.dataclass
class EnsembleStudent(QueueDistill):
    """The student of an ensemble (methods.ensemble): infonce_weight x InfoNCE(tau = temperature) +
    (1 - infonce_weight) x regression ('mae', eq. 4; 'mse' / 'smooth_l1' / 'kl' for Table 4) to the
    ensemble's cached embeddings of the sentences. The ensemble_distill job sets the teacher."""

    kind = "ensemble"
    infonce_weight: float = 0.1
    temperature: float = 0.3
    regression: str = "mae"
    teacher: Any = None
    teacher_weights: tuple | None = None
    head: str = "when_widths_differ"
    cache_dir: str | None = None
    teacher_batch_size: int = 128

    def __post_init__(self):
        api = "sentemb_jax.EnsembleStudent"
        v.require_number(self.infonce_weight, api, "infonce_weight", 0, 1)
        v.require_number(self.temperature, api, "temperature", 0, low_open=True)
        v.require_choice(self.regression, losses.REGRESSION_LOSSES, api, "regression")
        self._check_common()

    def loss(self, z1, z2, queues, teacher, reference):
        return losses.ensemble_distillation_loss(z1, teacher[0], self.infonce_weight, self.temperature, self.regression)
