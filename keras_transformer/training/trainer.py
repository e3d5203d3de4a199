"""Builds data, model, optimizer and callbacks from the flags, then runs one `model.fit`."""

from __future__ import annotations

import dataclasses
import math
import os
import sys

import keras
import tensorflow as tf

from keras_transformer import run_dir
from keras_transformer.config import TransformerConfig
from keras_transformer.data import (
    DataError,
    PipelineStats,
    SubwordTokenizer,
    load_parallel,
    make_batches,
    train_sentencepiece,
)
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.optimization import paper_optimizer
from keras_transformer.training import callbacks as cb
from keras_transformer.training.strategy import is_chief, make_strategy, set_precision


@dataclasses.dataclass
class TrainArgs:
    """Every train.py flag (DESIGN.md section 8), with the paper's defaults where it has one."""

    model_dir: str = "runs/multi30k-en-de"
    preset: str = "small"
    src_lang: str = "en"
    tgt_lang: str = "de"
    dataset: str = "multi30k"
    train_src: str | None = None
    train_tgt: str | None = None
    valid_src: str | None = None
    valid_tgt: str | None = None
    data_dir: str | None = None
    strategy: str = "default"
    cpu_devices: int = 1
    precision: str = "float32"
    vocab_size: int = 8000
    spm_model_type: str = "bpe"
    batch_tokens: int = 4096
    accum_steps: int = 1
    max_length: int = 128
    epochs: int | None = None
    train_steps: int | None = None
    steps_per_epoch: int = 1000
    checkpoint_every: int = 1000
    keep_checkpoints: int = 5
    eval_every: int = 0
    eval_sentences: int = 0
    eval_beam_size: int = 4
    patience: int = 0
    log_every: int = 100
    warmup_steps: int = 4000
    lr_scale: float = 1.0
    dropout_rate: float | None = None
    label_smoothing: float | None = None
    jit_compile: bool = False
    seed: int = 0
    verbose: int | None = None


def resolve_config(args: TrainArgs, vocab_size: int) -> TransformerConfig:
    overrides = {"vocab_size": vocab_size, "max_length": max(args.max_length, 256)}
    if args.dropout_rate is not None:
        overrides["dropout_rate"] = args.dropout_rate
    if args.label_smoothing is not None:
        overrides["label_smoothing"] = args.label_smoothing
    return TransformerConfig.preset(args.preset, **overrides)


def validate(args: TrainArgs) -> None:
    for name in ("batch_tokens", "max_length", "accum_steps", "vocab_size", "steps_per_epoch"):
        value = getattr(args, name)
        if not isinstance(value, int) or value <= 0:
            raise DataError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    if args.epochs is not None and args.train_steps is not None:
        raise DataError("give --epochs or --train-steps, not both")
    for name in ("epochs", "train_steps"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise DataError(f"--{name.replace('_', '-')} must be positive, got {value}")


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
        )
        for split in ("train", "validation")
    )


def get_tokenizer(args: TrainArgs, train, chief: bool) -> SubwordTokenizer:
    path = os.path.join(args.model_dir, run_dir.TOKENIZER_FILE)
    if os.path.isfile(path):
        return SubwordTokenizer.load(path)

    def sentences():
        for src, tgt in train.dataset.as_numpy_iterator():
            yield src.decode("utf-8")
            yield tgt.decode("utf-8")

    print(
        f"training a {args.vocab_size}-piece {args.spm_model_type} SentencePiece model", flush=True
    )
    proto = train_sentencepiece(
        sentences(), args.vocab_size, model_type=args.spm_model_type, seed=args.seed
    )
    tokenizer = SubwordTokenizer(proto)
    if chief:
        tmp = path + ".tmp"
        tokenizer.save(tmp)
        os.replace(tmp, path)
    tokenizer.model_asset = tf.saved_model.Asset(path)
    return tokenizer


