"""`train(plan)`: train or resume the run in `--model-dir`, as a short sequence of named stages:
prepare (data, `RunConfig`, tokenizer: `preparation.prepare`), build the model
(`model_state`), its bookkeeping and callbacks (`run_callbacks`), restore or initialize, then
`fit` on the input streams (`streams`) until the last step (`fit_to_step`).
"""

from __future__ import annotations

import logging
import math
import sys

import keras

from keras_transformer.data import PipelineStats
from keras_transformer.settings.args import TrainArgs, TrainSettings, describe
from keras_transformer.settings.plan import Plan
from keras_transformer.training import callbacks as cb
from keras_transformer.training.dry_run import dry_run, log_replica_tokens
from keras_transformer.training.job import Job
from keras_transformer.training.model_state import build, restore, step_of
from keras_transformer.training.preemption import PreemptionSave
from keras_transformer.training.preparation import Preparation, prepare
from keras_transformer.training.run_callbacks import bookkeeping, fit_verbosity, make_callbacks
from keras_transformer.training.step import TrainingModel
from keras_transformer.training.strategy import check_devices, use_precision
from keras_transformer.training.streams import (
    report_dropped,
    training_stream,
    validation_batches,
    worker_streams,
)
from keras_transformer.training.summary import summarize
from keras_transformer.training.watchdog import ProgressWatchdog

logger = logging.getLogger(__name__)


def train(plan: Plan) -> dict:
    """Train (or resume) the run in `plan.args.model_dir`; returns a summary dict."""
    args = plan.args
    job = Job.start(args)  # the devices first
    if not job.found.exists:  # stops before the data; a resumed run's flags are checked
        check_devices(args.precision, args.cpu_devices)  # against its config.json first
    keras.utils.set_random_seed(args.seed)  # before any tokenizer: it clears the kernel cache
    prep = prepare(plan, job)
    settings = prep.config.training
    set_up(settings, args, job.strategy.num_replicas_in_sync)
    state = build(prep.config.model, settings, job.strategy)
    model = state.model
    parts = bookkeeping(job, prep, state)
    step = restore(job, parts.checkpoint, model, parts.bleu, parts.metrics, prep.config.init)
    if step >= settings.train_steps:
        logger.info("already at step %d >= --train-steps %d", step, settings.train_steps)
        return summarize(job.shared, settings, model, parts.bleu)
    stats = PipelineStats()
    data_from = input_stream(job, prep, model, stats)
    valid_batches = validation_batches(prep.valid, prep.tokenizer, settings)
    evaluation = [parts.metrics, parts.bleu]
    callbacks = make_callbacks(settings, parts.manager, model, parts.guard, evaluation, job)
    try:
        fit_to_step(model, data_from, valid_batches, callbacks, settings)
    finally:
        for callback in callbacks:  # the PreemptionSave, the ProgressWatchdog
            if isinstance(callback, (PreemptionSave, ProgressWatchdog)):
                callback.close()
        # --async-checkpoint: the write in flight ends before anything else (a fit that
        # ended normally waited already; a failure raises unless one is on its way out)
        join_checkpoint_writes(callbacks)
    report_dropped(stats, settings)
    return summarize(job.shared, settings, model, parts.bleu)


def join_checkpoint_writes(callbacks) -> None:
    """Wait for --async-checkpoint's write in flight; its failure raises a TrainingError,
    or is logged when an exception is already on its way out (which it would hide)."""
    leaving = sys.exc_info()[1] is not None
    for callback in callbacks:
        if isinstance(callback, cb.CheckpointEvery):
            try:
                callback.wait()
            except cb.TrainingError as err:
                if not leaving:
                    raise
                logger.error("%s", err)


def set_up(settings: TrainSettings, args: TrainArgs, replicas: int) -> None:
    """Check the devices for the run's own precision (a resumed run's, read back) and set
    it, then log its settings."""
    use_precision(settings.precision, args.cpu_devices)
    logger.info("settings (config.json):\n%s", describe(settings, args))
    log_replica_tokens(settings, replicas)


def input_stream(job: Job, prep: Preparation, model: TrainingModel, stats: PipelineStats):
    """`data_from(start)`: the training stream (`streams.training_stream`); under
    multi_worker each worker reads its own share (`streams.worker_streams`)."""
    replicas = job.strategy.num_replicas_in_sync
    data_from = training_stream(prep.train, prep.tokenizer, prep.config.training, stats, replicas)
    if model.replica_next is not None:  # multi-worker: each worker reads its own share
        data_from = worker_streams(job.strategy, model, data_from)
    return data_from


def fit_to_step(model: TrainingModel, data_from, valid_batches, callbacks, settings) -> None:
    """`fit` until the optimizer has applied exactly `train_steps` updates.

    `data_from(start)` gives the training stream from stream position `start`
    (`model.data_next`: the pass and the batch in it where the last run stopped), so a
    resumed run sees the batches an uninterrupted one would. Keras epochs (validation,
    end-of-epoch checkpoints) are `steps_per_epoch` batches, counted by
    `model.data_position`. float16 steps skipped by loss scaling consume a batch without
    an update; `fit` is then called again for the missing updates.
    """
    guard = next(c for c in callbacks if isinstance(c, cb.NonFiniteLossGuard))
    spe = settings.steps_per_epoch
    verbose = fit_verbosity(settings)
    stalled = 0  # batches since the last update (float16 overflows)
    while step_of(model) < settings.train_steps:
        before, position = step_of(model), int(model.data_position.numpy())
        epoch, offset = divmod(position, spe)
        # a run resumed mid-epoch first finishes that epoch, so that epochs (validation,
        # end-of-epoch checkpoints) end where an uninterrupted run's do; a run that stops
        # mid-epoch (--train-steps) ends inside its last epoch, as a longer run passes it
        epochs = 1 if offset else math.ceil((settings.train_steps - before) / spe)
        model.fit(
            data_from(int(model.data_next.numpy())),
            validation_data=valid_batches,
            steps_per_epoch=spe - offset,
            initial_epoch=epoch,
            epochs=epoch + epochs,
            callbacks=callbacks,
            verbose=verbose,
            shuffle=False,  # the pipeline shuffles; Keras cannot shuffle a Dataset
        )
        guard.check()
        if model.stop_training:  # early stopping
            break
        if step_of(model) > before:
            stalled = 0
            continue
        # a short last fit may skip all its batches while the loss scale comes down: only
        # an epoch's worth of batches without an update is a failure
        stalled += int(model.data_position.numpy()) - position
        if stalled >= spe:
            batches = stalled
            raise cb.TrainingError(
                f"no update was applied in {batches} batches: every step had non-finite "
                "gradients (float16 overflow); try --precision float32 or mixed_bfloat16"
            )


__all__ = ["Job", "dry_run", "fit_to_step", "fit_verbosity", "report_dropped", "train"]
