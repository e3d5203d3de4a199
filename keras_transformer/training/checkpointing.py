"""Saving and stopping during `fit`: the NaN/Inf guard, the step checkpoints, the stop at
--train-steps."""

from __future__ import annotations

import logging
import math

import keras
import tensorflow as tf

from keras_transformer.training.async_checkpoint import AsyncWrites
from keras_transformer.training.callback_state import StepState, TrainingError, scalars
from keras_transformer.training.step import NONFINITE

logger = logging.getLogger(__name__)


class NonFiniteLossGuard(keras.callbacks.Callback):
    """Stops at a NaN/Inf loss, before anything is saved, and says so clearly.

    Under float16 loss scaling (a step reporting `nonfinite`: `TrainingModel`), the loss
    scaler has skipped that step: up to `tolerance` such steps in a row are counted and
    tolerated (a warning each), the next one stops. Elsewhere the first one stops."""

    def __init__(self, manager: tf.train.CheckpointManager | None, tolerance: int = 0):
        super().__init__()
        self.manager, self.tolerance = manager, tolerance
        self.failed_step = None
        self.in_a_row = 0  # non-finite steps since the last finite one
        self.skipped = 0  # tolerated non-finite steps in this process

    def on_train_batch_end(self, batch, logs=None):
        logged = scalars(logs)
        loss, flagged = logged.get("loss"), logged.get(NONFINITE)
        if not (flagged or (loss is not None and not math.isfinite(loss))):
            self.in_a_row = 0
            return
        self.in_a_row += 1
        step = int(self.model.optimizer.iterations.numpy())
        if flagged is not None and self.in_a_row <= self.tolerance:
            self.skipped += 1
            logger.warning(
                "non-finite float16 loss after step %d: step skipped (%d in a row, "
                "--nonfinite-steps %d)", step, self.in_a_row, self.tolerance,
            )  # fmt: skip
            return
        self.failed_step = step
        self.model.stop_training = True

    def check(self):
        if self.failed_step is not None:
            last = self.manager.latest_checkpoint if self.manager else None
            row = f" ({self.in_a_row} steps in a row)" if self.in_a_row > 1 else ""
            raise TrainingError(
                f"loss became NaN/Inf at step {self.failed_step}{row}; training stopped. "
                f"Last good checkpoint: {last or 'none'}. Try a lower learning rate "
                "(--lr-scale), more --warmup-steps, or --precision float32."
            )


class CheckpointEvery(keras.callbacks.Callback):
    """Saves every `every` steps and at each epoch end, numbered by optimizer step.

    tf.train.CheckpointManager writes the index and data files first and only then updates
    its state file, so a run killed mid-save restarts from the previous complete checkpoint.

    In a multi-worker job only the chief writes (`enabled`): every variable of the
    checkpoint is mirrored (identical on every worker, read without a collective), so the
    other workers' copies would be dead files.

    `asynchronous` (--async-checkpoint): a save blocks only while it copies the variables to
    host memory and the files are written in the background (`async_checkpoint.AsyncWrites`),
    one write at a time; `wait()` joins it, as every fit's end and `save()` do.
    """

    def __init__(
        self, manager, state: StepState, every: int, guard: NonFiniteLossGuard, enabled=True,
        asynchronous=False,
    ):  # fmt: skip
        super().__init__()
        self.manager, self.state, self.every, self.guard = manager, state, every, guard
        self.enabled = enabled
        self.writes = AsyncWrites(manager) if asynchronous and enabled else None

    def wait(self) -> None:
        """Join the background write in flight, if any; its failure raises a TrainingError."""
        if self.writes is not None:
            self.writes.wait()

    def _save(self):
        if self.guard.failed_step is not None or not self.enabled:  # never save a NaN state
            return
        step = self.state.step
        if step == 0:  # float16 loss scaling skipped every step so far: nothing to keep
            return
        self.wait()  # the manager names a checkpoint once written
        if self.manager.latest_checkpoint and self.manager.latest_checkpoint.endswith(f"-{step}"):
            return
        if self.writes is not None:
            self.writes.save(step)
        else:
            self.manager.save(checkpoint_number=step)

    def save(self) -> str | None:
        """Save now and wait for the write (the chief; nothing elsewhere); the newest
        checkpoint's path."""
        self._save()
        self.wait()
        return self.manager.latest_checkpoint if self.enabled else None

    def on_train_batch_end(self, batch, logs=None):
        # an epoch's last batch is saved at the epoch's end instead, after the epoch-end work
        # (validation, BLEU, best/, patience): a checkpoint never precedes work that belongs
        # to its step, so a kill during that work resumes before it and does it again
        steps = (self.params or {}).get("steps")
        last = steps is not None and batch + 1 >= steps
        if self.every and self.state.step % self.every == 0 and not last:
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        self._save()

    def on_train_end(self, logs=None):
        self.wait()


class StopAtStep(keras.callbacks.Callback):
    """Ends training when the optimizer reaches `train_steps` (exact across resumes)."""

    def __init__(self, state: StepState, train_steps: int):
        super().__init__()
        self.state, self.train_steps = state, train_steps

    def on_train_batch_end(self, batch, logs=None):
        if self.state.step >= self.train_steps:
            self.model.stop_training = True