def run(args: TrainArgs) -> dict:
    """Train (or resume) the run in `args.model_dir`; returns the last logs."""
    validate(args)
    set_precision(args.precision)
    strategy = make_strategy(args.strategy)  # first: collective ops must be set up at startup
    keras.utils.set_random_seed(
        args.seed
    )  # before any tokenizer: set_seed clears TF's kernel cache
    chief = is_chief(strategy)
    model_dir = (
        args.model_dir
        if chief
        else os.path.join(args.model_dir, f"worker_{strategy.cluster_resolver.task_id}")
    )
    args = dataclasses.replace(args, model_dir=model_dir)
    os.makedirs(model_dir, exist_ok=True)

    train, valid = load_data(args)
    print(f"train: {train.report()}\nvalidation: {valid.report()}", flush=True)
    tokenizer = get_tokenizer(args, train, chief)

    config_path = os.path.join(model_dir, run_dir.CONFIG_FILE)
    if os.path.isfile(config_path):
        model_config = TransformerConfig.from_dict(run_dir.read_config(model_dir)["model"])
    else:
        model_config = resolve_config(args, tokenizer.vocab_size)
        run_dir.write_json_atomic(
            config_path,
            {
                "model": model_config.to_dict(),
                "training": {k: v for k, v in dataclasses.asdict(args).items()},
            },
        )

    stats = PipelineStats()
    train_batches = make_batches(
        train.dataset,
        tokenizer,
        batch_tokens=args.batch_tokens * args.accum_steps,
        max_length=args.max_length,
        seed=args.seed,
        stats=stats,
    )
    valid_batches = make_batches(
        valid.dataset,
        tokenizer,
        batch_tokens=args.batch_tokens,
        max_length=args.max_length,
        shuffle=False,
        stats=PipelineStats(),
    )

    with strategy.scope():
        model = Transformer(model_config)
        model.compile(
            optimizer=paper_optimizer(model_config.d_model, args.warmup_steps, args.lr_scale),
            loss=LabelSmoothedCrossEntropy(model_config.label_smoothing),
            metrics=[MaskedAccuracy()],
            accum_steps=args.accum_steps,
            jit_compile=args.jit_compile,
        )
        model.optimizer.build(model.trainable_variables)
        state = cb.StepState(model)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, epoch=state.epoch)
    manager = tf.train.CheckpointManager(
        checkpoint,
        os.path.join(model_dir, run_dir.CHECKPOINT_DIR),
        max_to_keep=args.keep_checkpoints,
    )
    best_manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model), os.path.join(model_dir, run_dir.BEST_DIR), max_to_keep=1
    )
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        print(f"resumed from {manager.latest_checkpoint} at step {state.step}", flush=True)

    if args.train_steps is not None:
        if state.step >= args.train_steps:
            print(f"already at step {state.step} >= --train-steps {args.train_steps}", flush=True)
            return {"step": state.step}
        data = train_batches.repeat()
        spe = args.steps_per_epoch
        epochs = math.ceil(args.train_steps / spe)
        initial_epoch = min(state.step // spe, epochs - 1)
        fit_kwargs = dict(steps_per_epoch=spe, epochs=epochs, initial_epoch=initial_epoch)
    else:
        data = train_batches
        epochs = args.epochs or 20
        fit_kwargs = dict(epochs=epochs, initial_epoch=int(state.epoch.numpy()))
        if fit_kwargs["initial_epoch"] >= epochs:
            print(f"already trained {epochs} epochs", flush=True)
            return {"step": state.step}

    guard = cb.NonFiniteLossGuard(manager)
    metrics = cb.MetricsLogger(
        os.path.join(model_dir, run_dir.METRICS_FILE), state, args.log_every, chief
    )
    callbacks = [
        guard,
        cb.CheckpointEvery(manager, state, args.checkpoint_every, guard),
        metrics,
        keras.callbacks.TensorBoard(
            os.path.join(model_dir, run_dir.LOG_DIR), update_freq=args.log_every
        ),
    ]
    if args.train_steps is not None:
        callbacks.append(cb.StopAtStep(state, args.train_steps))
    if chief:
        callbacks.append(
            _bleu_callback(args, model, tokenizer, valid, best_manager, state, metrics)
        )
    verbose = args.verbose if args.verbose is not None else (1 if sys.stdout.isatty() else 2)
    history = model.fit(
        data,
        validation_data=valid_batches,
        callbacks=callbacks,
        verbose=verbose,
        shuffle=False,  # the pipeline shuffles (bounded buffer); Keras can't shuffle a Dataset
        **fit_kwargs,
    )
    guard.check()
    dropped = int(stats.too_long.numpy())
    if dropped:
        print(
            f"dropped {dropped} training pairs longer than --max-length {args.max_length}",
            flush=True,
        )
    last = {k: v[-1] for k, v in history.history.items()}
    last["step"] = state.step
    return last


def _bleu_callback(args, model, tokenizer, valid, best_manager, state, metrics):
    from keras_transformer.translator import Translator

    pairs = valid.dataset
    if args.eval_sentences:
        pairs = pairs.take(args.eval_sentences)
    sources, references = [], []
    for src, tgt in pairs.as_numpy_iterator():
        sources.append(src.decode("utf-8"))
        references.append(tgt.decode("utf-8"))
    translator = Translator(model, tokenizer, beam_size=args.eval_beam_size)
    return cb.BleuEvaluation(
        translator,
        sources,
        references,
        every=args.eval_every,
        best_manager=best_manager,
        state=state,
        metrics=metrics,
        log_dir=os.path.join(args.model_dir, run_dir.LOG_DIR),
        patience=args.patience,
    )


__all__ = ["TrainArgs", "run"]
