"""Validated readers: real file counts, every bad-input case, and fuzzing."""
import json
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sentemb_jax.data.files import FileSpec, index_rows, read_examples, read_sts_pairs
from sentemb_jax.errors import DataError

PAIR = {"sentence1": "sentence1", "sentence2": "sentence2", "score": "score"}


def _sts_spec(path, **kw):
    return FileSpec(str(path), PAIR, score_field="score", score_range=(0.0, 5.0), **kw)


@pytest.mark.parametrize("rel, fields, keep, expected", [
    ("stsb/train.tsv", PAIR, {}, 5749),
    ("stsb/dev.tsv", PAIR, {}, 1500),
    ("stsb/test.tsv", PAIR, {}, 1379),
    ("sick/sick_r_trial.tsv", {"sentence1": "sentence1", "sentence2": "sentence2", "score": "score"}, {}, 500),
    ("nli/triples.tsv", {"anchor": "anchor", "positive": "positive", "negative": "negative"}, {}, 8279),
    ("nli/pairs.tsv", {"anchor": "sentence1", "positive": "sentence2"}, {}, 50237),
    ("nli/sentences.tsv", {"text": "sentence"}, {}, 73856),
    ("unlabelled/wiki1m_head.tsv", {"text": "sentence"}, {}, 11914),
    ("qa/cqa_qatarliving.jsonl", {"anchor": ("question_title", "question_body"), "positive": "answer"}, {"label": ("Good",)}, 5267),
])
def test_real_file_counts(data_dir, rel, fields, keep, expected):
    score = "score" if "score" in fields else None
    rng = (1.0, 5.0) if rel.startswith("sick") else (0.0, 5.0)
    index = index_rows(FileSpec(os.path.join(data_dir, rel), fields, score_field=score, score_range=rng if score else None, keep=keep))
    assert len(index) == expected
    assert index.summary.skipped_bad_rows == 0 and index.summary.skipped_empty_text == 0


def test_nli_entailment_pairs_and_rows_round_trip(data_dir):
    spec = FileSpec(os.path.join(data_dir, "nli/pairs.tsv"), {"anchor": "sentence1", "positive": "sentence2"},
                    keep={"label": ("entailment",)})
    index = index_rows(spec)
    assert len(index) + index.summary.filtered == 50237
    with open(spec.path, encoding="utf-8") as f:
        lines = f.read().split("\n")[1:]
    ent = [l.split("\t") for l in lines if l and l.split("\t")[2] == "entailment"]
    assert len(index) == len(ent)
    ex = read_examples(spec)
    assert (ex[0]["anchor"], ex[0]["positive"]) == (ent[0][0], ent[0][1])
    assert (ex[-1]["anchor"], ex[-1]["positive"]) == (ent[-1][0], ent[-1][1])


