"""`Plan`: what `kt-train` hands the trainer, built once from the flags (and `--config`).

The walk goes down: the command parses its flags into `TrainArgs` (`training.args`), `Plan.of`
checks them once (`training.validation`) and parses the corpus lists once
(`training.corpora`); `training.trainer.train(plan)` resolves the automatic values
(`training.recipe`) and trains. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses

from keras_transformer.training.args import TrainArgs
from keras_transformer.training.corpora import Corpora
from keras_transformer.training.validation import validate


@dataclasses.dataclass(frozen=True)
class Plan:
    """The checked flags (`None`: resolved automatically) and the training corpora."""

    args: TrainArgs
    corpora: Corpora

    @classmethod
    def of(cls, args: TrainArgs) -> Plan:
        """Check `args` (ConfigError naming the flag) and parse its corpus lists."""
        args = dataclasses.replace(args)  # a copy: the plan's flags are its own
        return cls(args, validate(args))


__all__ = ["Plan"]
