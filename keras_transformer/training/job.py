"""`Job`: where this process trains (the strategy, its worker index, the chief's run
directory as the job found it), set up once at its start and read as data from then on."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from keras_transformer.run_dir import Run, RunState
from keras_transformer.settings.args import TrainArgs
from keras_transformer.training.strategy import place


@dataclasses.dataclass(frozen=True)
class Job:
    """Where this process trains: the strategy, its worker index (`task`: None for the chief,
    as TensorFlow decides) and the chief's run directory (config.json, spm.model,
    checkpoints, metrics: `shared`, and `found`, what it held at the start), which only the
    chief writes: every variable of a checkpoint is mirrored, the other workers' copies would
    be dead files."""

    strategy: tf.distribute.Strategy
    task: int | None
    found: RunState
    chief: bool = dataclasses.field(init=False)
    multi_worker: bool = dataclasses.field(init=False)
    shared: Run = dataclasses.field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "chief", self.task is None)
        multi_worker = isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)
        object.__setattr__(self, "multi_worker", multi_worker)
        object.__setattr__(self, "shared", self.found.run)

    @classmethod
    def start(cls, args: TrainArgs) -> Job:
        """The job of kt-train's flags `args`: placed first (`strategy.place`: the devices,
        the strategy; collective ops are set up at startup), then its run directory read."""
        strategy, task = place(args)
        return cls(strategy, task, RunState.read(args.model_dir))


__all__ = ["Job"]
