"""The kill tests' hook: $KT_KILL_AT ends the process (or signals it) at a set step and phase."""

from __future__ import annotations

import copy
import os

import keras
import tensorflow as tf

from keras_transformer.training.callback_state import StepState

KILL_AT_ENV = "KT_KILL_AT"  # test hook: "STEP:PHASE[:SIGNAL]" ends the process there (KillSwitch)


class KillSwitch(keras.callbacks.Callback):
    """Test hook: `os._exit(137)` (what a SIGKILL leaves: no cleanup, no flush) at optimizer
    step `step`, in `phase`: "batch" (the batch end, after its evaluation and before its
    checkpoint), "validation" (as the epoch-end validation that follows the step starts),
    "epoch_end" (the epoch-end work done, before the checkpoint that follows it) or "save"
    (inside the step's checkpoint save, given the `manager`: its data files written, the
    manager's state file not yet; every task wraps its manager, but in a multi-worker job
    only the chief's saves, so there the phase comes on the chief alone). Placed just before
    `CheckpointEvery` in the callback list; made by `kill_switch()` only when $KT_KILL_AT
    is set, so kill tests are deterministic instead of timed. With a signal
    ("STEP:PHASE:SIGTERM" or ":SIGINT"), the process sends itself that signal there instead
    (a preemption or a Ctrl-C at a set step and phase) and goes on."""

    PHASES = ("batch", "validation", "epoch_end", "save")
    SIGNALS = ("SIGTERM", "SIGINT")

    def __init__(
        self, state: StepState, step: int, phase: str, signal_name: str = "", manager=None
    ):
        super().__init__()
        if phase not in self.PHASES:
            raise ValueError(f"{KILL_AT_ENV}: phase {phase!r} is not one of {self.PHASES}")
        if phase == "save" and manager is None:
            raise ValueError(f"{KILL_AT_ENV}: phase 'save' needs the checkpoint manager")
        if signal_name and signal_name not in self.SIGNALS:
            raise ValueError(f"{KILL_AT_ENV}: signal {signal_name!r} is not one of {self.SIGNALS}")
        self.state, self.step, self.phase, self.signal_name = state, step, phase, signal_name
        self.sent, self.manager = False, manager

    def _maybe_exit(self, phase: str) -> None:
        if phase != self.phase or self.state.step != self.step:
            return
        if not self.signal_name:
            os._exit(137)
        if not self.sent:  # once: a resumed run passes the same step again
            import signal

            self.sent = True
            os.kill(os.getpid(), getattr(signal, self.signal_name))

    def on_train_batch_end(self, batch, logs=None):
        self._maybe_exit("batch")
        if (
            self.phase == "save"
            and self.state.step == self.step
            and "save" not in vars(self.manager)
        ):
            self._arm_save()

    def _arm_save(self) -> None:
        """The manager's next save runs `_maybe_exit("save")` as a write callback (TensorFlow
        runs it after the data files, before the manager records the checkpoint)."""
        manager, save = self.manager, self.manager.save

        def save_once(*args, options=None, **kwargs):
            del manager.save  # the class's method again
            options = copy.copy(options) or tf.train.CheckpointOptions()
            callbacks = options.experimental_write_callbacks or []
            options.experimental_write_callbacks = [*callbacks, lambda: self._maybe_exit("save")]
            return save(*args, options=options, **kwargs)

        manager.save = save_once

    def on_test_begin(self, logs=None):
        self._maybe_exit("validation")

    def on_epoch_end(self, epoch, logs=None):
        self._maybe_exit("epoch_end")


def kill_switch(state: StepState, manager=None) -> list:
    """[KillSwitch] when $KT_KILL_AT ("STEP:PHASE") is set, else [] (`manager`: the step
    checkpoints' tf.train.CheckpointManager, for the "save" phase)."""
    value = os.environ.get(KILL_AT_ENV)
    if not value:
        return []
    step, _, rest = value.partition(":")
    phase, _, signal_name = rest.partition(":")
    return [KillSwitch(state, int(step), phase or "batch", signal_name, manager)]
