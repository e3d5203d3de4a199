"""The model a run trains and what its checkpoints restore: the compiled `TrainingModel`,
the `tf.train.Checkpoint` of a resume, the restore from the chief's newest checkpoint."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import keras
import tensorflow as tf

from keras_transformer.config import TransformerConfig
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.optimization import paper_optimizer
from keras_transformer.run_dir import RunState
from keras_transformer.settings.args import INITIAL_LOSS_SCALE, TrainSettings
from keras_transformer.settings.run_config import InitRecord
from keras_transformer.training import callbacks as cb
from keras_transformer.training import ema, fine_tune, layout
from keras_transformer.training.job import Job
from keras_transformer.training.step import TrainingModel

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ModelState:
    """What a run trains and saves: the compiled model, the BLEU bookkeeping and the
    checkpoint that saves both (and restores them on a resume)."""

    model: TrainingModel
    progress: cb.BleuProgress
    checkpoint: tf.train.Checkpoint


def build(config: TransformerConfig, settings: TrainSettings, strategy) -> ModelState:
    """The run's model, in one call: compiled in `strategy`'s scope (`build_model`), then
    the BLEU bookkeeping and the checkpoint of them both (`training_checkpoint`)."""
    with strategy.scope():
        model = build_model(config, settings)
    progress = cb.BleuProgress()
    return ModelState(model, progress, training_checkpoint(model, progress))


def build_model(config: TransformerConfig, settings: TrainSettings) -> TrainingModel:
    """The Transformer inside a TrainingModel, compiled with the paper's optimizer (under
    mixed_float16 inside Keras' LossScaleOptimizer, starting at `--initial-loss-scale`)."""
    model = TrainingModel(Transformer(config), accum_steps=settings.accum_steps)
    optimizer = paper_optimizer(
        config.d_model, settings.warmup_steps, settings.lr_scale, ema_decay=settings.ema_decay
    )
    if settings.precision == "mixed_float16":  # what compile would wrap, with our start scale
        optimizer = keras.optimizers.LossScaleOptimizer(
            optimizer,
            initial_scale=settings.initial_loss_scale or INITIAL_LOSS_SCALE,
            name="loss_scale_optimizer",
        )
    model.compile(
        optimizer=optimizer,
        loss=LabelSmoothedCrossEntropy(config.label_smoothing),
        metrics=[MaskedAccuracy()],
        jit_compile=settings.jit_compile,
    )
    model.optimizer.build(model.transformer.trainable_variables)
    return model


def training_checkpoint(model: TrainingModel, progress: cb.BleuProgress) -> tf.train.Checkpoint:
    """Everything a resume restores: weights, optimizer (and loss scale), the data stream's
    position, the dropout RNG, the BLEU bookkeeping and the moving averages of --ema-decay."""
    return tf.train.Checkpoint(
        model=model.transformer,
        optimizer=model.optimizer,
        data_position=model.data_position,
        data_next=model.data_next,
        rng=seed_states(model.transformer),
        **layout.checkpoint_items(model),
        bleu=progress,
        **ema.checkpoint_items(model.optimizer),
    )


def restore(job: Job, checkpoint, model, bleu, metrics, init: InitRecord | None = None) -> int:
    """Resume from the chief's newest checkpoint (`restore_newest`), on every worker; then
    every worker checks that all are at the chief's step (`check_restored_step`). With none
    to restore, a fine-tuned run (`init`: config.json's record) starts from its source's
    weights, keeping its own dropout RNG states. Returns the step the model is at."""
    restored = restore_newest(job.found, checkpoint, model, bleu, metrics)
    step = step_of(model)
    check_restored_step(job, step)
    if not restored and init is not None:
        fine_tune.initialize(model.transformer, init, keep=seed_states(model.transformer))
    return step


def restore_newest(found: RunState, checkpoint, model, bleu, metrics) -> bool:
    """Restore the chief's newest checkpoint (of those `found` at the job's start); False
    when there is none.

    Only the chief writes checkpoints; every worker restores the chief's newest one, so all
    restart at the same step (and call their collectives at the same steps).
    `best/` keeps its own score; the larger of it and the checkpoint's is the best so far.
    metrics.jsonl and TensorBoard lose the events past the restored step (the resumed run
    writes them again), and every event when there is nothing to restore.
    """
    paths = found.checkpoints
    if not paths:  # a run killed before its first checkpoint wrote events: they go
        metrics.resume(restored=False)
        return False
    try:
        layout.restore(checkpoint, paths[-1], model)  # another layout: re-sharded
    except (AssertionError, ValueError, tf.errors.OpError) as err:
        # the half-restored checkpoint lists its unrestored values when it is deleted at exit:
        # the one-line error below says what matters
        tf.get_logger().setLevel("ERROR")
        first = str(err).strip().splitlines()[0][:200]
        raise cb.TrainingError(
            f"checkpoint {paths[-1]} does not match this model and training state ({first}): "
            "it was written by another configuration or version; use a new --model-dir"
        ) from None
    bleu.restore_best(found.run, step_of(model))
    metrics.resume()
    scale = getattr(model.optimizer, "dynamic_scale", None)
    scale = f" (loss scale {float(scale.numpy()):g})" if scale is not None else ""
    logger.info("resumed from %s at step %d%s", paths[-1], step_of(model), scale)
    return True


def check_restored_step(job: Job, step: int) -> None:
    """Every worker restored the chief's step (a collective in multi-worker runs), else one
    line naming the tasks that differ."""
    if not job.multi_worker:
        return
    steps = cb.replica_steps(job.strategy, step)
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    tasks = [f"chief:{i}" for i in range(len(cluster.get("chief") or []))]
    tasks += [f"worker:{i}" for i in range(len(cluster.get("worker") or []))]
    per_task = max(1, len(steps) // len(tasks))  # replicas are numbered task by task
    cb.check_same_step(
        steps, [tasks[min(i // per_task, len(tasks) - 1)] for i in range(len(steps))]
    )


def seed_states(model) -> list:
    """The dropout layers' RNG states: saved with the checkpoints for an exact resume."""
    return [v for v in model.variables if "seed_generator_state" in v.path]


def step_of(model) -> int:
    """The optimizer updates applied so far."""
    return int(model.optimizer.iterations.numpy())


__all__ = [
    "ModelState",
    "build",
    "build_model",
    "check_restored_step",
    "restore",
    "restore_newest",
    "seed_states",
    "step_of",
    "training_checkpoint",
]
