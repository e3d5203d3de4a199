"""`train(args)`: train or resume the run in `--model-dir`, as a short sequence of named stages."""

from __future__ import annotations

import math
import sys

import keras
import tensorflow as tf

from keras_transformer.config import TransformerConfig
from keras_transformer.data import PipelineStats, make_batches, training_batches
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.optimization import paper_optimizer
from keras_transformer.run_dir import LOG_DIR, Run
from keras_transformer.training import callbacks as cb
from keras_transformer.training import ema, fine_tune
from keras_transformer.training.args import (
    INITIAL_LOSS_SCALE,
    TrainArgs,
    TrainSettings,
    describe,
    validate,
)
from keras_transformer.training.preemption import PreemptionSave
from keras_transformer.training.preparation import (
    check_tag_symbol,
    load_data,
    settle,
    subword_sampler,
)
from keras_transformer.training.step import TrainingModel
from keras_transformer.training.strategy import is_chief, make_strategy, set_precision
from keras_transformer.training.summary import summarize


def train(args: TrainArgs) -> dict:
    """Train (or resume) the run in `args.model_dir`; returns a summary dict."""
    validate(args)
    # first: collective ops are set up at startup
    strategy = make_strategy(args.strategy, args.collective_timeout)
    keras.utils.set_random_seed(args.seed)  # before any tokenizer: it clears the kernel cache
    chief = is_chief(strategy)  # TensorFlow's chief; the other workers write nothing
    task = None if chief else _task_id(strategy)
    shared = Run(args.model_dir)  # the chief's directory: config.json, spm.model, checkpoints
    train_data, valid = load_data(args)
    print(f"train: {train_data.report()}\nvalidation: {valid.report()}", flush=True)
    settings, tokenizer = settle(shared, args, train_data, task, strategy.num_replicas_in_sync)
    print(f"settings (config.json):\n{describe(settings, args)}", flush=True)
    check_tag_symbol(tokenizer, settings)
    set_precision(settings.precision)

    with strategy.scope():
        model = build_model(shared.model_config(), settings)
    guard = cb.NonFiniteLossGuard(None)
    metrics = cb.MetricsLogger(shared, cb.StepState(model), settings.log_every, chief)
    bleu = make_bleu_callback(settings, model, tokenizer, valid, shared, chief, strategy, metrics)
    bleu.guard = guard
    checkpoint = training_checkpoint(model, bleu)
    manager = shared.checkpoint_manager(checkpoint, max_to_keep=settings.keep_checkpoints)
    guard.manager = manager
    if not restore(checkpoint, shared, manager, model, bleu, metrics) and settings.init_from:
        # a fine-tuned run without a checkpoint of its own starts from its source's weights
        fine_tune.initialize(
            model.transformer, shared.read_config()["init"], keep=seed_states(model.transformer)
        )
    if _step(model) >= settings.train_steps:
        print(f"already at step {_step(model)} >= --train-steps {settings.train_steps}", flush=True)
        return summarize(shared, settings, model, bleu)

    stats = PipelineStats()
    subword = subword_sampler(tokenizer, settings.subword_alpha)  # training sentences only
    data_from = training_stream(train_data, tokenizer, settings, stats, subword)
    valid_batches = validation_batches(valid, tokenizer, settings)
    callbacks = make_callbacks(settings, manager, model, guard, [metrics, bleu], strategy, chief)
    try:
        fit_to_step(model, data_from, valid_batches, callbacks, settings)
    finally:
        callbacks[-1].close()  # the PreemptionSave
    report_dropped(stats, settings)
    return summarize(shared, settings, model, bleu)


# -- stages ---------------------------------------------------------------------------------


def training_checkpoint(model: TrainingModel, bleu) -> tf.train.Checkpoint:
    """Everything a resume restores: weights, optimizer (and loss scale), the data stream's
    position, the dropout RNG, the BLEU bookkeeping and the moving averages of --ema-decay."""
    return tf.train.Checkpoint(
        model=model.transformer,
        optimizer=model.optimizer,
        data_position=model.data_position,
        data_next=model.data_next,
        rng=seed_states(model.transformer),
        bleu=bleu.progress,
        **ema.checkpoint_items(model.optimizer),
    )


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


def validation_batches(valid, tokenizer, settings: TrainSettings) -> tf.data.Dataset:
    """The validation batches, with their count attached: Keras then stops after the last
    one instead of running into the end of the data (and warning that it ran out)."""
    batches = make_batches(
        valid.dataset,
        tokenizer,
        batch_tokens=settings.batch_tokens,
        max_length=settings.max_length,
        shuffle=False,
    )
    count = int(batches.reduce(0, lambda n, _: n + 1))
    return batches.apply(tf.data.experimental.assert_cardinality(count))


