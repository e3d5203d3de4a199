"""A run's callbacks, built with their collaborators: the BLEU bookkeeping
(`cb.BleuProgress`) first, then the checkpoint that saves it, its manager, the NaN guard that
names the manager's last checkpoint, and the BLEU callback that the guard silences; then the
list `fit` runs, in Keras' order."""

from __future__ import annotations

import dataclasses
import logging
import sys

import tensorflow as tf

from keras_transformer.data.parallel_text import numpy_pairs
from keras_transformer.training import callbacks as cb
from keras_transformer.training import ema
from keras_transformer.training.collective import worker_share
from keras_transformer.training.job import Job
from keras_transformer.training.model_state import ModelState
from keras_transformer.training.preemption import PreemptionSave
from keras_transformer.training.progress import ProgressLog
from keras_transformer.training.watchdog import ProgressWatchdog

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Bookkeeping:
    """The parts of a run that a resume restores or that save it."""

    metrics: cb.MetricsLogger
    checkpoint: tf.train.Checkpoint
    manager: tf.train.CheckpointManager
    guard: cb.NonFiniteLossGuard
    bleu: cb.BleuEvaluation


def bookkeeping(job: Job, prep, state: ModelState) -> Bookkeeping:
    """The metrics log, the checkpoint's manager (on the run's checkpoints/), the NaN guard
    and the BLEU callback of `prep` (a `preparation.Preparation`) and `state` (the model,
    its BLEU bookkeeping and checkpoint), built in the order they depend on each other."""
    settings, model, progress = prep.config.training, state.model, state.progress
    metrics = cb.MetricsLogger(job.shared, cb.StepState.of(model), settings.log_every, job.chief)
    manager = job.shared.checkpoint_manager(state.checkpoint, max_to_keep=settings.keep_checkpoints)
    guard = cb.NonFiniteLossGuard(manager, settings.nonfinite_steps)
    bleu = make_bleu_callback(
        job, settings, model, prep.tokenizer, prep.valid, metrics=metrics, guard=guard,
        progress=progress,
    )  # fmt: skip
    return Bookkeeping(metrics, state.checkpoint, manager, guard, bleu)


def make_bleu_callback(
    job: Job, settings, model, tokenizer, valid, *, metrics, guard, progress
) -> cb.BleuEvaluation:
    """Validation BLEU: every worker translates its share of the sentences (w, w + N, ... for
    worker w of N; all of them in one process) and takes part in the sum and the stop."""
    from keras_transformer.inference.translator import Translator
    from keras_transformer.settings.decoding import DecodingOptions

    pairs = valid.dataset
    if settings.eval_sentences:
        pairs = pairs.take(settings.eval_sentences)
    pairs = [(src.decode("utf-8"), tgt.decode("utf-8")) for src, tgt in numpy_pairs(pairs)]
    index, count = worker_share(job.strategy)
    share = pairs[index::count]
    if count > 1:
        logger.info(
            "validation BLEU: sentences %d, %d + %d, ... of %d (share %d of %d, %d sentences)",
            index, index, count, len(pairs), index + 1, count, len(share),
        )  # fmt: skip
    options = DecodingOptions(beam_size=settings.eval_beam_size)
    return cb.BleuEvaluation(
        Translator(model.transformer, tokenizer, options),
        [src for src, _ in share],
        [tgt for _, tgt in share],
        every=settings.eval_every,
        best_dir=job.shared.best_dir if job.chief else None,
        model=model.transformer,
        state=cb.StepState.of(model),
        metrics=metrics,
        log_dir=job.shared.log_dir,
        patience=settings.patience,
        strategy=job.strategy,
        averaged=lambda: ema.swapped(model.transformer, model.optimizer),
        guard=guard,
        progress=progress,
        chief=job.chief,
    )


def make_callbacks(settings, manager, model, guard, evaluation: list, job: Job) -> list:
    """Keras runs callbacks in this order: a checkpoint taken at an evaluation step must
    already hold that evaluation's best score. The chief alone saves checkpoints; after a
    SIGTERM to any worker, every worker stops at the same batch, the chief saves there."""
    state = cb.StepState.of(model)  # first in the list: the step read once per batch
    checkpoints = cb.CheckpointEvery(
        manager, state, settings.checkpoint_every, guard, job.chief, settings.async_checkpoint
    )
    timeout = settings.collective_timeout
    watchdog = [ProgressWatchdog(timeout)] if timeout and job.multi_worker else []
    # no progress bar (stdout not a terminal, or --verbose 2): a line every --log-every steps
    lines = fit_verbosity(settings) == 2 and job.chief
    progress = [ProgressLog(state, settings.train_steps, settings.log_every)] if lines else []
    return [
        state,
        *watchdog,  # --collective-timeout: no progress for that long ends the process
        *progress,  # first: its step times leave out the callbacks' work (BLEU, checkpoints)
        guard,
        *evaluation,
        *cb.kill_switch(state, manager),  # tests only ($KT_KILL_AT)
        checkpoints,
        cb.StopAtStep(state, settings.train_steps),
        PreemptionSave(job.strategy, lambda: int(model.data_position.numpy()), checkpoints.save),
    ]


def fit_verbosity(settings) -> int:
    """Keras' `verbose`: --verbose, else the progress bar on a terminal and one line per
    epoch elsewhere (where `ProgressLog` adds a line every --log-every steps)."""
    if settings.verbose is not None:
        return settings.verbose
    return 1 if sys.stdout.isatty() else 2


__all__ = ["Bookkeeping", "bookkeeping", "fit_verbosity", "make_bleu_callback", "make_callbacks"]
