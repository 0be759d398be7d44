"""Everything a gin file can name besides the jobs: the library's configs, methods and helpers,
registered here - at the edge - so that the library itself knows no gin. Each is registered as
`sentemb_jax.<Name>`, the name its errors use (`sentemb_jax.DataConfig(batch_size=0): ...`), so
the command line finds the binding that set a bad value by that name."""
from __future__ import annotations

import gin
from sentemb_jax.distributed import initialize_distributed
from sentemb_jax.export import export_savedmodel
from sentemb_jax.hub import packaged_minilm_path, packaged_mpnet_path
from sentemb_jax.methods.contrastive import Contrastive, SimCSE
from sentemb_jax.methods.queue_distill import (
    SCT,
    ConGen,
    ContrastiveDistillation,
    EnsembleStudent,
    L2Distillation,
)
from sentemb_jax.methods.trans_encoder import DistillPhase, EvalSet
from sentemb_jax.methods.triplet import Triplet
from sentemb_jax.models import BertConfig, MPNetConfig, T5Config
from sentemb_jax.paths import default_data_dir
from sentemb_jax.training.config import (
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    MeshConfig,
    OptimizerConfig,
    ScheduleConfig,
    TowerConfig,
)

MODULE = "sentemb_jax"

CONFIGS = (TowerConfig, DataConfig, OptimizerConfig, ScheduleConfig, MeshConfig, CheckpointConfig, EvalConfig,
           T5Config, BertConfig, MPNetConfig, DistillPhase, EvalSet)
METHODS = (Contrastive, SimCSE, Triplet, ConGen, ContrastiveDistillation, L2Distillation, SCT, EnsembleStudent)
HELPERS = (default_data_dir, packaged_minilm_path, packaged_mpnet_path, initialize_distributed, export_savedmodel)

for _configurable in (*CONFIGS, *METHODS, *HELPERS):
    gin.external_configurable(_configurable, module=MODULE)
