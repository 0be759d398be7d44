"""ConGen's student head (ConGen.head): Linear + tanh to the teacher's width 'always' (ConGen
section 4.1), 'when_widths_differ' or 'never', built by the run setup (training.setup.with_head)
for the train loop and the AOT compile alike (benchmarks.aot.train_program), and saved with it.
Kept apart from tests/test_queue_distill.py so that each module stays under ~500 lines."""
import os
import types

import jax
import numpy as np
import pytest
from hf_models import make_minilm_shaped_bert

import gin
import sentemb_jax.jobs  # noqa: F401 - registers the methods with gin
from sentemb_jax import configuration
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import ConfigError
from sentemb_jax.methods.queue_distill import SCT, ConGen
from sentemb_jax.training.method import MethodContext
from sentemb_jax.training.setup import with_head as _with_projection

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH = 32  # the student's


@pytest.fixture(scope="module")
def student(tmp_path_factory, minilm_dir):
    """A random 1-layer, 32-d BERT with MiniLM's tokenizer: mean pooling, no head of its own."""
    path = tmp_path_factory.mktemp("head") / "student"
    make_minilm_shaped_bert(path, minilm_dir, layers=1, hidden=WIDTH)
    encoder = SentenceEncoder.from_pretrained(str(path))
    assert encoder.module.projection_dim is None and encoder.get_sentence_embedding_dimension() == WIDTH
    return encoder


def _method(head: str, teacher_width: int, cached_rows_only: bool = False):
    m = ConGen(teacher="unused", head=head)
    if cached_rows_only:  # the teacher's cached rows alone, no teacher loaded
        m._rows = np.zeros((1, teacher_width), np.float32)
    else:
        m._teacher = types.SimpleNamespace(get_sentence_embedding_dimension=lambda: teacher_width)
    return m


def _raw(encoder, ids, mask):
    """The tower's output before its L2 normalisation."""
    return np.asarray(encoder.module.clone(normalize=False).apply({"params": encoder.params}, ids, mask))


@pytest.mark.parametrize("head,teacher_width,want", [
    ("always", WIDTH, WIDTH), ("always", 24, 24),  # ConGen 4.1: a (square) Linear + tanh in either case
    ("when_widths_differ", WIDTH, None), ("when_widths_differ", 24, 24),
    ("never", WIDTH, None)])
def test_head_choice_builds_the_student(student, head, teacher_width, want):
    for cached_rows_only in (False, True):  # the train loop (teacher loaded) and the AOT compile (rows only)
        assert _method(head, teacher_width, cached_rows_only=cached_rows_only).student_head(WIDTH) == want
    built = _with_projection(student, want, seed=0)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, (6, 8)).astype(np.int32)
    mask = np.ones_like(ids)
    out = np.asarray(built.module.apply({"params": built.params}, ids, mask))
    assert out.shape == (6, want or WIDTH) and built.get_sentence_embedding_dimension() == (want or WIDTH)
    if built.module.normalize:
        np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)
    if want is None:
        assert built is student and "projection" not in built.params
        return
    m = built.module
    assert (m.projection_dim, m.projection_bias, m.projection_activation) == (want, True, "tanh")
    proj = built.params["projection"]
    assert proj["kernel"].shape == (WIDTH, want) and proj["bias"].shape == (want,)
    assert built.params["backbone"] is student.params["backbone"]  # the student's own weights, a new head on them
    raw = _raw(built, ids, mask)
    pooled = _raw(student, ids, mask)  # the head's input: the pooled tower
    np.testing.assert_allclose(raw, np.tanh(pooled @ np.asarray(proj["kernel"]) + np.asarray(proj["bias"])),
                               rtol=1e-5, atol=1e-6)
    assert np.abs(raw).max() < 1 < np.abs(pooled).max()  # tanh bounds what the norm sees; the pooled tower is not


