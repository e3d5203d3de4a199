"""Validation BLEU during training: the best weights in best/, early stopping, and the
progress both keep in the training checkpoints."""

from __future__ import annotations

import contextlib
import logging
import os

import keras
import tensorflow as tf

from keras_transformer.training.checkpointing import NonFiniteLossGuard
from keras_transformer.training.collective import agree_any, sum_over_workers
from keras_transformer.training.metrics_log import MetricsLogger

logger = logging.getLogger(__name__)


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

    In a multi-worker run every worker holds this callback with its own share of the
    sentences (`sources`, `references`): each translates its share, sacreBLEU's sufficient
    statistics are summed over the workers (one collective) and every worker computes the
    same BLEU from the sum, the BLEU of the whole set. The chief alone writes (best/, the
    TensorBoard scalar, metrics.jsonl); the decision to stop is a collective too, so every
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
        chief: bool = True,
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
            if log_dir and chief
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
        """{"bleu": the BLEU of every worker's share together}: a collective in multi-worker
        runs; in one process, `evaluation.score`'s BLEU of the sentences, exactly."""
        from keras_transformer.inference import evaluation

        hypotheses = []
        for i in range(0, len(self.sources), self.batch_size):
            out = self.translate_fn(tf.constant(self.sources[i : i + self.batch_size]))
            hypotheses += [t.decode("utf-8") for t in out["outputs"].numpy()]
        statistics = evaluation.bleu_statistics(hypotheses, self.references)
        total = sum_over_workers(self.strategy, statistics)
        return {
            "bleu": evaluation.bleu_from_statistics(total),
            "hypothesis_length": total[0],
            "reference_length": total[1],
        }

    def _judge(self, logs) -> bool:
        """Evaluate (every worker its share) and return True when patience has run out."""
        with self.averaged():
            return self._judge_weights(logs)

    def _judge_weights(self, logs) -> bool:
        step = self.state.step
        result = self.evaluate()
        bleu = result["bleu"]
        self.last_bleu = bleu
        if logs is not None:
            logs["val_bleu"] = bleu
        if self.writer:
            with self.writer.as_default():
                tf.summary.scalar("bleu", bleu, step=step)
            self.writer.flush()  # on disk now, as metrics.jsonl: kt-train ends with os._exit
        self.metrics.write("bleu", {"val_bleu": bleu})
        logger.info(
            "\nstep %d: validation BLEU %.2f (hypothesis/reference length %s/%s)",
            step, bleu, result.get("hypothesis_length"), result.get("reference_length"),
        )  # fmt: skip
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
