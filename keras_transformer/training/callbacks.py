"""Callbacks for `model.fit`: checkpoints, metrics.jsonl, NaN guard, BLEU with early stopping.

Their names stay importable from here; each lives in the module of its responsibility:
`callback_state` (the step, TrainingError), `checkpointing` (the NaN guard, step
checkpoints, the stop at --train-steps), `kill_switch` (the kill tests' hook),
`metrics_log` (metrics.jsonl, TensorBoard), `validation_bleu` (BLEU, best/, early stopping),
`collective` (what the workers of a multi-worker run agree on).
"""

from __future__ import annotations

from keras_transformer.training.callback_state import StepState, TrainingError, learning_rate
from keras_transformer.training.checkpointing import CheckpointEvery, NonFiniteLossGuard, StopAtStep
from keras_transformer.training.collective import agree_any, check_same_step, replica_steps
from keras_transformer.training.kill_switch import KILL_AT_ENV, KillSwitch, kill_switch
from keras_transformer.training.metrics_log import MetricsLogger, truncate_events
from keras_transformer.training.validation_bleu import BleuEvaluation, BleuProgress

__all__ = [
    "KILL_AT_ENV",
    "BleuEvaluation",
    "BleuProgress",
    "CheckpointEvery",
    "KillSwitch",
    "MetricsLogger",
    "NonFiniteLossGuard",
    "StepState",
    "StopAtStep",
    "TrainingError",
    "agree_any",
    "check_same_step",
    "kill_switch",
    "learning_rate",
    "replica_steps",
    "truncate_events",
]
