"""What the training callbacks share: TrainingError, the optimizer step (`StepState`), the
scalars of Keras' logs and the learning rate."""

from __future__ import annotations

import keras

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


class StepState(keras.callbacks.Callback):
    """The optimizer step: the number of updates applied (skipped float16 steps excluded).

    Read once per batch: in a callback list (first, `StepState.of` shares one per model), its
    `on_train_batch_end` reads the step, and the callbacks after it at that batch's end get
    that value; any other hook forgets it (the callbacks of an epoch's end read the
    variable). Outside a callback list every `step` reads the variable. `reads` counts them.
    """

    def __init__(self, model):
        super().__init__()
        self.trainer = model
        self.reads = 0
        self._batch_step = None

    @classmethod
    def of(cls, model) -> StepState:
        """The model's shared StepState (put it first in the callback list)."""
        if getattr(model, "_kt_step_state", None) is None:
            model._kt_step_state = cls(model)
        return model._kt_step_state

    @property
    def step(self) -> int:
        if self._batch_step is not None:
            return self._batch_step
        self.reads += 1
        return int(self.trainer.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        self._batch_step = None
        self._batch_step = self.step

    def _forget(self, *args, **kwargs):
        self._batch_step = None

    on_train_begin = on_train_end = on_epoch_begin = on_epoch_end = _forget
    on_train_batch_begin = on_test_begin = _forget