def training_stream(train_data, tokenizer, settings: TrainSettings, stats, subword):
    """`data_from(start)`: the training batches from stream position `start`, position-tagged."""

    def data_from(start: int) -> tf.data.Dataset:
        return training_batches(
            train_data,
            tokenizer,
            batch_tokens=settings.batch_tokens * settings.accum_steps,
            max_length=settings.max_length,
            seed=settings.seed,
            start=start,
            stats=stats,
            positions=True,  # TrainingModel keeps the stream position of the next batch
            subword=subword,
        )

    return data_from


def report_dropped(stats: PipelineStats, settings: TrainSettings) -> None:
    """Print how many training pairs over --max-length the pipeline dropped, if any."""
    if int(stats.too_long.numpy()):
        print(
            f"dropped {int(stats.too_long.numpy())} training pairs longer than "
            f"--max-length {settings.max_length}",
            flush=True,
        )


def restore(checkpoint, shared: Run, manager, model, bleu, metrics) -> bool:
    """Resume from the chief's newest checkpoint, on every worker; False when there is none.

    The chief's checkpoints are the truth: a worker killed between the chief's save and its
    own would otherwise restart from another step (and call collectives at other steps).
    `best/` keeps its own score; the larger of it and the checkpoint's is the best so far.
    metrics.jsonl loses the events past the restored step (the resumed run writes them again).
    """
    paths = shared.checkpoints()
    if not paths:
        return False
    try:
        checkpoint.restore(paths[-1]).assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as err:
        # the half-restored checkpoint lists its unrestored values when it is deleted at exit:
        # the one-line error below says what matters
        tf.get_logger().setLevel("ERROR")
        first = str(err).strip().splitlines()[0][:200]
        raise cb.TrainingError(
            f"checkpoint {paths[-1]} does not match this model and training state ({first}): "
            "it was written by another configuration or version; use a new --model-dir"
        ) from None
    bleu.restore_best(shared)
    metrics.resume()
    scale = getattr(model.optimizer, "dynamic_scale", None)
    scale = f" (loss scale {float(scale.numpy()):g})" if scale is not None else ""
    print(f"resumed from {paths[-1]} at step {_step(model)}{scale}", flush=True)
    return True


def seed_states(model) -> list:
    """The dropout layers' RNG states: saved with the checkpoints for an exact resume."""
    return [v for v in model.variables if "seed_generator_state" in v.path]


def make_bleu_callback(settings, model, tokenizer, valid, shared: Run, chief, strategy, metrics):
    from keras_transformer.inference.translator import Translator

    sources, references, translate = [], [], None
    if chief:
        pairs = valid.dataset
        if settings.eval_sentences:
            pairs = pairs.take(settings.eval_sentences)
        for src, tgt in pairs.as_numpy_iterator():
            sources.append(src.decode("utf-8"))
            references.append(tgt.decode("utf-8"))
        translate = Translator(model.transformer, tokenizer, beam_size=settings.eval_beam_size)
    return cb.BleuEvaluation(
        translate,
        sources,
        references,
        every=settings.eval_every,
        best_dir=shared.path("best") if chief else None,
        model=model.transformer,
        state=cb.StepState(model),
        metrics=metrics,
        log_dir=shared.path(LOG_DIR),
        patience=settings.patience,
        strategy=strategy,
        averaged=lambda: ema.swapped(model.transformer, model.optimizer),
    )


def make_callbacks(settings, manager, model, guard, evaluation: list, strategy, chief) -> list:
    """Keras runs callbacks in this order: a checkpoint taken at an evaluation step must
    already hold that evaluation's best score. The chief alone saves checkpoints; after a
    SIGTERM to any worker, every worker stops at the same batch, the chief saves there."""
    state = cb.StepState(model)
    checkpoints = cb.CheckpointEvery(manager, state, settings.checkpoint_every, guard, chief)
    return [
        guard,
        *evaluation,
        checkpoints,
        cb.StopAtStep(state, settings.train_steps),
        PreemptionSave(strategy, lambda: int(model.data_position.numpy()), checkpoints.save),
    ]


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
    verbose = (
        settings.verbose if settings.verbose is not None else (1 if sys.stdout.isatty() else 2)
    )
    while _step(model) < settings.train_steps:
        before, position = _step(model), int(model.data_position.numpy())
        epoch, offset = divmod(position, spe)
        # a run resumed mid-epoch first finishes that epoch, so that epochs (validation,
        # end-of-epoch checkpoints) end where an uninterrupted run's do
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
        if _step(model) == before:
            batches = int(model.data_position.numpy()) - position
            raise cb.TrainingError(
                f"no update was applied in {batches} batches: every step had non-finite "
                "gradients (float16 overflow); try --precision float32 or mixed_bfloat16"
            )


# -- helpers --------------------------------------------------------------------------------


def _step(model) -> int:
    return int(model.optimizer.iterations.numpy())


def _task_id(strategy) -> int:
    return strategy.cluster_resolver.task_id


__all__ = ["TrainArgs", "fit_to_step", "train"]
