"""The train job and the run configuration as gin builds them.

    python -m sentemb_jax.main --gin_file=gin/models/minilm_l6.gin --gin_file=gin/runs/minilm_nli.gin \
        --gin.MODEL_DIR="'/tmp/minilm_nli'"

gin injects whole components, as t5x does: `sentemb_jax.train.config = @sentemb_jax.RunConfig()`
and `sentemb_jax.train.method = %METHOD` (gin/train.gin). Each group of the config is bound by its
own selector - `sentemb_jax.DataConfig.batch_size = 64`, `sentemb_jax.OptimizerConfig.name =
'adamw'` - and a gin scope applies to the groups too (`stage1/sentemb_jax.DataConfig.task`).
"""
from __future__ import annotations

import gin
from sentemb_jax.distributed import is_primary
from sentemb_jax.errors import ConfigError
from sentemb_jax.run_dir import write_gin_config
from sentemb_jax.training import trainer
from sentemb_jax.training.config import (
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    MeshConfig,
    OptimizerConfig,
    RunConfig,
    ScheduleConfig,
    TowerConfig,
)
from sentemb_jax.training.method import Method

_GROUPS = {"data": DataConfig, "optimizer": OptimizerConfig, "schedule": ScheduleConfig, "mesh": MeshConfig,
           "checkpoints": CheckpointConfig, "evaluation": EvalConfig}


def made(value, cls):
    """`value`, or what it makes when it is a class gin names without calling it (`MODEL =
    @sentemb_jax.TowerConfig`, `METHOD = @sentemb_jax.ConGen`): made here, in the current gin
    scope, so that scoped bindings (stage1/sentemb_jax.TowerConfig.*) apply to it."""
    if value is not None and not isinstance(value, cls) and callable(value):
        return value()
    return value


@gin.configurable("RunConfig", module="sentemb_jax")
def run_config(model_dir: str = gin.REQUIRED, num_steps: int = gin.REQUIRED, model: TowerConfig | None = None,
               data: DataConfig | None = None, optimizer: OptimizerConfig | None = None,
               schedule: ScheduleConfig | None = None, mesh: MeshConfig | None = None,
               checkpoints: CheckpointConfig | None = None, evaluation: EvalConfig | None = None, log_every: int = 10,
               time_budget_s: float | None = None, skip_nonfinite: int = 0, prng_impl: str | None = None,
               matmul_precision: str = "default") -> RunConfig:
    """A RunConfig (training.config); a group not bound here is made from its own bindings
    (`sentemb_jax.DataConfig.*`, ...) in the current gin scope."""
    groups = {name: given if given is not None else gin.get_configurable(f"sentemb_jax.{cls.__name__}")()
              for (name, cls), given in zip(_GROUPS.items(), (data, optimizer, schedule, mesh, checkpoints, evaluation))}
    return RunConfig(model_dir=model_dir, num_steps=num_steps, model=made(model, TowerConfig), log_every=log_every,
                     time_budget_s=time_budget_s, skip_nonfinite=skip_nonfinite, prng_impl=prng_impl,
                     matmul_precision=matmul_precision, **groups)


@gin.configurable(module="sentemb_jax")
def train(config: RunConfig = gin.REQUIRED, method: Method = gin.REQUIRED, export_dir: str | None = None) -> dict:
    """Train `config`'s tower with `method` (training.trainer.train); the gin configuration is kept in
    MODEL_DIR/config.gin once the start checks have passed, as t5x does. export_dir: the best tower
    by STS-B dev as a sentence-transformers directory at the end."""
    def keep_gin_config() -> None:
        if is_primary():
            write_gin_config(config.model_dir, gin.config_str(), gin.markdown(gin.config_str()))

    return trainer.train(config, made(method, Method), export_dir=export_dir, on_start=keep_gin_config)


def bound_train() -> tuple[RunConfig, Method]:
    """(config, method) the parsed gin files give the train job - what the compile-only tools and
    the step-time benchmark build their program from (gin must be parsed)."""
    bindings = gin.get_bindings("sentemb_jax.train")
    missing = [name for name in ("config", "method") if name not in bindings]
    if missing:
        raise ConfigError(f"these gin files configure no train job: sentemb_jax.train.{missing[0]} is unbound "
                          "(a run file includes gin/train.gin; a model file sets MODEL)")
    return bindings["config"], made(bindings["method"], Method)


def bound_model() -> TowerConfig:
    """The TowerConfig the parsed gin files' model file sets (`MODEL`): what the encode and
    Trans-Encoder compile-only programs build their tower from."""
    try:
        model = made(gin.get_bindings("MODEL/gin.macro").get("value"), TowerConfig)
    except (ValueError, KeyError):
        model = None
    if not isinstance(model, TowerConfig):
        raise ConfigError("these gin files set no model: add a model file, e.g. --gin_file=gin/models/st5_base.gin "
                          "(it sets MODEL = @sentemb_jax.TowerConfig)")
    return model
