"""Robustness: kill -9 at five moments (one mid checkpoint write) then exact resume;
environment errors before the first step; bad encode() inputs; fuzzing of the tokenisation paths
with random Unicode (surrogates and control characters included). docs/ROBUSTNESS.md lists every
bad input with its message and exit code (`python -m lab.experiments.robustness_table`)."""
import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from hf_models import make_t5
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from run_utils import gin_file_args, latest_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 16


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("t5"))
    make_t5(path, "1.1")
    return path


def _train_args(model_path, model_dir, data_dir, steps=STEPS):
    return [*gin_file_args("gin/runs/tiny_t5_nli.gin"), f"--gin.MODEL_PATH='{model_path}'", f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.DATA_DIR='{data_dir}'", f"--gin.sentemb_jax.RunConfig.num_steps={steps}"]


def _cmd(*args, **kwargs):
    return [sys.executable, "-m", "sentemb_jax.main", *_train_args(*args, **kwargs)]


def _packed_cmd(*args):
    return _cmd(*args) + ["--gin.sentemb_jax.DataConfig.pack=True"]  # the packer's state must resume too


def _finalized(ckpt_dir):
    return sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit()) if os.path.isdir(ckpt_dir) else []


def _unfinished(ckpt_dir):
    """Checkpoint directories orbax has not finalised (written under a temporary name)."""
    return [d for d in os.listdir(ckpt_dir) if not d.isdigit()] if os.path.isdir(ckpt_dir) else []


# (fault, newest finalised checkpoint the kill leaves): tiny_t5_nli checkpoints every 2 steps.
# Kill 1 lands inside step 6's checkpoint write (all written under orbax's temporary name, not
# renamed), kill 2 right after the restart's first step, kills 3-5 between and just after checkpoints.
# Then a preemption notice (SIGTERM) after step 15: the loop checkpoints step 15 (not a checkpoint
# step) and exits 143; the last run takes step 16 from there.
KILLS = [("in_save:6", 4), ("after_step:5", 4), ("after_step:8", 8), ("after_step:11", 10), ("after_step:14", 14),
         ("sigterm_after_step:15", 15)]


def test_kill_at_five_moments_and_sigterm_then_resume_equals_uninterrupted(t5_dir, tmp_path, data_dir):
    """SIGKILL at five deterministic moments (sentemb_jax.faults: SENTEMB_FAULT), one
    inside a checkpoint write. Each restart resumes from the newest finalised checkpoint - never a
    partial one - and the end equals an uninterrupted run (packed batches, so the packer's
    carried-over rows resume too). No timing: the same on a fast or a slow machine."""
    full = str(tmp_path / "full")
    subprocess.run(_packed_cmd(t5_dir, full, data_dir), cwd=REPO, check=True, capture_output=True, timeout=600)
    lines = [json.loads(line) for line in open(os.path.join(full, "metrics.jsonl"))]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1)) and all(np.isfinite(line["loss"]) for line in lines)
    assert os.listdir(os.path.join(full, "tensorboard"))
    killed = str(tmp_path / "killed")
    ckpt = os.path.join(killed, "checkpoints")
    errs = []
    for fault, newest in KILLS:
        proc = subprocess.run(_packed_cmd(t5_dir, killed, data_dir), cwd=REPO, capture_output=True, text=True,
                              timeout=600, env={**os.environ, "SENTEMB_FAULT": fault})
        if fault.startswith("sigterm"):
            assert proc.returncode == 128 + signal.SIGTERM, (fault, proc.returncode, proc.stderr[-2000:])
            assert proc.stderr.strip().splitlines()[-1] == (
                f"stopped by SIGTERM after step 15; its checkpoint is in {ckpt} - run the same command to resume from it")
        else:
            assert proc.returncode == -signal.SIGKILL, (fault, proc.returncode, proc.stderr[-2000:])
        assert _finalized(ckpt)[-1] == newest, (fault, _finalized(ckpt))
        if fault.startswith("in_save"):
            partial = _unfinished(ckpt)
            assert partial and int(partial[0].split(".")[0]) == 6, partial  # step 6, never finalised
        errs.append(proc.stderr)
    proc = subprocess.run(_packed_cmd(t5_dir, killed, data_dir), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Each restart resumed from the newest finalised checkpoint the kill before it left.
    for err, (_, newest) in zip(errs[1:] + [proc.stderr], KILLS):
        assert f"resumed from {killed} at step {newest}" in err, err[-2000:]
    a, data_a = latest_checkpoint(full, STEPS)
    b, data_b = latest_checkpoint(killed, STEPS)
    diffs = [float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))]
    assert len(diffs) > 10 and max(diffs) <= 1e-6
    assert data_a["input"] == data_b["input"] and data_a["input"]["step_in_epoch"] == STEPS


