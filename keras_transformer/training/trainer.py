"""`train(plan)`: train or resume the run in `--model-dir`, as a short sequence of named stages.

Each part gets its collaborators when it is built: the BLEU bookkeeping (`cb.BleuProgress`)
first, then the checkpoint that saves it, its manager, the NaN guard that names the manager's
last checkpoint, and the BLEU callback that the guard silences.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys

import keras
import tensorflow as tf

from keras_transformer.config import TransformerConfig
from keras_transformer.data import DataMissing, PipelineStats, make_batches, training_batches
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.optimization import paper_optimizer
from keras_transformer.run_dir import LOG_DIR, Run
from keras_transformer.settings.args import INITIAL_LOSS_SCALE, TrainSettings, describe
from keras_transformer.settings.plan import Plan
from keras_transformer.settings.recipe import COUNTED, replica_tokens
from keras_transformer.training import callbacks as cb
from keras_transformer.training import ema, fine_tune, layout
from keras_transformer.training.preemption import PreemptionSave
from keras_transformer.training.preparation import (
    check_tag_symbol,
    load_data,
    planned_settings,
    settle,
    subword_sampler,
)
from keras_transformer.training.progress import ProgressLog
from keras_transformer.training.step import TrainingModel
from keras_transformer.training.strategy import (
    StrategyError,
    check_devices,
    device_report,
    is_chief,
    make_strategy,
    planned_replicas,
    set_precision,
)
from keras_transformer.training.summary import summarize
from keras_transformer.training.watchdog import ProgressWatchdog

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Job:
    """Where this process trains: the strategy, its worker index (None for the chief, as
    TensorFlow decides) and the chief's run directory (config.json, spm.model, checkpoints,
    metrics), which only the chief writes: every variable of a checkpoint is mirrored, the
    other workers' copies would be dead files."""

    strategy: tf.distribute.Strategy
    task: int | None
    shared: Run

    @property
    def chief(self) -> bool:
        return self.task is None

    @classmethod
    def start(cls, model_dir: str, strategy_name: str) -> Job:
        # first: collective ops are set up at startup
        strategy = make_strategy(strategy_name)
        task = None if is_chief(strategy) else _task_id(strategy)
        return cls(strategy, task, Run(model_dir))


def train(plan: Plan) -> dict:
    """Train (or resume) the run in `plan.args.model_dir`; returns a summary dict."""
    args = plan.args
    job = Job.start(args.model_dir, args.strategy)
    logger.info("%s", device_report(job.strategy))
    if not job.shared.exists:  # a resumed run's precision is checked once read back
        check_devices(args.precision, args.cpu_devices)
    keras.utils.set_random_seed(args.seed)  # before any tokenizer: it clears the kernel cache
    train_data, valid = load_data(plan)
    logger.info("train: %s\nvalidation: %s", train_data.report(), valid.report())
    replicas = job.strategy.num_replicas_in_sync
    settings, tokenizer = settle(job.shared, args, train_data, job.task, replicas)
    check_devices(settings.precision, args.cpu_devices)
    logger.info("settings (config.json):\n%s", describe(settings, args))
    log_replica_tokens(settings, replicas)
    check_tag_symbol(tokenizer, settings)
    set_precision(settings.precision)

    with job.strategy.scope():
        model = build_model(job.shared.model_config(), settings)
    metrics = cb.MetricsLogger(job.shared, cb.StepState(model), settings.log_every, job.chief)
    progress = cb.BleuProgress()
    checkpoint = training_checkpoint(model, progress)
    manager = job.shared.checkpoint_manager(checkpoint, max_to_keep=settings.keep_checkpoints)
    guard = cb.NonFiniteLossGuard(manager, settings.nonfinite_steps)
    bleu = make_bleu_callback(
        job, settings, model, tokenizer, valid, metrics=metrics, guard=guard, progress=progress
    )
    if not restore(job.shared, checkpoint, model, bleu, metrics) and settings.init_from:
        # a fine-tuned run without a checkpoint of its own starts from its source's weights
        fine_tune.initialize(
            model.transformer, job.shared.read_config()["init"], keep=seed_states(model.transformer)
        )
    check_restored_step(job, _step(model))
    if _step(model) >= settings.train_steps:
        logger.info("already at step %d >= --train-steps %d", _step(model), settings.train_steps)
        return summarize(job.shared, settings, model, bleu)

    stats = PipelineStats()
    subword = subword_sampler(tokenizer, settings.subword_alpha)  # training sentences only
    data_from = training_stream(train_data, tokenizer, settings, stats, subword, replicas)
    if model.replica_next is not None:  # multi-worker: each worker reads its own share
        data_from = worker_streams(job.strategy, model, data_from)
    valid_batches = validation_batches(valid, tokenizer, settings)
    callbacks = make_callbacks(settings, manager, model, guard, [metrics, bleu], job)
    try:
        fit_to_step(model, data_from, valid_batches, callbacks, settings)
    finally:
        for callback in callbacks:  # the PreemptionSave, the ProgressWatchdog
            if isinstance(callback, (PreemptionSave, ProgressWatchdog)):
                callback.close()
    report_dropped(stats, settings)
    return summarize(job.shared, settings, model, bleu)


