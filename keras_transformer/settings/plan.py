"""`Plan`: what `kt-train` hands the trainer, built once from the flags (and `--config`).

The walk goes down: the command parses its flags into `TrainArgs` (`settings.args`), `Plan.of`
checks them once (`settings.validation`) and parses the corpus lists once
(`settings.corpora`); `training.trainer.train(plan)` resolves the automatic values
(`settings.recipe`) and trains. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses

from keras_transformer.settings.args import TrainArgs
from keras_transformer.settings.corpora import Corpora
from keras_transformer.settings.validation import validate


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