def test_stop_signals_set_a_flag_and_a_second_ctrl_c_interrupts():
    import signal as sig

    from sentemb_jax.errors import Preempted
    from sentemb_jax.training.preemption import StopSignals

    before = sig.getsignal(sig.SIGTERM)
    with StopSignals() as stop:
        assert stop.requested() is None
        os.kill(os.getpid(), sig.SIGINT)  # handled: the loop would checkpoint and stop
        assert stop.requested() == sig.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig.SIGINT)
    assert sig.getsignal(sig.SIGTERM) is before  # handlers restored
    e = Preempted(sig.SIGTERM, 12, "/run/checkpoints")
    assert e.exit_code == 143 and str(e).startswith("SIGTERM after step 12; its checkpoint is in /run/checkpoints")


def test_fault_plan_is_validated(monkeypatch):
    from sentemb_jax import faults

    monkeypatch.setenv(faults.ENV, "after_step:3")
    assert faults.planned() == ("after_step", 3)
    monkeypatch.setenv(faults.ENV, "sigterm_in:export")
    assert faults.planned() == ("sigterm_in", "export")
    monkeypatch.setenv(faults.ENV, "sometime")
    with pytest.raises(ValueError, match="SENTEMB_FAULT='sometime': expected one of after_step:<step>, sigterm_after_step:<step>, in_save:<step>"):
        faults.planned()


def test_model_dir_full_stops_before_training(t5_dir, tmp_path, data_dir, monkeypatch, capsys):
    from sentemb_jax import main as runner
    from sentemb_jax.training import trainer

    monkeypatch.setattr(trainer.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**12, 10**12 - 4096, 4096))
    out = tmp_path / "full_disk"
    assert runner.main(_train_args(t5_dir, str(out), data_dir)) == 1
    err = capsys.readouterr().err
    assert f"MODEL_DIR {out}: 0.00 GiB free, but 3 checkpoints of this train state" in err and "CheckpointConfig.keep" in err
    assert not os.path.exists(out / "metrics.jsonl") and not _finalized(str(out / "checkpoints"))


