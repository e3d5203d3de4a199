"""Callbacks for `model.fit`: checkpoints, metrics.jsonl, NaN guard, BLEU with early stopping."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time

import keras
import tensorflow as tf

from keras_transformer.errors import KerasTransformerError
from keras_transformer.training.step import NONFINITE

logger = logging.getLogger(__name__)


class TrainingError(KerasTransformerError, RuntimeError):
    """Training cannot go on; the message says why and where the last good checkpoint is."""


def _scalars(logs) -> dict:
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
        scalars = _scalars(logs)
        loss, flagged = scalars.get("loss"), scalars.get(NONFINITE)
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
    """

    def __init__(
        self, manager, state: StepState, every: int, guard: NonFiniteLossGuard, enabled=True
    ):
        super().__init__()
        self.manager, self.state, self.every, self.guard = manager, state, every, guard
        self.enabled = enabled

    def _save(self):
        if self.guard.failed_step is not None or not self.enabled:  # never save a NaN state
            return
        step = self.state.step
        if step == 0:  # float16 loss scaling skipped every step so far: nothing to keep
            return
        if self.manager.latest_checkpoint and self.manager.latest_checkpoint.endswith(f"-{step}"):
            return
        self.manager.save(checkpoint_number=step)

    def save(self) -> str | None:
        """Save now (the chief; nothing elsewhere); the newest checkpoint's path."""
        self._save()
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


KILL_AT_ENV = "KT_KILL_AT"  # test hook: "STEP:PHASE[:SIGNAL]" ends the process there (KillSwitch)


class KillSwitch(keras.callbacks.Callback):
    """Test hook: `os._exit(137)` (what a SIGKILL leaves: no cleanup, no flush) at optimizer
    step `step`, in `phase`: "batch" (the batch end, after its evaluation and before its
    checkpoint), "validation" (as the epoch-end validation that follows the step starts) or
    "epoch_end" (the epoch-end work done, before the checkpoint that follows it). Placed in
    the callback list just before `CheckpointEvery`; made by `kill_switch()` only when
    $KT_KILL_AT is set, so kill tests are deterministic instead of timed. With a signal
    ("STEP:PHASE:SIGTERM" or ":SIGINT"), the process sends itself that signal there instead
    (a preemption or a Ctrl-C at a set step and phase) and goes on."""

    PHASES = ("batch", "validation", "epoch_end")
    SIGNALS = ("SIGTERM", "SIGINT")

    def __init__(self, state: StepState, step: int, phase: str, signal_name: str = ""):
        super().__init__()
        if phase not in self.PHASES:
            raise ValueError(f"{KILL_AT_ENV}: phase {phase!r} is not one of {self.PHASES}")
        if signal_name and signal_name not in self.SIGNALS:
            raise ValueError(f"{KILL_AT_ENV}: signal {signal_name!r} is not one of {self.SIGNALS}")
        self.state, self.step, self.phase, self.signal_name = state, step, phase, signal_name
        self.sent = False

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

    def on_test_begin(self, logs=None):
        self._maybe_exit("validation")

    def on_epoch_end(self, epoch, logs=None):
        self._maybe_exit("epoch_end")


def kill_switch(state: StepState) -> list:
    """[KillSwitch] when $KT_KILL_AT ("STEP:PHASE") is set, else []."""
    value = os.environ.get(KILL_AT_ENV)
    if not value:
        return []
    step, _, rest = value.partition(":")
    phase, _, signal_name = rest.partition(":")
    return [KillSwitch(state, int(step), phase or "batch", signal_name)]


class StopAtStep(keras.callbacks.Callback):
    """Ends training when the optimizer reaches `train_steps` (exact across resumes)."""

    def __init__(self, state: StepState, train_steps: int):
        super().__init__()
        self.state, self.train_steps = state, train_steps

    def on_train_batch_end(self, batch, logs=None):
        if self.state.step >= self.train_steps:
            self.model.stop_training = True


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
            truncate_events(os.path.join(self.run_dir.path("logs"), folder), step)
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
            **{k: v for k, v in _scalars(logs).items() if k != NONFINITE},
        }
        record["learning_rate"] = learning_rate(self.model.optimizer)
        self.run_dir.append_metrics(record)
        if self.writer is None:
            self.writer = tf.summary.create_file_writer(
                os.path.join(self.run_dir.path("logs"), "train")
            )
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


