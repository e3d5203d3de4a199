"""`TrainArgs`: every train.py flag, defined once, and how unset ones are resolved into a
run's `TrainSettings`.

Priority, as in OpenNMT-tf's `--auto_config`: built-in defaults < automatic values (from the
preset and the corpus size) < what the user sets. A field left at `None` is "automatic";
`resolve` fills it in. `train.py` builds its command line from these fields, and
`config.json` stores the resolved values, so a resumed run keeps them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from keras_transformer.config import BEAM_SIZE, PRESETS, ConfigError
from keras_transformer.training.corpora import training_corpora

# The choices of --strategy and --precision (training.strategy implements them).
STRATEGIES = ("default", "one_device", "mirrored", "multi_worker", "tpu")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# How long a non-chief worker waits for the chief's tokenizer and config.json: the chief
# trains SentencePiece on up to 2M sentences and counts batches first (WMT14: tens of minutes).
WORKER_WAIT_SECONDS = 4 * 3600

# Keras' LossScaleOptimizer default: the loss scale of a new mixed_float16 run.
INITIAL_LOSS_SCALE = 2.0**15

# The automatic micro-batch bound: the GiB one replica's training step on one micro-batch may
# keep (a quarter of a 16 GB GPU such as the paper's P100s, whose 8 shared its 25000-token
# update; the rest is left to the weights, Adam's moments, the summed gradients and TF).
MICRO_BATCH_MEMORY_GIB = 4.0
# The recipe's padded tokens per update (all replicas), large and small corpus.
PAPER_UPDATE_TOKENS, SMALL_UPDATE_TOKENS = 25000, 4096

# A corpus with at least this many pairs gets the paper's recipe (WMT14: 4.5M pairs).
LARGE_CORPUS = 1_000_000
SMALL_CORPUS_EPOCHS = 20
# The model flags' values when neither the user nor a fine-tuned run (--init-from) sets them.
DEFAULT_PRESET = "small"
DEFAULT_SPM_MODEL_TYPE = "bpe"


def flag(default: Any = None, help: str = "", choices=None, auto: str = "") -> Any:  # noqa: A002
    meta = {"help": help + (f" (default: {auto})" if auto else ""), "choices": choices}
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass
class TrainArgs:
    """The flags of train.py (DESIGN.md section 8); `None` means "resolved automatically"."""

    model_dir: str = flag("runs/multi30k-en-de", "checkpoints, tokenizer, config.json, logs")
    preset: str | None = flag(
        None, "model size (paper Table 3: base, big)", tuple(PRESETS), auto=DEFAULT_PRESET
    )
    src_lang: str = flag("en", "source language")
    tgt_lang: str = flag("de", "target language")
    dataset: str = flag(
        "multi30k",
        "multi30k | files | tfds:NAME (e.g. tfds:wmt14_translate/de-en); a comma-separated "
        "list mixes several training corpora (validation: the first's)",
    )
    train_src: str | None = flag(None, "training source file(s), comma-separated (--dataset files)")
    train_tgt: str | None = flag(None, "training target file(s), comma-separated (--dataset files)")
    train_weights: str | None = flag(
        None, "sampling weights of the training corpora, comma-separated", auto="their sizes"
    )
    tag_corpus: str | None = flag(
        None, "1-based indices of training corpora whose sources get the <BT> tag, e.g. 2"
    )
    subword_alpha: float | None = flag(
        None,
        "subword regularization of training sentences: BPE-dropout probability (bpe), "
        "sampling smoothness over the n-best segmentations (unigram)",
        auto="0: off",
    )
    valid_src: str | None = flag(None, "validation source file (--dataset files)")
    valid_tgt: str | None = flag(None, "validation target file (--dataset files)")
    data_dir: str | None = flag(
        None, "local data: Multi30k files or a TFDS data_dir (env KT_DATA_DIR)"
    )
    tfds_download: bool = flag(
        False, "let TFDS download and prepare a --dataset tfds:NAME missing from --data-dir"
    )
    strategy: str = flag("default", "distribution strategy", STRATEGIES)
    worker_wait: int = flag(
        WORKER_WAIT_SECONDS, "seconds a non-chief worker waits for the chief's config.json"
    )
    cpu_devices: int = flag(
        1, "split the CPU into N logical devices (multi-device paths without GPUs)"
    )
    precision: str | None = flag(None, "dtype policy", PRECISIONS, auto="float32")
    initial_loss_scale: float | None = flag(
        None,
        "float16 loss scale at step 0 (halved at every overflow, doubled after 2000 finite "
        "steps; a resumed run continues from the saved scale)",
        auto=f"{INITIAL_LOSS_SCALE:g}, Keras' default, with mixed_float16",
    )
    vocab_size: int | None = flag(
        None, "joint SentencePiece vocabulary", auto="8000; 37000 for a large corpus"
    )
    spm_model_type: str | None = flag(
        None, "SentencePiece model type", ("bpe", "unigram"), auto=DEFAULT_SPM_MODEL_TYPE
    )
    batch_tokens: int | None = flag(
        None,
        "padded tokens per micro-batch, all replicas (an update is --accum-steps of them)",
        auto="the recipe's tokens per update (4096; 25000 for a large corpus) split into "
        "--accum-steps micro-batches",
    )
    accum_steps: int | None = flag(
        None,
        "micro-batches per update (the same update as one k-times larger batch)",
        auto="the fewest that divide the recipe's update into micro-batches within "
        "--micro-batch-memory; 1 when --batch-tokens is given",
    )
    micro_batch_memory: float | None = flag(
        None,
        "GiB per replica that one micro-batch's training step may keep (estimated from the "
        "vocabulary, the preset and --max-length); bounds the automatic --accum-steps",
        auto=f"{MICRO_BATCH_MEMORY_GIB:g}",
    )
    max_length: int = flag(128, "longest source or target in tokens; longer pairs are dropped")
    epochs: int | None = flag(None, "train for N epochs (sets --train-steps)")
    train_steps: int | None = flag(
        None,
        "optimizer updates",
        auto=f"{SMALL_CORPUS_EPOCHS} epochs (counted without --subword-alpha's sampling); "
        "100000 (big: 300000) for a large corpus",
    )
    steps_per_epoch: int | None = flag(
        None, "batches per epoch; each epoch reshuffles", auto="one pass over the corpus"
    )
    checkpoint_every: int | None = flag(
        None, "save every N steps", auto="train steps / 70, at least 100"
    )
    keep_checkpoints: int = flag(5, "checkpoints kept in checkpoints/")
    eval_every: int | None = flag(None, "validation BLEU every N steps", auto="train steps / 10")
    eval_sentences: int | None = flag(None, "validation sentences for BLEU (0: all)", auto="500")
    eval_beam_size: int = flag(BEAM_SIZE, "beam size of the validation BLEU")
    patience: int = flag(0, "early stop after N BLEU evaluations without gain (0: never)")
    log_every: int = flag(100, "metrics.jsonl and TensorBoard every N steps")
    warmup_steps: int | None = flag(
        None,
        "learning-rate warmup",
        auto="4000; 0.4 x train steps (at most 4000) for a small corpus",
    )
    lr_scale: float | None = flag(
        None, "multiplies the paper's schedule", auto="1.0; 0.8 for a small corpus"
    )
    dropout_rate: float | None = flag(
        None, "residual dropout", auto="the preset's; at least 0.2 for a small corpus"
    )
    label_smoothing: float | None = flag(None, "epsilon_ls", auto="0.1")
    jit_compile: bool = flag(False, "XLA (measure first: slower on CPU)")
    # -- fine-tuning and weight averaging (training.fine_tune, training.ema) --
    init_from: str | None = flag(
        None,
        "fine-tune: a run directory whose model configuration, SentencePiece model and "
        "weights (its best/) this new run starts from; optimizer, step and schedule are new",
    )
    init_checkpoint: str | None = flag(
        None, "with --init-from: the weights of this checkpoint instead of best/"
    )
    init_average_last: int | None = flag(
        None, "with --init-from: the mean of its last K checkpoints instead of best/"
    )
    ema_decay: float | None = flag(
        None,
        "keep an exponential moving average of the weights with this decay (e.g. 0.999); "
        "validation BLEU, best/ and export use it",
        auto="off",
    )
    seed: int = flag(0, "seed of the weights, the data order and dropout")
    verbose: int | None = flag(
        None, "Keras fit verbosity", (0, 1, 2), auto="1 on a terminal, else 2"
    )
    # -- clusters and devices (training.strategy, training.preemption) --
    collective_timeout: float | None = flag(
        None,
        "--strategy multi_worker: seconds a collective may wait for a peer before the job "
        "fails with DeadlineExceededError instead of hanging (TensorFlow starts a watch "
        "thread per collective for it)",
        auto="no timeout",
    )
    gpu_memory_growth: bool = flag(
        False, "allocate GPU memory as needed instead of all of it at start (shared GPUs)"
    )
    deterministic: bool = flag(
        False,
        "op determinism on GPUs (tf.config.experimental.enable_op_determinism) and no "
        "TensorFloat-32 matmuls: the same command gives the same weights on the same GPUs; "
        "slower (CPU training is deterministic without it)",
    )


@dataclasses.dataclass
class TrainSettings(TrainArgs):
    """A run's resolved settings (config.json "training"): the flags with every automatic
    value filled in (`resolve`, or read back on a resume)."""


# Flags that a resumed run cannot change: they define the model, its schedule or the data order.
FIXED_ON_RESUME = (
    "preset", "src_lang", "tgt_lang", "dataset", "vocab_size", "spm_model_type", "max_length",
    "precision", "initial_loss_scale",
    "warmup_steps", "lr_scale", "dropout_rate", "label_smoothing", "steps_per_epoch", "seed",
    "batch_tokens", "accum_steps",
    "train_weights", "tag_corpus", "subword_alpha",
    "init_from", "init_checkpoint", "init_average_last", "ema_decay",
)  # fmt: skip


def option(name: str) -> str:
    return "--" + name.replace("_", "-")


def validate(args: TrainArgs) -> None:
    """Raise ConfigError naming the flag for values no run can use."""
    positive = ("cpu_devices", "worker_wait", "accum_steps", "max_length", "keep_checkpoints", "log_every",
                "eval_beam_size", "vocab_size", "batch_tokens", "epochs", "train_steps",
                "steps_per_epoch", "checkpoint_every", "eval_every", "warmup_steps")  # fmt: skip
    for name in positive:
        value = getattr(args, name)
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{option(name)} must be a positive integer, got {value!r}")
    for name in ("patience", "eval_sentences"):
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
    training_corpora(args)
    check_subword_alpha(args)
    validate_init_and_ema(args)


def validate_init_and_ema(args: TrainArgs) -> None:
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


def check_resume(args: TrainArgs, saved: dict, config_path: str) -> None:
    """A resumed run keeps its model, schedule and data order: refuse a flag that differs."""
    for name in FIXED_ON_RESUME:
        given = getattr(args, name)
        if name in saved and given is not None and given != saved[name]:
            raise ConfigError(
                f"{option(name)} {given} differs from {saved[name]} in {config_path}: a resumed "
                "run keeps its configuration (use a new --model-dir to change it)"
            )


def resolve(
    args: TrainArgs, *, num_pairs: int | None, batches_per_pass, replicas: int = 1
) -> TrainSettings:
    """Fill every automatic field from the preset and the corpus size.

    A corpus of `LARGE_CORPUS` pairs or more (or of unknown size, as TFDS datasets are
    until read) gets the paper's recipe: vocabulary 37000, 25000-token batches, warmup
    4000, learning rate x1, the preset's dropout, 100k steps (big: 300k). A smaller corpus
    (Multi30k: 29k pairs) gets the recipe measured in the README's quality table: 8000
    pieces, 4096-token batches, dropout at least 0.2, learning rate x0.8, 20 epochs with
    40% of them warming up. With --subword-alpha the 20 epochs are counted at the
    deterministic segmentation: the same updates (and time) as without, fewer passes over
    the longer sampled sentences. An update too large for `--micro-batch-memory` on each of the
    `replicas` is accumulated from micro-batches (`split_update`).
    `batches_per_pass(vocab_size, update_tokens, sampled=True)` counts (or estimates) the
    batches of one pass over the corpus (`sampled=False`: at the deterministic
    segmentation); it is only called when needed.
    """
    large = num_pairs is None or num_pairs >= LARGE_CORPUS
    out = TrainSettings(**dataclasses.asdict(args))
    out.preset = args.preset or DEFAULT_PRESET
    out.spm_model_type = args.spm_model_type or DEFAULT_SPM_MODEL_TYPE
    out.vocab_size = args.vocab_size or (37000 if large else 8000)
    split_update(out, PAPER_UPDATE_TOKENS if large else SMALL_UPDATE_TOKENS, replicas)
    _resolve_schedule(out, args, large, batches_per_pass)
    if out.lr_scale is None:
        out.lr_scale = 1.0 if large else 0.8
    preset_dropout = PRESETS[out.preset]["dropout_rate"]
    if out.dropout_rate is None:
        out.dropout_rate = preset_dropout if large else max(preset_dropout, 0.2)
    if out.label_smoothing is None:
        out.label_smoothing = 0.1
    if out.precision is None:
        out.precision = "float32"
    if out.initial_loss_scale is None and out.precision == "mixed_float16":
        out.initial_loss_scale = INITIAL_LOSS_SCALE
    if out.eval_sentences is None:
        out.eval_sentences = 500
    if out.subword_alpha is None:
        out.subword_alpha = 0.0
    return out


def _resolve_schedule(out: TrainSettings, args: TrainArgs, large: bool, batches_per_pass) -> None:
    """The steps: epoch, updates, warmup, checkpoint and validation cadence (`resolve`)."""
    update_tokens = out.batch_tokens * out.accum_steps
    if out.steps_per_epoch is None:
        out.steps_per_epoch = max(1, batches_per_pass(out.vocab_size, update_tokens))
    if args.epochs is not None:
        out.train_steps = args.epochs * out.steps_per_epoch
    elif out.train_steps is None and large:
        out.train_steps = 300_000 if out.preset == "big" else 100_000
    elif out.train_steps is None:
        # 20 passes at the deterministic segmentation: sampled segmentations
        # (--subword-alpha) are longer, so they make fewer passes in the same updates
        budget_pass = out.steps_per_epoch
        if args.subword_alpha and args.steps_per_epoch is None:
            budget_pass = max(1, batches_per_pass(out.vocab_size, update_tokens, sampled=False))
        out.train_steps = SMALL_CORPUS_EPOCHS * budget_pass
    out.epochs = None
    if out.warmup_steps is None:
        out.warmup_steps = (
            4000 if large else min(4000, max(100, int(round(0.4 * out.train_steps, -2))))
        )
    if out.checkpoint_every is None:
        out.checkpoint_every = max(100, int(round(out.train_steps / 70, -2)))
    if out.eval_every is None:
        out.eval_every = max(out.steps_per_epoch, int(math.ceil(out.train_steps / 10)))


def step_floats_per_token(preset: str, vocab_size: int, max_length: int) -> int:
    """Estimated float32 values that a training step keeps (for its backward pass) per padded
    token of a micro-batch, i.e. per source and target position: 4 vocabulary-sized rows
    (logits, smoothed targets, softmax, the logits' gradient) and, per layer, the encoder's
    and the decoder's activations: 32 d_model-sized rows, 6 d_ff-sized rows and 9
    heads x max_length attention rows (scores, softmax, dropout of the three attentions).
    """
    p = PRESETS[preset]
    attention = p["num_heads"] * max_length
    per_layer = 32 * p["d_model"] + 6 * p["d_ff"] + 9 * attention
    return 4 * vocab_size + p["num_layers"] * per_layer


def split_update(out: TrainSettings, update_tokens: int, replicas: int) -> None:
    """Set `out.batch_tokens` (micro-batch) and `out.accum_steps` from the recipe's
    `update_tokens` per update. User values win: --batch-tokens alone is one micro-batch per
    update; --accum-steps k alone splits the recipe's update into k. With neither, k is the
    fewest micro-batches that divide the update exactly and keep each replica's share under
    --micro-batch-memory GiB (`step_floats_per_token`), so the update stays the recipe's.
    """
    if out.micro_batch_memory is None:
        out.micro_batch_memory = MICRO_BATCH_MEMORY_GIB
    if out.batch_tokens is not None:
        out.accum_steps = out.accum_steps or 1
        return
    if out.accum_steps is None:
        floats = step_floats_per_token(out.preset, out.vocab_size, out.max_length)
        fits = max(1, int(out.micro_batch_memory * 2**30 // (4 * floats))) * replicas
        out.accum_steps = math.ceil(update_tokens / fits)
        while update_tokens % out.accum_steps:
            out.accum_steps += 1
    out.batch_tokens = math.ceil(update_tokens / out.accum_steps)


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


def describe(args: TrainSettings, given: TrainArgs) -> str:
    """The resolved settings, one line each, marking those that were resolved automatically."""
    lines = []
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        auto = getattr(given, field.name) is None and value is not None
        lines.append(f"  {option(field.name):20} {value}{'  (auto)' if auto else ''}")
    return "\n".join(lines)


__all__ = [
    "ConfigError",
    "TrainArgs",
    "TrainSettings",
    "check_resume",
    "describe",
    "resolve",
    "split_update",
    "step_floats_per_token",
    "validate",
]
