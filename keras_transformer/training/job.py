"""`Job`: where this process trains (the strategy, its worker index, the chief's run
directory)."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from keras_transformer.run_dir import Run
from keras_transformer.training.strategy import is_chief, make_strategy


@dataclasses.dataclass(frozen=True)
class Job:
    """Where this process trains: the strategy, its worker index (None for the chief, as
    TensorFlow decides) and the chief's run directory (config.json, spm.model, checkpoints,
    metrics), which only the chief writes: every variable of a checkpoint is mirrored, the
    other workers' copies would be dead files."""

    strategy: tf.distribute.Strategy
    task: int | None
    shared: Run

    @property
    def chief(self) -> bool:
        return self.task is None

    @property
    def multi_worker(self) -> bool:
        return isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)

    @classmethod
    def start(cls, model_dir: str, strategy_name: str) -> Job:
        # first: collective ops are set up at startup
        strategy = make_strategy(strategy_name, model_dir)
        task = None if is_chief(strategy) else strategy.cluster_resolver.task_id
        return cls(strategy, task, Run(model_dir))


__all__ = ["Job"]