class BleuProgress(tf.Module):
    """The best validation BLEU, its step and the evaluations without gain since: saved with
    the training checkpoints (created before the callback that updates them, so that the
    checkpoint, its manager and the callbacks that use the manager are built in order)."""

    def __init__(self):
        super().__init__(name="bleu_progress")
        self.best = tf.Variable(-1.0, trainable=False, name="best_bleu")
        self.best_step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="best_step")
        self.bad_evals = tf.Variable(0, dtype=tf.int64, trainable=False, name="bad_evals")


class BleuEvaluation(keras.callbacks.Callback):
    """sacreBLEU on the validation set every `every` steps (and at each epoch end).

    Keeps the best weights and their score in `best_dir`, logs `val_bleu` (TensorBoard and
    metrics.jsonl) and stops training after `patience` evaluations without improvement
    (0: never stops early). `averaged()`, when given, is a context manager under which the
    model holds the weights to validate (the moving averages of --ema-decay): those are
    translated and saved to `best_dir`. The best score and the count of evaluations without
    gain are variables (`self.progress`), saved with the training checkpoints, so a resumed run
    neither overwrites `best/` with a worse model nor forgets its patience.

    In a multi-worker run every worker holds this callback; only the chief translates
    (`translate_fn` is None elsewhere), and the decision to stop is a collective, so every
    worker stops at the same step.
    """

    def __init__(
        self,
        translate_fn,
        sources,
        references,
        *,
        every,
        best_dir: str | None,
        model: keras.Model,
        state,
        metrics: MetricsLogger,
        log_dir: str | None,
        patience: int = 0,
        batch_size: int = 64,
        strategy: tf.distribute.Strategy | None = None,
        averaged=None,
        guard: NonFiniteLossGuard | None = None,
        progress: BleuProgress | None = None,
    ):
        super().__init__()
        self.averaged = averaged or contextlib.nullcontext
        self.translate_fn, self.sources, self.references = translate_fn, sources, references
        self.every, self.state, self.transformer = every, state, model
        self.guard = guard  # no evaluation after a NaN/Inf loss
        self.metrics, self.patience, self.batch_size = metrics, patience, batch_size
        self.strategy = strategy
        self.writer = (
            tf.summary.create_file_writer(os.path.join(log_dir, "validation"))
            if log_dir and translate_fn is not None
            else None
        )
        self.progress = progress or BleuProgress()
        # best/ holds the weights and their own score, so a kill between a save there and the
        # next training checkpoint loses neither (restore_best takes the larger score)
        self.best_score = tf.Variable(-1.0, trainable=False, name="best_score")
        self.best_manager = (
            tf.train.CheckpointManager(
                tf.train.Checkpoint(model=model, score=self.best_score), best_dir, max_to_keep=1
            )
            if best_dir
            else None
        )
        self.last_step, self.last_bleu, self.stopped_early = -1, None, False

    def restore_best(self, run_dir, step: int | None = None) -> None:
        """After a restore at `step`: the best score is the larger of the checkpoint's and
        best/'s. A best/ newer than `step` (saved by an evaluation whose checkpoint the kill
        prevented) is left out: the resumed run does that evaluation again."""
        paths = run_dir.checkpoints(best=True)
        if not paths or (step is not None and int(paths[-1].rsplit("-", 1)[1]) > step):
            return
        reader = tf.train.load_checkpoint(paths[-1])
        key = "score/.ATTRIBUTES/VARIABLE_VALUE"
        if not reader.has_tensor(key):  # best/ written before it kept its score
            return
        score = float(reader.get_tensor(key))
        if score > float(self.progress.best.numpy()):
            self.progress.best.assign(score)
            self.progress.best_step.assign(int(paths[-1].rsplit("-", 1)[1]))
            self.progress.bad_evals.assign(0)

    def _weights_finite(self) -> bool:
        return all(bool(tf.reduce_all(tf.math.is_finite(w))) for w in self.transformer.weights)

    def evaluate(self) -> dict:
        from keras_transformer.inference.evaluation import score

        hypotheses = []
        for i in range(0, len(self.sources), self.batch_size):
            out = self.translate_fn(tf.constant(self.sources[i : i + self.batch_size]))
            hypotheses += [t.decode("utf-8") for t in out["outputs"].numpy()]
        return score(hypotheses, self.references)

    def _judge(self, logs) -> bool:
        """Evaluate (chief) and return True when patience has run out."""
        if self.translate_fn is None:
            return False
        with self.averaged():
            return self._judge_weights(logs)

    def _judge_weights(self, logs) -> bool:
        step = self.state.step
        bleu = self.evaluate()["bleu"]
        self.last_bleu = bleu
        if logs is not None:
            logs["val_bleu"] = bleu
        if self.writer:
            with self.writer.as_default():
                tf.summary.scalar("bleu", bleu, step=step)
        self.metrics.write("bleu", {"val_bleu": bleu})
        logger.info("\nstep %d: validation BLEU %.2f", step, bleu)
        if bleu > float(self.progress.best.numpy()) and self._weights_finite():
            self.progress.best.assign(bleu)
            self.progress.best_step.assign(step)
            self.progress.bad_evals.assign(0)
            if self.best_manager is not None:
                self.best_score.assign(bleu)
                self.best_manager.save(checkpoint_number=step)
            return False
        self.progress.bad_evals.assign_add(1)
        return bool(self.patience) and int(self.progress.bad_evals.numpy()) >= self.patience

    def _evaluate_now(self, logs):
        step = self.state.step
        if step == self.last_step or step == 0:  # nothing trained yet: nothing to evaluate
            return
        if self.guard is not None and self.guard.failed_step is not None:
            return
        self.last_step = step
        stop = agree_any(self.strategy, self._judge(logs))
        if stop:
            logger.info("early stopping: no BLEU gain in %d evaluations", self.patience)
            self.stopped_early = True
            self.model.stop_training = True

    def on_train_batch_end(self, batch, logs=None):
        if self.every and self.state.step % self.every == 0:
            self._evaluate_now(logs)

    def on_epoch_end(self, epoch, logs=None):
        self._evaluate_now(logs)