def _write(tmp_path, name, text, mode="w"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_wrong_field_count_names_file_and_line(tmp_path):
    path = _write(tmp_path, "a.tsv", "sentence1\tsentence2\tscore\na\tb\t1\nonly two\tfields\nc\td\t2\n")
    with pytest.raises(DataError, match=r"a\.tsv:3: expected 3 TAB-separated fields, found 2"):
        index_rows(_sts_spec(path))
    index = index_rows(_sts_spec(path), on_bad_row="skip")
    assert len(index) == 2 and index.summary.skipped_bad_rows == 1
    assert "line 3" in index.summary.first_bad_row and "skipped 1 malformed" in str(index.summary)
    assert [e["sentence1"] for e in read_examples(_sts_spec(path), on_bad_row="skip")] == ["a", "c"]


def test_invalid_utf8_names_byte_offset(tmp_path):
    data = "sentence1\tsentence2\tscore\na\tb\t1\n".encode() + b"ok\tbad \xff byte\t2\n"
    path = _write(tmp_path, "u.tsv", data)
    offset = data.index(b"\xff")
    with pytest.raises(DataError, match=rf"u\.tsv:3: invalid UTF-8 at byte offset {offset}"):
        index_rows(_sts_spec(path))


def test_empty_text_skipped_and_counted(tmp_path):
    path = _write(tmp_path, "e.tsv", "sentence1\tsentence2\tscore\na\tb\t1\n   \tb\t2\nc\t\t3\nd\te\t4\n")
    index = index_rows(_sts_spec(path))
    assert len(index) == 2 and index.summary.skipped_empty_text == 2


@pytest.mark.parametrize("score, message", [("nan", "score is nan"), ("7.5", r"score 7\.5 outside the declared range \[0\.0, 5\.0\]"),
                                            ("high", "score 'high' is not a number"), ("-1", r"score -1\.0 outside")])
def test_bad_scores_name_file_and_line(tmp_path, score, message):
    path = _write(tmp_path, "s.tsv", f"sentence1\tsentence2\tscore\na\tb\t1\nc\td\t{score}\n")
    with pytest.raises(DataError, match=rf"s\.tsv:3: {message}"):
        index_rows(_sts_spec(path))
    with pytest.raises(DataError, match=r"s\.tsv:3"):
        read_sts_pairs(str(path), score_range=(0, 5))


def test_missing_file_and_columns(tmp_path):
    with pytest.raises(DataError, match=r"nope\.tsv: no such file \(from X\.path='nope\.tsv'\)"):
        index_rows(FileSpec(str(tmp_path / "nope.tsv"), PAIR, binding="X.path='nope.tsv'"))
    path = _write(tmp_path, "h.tsv", "sentence1\tother\tscore\na\tb\t1\n")
    with pytest.raises(DataError, match=r"h\.tsv:1: header .* lacks column\(s\) \['sentence2'\]"):
        index_rows(_sts_spec(path))
    with pytest.raises(DataError, match="empty file"):
        index_rows(_sts_spec(_write(tmp_path, "z.tsv", "")))


def test_jsonl_bad_rows(tmp_path):
    good = {"question_title": "q", "question_body": "b", "answer": "a", "label": "Good"}
    lines = [json.dumps(good), "{not json", json.dumps([1, 2]), json.dumps({"question_title": "q"}),
             json.dumps({**good, "answer": {"x": 1}}), json.dumps({**good, "label": "Bad"}), json.dumps({**good, "answer": " "})]
    path = _write(tmp_path, "c.jsonl", "\n".join(lines) + "\n")
    spec = FileSpec(str(path), {"anchor": ("question_title", "question_body"), "positive": "answer"}, keep={"label": ("Good",)})
    with pytest.raises(DataError, match=r"c\.jsonl:2: not valid JSON"):
        index_rows(spec)
    index = index_rows(spec, on_bad_row="skip")
    s = index.summary
    assert (len(index), s.skipped_bad_rows, s.filtered, s.skipped_empty_text) == (1, 4, 1, 1)
    assert read_examples(spec, on_bad_row="skip") == [{"anchor": "q b", "positive": "a"}]


def _check_error(e: DataError, path: str):
    msg = str(e)
    assert msg.startswith(path), msg
    assert (":" in msg[len(path):len(path) + 12]) or "byte offset" in msg or "empty file" in msg, msg


# Any code point incl. lone surrogates (JSON escapes can spell them) and control characters.
_ANY_CHAR = st.one_of(st.characters(), st.characters(categories=["Cs", "Cc"]))


def test_jsonl_lone_surrogate_is_a_bad_row(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"q": "fine", "a": "ok", "label": "Good"}\n{"q": "bad \\ud800 here", "a": "x", "label": "Good"}\n')
    spec = FileSpec(str(path), {"anchor": "q", "positive": "a"}, keep={"label": ("Good",)})
    with pytest.raises(DataError, match=r"s\.jsonl:2: value of 'q' is not valid Unicode \(lone surrogate '\\ud800' at character 4\)"):
        index_rows(spec)
    assert read_examples(spec, on_bad_row="skip") == [{"anchor": "fine", "positive": "ok"}]


# A lone surrogate (hypothesis found it): U+D800 as bytes (not UTF-8) and as a JSON escape.
_SURROGATE_TSV = "x\ud800y\tb\t1.0\n".encode("utf-8", "surrogatepass")
_SURROGATE_JSONL = json.dumps({"q": "bad \ud800 here", "a": "x", "label": "Good"}).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.binary(max_size=400), on_bad_row=st.sampled_from(["error", "skip"]))
@example(data=_SURROGATE_TSV, on_bad_row="error")
@example(data=_SURROGATE_TSV, on_bad_row="skip")
def test_fuzz_tsv_reader_only_raises_data_error(tmp_path, data, on_bad_row):
    path = tmp_path / "fuzz.tsv"
    path.write_bytes(b"sentence1\tsentence2\tscore\n" + data)
    try:
        index = index_rows(_sts_spec(path), on_bad_row)
        read = 0
        for ex in read_examples(_sts_spec(path), on_bad_row):
            assert 0.0 <= ex["score"] <= 5.0 and ex["sentence1"].strip() and ex["sentence2"].strip()
            read += 1
        assert len(index) == read  # the index holds exactly the rows the reader yields
    except DataError as e:
        _check_error(e, str(path))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.one_of(st.binary(max_size=400),
                      st.lists(st.dictionaries(st.sampled_from(["q", "a", "label", "x"]),
                                               st.one_of(st.text(), st.text(_ANY_CHAR), st.integers(), st.none(),
                                                         st.lists(st.text())), max_size=4),
                               max_size=5).map(lambda rows: "\n".join(json.dumps(r) for r in rows).encode())),
       on_bad_row=st.sampled_from(["error", "skip"]))
@example(data=_SURROGATE_JSONL, on_bad_row="error")
@example(data=_SURROGATE_JSONL, on_bad_row="skip")
def test_fuzz_jsonl_reader_only_raises_data_error(tmp_path, data, on_bad_row):
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(data)
    spec = FileSpec(str(path), {"anchor": "q", "positive": "a"}, keep={"label": ("Good",)})
    try:
        for ex in read_examples(spec, on_bad_row):
            assert isinstance(ex["anchor"], str) and ex["anchor"].strip()
    except DataError as e:
        _check_error(e, str(path))
