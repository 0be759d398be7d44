"""The accelerator report's bundle: bounded before anything is written, at most 64 MiB, and it
unpacks to a model equal to the bfloat16-rounded original and to the data as it was."""
import filecmp
import os

import numpy as np
import pytest

from sentemb_jax.benchmarks import report_kit
from sentemb_jax.encoder import SentenceEncoder
from sentemb_jax.errors import ConfigError
from sentemb_jax.hub import packaged_minilm_path


def test_a_bundle_over_its_limit_is_refused_before_anything_is_written(tmp_path, data_dir):
    """Refused before the model is read where the data and packages alone are over the limit, and
    after compacting the model (before writing) where they fit but the whole bundle would not."""
    with pytest.raises(ConfigError, match=r"at least .* MiB \(its data, packages and wheels\), over --limit_mib 8 "
                                          r"\(nothing was written\)") as early:
        report_kit.pack(packaged_minilm_path(), data_dir, str(tmp_path / "kit"), [], limit_mib=8)
    rest_mib = float(str(early.value).split("at least ")[1].split(" MiB")[0])
    limit = round(rest_mib + 1, 1)  # the data and packages fit; with the model they do not
    with pytest.raises(ConfigError, match=rf"would take up to .* MiB, over --limit_mib {limit:g} \(nothing was written\)"):
        report_kit.pack(packaged_minilm_path(), data_dir, str(tmp_path / "kit"), [], limit_mib=limit)
    assert os.listdir(tmp_path) == []


def test_the_bundle_fits_64_mib_and_unpacks_to_the_rounded_model_and_the_data(tmp_path, data_dir):
    kit, out = tmp_path / "kit", tmp_path / "unpacked"
    summary = report_kit.pack(packaged_minilm_path(), data_dir, str(kit), [])
    assert summary["bytes"] <= summary["bound"] <= 64 * 2**20
    assert {"gin", "tensorboardX", "pytest"} <= set(os.listdir(kit / "site"))
    done = report_kit.unpack(str(kit), str(out))
    for rel in ("stsb/test.tsv", "nli/sentences.tsv", "sts12-16/STS12"):
        a = os.path.join(data_dir, rel)
        files = [os.path.relpath(os.path.join(r, f), a) for r, _, fs in os.walk(a) for f in fs] if os.path.isdir(a) else ["."]
        assert files and all(filecmp.cmp(os.path.normpath(os.path.join(a, f)),
                                         os.path.normpath(os.path.join(done["data"], rel, f)), shallow=False)
                             for f in files), rel
    texts = ["A man is playing a guitar.", "Two dogs run through the snow."]
    original = SentenceEncoder.from_pretrained(packaged_minilm_path()).encode(texts, normalize_embeddings=True)
    rebuilt = SentenceEncoder.from_pretrained(done["model"]).encode(texts, normalize_embeddings=True)
    assert np.min(np.sum(original * rebuilt, axis=1)) > 0.999  # bfloat16-rounded weights, same rows