def test_model_without_weights_stops_before_training(t5_dir, tmp_path, data_dir):
    empty = tmp_path / "no_weights"
    empty.mkdir()
    for f in os.listdir(t5_dir):
        if not f.endswith(".safetensors"):
            shutil.copy(os.path.join(t5_dir, f), empty)
    out = tmp_path / "run"
    proc = subprocess.run(_cmd(str(empty), str(out), data_dir), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and f"{empty}: no weights found" in proc.stderr
    assert not os.path.exists(out / "metrics.jsonl")


# ------------------------------------------------------------------------------------------------
# encode() inputs and the tokenisation paths.


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    from sentemb_jax.encoder import SentenceEncoder

    return SentenceEncoder.from_pretrained(minilm_dir)


def test_encode_bad_inputs(minilm):
    # Empty input, None, a non-str item and batch_size 0: tests/test_minilm.py::test_encode_input_errors.
    from sentemb_jax.errors import InvalidTextError

    with pytest.raises(TypeError, match="item 0 is bytes"):
        minilm.encode([b"bytes"])
    with pytest.raises(InvalidTextError, match=r"item 1 is not valid Unicode \(lone surrogate '\\ud800' at character 2\)"):
        minilm.encode(["ok", "ab\ud800c"])
    long = "word " * 50_000  # 250k characters: truncated to the model's 256 tokens
    e = minilm.encode([long, ""])
    assert e.shape == (2, 384) and np.isfinite(e).all()
    np.testing.assert_allclose(e[0], minilm.encode(["word " * 300])[0], atol=1e-5)  # same first 254 word pieces
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert minilm.encode("one").shape == (384,)


# Any code point: hypothesis' default alphabet leaves out surrogates (Cs); add them, and more
# control characters (Cc).
ANY_TEXT = st.text(st.one_of(st.characters(), st.characters(categories=["Cs", "Cc"])), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(texts=st.lists(ANY_TEXT, max_size=5))
@example(texts=["\ud800"])  # found by hypothesis: a lone surrogate (InvalidTextError since)
@example(texts=["ok", "ab\ud800c"])
def test_fuzz_encode_only_our_error(minilm, texts):
    from sentemb_jax.errors import InvalidTextError

    has_surrogate = any(0xD800 <= ord(c) <= 0xDFFF for t in texts for c in t)
    try:
        e = minilm.encode(texts, batch_size=4)
    except InvalidTextError as err:
        assert has_surrogate and "lone surrogate" in str(err)
        return
    assert not has_surrogate and e.shape == (len(texts), 384) and np.isfinite(e).all()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(text=st.text(st.characters(codec="utf-8"), max_size=60))
@example(text="[UNK]")  # found by hypothesis: HF's special-token strings in the text
@example(text="\u2028")  # found by hypothesis: U+2028 / U+2029 are whitespace for HF
@example(text="a\u2029b")
def test_fuzz_pipeline_tokenisation_equals_hf(minilm_dir, hf_minilm, text):
    """The seqio pipeline's in-graph WordPiece (TF) on random valid Unicode, control characters
    and special-token strings ("[UNK]") included: never raises, and gives Hugging Face's ids.
    tests/test_tokenizer_unicode.py checks 3,000 whitespace / control / format / mark characters."""
    import tensorflow as tf

    from sentemb_jax.data.vocab import tokenizer_spec_for

    spec = tokenizer_spec_for(minilm_dir)
    ids = spec.tokenize_tf(tf.constant(text), 64).numpy().tolist()
    assert ids[0] == 101 and ids[-1] == 102 and len(ids) <= 64 and max(ids) < 30522
    assert ids == hf_minilm(text, truncation=True, max_length=64)["input_ids"]


@pytest.fixture(scope="module")
def hf_minilm(minilm_dir):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(minilm_dir)


def test_max_seq_length_beyond_positions_is_capped(minilm_dir, caplog):
    """BERT has 512 learned positions: 1024 gave NaN for every row of a batch with a long text."""
    import logging

    from sentemb_jax.encoder import SentenceEncoder

    with caplog.at_level(logging.WARNING, logger="sentemb_jax"):
        enc = SentenceEncoder.from_pretrained(minilm_dir, max_seq_length=1024)
    assert enc.max_seq_length == 512
    assert f"{minilm_dir}: max_seq_length=1024 is more than the model's 512 positions; capped at 512" in caplog.text
    e = enc.encode(["word " * 2000, "short"])
    assert np.isfinite(e).all()
    np.testing.assert_allclose(e, SentenceEncoder.from_pretrained(minilm_dir, max_seq_length=512).encode(["word " * 2000, "short"]),
                               atol=1e-6)
    with pytest.raises(ValueError, match="max_seq_length must be >= 1, got 0"):
        SentenceEncoder.from_pretrained(minilm_dir, max_seq_length=0)


def test_model_without_tokenizer_files_is_an_error(minilm_dir, tmp_path):
    """It loaded with a 5-token fallback vocabulary (every word [UNK]) and gave wrong embeddings."""
    from sentemb_jax.encoder import SentenceEncoder
    from sentemb_jax.errors import TokenizerError

    copy = tmp_path / "no_tokenizer"
    shutil.copytree(minilm_dir, copy, ignore=shutil.ignore_patterns("tokenizer.json", "vocab.txt"))
    with pytest.raises(TokenizerError, match=f"{copy}: no tokenizer found \\(looked for tokenizer.json, vocab.txt"):
        SentenceEncoder.from_pretrained(str(copy))
