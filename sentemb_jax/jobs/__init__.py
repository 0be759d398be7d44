"""Every job `python -m sentemb_jax.main` can run (`run.job = @sentemb_jax.<job>` in gin), one module
per kind; importing this package registers all of them with gin (and what they configure).

    train                  sentemb_jax.training.trainer   the train loop: contrastive, ConGen / SCT, ensemble student
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
import gin
from sentemb_jax import distributed, hub  # noqa: F401 - their gin configurables (initialize_distributed, packaged_minilm_path)
from sentemb_jax.data import from_scratch  # noqa: F401 - from_scratch_inputs (scaling_study.prepare)
from sentemb_jax.export import export_savedmodel
from sentemb_jax.jobs import compose, data, distill, evaluate, prepare, scaling, trans_encoder  # noqa: F401 - registers their jobs
from sentemb_jax.methods import queue_distill, triplet  # noqa: F401 - QueueDistillConfig (train.distill), triplet_margin_loss
from sentemb_jax.paths import default_data_dir
from sentemb_jax.training import trainer  # noqa: F401 - the train job

gin.external_configurable(default_data_dir, module="sentemb_jax")
gin.external_configurable(export_savedmodel, module="sentemb_jax")
