"""What the training callbacks share: TrainingError, the optimizer step (`StepState`), the
scalars of Keras' logs and the learning rate."""

from __future__ import annotations

from keras_transformer.errors import KerasTransformerError


class TrainingError(KerasTransformerError, RuntimeError):
    """Training cannot go on; the message says why and where the last good checkpoint is."""


def scalars(logs) -> dict:
    """The entries of Keras' `logs` that are numbers, as floats."""
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def learning_rate(optimizer) -> float:
    """The optimizer's current learning rate (its schedule at the current step)."""
    lr = optimizer.learning_rate
    return float(lr.numpy() if hasattr(lr, "numpy") else lr)


class StepState:
    """The optimizer step: the number of updates applied (skipped float16 steps excluded)."""

    def __init__(self, model):
        self.model = model

    @property
    def step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())