def dry_run(plan: Plan) -> str:
    """The plan `train(plan)` would follow, as train shows it (the corpora and the settings
    table), from the corpus sizes alone: no tokenizer trained, nothing downloaded (neither
    Multi30k nor TFDS), nothing written (not even --model-dir). A corpus not at hand (not
    downloaded or prepared yet) is of unknown size: the plan of a large corpus, said so."""
    args = plan.args
    # the replicas bound the automatic micro-batch; multi_worker's from TF_CONFIG (building
    # the strategy would wait for the peers)
    if args.strategy == "multi_worker":
        replicas = planned_replicas(args.strategy)
    else:
        strategy = make_strategy(args.strategy)
        logger.info("%s", device_report(strategy))
        replicas = strategy.num_replicas_in_sync
    try:  # a preview of a GPU recipe on another machine still shows its plan
        check_devices(args.precision, args.cpu_devices)
        device_note = ""
    except StrategyError as err:
        device_note = f"on this machine, kt-train would stop: {err}\n"
    local = dataclasses.replace(args, tfds_download=False)
    try:
        train_data, valid = load_data(dataclasses.replace(plan, args=local), download=False)
        corpora = f"train: {train_data.report()}\nvalidation: {valid.report()}"
    except DataMissing as err:
        train_data = None
        corpora = (
            f"train: not at hand ({err})\n"
            "corpus size unknown: the plan of a large corpus (1,000,000 pairs or more); "
            "a smaller one gets the small-corpus recipe"
        )
    settings = planned_settings(Run(args.model_dir), args, train_data, replicas)
    return (
        f"{corpora}\n"
        f"settings (config.json):\n{describe(settings, args, pending=COUNTED)}\n"
        f"{log_replica_tokens(settings, replicas)}\n{device_note}"
        f"dry run: nothing trained, nothing written to {args.model_dir}"
    )


def log_replica_tokens(settings: TrainSettings, replicas: int) -> str:
    """Log the tokens per replica (a warning below the floor); returns the line."""
    line, warning = replica_tokens(settings, replicas)
    logger.info("%s", line)
    if warning:
        logger.warning("%s", warning)
    return line


# -- stages ---------------------------------------------------------------------------------


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


def training_stream(train_data, tokenizer, settings: TrainSettings, stats, subword, split=1):
    """`data_from(start)`: the training batches from stream position `start`, position-tagged.

    `data_from(start, shard=(index, count), replicas=n)`: one worker's stream of its share of
    the pairs, in batches of 1/n of the token budget (one replica's).
    With --jit-compile, a bucket's batches all have its row count, divisible by the rows'
    split: `split` replicas (one stream's batches split between them) x --accum-steps."""

    def data_from(start: int, shard=None, replicas: int = 1) -> tf.data.Dataset:
        static = settings.accum_steps * (split if shard is None else 1)
        return training_batches(
            train_data,
            tokenizer,
            batch_tokens=settings.batch_tokens * settings.accum_steps // replicas,
            max_length=settings.max_length,
            seed=settings.seed,
            start=start,
            stats=stats,
            positions=True,  # TrainingModel keeps the stream position of the next batch
            subword=subword,
            shard=shard,
            static_rows=static if settings.jit_compile else None,
        )

    return data_from


def worker_streams(strategy, model: TrainingModel, stream):
    """Multi-worker input: `data_from(_)` gives every worker a stream of its own share of
    each pass's pairs (`training_batches(shard=...)`: pairs w, w + W, ... for worker w of
    W), which it alone reads and tokenizes; each of its replicas takes whole batches of
    1/(replicas of the job) of the token budget, so an update still holds about
    --batch-tokens x --accum-steps tokens. The stream starts after the last batch this
    worker's replicas trained on (`model.replica_next`), so a resume is exact."""
    ids = strategy.run(lambda: tf.distribute.get_replica_context().replica_id_in_sync_group)
    local = [int(i) for i in strategy.experimental_local_results(ids)]

    def data_from(_start=None):
        start = int(max(model.replica_next.numpy()[local]))

        def worker_stream(context: tf.distribute.InputContext) -> tf.data.Dataset:
            shard = (context.input_pipeline_id, context.num_input_pipelines)
            logger.info(
                "worker input: pairs %d, %d + %d, ... of every pass (share %d of %d), from "
                "stream position %d",
                shard[0], shard[0], shard[1], shard[0] + 1, shard[1], start,
            )  # fmt: skip
            return stream(start, shard=shard, replicas=context.num_replicas_in_sync)

        return strategy.distribute_datasets_from_function(worker_stream)

    return data_from


