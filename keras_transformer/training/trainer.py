"""`run(args)`: train or resume the run in `--model-dir`, as a short sequence of named stages."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time

import keras
import tensorflow as tf

from keras_transformer.config import TransformerConfig
from keras_transformer.data import (
    PipelineStats,
    SubwordTokenizer,
    load_parallel,
    make_batches,
    train_sentencepiece,
    training_batches,
)
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.optimization import paper_optimizer
from keras_transformer.run_dir import CONFIG_FILE, LOG_DIR, Run
from keras_transformer.training import callbacks as cb
from keras_transformer.training.args import (
    ConfigError,
    TrainArgs,
    check_resume,
    describe,
    resolve,
    validate,
)
from keras_transformer.training.step import TrainingModel
from keras_transformer.training.strategy import is_chief, make_strategy, set_precision
from keras_transformer.training.summary import summarize

WORKER_WAIT_SECONDS = 900  # how long a non-chief worker waits for the chief's config.json


def run(args: TrainArgs) -> dict:
    """Train (or resume) the run in `args.model_dir`; returns a summary dict."""
    validate(args)
    set_precision(args.precision)
    strategy = make_strategy(args.strategy)  # first: collective ops are set up at startup
    keras.utils.set_random_seed(args.seed)  # before any tokenizer: it clears the kernel cache
    chief = is_chief(strategy)
    shared = Run(args.model_dir)  # the chief's directory: config.json, spm.model
    own = shared if chief else Run(os.path.join(args.model_dir, f"worker_{_task_id(strategy)}"))
    train, valid = load_data(args)
    print(f"train: {train.report()}\nvalidation: {valid.report()}", flush=True)
    settings, tokenizer = prepare_run(shared, args, train, chief)
    print(f"settings (config.json):\n{describe(settings, args)}", flush=True)

    with strategy.scope():
        model = build_model(shared.model_config(), settings)
    metrics = cb.MetricsLogger(own, cb.StepState(model), settings.log_every, chief)
    bleu = make_bleu_callback(settings, model, tokenizer, valid, shared, chief, strategy, metrics)
    checkpoint = tf.train.Checkpoint(
        model=model.transformer,
        optimizer=model.optimizer,
        data_position=model.data_position,
        rng=seed_states(model.transformer),
        bleu=bleu.progress,
    )
    manager = own.checkpoint_manager(checkpoint, max_to_keep=settings.keep_checkpoints)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        scale = getattr(model.optimizer, "dynamic_scale", None)
        scale = f" (loss scale {float(scale.numpy()):g})" if scale is not None else ""
        print(f"resumed from {manager.latest_checkpoint} at step {_step(model)}{scale}", flush=True)
    if _step(model) >= settings.train_steps:
        print(f"already at step {_step(model)} >= --train-steps {settings.train_steps}", flush=True)
        return summarize(shared, settings, model, bleu)

    stats = PipelineStats()

    def data_from(position: int) -> tf.data.Dataset:
        return training_batches(
            train.dataset,
            tokenizer,
            batch_tokens=settings.batch_tokens * settings.accum_steps,
            max_length=settings.max_length,
            seed=settings.seed,
            steps_per_epoch=settings.steps_per_epoch,
            start_step=position,
            stats=stats,
            num_pairs=train.num_pairs,
        )

    valid_batches = make_batches(
        valid.dataset,
        tokenizer,
        batch_tokens=settings.batch_tokens,
        max_length=settings.max_length,
        shuffle=False,
    )
    callbacks = make_callbacks(settings, own, manager, model, [metrics, bleu])
    fit_to_step(model, data_from, valid_batches, callbacks, settings)
    if int(stats.too_long.numpy()):
        print(
            f"dropped {int(stats.too_long.numpy())} training pairs longer than "
            f"--max-length {settings.max_length}",
            flush=True,
        )
    return summarize(shared, settings, model, bleu)


# -- stages ---------------------------------------------------------------------------------


def load_data(args: TrainArgs):
    """(train, validation) ParallelText from the --dataset flags."""
    files = {
        "train": (args.train_src, args.train_tgt),
        "validation": (args.valid_src, args.valid_tgt),
    }
    return tuple(
        load_parallel(
            args.dataset,
            split,
            args.src_lang,
            args.tgt_lang,
            data_dir=args.data_dir,
            files=files[split],
            seed=args.seed,  # TFDS: the order of its files
        )
        for split in ("train", "validation")
    )


def prepare_run(run: Run, args: TrainArgs, train, chief: bool):
    """(resolved settings, tokenizer): from config.json when resuming (refusing flags that
    would change the run), else resolved from the corpus and written by the chief."""
    if not chief:
        _wait_for(run.path(CONFIG_FILE))
    if run.exists:
        saved = run.read_config()["training"]
        check_resume(args, saved, run.path(CONFIG_FILE))
        known = {f.name for f in dataclasses.fields(TrainArgs)}
        settings = dataclasses.replace(
            args, **{k: v for k, v in saved.items() if k in known and getattr(args, k) is None}
        )
        if args.epochs is not None:
            settings.train_steps = args.epochs * settings.steps_per_epoch
        settings.epochs = None
        return settings, run.load_tokenizer()

    tokenizers: dict[int, SubwordTokenizer] = {}

    def tokenizer_for(vocab_size: int) -> SubwordTokenizer:
        if vocab_size not in tokenizers:
            tokenizers[vocab_size] = train_tokenizer(train, vocab_size, args)
        return tokenizers[vocab_size]

    def batches_per_pass(vocab_size: int, batch_tokens: int) -> int:
        return count_batches(train, tokenizer_for(vocab_size), batch_tokens, args.max_length)

    settings = resolve(args, num_pairs=train.num_pairs, batches_per_pass=batches_per_pass)
    tokenizer = tokenizer_for(settings.vocab_size)
    model_config = TransformerConfig.preset(
        settings.preset,
        vocab_size=tokenizer.vocab_size,
        max_length=max(settings.max_length, 256),
        dropout_rate=settings.dropout_rate,
        label_smoothing=settings.label_smoothing,
    )
    run.save_tokenizer(tokenizer)  # before config.json: other workers wait for config.json
    run.write_config({"model": model_config.to_dict(), "training": dataclasses.asdict(settings)})
    return settings, tokenizer


def train_tokenizer(train, vocab_size: int, args: TrainArgs) -> SubwordTokenizer:
    def sentences():
        for src, tgt in train.dataset.as_numpy_iterator():
            yield src.decode("utf-8")
            yield tgt.decode("utf-8")

    print(f"training a {vocab_size}-piece {args.spm_model_type} SentencePiece model", flush=True)
    proto = train_sentencepiece(
        sentences(), vocab_size, model_type=args.spm_model_type, seed=args.seed
    )
    return SubwordTokenizer(proto)


def count_batches(train, tokenizer, batch_tokens: int, max_length: int, sample: int = 20_000):
    """Batches in one pass over the corpus: counted on up to `sample` pairs, then scaled."""
    batches = make_batches(
        train.dataset.take(sample),
        tokenizer,
        batch_tokens=batch_tokens,
        max_length=max_length,
        shuffle=False,
    )
    counted = int(batches.reduce(0, lambda n, _: n + 1))
    total = train.num_pairs
    if total is None or total <= sample:
        return counted if total is not None else max(counted, 1000)
    return math.ceil(counted * total / sample)


def build_model(config: TransformerConfig, settings: TrainArgs) -> TrainingModel:
    """The Transformer inside a TrainingModel, compiled with the paper's optimizer."""
    model = TrainingModel(Transformer(config), accum_steps=settings.accum_steps)
    model.compile(
        optimizer=paper_optimizer(config.d_model, settings.warmup_steps, settings.lr_scale),
        loss=LabelSmoothedCrossEntropy(config.label_smoothing),
        metrics=[MaskedAccuracy()],
        jit_compile=settings.jit_compile,
    )
    model.optimizer.build(model.transformer.trainable_variables)
    return model