def agree_any(strategy: tf.distribute.Strategy | None, flag: bool) -> bool:
    """True on every worker if it is True on any: a collective in multi-worker runs (every
    worker must call it at the same point); the flag itself elsewhere."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return flag
    value = strategy.experimental_distribute_values_from_function(
        lambda _: tf.constant(1.0 if flag else 0.0)
    )
    return float(strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)) > 0.0


def replica_steps(strategy: tf.distribute.Strategy, step: int) -> list[int]:
    """Every replica's `step`, in replica order: a collective in multi-worker runs (each
    replica contributes its step at its own index of a vector summed over replicas, the
    reduction `agree_any` uses); [step] elsewhere."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return [step]
    count = strategy.num_replicas_in_sync
    value = strategy.experimental_distribute_values_from_function(
        lambda context: (
            tf.one_hot(context.replica_id_in_sync_group, count, dtype=tf.float64) * float(step)
        )
    )
    return [int(s) for s in strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)]


def check_same_step(steps: list[int], tasks: list[str]) -> None:
    """Raise TrainingError naming the tasks whose restored step differs from the chief's
    (`steps[i]` restored by `tasks[i]`, the chief first), e.g. a worker that could not see
    the run directory and started from step 0."""
    if len(set(steps)) <= 1:
        return
    differ = [f"{task} at step {s}" for task, s in zip(tasks, steps) if s != steps[0]]
    raise TrainingError(
        f"the workers restored different steps: {tasks[0]} at step {steps[0]}, "
        f"{', '.join(differ)}; every task must see the same --model-dir (a shared directory)"
    )


__all__ = [
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
]
