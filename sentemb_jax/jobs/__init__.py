"""Every job `python -m sentemb_jax.main` can run (`run.job = @sentemb_jax.<job>` in gin), one module
per kind; importing this package registers all of them with gin, and with them everything a gin
file can name (jobs/configurables.py).

    train                  jobs/train.py       the train loop: any method (contrastive, ConGen / SCT, ensemble student)
    trans_encoder          jobs/trans_encoder.py   bi <-> cross self- / mutual distillation
    distill_report         jobs/distill.py     distil, then the STS table of teacher, student before / after
    ensemble_distill       jobs/distill.py     submodels, their ensemble, its distilled student
    eval_sts / eval_pairs / eval_transfer / eval_sentglue / eval_reranking / eval_all / evaluate_stsb
                           jobs/evaluate.py    evaluate a model directory into MODEL_DIR/results.json
    export_savedmodel      sentemb_jax.export  a TF SavedModel with in-graph tokenisation
    data_summary           jobs/data.py        validate the data files, show a batch of each task
    prepare_corpus         jobs/prepare.py     validate a large corpus once into ArrayRecord shards + manifest
    scaling_study          jobs/scaling.py     a ladder of model sizes, one recipe: table + score vs params / FLOPs
    run_stages, join_path  jobs/compose.py     several jobs in a row; a path from macros
"""
from sentemb_jax.jobs import (  # noqa: F401 - registers their jobs and configurables
    compose,
    configurables,
    data,
    distill,
    evaluate,
    prepare,
    scaling,
    train,
    trans_encoder,
)