def seed_states(model) -> list:
    """The dropout layers' RNG states: saved with the checkpoints for an exact resume."""
    return [v for v in model.variables if "seed_generator_state" in v.path]


def make_bleu_callback(settings, model, tokenizer, valid, run: Run, chief, strategy, metrics):
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
    best = run.checkpoint_manager(tf.train.Checkpoint(model=model.transformer), best=True)
    return cb.BleuEvaluation(
        translate,
        sources,
        references,
        every=settings.eval_every,
        best_manager=best if chief else None,
        state=cb.StepState(model),
        metrics=metrics,
        log_dir=run.path(LOG_DIR),
        patience=settings.patience,
        strategy=strategy,
    )


def make_callbacks(settings, run: Run, manager, model, evaluation: list) -> list:
    """Keras runs callbacks in this order: a checkpoint taken at an evaluation step must
    already hold that evaluation's best score."""
    state = cb.StepState(model)
    guard = cb.NonFiniteLossGuard(manager)
    return [
        guard,
        *evaluation,
        cb.CheckpointEvery(manager, state, settings.checkpoint_every, guard),
        keras.callbacks.TensorBoard(run.path(LOG_DIR), update_freq=settings.log_every),
        cb.StopAtStep(state, settings.train_steps),
    ]


def fit_to_step(model: TrainingModel, data_from, valid_batches, callbacks, settings) -> None:
    """`fit` until the optimizer has applied exactly `train_steps` updates.

    The data restarts at `model.data_position` (batches consumed), so a resumed run sees
    the batches an uninterrupted one would. float16 steps skipped by loss scaling consume a
    batch without an update; `fit` is then called again for the missing updates.
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
            data_from(position),
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


def _wait_for(path: str, timeout: float = WORKER_WAIT_SECONDS) -> None:
    """A non-chief worker waits for the chief to write the run's config.json."""
    deadline = time.monotonic() + timeout
    while not os.path.isfile(path):
        if time.monotonic() > deadline:
            raise ConfigError(
                f"waited {timeout:.0f} s for the chief worker to write {path}: start worker 0 "
                "with the same --model-dir (a directory every worker can read)"
            )
        time.sleep(1.0)


__all__ = ["TrainArgs", "fit_to_step", "run"]
