"""Markdown tables of a results.json dictionary (the format the evaluation jobs write)."""
from __future__ import annotations

from sentemb_jax.evaluation.sts import STS_TASKS, TASK_LABELS

_MISSING = "–"


def _fmt(value) -> str:
    return _MISSING if value is None else f"{value:.2f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def sts_table(results: dict, model_name: str) -> str:
    """STS12 STS13 STS14 STS15 STS16 STS-B SICK-R Avg (Spearman x 100); omitted tasks show '–'."""
    return sts_rows_table({model_name: results["sts"]})


def sts_rows_table(rows: dict[str, dict]) -> str:
    """The STS table with one row per model (name -> its `sts` scores)."""
    header = ["Model"] + [TASK_LABELS.get(t, t) for t in STS_TASKS] + ["Avg"]
    return markdown_table(header, [[name] + [_fmt(sts.get(t)) for t in STS_TASKS] + [_fmt(sts.get("avg"))]
                           for name, sts in rows.items()])


def pairs_table(results: dict, model_name: str) -> str:
    pairs = results["pairs"]
    cols = [("MRPC", "MRPC test"), ("QNLI", "QNLI dev[1000:]"), ("QNLI_dev", "QNLI dev[:1000]"), ("QQP", "QQP")]
    cols = [(k, label) for k, label in cols if k in pairs or k != "QQP"]
    return markdown_table(["Model"] + [label for _, label in cols],
                  [[model_name] + [_fmt(pairs.get(k, {}).get("auc")) for k, _ in cols]])


def transfer_table(results: dict, model_name: str) -> str:
    transfer = results["transfer"]
    tasks = ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC"]
    return markdown_table(["Model"] + tasks + ["Avg"],
                  [[model_name] + [_fmt(transfer.get(t, {}).get("acc")) for t in tasks] + [_fmt(transfer.get("avg"))]])


def sentglue_table(results: dict, model_name: str) -> str:
    glue = results["sentglue"]
    cols = [("MRPC", "MRPC acc"), ("STSB", "STS-B Spearman"), ("QNLI", "QNLI acc"), ("SICKE", "SICK-E acc")]
    row = [_fmt(glue.get(k, {}).get("score")) for k, _ in cols]
    if "MRPC" in glue:
        row[0] += f" (F1 {glue['MRPC']['f1']:.2f})"
    return markdown_table(["Model"] + [label for _, label in cols] + ["Avg"], [[model_name] + row + [_fmt(glue.get("avg"))]])


def results_markdown(results: dict) -> str:
    """All sections present in `results`, each with a one-line note on how it was computed."""
    name = results.get("model_name", "model")
    parts = [f"# Evaluation of `{results.get('model', name)}`", ""]
    if "sts" in results:
        parts += [f"## STS (cosine Spearman x 100, STS12-16 aggregation `{results['aggregation']}`)", "",
                  sts_table(results, name), ""]
        if results.get("sts_missing"):
            parts += [f"Omitted (data absent): {', '.join(results['sts_missing'])}; Avg is over the tasks shown.", ""]
    if "alignment_uniformity" in results:
        au = results["alignment_uniformity"]
        parts += ["## Alignment / uniformity (STS-B test; lower is better)", "",
                  markdown_table(["Model", "alignment", "uniformity", "positive pairs (gold > 4)"],
                         [[name, f"{au['alignment']:.4f}", f"{au['uniformity']:.4f}", str(au["positive_pairs"])]]), ""]
    if "pairs" in results:
        parts += ["## Pair classification (ROC AUC x 100 of cosine scores)", "", pairs_table(results, name), ""]
    if "transfer" in results:
        parts += ["## SentEval transfer (accuracy x 100; logistic regression)", "", transfer_table(results, name), ""]
    if "sentglue" in results:
        parts += ["## SentGLUE-style pair tasks ([u, v, |u-v|, u*v] + linear head; x 100)", "",
                  sentglue_table(results, name), ""]
    if "reranking" in results:
        rr = results["reranking"]
        parts += ["## Re-ranking (x 100)", "", markdown_table(["Model", "file", "MAP", "MRR@10", "queries"],
                                                      [[name, rr["path"], _fmt(rr["map"]), _fmt(rr["mrr@10"]), str(rr["queries"])]]), ""]
    return "\n".join(parts)
