"""MTEB 2 (mteb 2.26.24) runs our encoders through its own evaluator: `MtebEncoder` on a local STS-B
test task scores what our STS-B evaluator scores, and what MTEB scores sentence-transformers' model
on the same weights; `MtebCrossEncoder` satisfies MTEB's cross-encoder protocol.

No hub: the task's data is /work/shared/data/stsb/test.tsv; MTEB's result cache is a tmp dir."""
from __future__ import annotations

import os
import tempfile
import time

import pytest

# mteb builds its default result cache when imported: keep it out of the repo and home.
os.environ.setdefault("MTEB_CACHE", os.path.join(tempfile.gettempdir(), "sentemb_jax_test_mteb_cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

mteb = pytest.importorskip("mteb")

import datasets  # noqa: E402
from mteb.abstasks.sts import AbsTaskSTS  # noqa: E402
from mteb.abstasks.task_metadata import TaskMetadata  # noqa: E402
from mteb.models import CrossEncoderProtocol, EncoderProtocol  # noqa: E402
from mteb.types import PromptType  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from sentemb_jax.data.files import read_sts_pairs  # noqa: E402
from sentemb_jax.evaluation.mteb_adapter import MtebCrossEncoder, MtebEncoder  # noqa: E402


class LocalStsbTest(AbsTaskSTS):
    """STS-B test (1,379 pairs, gold 0-5) from DATA_DIR/stsb/test.tsv instead of the hub."""

    min_score = 0
    max_score = 5
    metadata = TaskMetadata(
        name="LocalSTSBenchmarkTest",
        dataset={"path": "local/stsb", "revision": "local"},
        description="STS-B test split read from the shared data folder (no hub).",
        reference="https://github.com/PhilipMay/stsb-multi-mt/",
        type="STS",
        category="t2t",
        modalities=["text"],
        eval_splits=["test"],
        eval_langs=["eng-Latn"],
        main_score="cosine_spearman",
        date=("2017-01-01", "2017-12-31"),
        domains=["Blog", "News", "Written"],
        task_subtypes=[],
        license="not specified",
        annotations_creators="human-annotated",
        dialect=[],
        sample_creation="found",
        bibtex_citation="",
    )

    def __init__(self, data_dir: str, **kwargs):
        super().__init__(**kwargs)
        self.data_dir = data_dir

    def load_data(self, num_proc=None, **kwargs) -> None:
        if self.data_loaded:
            return
        s1, s2, gold = read_sts_pairs(os.path.join(self.data_dir, "stsb", "test.tsv"), score_range=(0.0, 5.0))
        self.dataset = datasets.DatasetDict({"test": datasets.Dataset.from_dict(
            {"sentence1": s1, "sentence2": s2, "score": [float(g) for g in gold]})})
        self.data_loaded = True


def _main_score(model, data_dir: str, cache_dir) -> float:
    task = LocalStsbTest(data_dir)
    result = mteb.evaluate(model, task, cache=mteb.ResultCache(cache_path=str(cache_dir)),
                           overwrite_strategy="always", encode_kwargs={"batch_size": 64}, show_progress_bar=False)
    (task_result,) = result.task_results
    return float(task_result.get_score())


@pytest.fixture(scope="module")
def encoder(minilm_dir):
    from sentemb_jax.encoder import SentenceEncoder

    return SentenceEncoder.from_pretrained(minilm_dir)


def test_mteb2_scores_our_encoder_as_our_sts_evaluator_and_as_sentence_transformers(
        encoder, minilm_dir, data_dir, tmp_path, monkeypatch):
    from sentence_transformers import SentenceTransformer

    from sentemb_jax.evaluation.sts import StsbEvaluator

    monkeypatch.chdir(tmp_path)  # anything MTEB writes relative to the working directory lands here
    ours = MtebEncoder(encoder, name="sentence-transformers/all-MiniLM-L6-v2", languages=["eng-Latn"])
    assert isinstance(ours, EncoderProtocol)
    meta = ours.mteb_model_meta
    assert meta.embed_dim == 384 and meta.framework == ["JAX"] and meta.similarity_fn_name.value == "cosine"
    assert 20_000_000 < meta.n_parameters < 25_000_000  # all-MiniLM-L6-v2: 22.7M

    t0 = time.perf_counter()
    mteb_ours = _main_score(ours, data_dir, tmp_path / "cache_ours") * 100
    t1 = time.perf_counter()
    own = StsbEvaluator(data_dir, split="test")(encoder)["spearman"]
    t2 = time.perf_counter()
    mteb_st = _main_score(SentenceTransformer(minilm_dir, device="cpu"), data_dir, tmp_path / "cache_st") * 100
    t3 = time.perf_counter()
    print(f"\nSTS-B test Spearman x100: MTEB 2 on MtebEncoder {mteb_ours:.4f} ({t1 - t0:.1f}s), "
          f"our StsbEvaluator {own:.4f} ({t2 - t1:.1f}s), MTEB 2 on SentenceTransformer {mteb_st:.4f} ({t3 - t2:.1f}s)")
    assert abs(mteb_ours - own) <= 0.01
    assert abs(mteb_ours - mteb_st) <= 0.05
    assert 75 < mteb_ours < 90  # all-MiniLM-L6-v2 on STS-B test: 82.0
    # MTEB wrote its result files into the tmp caches given to it.
    assert any(files for _, _, files in os.walk(tmp_path / "cache_ours"))


def test_mteb_encoder_takes_a_dataloader_and_picks_prompts_as_mteb(encoder):
    texts = ["A man is playing a guitar.", "A woman slices an onion.", "Two dogs run."]
    loader = DataLoader(datasets.Dataset.from_dict({"text": texts}), batch_size=2)
    md = LocalStsbTest.metadata
    plain = MtebEncoder(encoder)
    got = plain.encode(loader, task_metadata=md, hf_split="test", hf_subset="default", batch_size=2)
    assert got.shape == (3, 384)
    assert abs(got - encoder.encode(texts)).max() <= 1e-5
    prompted = MtebEncoder(encoder, model_prompts={"query": "query: ", "STS": "sts: "})
    assert prompted.prompt(md, PromptType.query) == "sts: "  # task type beats prompt type
    q = MtebEncoder(encoder, model_prompts={"query": "query: "})
    assert q.prompt(md, PromptType.query) == "query: " and q.prompt(md, None) is None
    emb = q.encode(loader, task_metadata=md, hf_split="test", hf_subset="default", prompt_type=PromptType.query)
    assert abs(emb - encoder.encode(texts, prompt="query: ")).max() <= 1e-5


def test_mteb_cross_encoder_satisfies_the_protocol(minilm_dir):
    from sentemb_jax.cross_encoder import CrossEncoder

    ce = CrossEncoder.from_pretrained(minilm_dir, pooling="mean", max_seq_length=32, seed=0)
    wrapped = MtebCrossEncoder(ce)
    assert isinstance(wrapped, CrossEncoderProtocol)
    assert wrapped.mteb_model_meta.is_cross_encoder
    first = ["A man is playing a guitar.", "A woman slices an onion.", "Two dogs run."]
    second = ["A man plays guitar.", "Someone cuts an onion.", "A cat sleeps."]
    scores = wrapped.predict(DataLoader(datasets.Dataset.from_dict({"text": first}), batch_size=2),
                             DataLoader(datasets.Dataset.from_dict({"text": second}), batch_size=2),
                             task_metadata=LocalStsbTest.metadata, hf_split="test", hf_subset="default",
                             batch_size=2, show_progress_bar=False)
    assert scores.shape == (3,)
    assert abs(scores - ce.predict(list(zip(first, second)))).max() <= 1e-6