def test_head_kept_and_saved(student, tmp_path):
    """A student that already ends in the head keeps it (a second ConGen run on a ConGen student);
    the head is saved as a sentence-transformers Dense with tanh and loads back."""
    built = _with_projection(student, WIDTH, seed=0)
    assert _with_projection(built, WIDTH, seed=1) is built
    built.save_pretrained(str(tmp_path / "s"))
    loaded = SentenceEncoder.from_pretrained(str(tmp_path / "s"))
    assert (loaded.module.projection_dim, loaded.module.projection_activation) == (WIDTH, "tanh")
    texts = ["a man plays a guitar", "two dogs run on the beach"]
    np.testing.assert_allclose(loaded.encode(texts), built.encode(texts), atol=1e-6)


def test_sct_gets_no_head_whatever_the_choice():
    for method in (SCT(), SCT(teacher="unused")):  # SCT's projector h is its student's head
        method._teacher = types.SimpleNamespace(get_sentence_embedding_dimension=lambda: 24)
        assert method.student_head(WIDTH) is None


def test_never_with_other_widths_and_invalid_values_name_the_argument_and_the_binding():
    with pytest.raises(ConfigError, match=r"^sentemb_jax\.ConGen\(head='never'\): the student embeds in "
                                          r"32 dimensions and the teacher in 24"):
        _method("never", 24).student_head(WIDTH)
    with pytest.raises(ConfigError, match=r"^sentemb_jax\.ConGen\(head='sometimes'\): must be one of "
                                          r"\('always', 'when_widths_differ', 'never'\)"):
        ConGen(teacher="t", head="sometimes")
    # The command line words the same error as the gin binding that set the value.
    gin.parse_config("sentemb_jax.ConGen.head = 'never'")
    gin.finalize()
    with pytest.raises(ConfigError) as e:
        _method("never", 24).student_head(WIDTH)
    assert configuration.reword(e.value).startswith(
        "gin binding sentemb_jax.ConGen.head = 'never': the student embeds in 32 dimensions and the teacher in 24")


class _Unread:
    """A batch source whose reading fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"the source was read ({name}) before the head was checked")


def test_never_fails_when_the_teacher_loads(student, tmp_path, minilm_dir):
    """The train loop's prepare() refuses before the teacher embeds any data (the task is never read)."""
    make_minilm_shaped_bert(tmp_path / "teacher", minilm_dir, layers=1, hidden=24)
    method = ConGen(teacher=str(tmp_path / "teacher"), head="never")
    with pytest.raises(ConfigError, match="the student embeds in 32 dimensions and the teacher in 24"):
        method.prepare(MethodContext(student=student, sequence_length=16, seed=0, source=_Unread()))
    assert method._rows is None


@pytest.mark.parametrize("head,size,want", [("always", "t5_tiny_d384", 384), ("when_widths_differ", "t5_tiny", 384),
                                            ("when_widths_differ", "t5_tiny_d384", None)])
def test_aot_train_program_builds_the_head_train_builds(head, size, want, monkeypatch, minilm_dir):
    """The compile-only train step gets the head the run setup adds (a T5 student from scratch, its
    width 256 or 384, against all-MiniLM-L6-v2's 384; nothing of the task read)."""
    from sentemb_jax.benchmarks import aot

    monkeypatch.chdir(REPO)
    program = aot.train_program(["gin/congen.gin", f"gin/sizes/{size}.gin"], [
        "sentemb_jax.TowerConfig.init_from = None", "sentemb_jax.TowerConfig.init_layers = None",
        f"sentemb_jax.TowerConfig.tokenizer_dir = '{minilm_dir}'",
        "sentemb_jax.TowerConfig.backbone = @sentemb_jax.T5Config()", "sentemb_jax.T5Config.has_decoder = False",
        f"sentemb_jax.ConGen.head = '{head}'"], jax.devices()[:1])
    tower = program.args[0].params["tower"]
    assert ("projection" in tower) == (want is not None)
    if want:
        assert tower["projection"]["kernel"].shape[-1] == want
