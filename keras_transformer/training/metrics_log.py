"""metrics.jsonl and the TensorBoard scalars, keyed by the optimizer step, and their
truncation when a run resumes."""

from __future__ import annotations

import os
import time

import keras
import tensorflow as tf

from keras_transformer.training.callback_state import StepState, learning_rate, scalars
from keras_transformer.training.step import NONFINITE


class MetricsLogger(keras.callbacks.Callback):
    """Appends one JSON object per event to metrics.jsonl (step, epoch, loss, lr, val_*) and
    writes the same scalars to TensorBoard (logs/train), both keyed by the optimizer step,
    which keeps counting across `fit` calls and resumes (Keras' TensorBoard callback counts
    batches and restarts at every `fit`)."""

    def __init__(self, run_dir, state: StepState, every: int = 100, enabled: bool = True):
        super().__init__()
        self.run_dir, self.state, self.every, self.enabled = run_dir, state, every, enabled
        self.start = time.time()
        self.epoch = 0
        self.writer = None

    def resume(self, restored: bool = True) -> None:
        """After a restore: drop the events past the restored step (they will be written
        again), and continue `time_s` from the last one kept. With nothing `restored` (a run
        killed before its first checkpoint, started again), every event the killed run
        wrote goes: the new run writes them all again."""
        if not self.enabled:
            return
        step = self.state.step if restored else -1
        kept = self.run_dir.truncate_metrics(step)
        for folder in ("train", "validation"):
            truncate_events(os.path.join(self.run_dir.log_dir, folder), step)
        if kept:
            self.start = time.time() - float(kept[-1].get("time_s", 0.0))

    def write(self, event: str, logs: dict) -> None:
        if not self.enabled:
            return
        record = {
            "event": event,
            "step": self.state.step,
            "epoch": self.epoch,
            "time_s": round(time.time() - self.start, 1),
            **{k: v for k, v in scalars(logs).items() if k != NONFINITE},
        }
        record["learning_rate"] = learning_rate(self.model.optimizer)
        self.run_dir.append_metrics(record)
        if self.writer is None:
            self.writer = tf.summary.create_file_writer(os.path.join(self.run_dir.log_dir, "train"))
        prefix = "epoch_" if event == "epoch" else ""
        with self.writer.as_default(step=record["step"]):
            for key, value in record.items():
                if key not in ("event", "step", "epoch", "time_s") and event != "bleu":
                    tf.summary.scalar(prefix + key, value)
        self.writer.flush()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.every and self.state.step and self.state.step % self.every == 0:
            self.write("train", logs)

    def on_epoch_end(self, epoch, logs=None):
        self.write("epoch", logs)


def truncate_events(folder: str, step: int) -> None:
    """Drop the TensorBoard summaries past `step` from the event files in `folder` (a resumed
    run writes them again; TensorBoard purges only steps that go back, so an event written
    again at the same step would show twice). Events without a summary (a file's version
    record) stay. Each file is rewritten beside itself and renamed over it, through
    `tf.io.gfile`, so a `--model-dir` on gs:// (or any file system TensorFlow knows) is
    truncated as a local one is."""
    from tensorflow.core.util import event_pb2

    if not tf.io.gfile.isdir(folder):
        return
    for name in sorted(tf.io.gfile.listdir(folder)):
        if not name.startswith("events.out.tfevents"):
            continue
        path = f"{folder.rstrip('/')}/{name}"
        records, damaged = [], False
        try:
            for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
                records.append(record)
        except tf.errors.DataLossError:  # a last record the kill cut short: dropped
            damaged = True
        kept = [r for r in records if _kept_event(event_pb2.Event.FromString(r), step)]
        if len(kept) == len(records) and not damaged:
            continue
        with tf.io.TFRecordWriter(path + ".tmp") as writer:
            for record in kept:
                writer.write(record)
        tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def _kept_event(event, step: int) -> bool:
    return event.step <= step or not event.HasField("summary")
