"""Evaluation of sentence encoders: STS, pair AUC, SentEval transfer, SentGLUE, geometry, re-ranking.

What counts as a model (see `encoding.py`):

* a bi-encoder: any object with `encode(sentences, batch_size=..., **kwargs) -> array [n, dim]`
  (`SentenceEncoder`, `sentence_transformers.SentenceTransformer`, an MTEB custom model), or a
  plain callable `f(sentences) -> array [n, dim]`;
* a cross-encoder (pair tasks and re-ranking only): any object with `predict(pairs) -> array [n]`
  and no `encode` (`sentence_transformers.CrossEncoder`).

Modules: `sts` (STS12-16, STS-B, SICK-R), `pairs` (AUC), `transfer` (SentEval MR/CR/SUBJ/MPQA/SST2/TREC),
`sentglue` (MRPC/STS-B/QNLI/SICK-E with [u, v, |u-v|, u*v]), `geometry` (alignment/uniformity),
`reranking` (MAP, MRR@10), `readers` (labelled TSV / JSONL files), `plots`, `report`, `mteb_adapter`
(MTEB 2's encoder / cross-encoder protocols; imports mteb, so nothing else imports it). The gin jobs that run
them are in `sentemb_jax/jobs/evaluate.py`.
"""
