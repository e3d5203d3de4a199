"""The automatic recipe: how the flags left unset (`None`) are resolved into a run's
`TrainSettings`, from the preset and the corpus size.

Priority, as in OpenNMT-tf's `--auto_config`: built-in defaults < automatic values (this
module) < what the user sets. `config.json` stores the resolved values, so a resumed run keeps
them.
"""

from __future__ import annotations

import dataclasses
import math

from keras_transformer.config import PRESETS
from keras_transformer.settings.args import (
    DEFAULT_PRESET,
    DEFAULT_SPM_MODEL_TYPE,
    INITIAL_LOSS_SCALE,
    TrainArgs,
    TrainSettings,
)
from keras_transformer.settings.memory import (
    fewest_micro_batches,
    micro_batch_memory_gib,
    tokens_that_fit,
)

# The recipe's padded tokens per update (all replicas), large and small corpus.
PAPER_UPDATE_TOKENS, SMALL_UPDATE_TOKENS = 25000, 4096

# A corpus with at least this many pairs gets the paper's recipe (WMT14: 4.5M pairs).
LARGE_CORPUS = 1_000_000
SMALL_CORPUS_EPOCHS = 20
# The settings counted in batches of the corpus: a dry run, which trains no tokenizer to count
# with, leaves those the user did not set unresolved (None).
COUNTED = ("steps_per_epoch", "train_steps", "warmup_steps", "checkpoint_every", "eval_every")


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
    segmentation); it is only called when needed. None (a dry run) leaves the settings
    counted in batches (`COUNTED`) at None when the user did not set them.
    """
    large = num_pairs is None or num_pairs >= LARGE_CORPUS
    out = TrainSettings(**dataclasses.asdict(args))
    out.preset = args.preset or DEFAULT_PRESET
    out.spm_model_type = args.spm_model_type or DEFAULT_SPM_MODEL_TYPE
    out.cpu_devices = args.cpu_devices or 1
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
    """The steps: epoch, updates, warmup, checkpoint and validation cadence (`resolve`).

    `batches_per_pass` None (a dry run: no tokenizer to count with) leaves what depends on
    the count of batches at None (`COUNTED`)."""
    update_tokens = out.batch_tokens * out.accum_steps
    if out.steps_per_epoch is None and batches_per_pass is not None:
        out.steps_per_epoch = max(1, batches_per_pass(out.vocab_size, update_tokens))
    spe = out.steps_per_epoch
    if args.epochs is not None:
        out.train_steps = args.epochs * spe if spe else None
    elif out.train_steps is None and large:
        out.train_steps = 300_000 if out.preset == "big" else 100_000
    elif out.train_steps is None:
        # 20 passes at the deterministic segmentation: sampled segmentations
        # (--subword-alpha) are longer, so they make fewer passes in the same updates
        budget_pass = spe
        if args.subword_alpha and args.steps_per_epoch is None and batches_per_pass:
            budget_pass = max(1, batches_per_pass(out.vocab_size, update_tokens, sampled=False))
        out.train_steps = SMALL_CORPUS_EPOCHS * budget_pass if budget_pass else None
    if out.train_steps is None:  # a dry run: the rest follows from the count
        return
    out.epochs = None
    steps = out.train_steps
    # a run shorter than one pass is one epoch of its own length (validation and the
    # progress bar end where the run does); the data stream is the same
    if args.steps_per_epoch is None and spe and spe > steps:
        out.steps_per_epoch = spe = steps
    # A checkpoint and a BLEU evaluation at least once in the run. From 500 updates on (small
    # corpus; 8,000 large) the cap never binds, so longer runs (the default recipe among
    # them) resolve as before. Warmup is not capped by the run's length: it shapes the
    # weights, and a run stopped early and resumed to more steps must train as the longer
    # run does (test_ema's resume), so it keeps its floor of 100 (or --warmup-steps).
    if out.warmup_steps is None:
        out.warmup_steps = 4000 if large else min(4000, max(100, int(round(0.4 * steps, -2))))
    if out.checkpoint_every is None:
        out.checkpoint_every = min(steps, max(100, int(round(steps / 70, -2))))
    if out.eval_every is None and spe:
        out.eval_every = min(steps, max(spe, int(math.ceil(steps / 10))))


# Fine-tuning (--init-from): the source's weights are trained already, so the schedule adapts
# them instead of training from scratch. A short warmup, 5% of the updates (rounded to
# hundreds, 100 to 1000: fixed for short runs, as the recipe's, so a resumed run trains as
# the longer run does), to a peak learning rate of FINE_TUNE_PEAK_LR, a third of OPUS-MT's
# training rate (Marian's --learn-rate 0.0003), decaying as the paper's schedule after it.
FINE_TUNE_PEAK_LR = 1e-4


def fine_tune_schedule(out: TrainSettings, args: TrainArgs, d_model: int) -> None:
    """The fine-tuning schedule of a run started from trained weights (`--init-from`), for
    a model of width `d_model`: `out.warmup_steps` and `out.lr_scale` where the user set
    neither (the paper's schedule peaks at lr_scale / sqrt(d_model x warmup)). A dry run
    with no count of batches (train_steps None) is left as it is."""
    if out.train_steps is None:
        return
    if args.warmup_steps is None:
        out.warmup_steps = min(1000, max(100, int(round(0.05 * out.train_steps, -2))))
    if args.lr_scale is None:
        out.lr_scale = round(FINE_TUNE_PEAK_LR * math.sqrt(d_model * out.warmup_steps), 6)


def split_update(out: TrainSettings, update_tokens: int, replicas: int) -> None:
    """Set `out.batch_tokens` (micro-batch) and `out.accum_steps` from the recipe's
    `update_tokens` per update. User values win: --batch-tokens alone is one micro-batch per
    update; --accum-steps k alone splits the recipe's update into k. With neither, k is the
    fewest micro-batches that divide the update exactly and keep each replica's share under
    --micro-batch-memory GiB (`settings.memory`), so the update stays the recipe's.
    """
    if out.micro_batch_memory is None:
        out.micro_batch_memory = micro_batch_memory_gib()
    if out.tokens_per_replica is not None:  # fairseq's --max-tokens: a per-replica budget
        out.batch_tokens = out.tokens_per_replica * replicas
    if out.batch_tokens is not None:
        out.accum_steps = out.accum_steps or 1
        return
    if out.accum_steps is None:
        fits = tokens_that_fit(
            out.micro_batch_memory, out.preset, out.vocab_size, out.max_length, out.precision
        )
        out.accum_steps = fewest_micro_batches(update_tokens, fits * replicas)
    out.batch_tokens = math.ceil(update_tokens / out.accum_steps)


# Below this many padded tokens per replica and micro-batch a GPU waits more than it computes:
# a step's matmuls have one row per token (a few thousand fill a V100/A100's tensor cores;
# fairseq's WMT recipes use 3584-4096 per GPU), while its fixed costs, the gradient all-reduce
# (about 260 MB for base, 850 MB for big) and the step's launches, do not shrink with it.
TOKENS_PER_REPLICA_FLOOR = 2048


def replica_tokens(settings: TrainSettings, replicas: int) -> tuple[str, str | None]:
    """(the plan's tokens-per-replica line, a warning below `TOKENS_PER_REPLICA_FLOOR` or
    None): what one replica computes per micro-batch and per update."""
    micro = settings.batch_tokens // max(1, replicas)
    update = settings.batch_tokens * settings.accum_steps
    line = (
        f"tokens per replica: {micro} per micro-batch, {micro * settings.accum_steps} per "
        f"update ({update} tokens per update = {replicas} replica{'s' * (replicas > 1)} x "
        f"{settings.accum_steps} micro-batch{'es' * (settings.accum_steps > 1)} x {micro})"
    )
    warning = None
    if micro < TOKENS_PER_REPLICA_FLOOR:
        warning = (
            f"{micro} tokens per replica and micro-batch is below {TOKENS_PER_REPLICA_FLOOR}: "
            "a GPU would mostly wait on the all-reduce; give --tokens-per-replica (and fewer "
            "--accum-steps) to keep each replica busy (docs/gpu.md)"
        )
    return line, warning


__all__ = [
    "COUNTED",
    "FINE_TUNE_PEAK_LR",
    "LARGE_CORPUS",
    "TOKENS_PER_REPLICA_FLOOR",
    "fine_tune_schedule",
    "replica_tokens",
    "resolve",
    "split_update",
]
