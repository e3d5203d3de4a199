"""Every check of the training flags, in one place: values no run can use (`validate`) and
flags a resumed run cannot change (`check_resume`). Each raises ConfigError naming the flag."""

from __future__ import annotations

import math

from keras_transformer.config import ConfigError
from keras_transformer.settings.args import (
    DEFAULT_SPM_MODEL_TYPE,
    FIXED_ON_RESUME,
    TrainArgs,
    option,
)
from keras_transformer.settings.corpora import Corpora, parse_corpora


def validate(args: TrainArgs) -> Corpora:
    """Raise ConfigError naming the flag for values no run can use; return the training
    corpora of the list flags (parsing them is checking them)."""
    check_values(args)
    corpora = parse_corpora(args)
    check_subword_alpha(args)
    check_init_and_ema(args)
    return corpora


def check_values(args: TrainArgs) -> None:
    """The numeric flags and the loss scale."""
    positive = ("cpu_devices", "worker_wait", "accum_steps", "max_length", "keep_checkpoints", "log_every",
                "eval_beam_size", "vocab_size", "batch_tokens", "tokens_per_replica", "epochs",
                "train_steps", "steps_per_epoch", "checkpoint_every", "eval_every", "warmup_steps")  # fmt: skip
    for name in positive:
        value = getattr(args, name)
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{option(name)} must be a positive integer, got {value!r}")
    for name in ("patience", "eval_sentences", "nonfinite_steps"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ConfigError(f"{option(name)} must be >= 0, got {value!r}")
    for name in ("dropout_rate", "label_smoothing"):
        value = getattr(args, name)
        if value is not None and not 0.0 <= value < 1.0:
            raise ConfigError(f"{option(name)} must be in [0, 1), got {value!r}")
    if args.micro_batch_memory is not None and not args.micro_batch_memory > 0:
        raise ConfigError(
            f"--micro-batch-memory must be a positive number of GiB, got {args.micro_batch_memory!r}"
        )
    if args.collective_timeout is not None and not args.collective_timeout > 0:
        raise ConfigError(
            f"--collective-timeout must be a positive number of seconds, got "
            f"{args.collective_timeout!r}"
        )
    if args.lr_scale is not None and not args.lr_scale > 0:
        raise ConfigError(f"--lr-scale must be positive, got {args.lr_scale!r}")
    if args.tokens_per_replica is not None and args.batch_tokens is not None:
        raise ConfigError("give --tokens-per-replica or --batch-tokens, not both")
    if args.epochs is not None and args.train_steps is not None:
        raise ConfigError("give --epochs or --train-steps, not both")
    if args.initial_loss_scale is not None:
        if not 1.0 <= args.initial_loss_scale < 2.0**100:
            raise ConfigError(
                f"--initial-loss-scale must be in [1, 2**100), got {args.initial_loss_scale!r}"
            )
        if args.precision != "mixed_float16":
            raise ConfigError(
                "--initial-loss-scale applies to --precision mixed_float16 only (the other "
                "precisions scale no loss): add --precision mixed_float16 or drop it"
            )


def check_init_and_ema(args: TrainArgs) -> None:
    """The fine-tuning (--init-*) and --ema-decay flags."""
    if args.ema_decay is not None and not 0.0 < args.ema_decay < 1.0:
        raise ConfigError(f"--ema-decay must be in (0, 1), e.g. 0.999, got {args.ema_decay!r}")
    for name in ("init_checkpoint", "init_average_last"):
        if getattr(args, name) is not None and args.init_from is None:
            raise ConfigError(f"{option(name)} needs --init-from RUN_DIR (the run to fine-tune)")
    if args.init_checkpoint is not None and args.init_average_last is not None:
        raise ConfigError("give --init-checkpoint or --init-average-last, not both")
    if args.init_average_last is not None and args.init_average_last < 1:
        raise ConfigError(
            f"--init-average-last must be a positive integer, got {args.init_average_last!r}"
        )


def check_subword_alpha(args: TrainArgs) -> None:
    alpha = args.subword_alpha
    if alpha is None:
        return
    if not math.isfinite(alpha) or alpha < 0:
        raise ConfigError(f"--subword-alpha must be >= 0, got {alpha!r}")
    if (args.spm_model_type or DEFAULT_SPM_MODEL_TYPE) == "bpe" and alpha >= 1:
        raise ConfigError(
            f"--subword-alpha {alpha} is a BPE-dropout probability for --spm-model-type bpe: "
            "give a value in [0, 1)"
        )


def check_resume(args: TrainArgs, saved: dict, config_path: str) -> None:
    """A resumed run keeps its model, schedule and data order: refuse a flag that differs
    (`flag(fixed_on_resume=True)`) from its value in `saved` (the settings config.json
    records)."""
    for name in FIXED_ON_RESUME:
        given = getattr(args, name)
        if name in saved and given is not None and given != saved[name]:
            raise ConfigError(
                f"{option(name)} {given} differs from {saved[name]} in {config_path}: a resumed "
                "run keeps its configuration (use a new --model-dir to change it)"
            )


__all__ = ["FIXED_ON_RESUME", "check_resume", "validate"]
