"""--async-checkpoint: TensorFlow's asynchronous checkpoint, made to work with Keras 3.

`tf.train.CheckpointOptions(enable_async=True)` copies every
variable to a host copy in the caller's thread (the only part that blocks), then writes the
copies in a background thread, in the format and object graph of a synchronous save (its
`AsyncCheckpointHelper`: tensorflow/python/checkpoint/async_checkpoint_helper.py); the
CheckpointManager records the checkpoint in its state file from that thread, after the files.

With Keras 3.15 it fails at the second save: Keras' TensorFlow variable maps itself to a new
`tf.Variable(copy)` each time it is copied (keras/src/backend/tensorflow/core.py,
`Variable._copy_trackable_to_cpu`), which TensorFlow's copy function (a `tf.function`)
refuses. `_copy_to_host` maps it to its TensorFlow variable's own host copy instead, made
once and refreshed at every save (a `ResourceVariable`, or a distributed one under mirrored/multi_worker).
`tests/training/test_async_checkpoint.py` checks the result against synchronous saves.
"""

from __future__ import annotations

import contextlib
import copy

import tensorflow as tf
from keras.src.backend.tensorflow.core import Variable as KerasVariable

from keras_transformer.training.callback_state import TrainingError

OPTIONS = tf.train.CheckpointOptions(enable_async=True)


def _copy_to_host(self, object_map) -> None:
    """Keras' `Variable._copy_trackable_to_cpu`, with one host copy per variable."""
    self._value._copy_trackable_to_cpu(object_map)  # TensorFlow's copy: made once, refreshed
    object_map[self] = object_map[self._value]


@contextlib.contextmanager
def keras_host_copies():
    """`_copy_to_host` in place of Keras' method while an asynchronous save copies (only
    then: the method is TensorFlow's hook for asynchronous checkpoints alone)."""
    keras_method = KerasVariable.__dict__["_copy_trackable_to_cpu"]
    KerasVariable._copy_trackable_to_cpu = _copy_to_host
    try:
        yield
    finally:
        KerasVariable._copy_trackable_to_cpu = keras_method


class AsyncWrites:
    """Saves of `manager` written in the background, one at a time.

    `save(step)` waits for the previous write (and raises its failure), copies the variables
    and returns; `wait()` joins the write in flight and raises its failure as a TrainingError
    naming the checkpoint. The manager's state file names a checkpoint only once its files
    are written, so a process killed mid-write resumes from the previous one.
    """

    def __init__(self, manager: tf.train.CheckpointManager):
        self.manager, self.pending = manager, None
        self.checkpoint = manager._checkpoint

    def save(self, step: int) -> None:
        self.wait()
        # the background writer saves its own Checkpoint's save counter: the value the
        # manager gives the caller's (+ 1), so both kinds of save hold the same tensors
        writer = self.checkpoint._async_checkpointer().checkpointer()
        writer.save_counter.assign(self.checkpoint.save_counter + 1)
        self.pending = f"step {step} in {self.manager.directory}"
        with keras_host_copies():  # the copies are made in this call; the write is not
            self.manager.save(checkpoint_number=step, options=copy.copy(OPTIONS))

    def wait(self) -> None:
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        self.manager.sync()
        helper = self.checkpoint._async_checkpointer_impl
        try:
            helper._check_async_thread_error()
        except Exception as err:  # noqa: BLE001  (any failure of the write, said in one line)
            first = (str(err).strip().splitlines() or [""])[0][:300]
            why = f"{type(err).__name__}: {first}"
            raise TrainingError(
                f"asynchronous checkpoint write of {pending} failed: {why}"
            ) from err


__all__ = ["OPTIONS", "AsyncWrites", "keras_host_copies"]
