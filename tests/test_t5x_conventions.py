"""t5x's job conventions: MODEL_DIR/config.gin (and the same text in TensorBoard), the
comma-separated --gin_search_paths, --tfds_data_dir for TFDS-backed seqio tasks, and t5x's
Adafactor in the Sentence-T5 files."""
import glob

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds
from run_utils import gin_file_args

import gin
from sentemb_jax import main as runner
from sentemb_jax.data.pipeline import InputPipeline
from sentemb_jax.data.tasks import _register
from sentemb_jax.data.vocab import tokenizer_spec_for

PAIRS = [("how do I renew a passport?", "Apply online with the old passport."),
         ("best way to learn piano", "Practise a little every day."),
         ("why is the sky blue", "Rayleigh scattering of sunlight."),
         ("can I freeze bread", "Yes, sliced bread freezes well.")]


class SentembTinyQa(tfds.core.GeneratorBasedBuilder):
    """Four question/answer pairs, prepared into a local TFDS directory by the test (no download)."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"anchor": tfds.features.Text(), "positive": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i, (q, a) in enumerate(PAIRS):
            yield i, {"anchor": q, "positive": a}


def _event_texts(directory: str) -> dict[str, str]:
    texts = {}
    for path in glob.glob(f"{directory}/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tensor.string_val:
                    texts[value.tag] = value.tensor.string_val[0].decode()
    return texts


def test_config_gin_search_paths_and_tfds_data_dir(tmp_path, data_dir, minilm_dir):
    # Two search directories in one comma-separated flag; the include lives in the second.
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (second / "split.gin").write_text("sentemb_jax.evaluate_stsb.split = 'dev'\n")
    model_dir = tmp_path / "run"
    job = tmp_path / "job.gin"
    job.write_text("include 'gin/models/minilm_l6.gin'\ninclude 'gin/runs/eval_stsb_dev.gin'\ninclude 'split.gin'\n"
                   f"MODEL_DIR = '{model_dir}'\nsentemb_jax.evaluate_stsb.model_dir = %MODEL_DIR\n")
    tfds_dir = tmp_path / "tfds"
    SentembTinyQa(data_dir=str(tfds_dir)).download_and_prepare()
    try:
        rc = runner.main([f"--gin_file={job}", f"--gin_search_paths={first},{second}", f"--tfds_data_dir={tfds_dir}",
                          f"--gin.DATA_DIR='{data_dir}'", "--gin.sentemb_jax.evaluate_stsb.batch_size=128"])
        assert rc == 0

        # config.gin holds the command line's override and parses back to the same configuration.
        written = (model_dir / "config.gin").read_text()
        assert "evaluate_stsb.batch_size = 128" in written  # gin writes the short names
        assert "evaluate_stsb.split = 'dev'" in written
        gin.clear_config()
        gin.parse_config_files_and_bindings([str(model_dir / "config.gin")], [])
        assert gin.config_str() == written
        assert gin.markdown(written) == _event_texts(str(model_dir / "tensorboard"))["gin/config/text_summary"]

        # --tfds_data_dir reached seqio: a TFDS-backed task reads the local prepared dataset,
        # through our own input pipeline.
        name = _register("sentemb_test_tfds_qa", seqio.TfdsDataSource(tfds_name="sentemb_tiny_qa:1.0.0"),
                         ("anchor", "positive"), tokenizer_spec_for(minilm_dir))
        pipe = InputPipeline(name, batch_size=4, sequence_length=32, seed=0, shuffle=False, num_epochs=1)
        batch = next(iter(pipe))
        spec = tokenizer_spec_for(minilm_dir)
        want = [list(spec.tokenize_batch_tf(tf.constant([q for q, _ in PAIRS]), 32).to_list()[i]) for i in range(4)]
        got = [row[mask == 1].tolist() for row, mask in zip(batch["anchor_input_ids"], batch["anchor_attention_mask"])]
        assert sorted(got) == sorted(want)
    finally:
        seqio.set_tfds_data_dir_override(None)
        seqio.TaskRegistry.remove("sentemb_test_tfds_qa")


@pytest.mark.parametrize("args, message", [
    ([*gin_file_args("gin/runs/eval_stsb_dev.gin"), "--gin_search_paths=/no/such/dir"], "--gin_search_path(s)=/no/such/dir: no such directory"),
    ([*gin_file_args("gin/runs/eval_stsb_dev.gin"), "--tfds_data_dir="], "--tfds_data_dir: empty"),
])
def test_bad_t5x_flags_exit_2(args, message, capsys):
    gin.clear_config()
    assert runner.main(args) == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# t5x's Adafactor (gin/optimizers/adafactor_t5x.gin): parameter scaling and update clipping at 1.0

ST5_FILES = [f"gin/st5_{size}{kind}.gin" for size in ("base", "large", "3b", "11b") for kind in ("", "_encdec")]


@pytest.mark.parametrize("path", ST5_FILES)
def test_st5_files_train_with_t5x_adafactor(path, monkeypatch):
    from sentemb_jax.training import optimizers

    runner.register_configurables()
    runner.parse_gin([path], ["MODEL_DIR='/tmp/unused'", "TOKENIZER_DIR='/tmp/unused'"])
    seen, original = {}, optax.adafactor

    def adafactor(*args, **kwargs):  # what reaches optax when the train job builds its optimizer
        seen.update(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(optimizers.optax, "adafactor", adafactor)
    from sentemb_jax.jobs.train import bound_train

    config, _ = bound_train()
    optimizers.make_optimizer(config.optimizer, config.schedule, config.num_steps)
    assert seen["multiply_by_parameter_scale"] is True and seen["clipping_threshold"] == 1.0
    assert seen["decay_rate"] == 0.8 and seen["min_dim_size_to_factor"] == 128 and seen["factored"] is True


def test_make_optimizer_clipping_threshold_is_optax_adafactor():
    from sentemb_jax.training.config import OptimizerConfig, ScheduleConfig
    from sentemb_jax.training.optimizers import make_optimizer

    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(130, 4)), jnp.float32), "b": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}
    grads = [jax.tree_util.tree_map(lambda p, s=s: jnp.asarray(np.random.default_rng(s).normal(size=p.shape) * 10, p.dtype),
                                    params) for s in range(3)]

    def updates(opt):
        state, out = opt.init(params), []
        for g in grads:
            u, state = opt.update(g, state, params)
            out.append(u)
        return out

    direct = dict(min_dim_size_to_factor=128, decay_rate=0.8, multiply_by_parameter_scale=True, factored=True)
    for clip_norm in (1.0, None):  # with the global-norm clipping of the gradient before it, and without
        ours = updates(make_optimizer(OptimizerConfig("adafactor", clip_norm=clip_norm, multiply_by_parameter_scale=True,
                                                      clipping_threshold=1.0),
                                      ScheduleConfig(peak=1e-2, decay="constant"), num_steps=3))
        want = optax.adafactor(1e-2, clipping_threshold=1.0, **direct)
        want = updates(optax.chain(optax.clip_by_global_norm(clip_norm), want) if clip_norm else want)
        for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The threshold is reached in these steps: without it the updates differ.
    unclipped = updates(optax.adafactor(1e-2, clipping_threshold=None, **direct))
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(unclipped), jax.tree_util.tree_leaves(ours)))


@pytest.mark.parametrize("value,text", [(0, "0"), (-1, "-1"), ("x", "'x'"), (float("inf"), "1e999")])
def test_bad_clipping_threshold_names_the_argument_and_the_binding(value, text):
    from sentemb_jax import configuration
    from sentemb_jax.errors import ConfigError
    from sentemb_jax.training.config import OptimizerConfig

    allowed = "must be None (no update clipping) or a finite number > 0"
    with pytest.raises(ConfigError) as e:
        OptimizerConfig(clipping_threshold=value)
    assert str(e.value).startswith(f"sentemb_jax.OptimizerConfig(clipping_threshold={value!r}): {allowed}")
    runner.register_configurables()
    gin.parse_config(f"sentemb_jax.OptimizerConfig.clipping_threshold = {text}")
    gin.finalize()
    with pytest.raises(ConfigError) as e:
        gin.get_configurable("sentemb_jax.OptimizerConfig")()
    assert configuration.reword(e.value).startswith(
        f"gin binding sentemb_jax.OptimizerConfig.clipping_threshold = {value!r}: {allowed}")