def report_dropped(stats: PipelineStats, settings: TrainSettings) -> None:
    """Print how many training pairs over --max-length the pipeline dropped, if any."""
    if int(stats.too_long.numpy()):
        logger.info(
            "dropped %d training pairs longer than --max-length %d",
            int(stats.too_long.numpy()),
            settings.max_length,
        )


def restore(shared: Run, checkpoint, model, bleu, metrics) -> bool:
    """Resume from the chief's newest checkpoint, on every worker; False when there is none.

    Only the chief writes checkpoints; every worker restores the chief's newest one, so all
    restart at the same step (and call their collectives at the same steps).
    `best/` keeps its own score; the larger of it and the checkpoint's is the best so far.
    metrics.jsonl and TensorBoard lose the events past the restored step (the resumed run
    writes them again), and every event when there is nothing to restore.
    """
    paths = shared.checkpoints()
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
    bleu.restore_best(shared, _step(model))
    metrics.resume()
    scale = getattr(model.optimizer, "dynamic_scale", None)
    scale = f" (loss scale {float(scale.numpy()):g})" if scale is not None else ""
    logger.info("resumed from %s at step %d%s", paths[-1], _step(model), scale)
    return True


def check_restored_step(job: Job, step: int) -> None:
    """Every worker restored the chief's step (a collective in multi-worker runs), else one
    line naming the tasks that differ."""
    if not isinstance(job.strategy, tf.distribute.MultiWorkerMirroredStrategy):
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


def make_bleu_callback(
    job: Job, settings, model, tokenizer, valid, *, metrics, guard, progress
) -> cb.BleuEvaluation:
    """Validation BLEU (the chief translates; every worker takes part in the stop decision)."""
    from keras_transformer.inference.translator import Translator
    from keras_transformer.settings.decoding import DecodingOptions

    sources, references, translate = [], [], None
    if job.chief:
        pairs = valid.dataset
        if settings.eval_sentences:
            pairs = pairs.take(settings.eval_sentences)
        for src, tgt in pairs.as_numpy_iterator():
            sources.append(src.decode("utf-8"))
            references.append(tgt.decode("utf-8"))
        options = DecodingOptions(beam_size=settings.eval_beam_size)
        translate = Translator(model.transformer, tokenizer, options)
    return cb.BleuEvaluation(
        translate,
        sources,
        references,
        every=settings.eval_every,
        best_dir=job.shared.path("best") if job.chief else None,
        model=model.transformer,
        state=cb.StepState(model),
        metrics=metrics,
        log_dir=job.shared.path(LOG_DIR),
        patience=settings.patience,
        strategy=job.strategy,
        averaged=lambda: ema.swapped(model.transformer, model.optimizer),
        guard=guard,
        progress=progress,
    )


def make_callbacks(settings, manager, model, guard, evaluation: list, job: Job) -> list:
    """Keras runs callbacks in this order: a checkpoint taken at an evaluation step must
    already hold that evaluation's best score. The chief alone saves checkpoints; after a
    SIGTERM to any worker, every worker stops at the same batch, the chief saves there."""
    state = cb.StepState(model)
    checkpoints = cb.CheckpointEvery(manager, state, settings.checkpoint_every, guard, job.chief)
    timeout = settings.collective_timeout
    multi_worker = isinstance(job.strategy, tf.distribute.MultiWorkerMirroredStrategy)
    watchdog = [ProgressWatchdog(timeout)] if timeout and multi_worker else []
    # no progress bar (stdout not a terminal, or --verbose 2): a line every --log-every steps
    lines = fit_verbosity(settings) == 2 and job.chief
    progress = [ProgressLog(state, settings.train_steps, settings.log_every)] if lines else []
    return [
        *watchdog,  # --collective-timeout: no progress for that long ends the process
        *progress,  # first: its step times leave out the callbacks' work (BLEU, checkpoints)
        guard,
        *evaluation,
        *cb.kill_switch(state),  # tests only ($KT_KILL_AT)
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
    while _step(model) < settings.train_steps:
        before, position = _step(model), int(model.data_position.numpy())
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
        if _step(model) > before:
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


# -- helpers --------------------------------------------------------------------------------


def _step(model) -> int:
    return int(model.optimizer.iterations.numpy())


def _task_id(strategy) -> int:
    return strategy.cluster_resolver.task_id


__all__ = ["Job", "dry_run", "fit_to_step", "train"]
