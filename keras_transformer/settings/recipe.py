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
    COUNTED,
    DEFAULT_PRESET,
    DEFAULT_SPM_MODEL_TYPE,
    INITIAL_LOSS_SCALE,
    TrainArgs,
    TrainSettings,
)
from keras_transformer.settings.memory import micro_batch_memory_gib, micro_batches

# The recipe's padded tokens per update (all replicas), large and small corpus.
PAPER_UPDATE_TOKENS, SMALL_UPDATE_TOKENS = 25000, 4096

# A corpus with at least this many pairs gets the paper's recipe (WMT14: 4.5M pairs).
LARGE_CORPUS = 1_000_000
SMALL_CORPUS_EPOCHS = 20


def resolve(
    args: TrainArgs, *, num_pairs: int | None, batches_per_pass=None, replicas: int = 1
) -> TrainSettings:
    """The two phases in one call (a dry run, the tests): `sizes`, then `schedule` from
    `batches_per_pass(vocab_size, update_tokens, sampled=True)`, which counts (or estimates)
    the batches of one pass and is called only for the counts `counts_needed` names. None
    leaves the settings counted in batches (`COUNTED`) at None when the user did not set
    them."""
    sized = sizes(args, num_pairs=num_pairs, replicas=replicas)
    counts = {}
    if batches_per_pass is not None:
        for name in sized.counts:
            extra = {} if name == "sampled" else {"sampled": False}
            vocab_size = sized.settings.vocab_size
            counts[name] = batches_per_pass(vocab_size, sized.update_tokens, **extra)
    return schedule(sized, args, num_pairs=num_pairs, **counts)


def is_large(num_pairs: int | None) -> bool:
    """The paper's recipe: a corpus of `LARGE_CORPUS` pairs or more, or of unknown size (as
    TFDS datasets are until read)."""
    return num_pairs is None or num_pairs >= LARGE_CORPUS


@dataclasses.dataclass(frozen=True)
class Sized:
    """Phase 1's result (`sizes`): the settings, those counted in batches (`COUNTED`) still
    None unless given; the passes phase 2 (`schedule`) needs counted in batches of an update
    of `update_tokens` (`counts_needed`): "sampled" at training's segmentation, "plain" at
    the deterministic one."""

    settings: TrainSettings
    counts: tuple[str, ...]
    update_tokens: int


def sizes(args: TrainArgs, *, num_pairs: int | None, replicas: int = 1) -> Sized:
    """Phase 1: every automatic setting but those counted in batches (`COUNTED`), from the
    preset and the corpus size, and the passes to count for phase 2.

    A large corpus (`is_large`) gets the paper's recipe: vocabulary 37000, 25000-token
    batches, learning rate x1, the preset's dropout. A smaller corpus (Multi30k: 29k pairs)
    gets the recipe measured in the README's quality table: 8000 pieces, 4096-token batches,
    dropout at least 0.2, learning rate x0.8. An update too large for `--micro-batch-memory`
    on each of the `replicas` is accumulated from micro-batches (`split_update`).
    """
    large = is_large(num_pairs)
    out = dataclasses.asdict(args)
    out["preset"] = args.preset or DEFAULT_PRESET
    out["spm_model_type"] = args.spm_model_type or DEFAULT_SPM_MODEL_TYPE
    out["cpu_devices"] = args.cpu_devices or 1
    out["vocab_size"] = args.vocab_size or (37000 if large else 8000)
    out.update(split_update(out, PAPER_UPDATE_TOKENS if large else SMALL_UPDATE_TOKENS, replicas))
    preset_dropout = PRESETS[out["preset"]]["dropout_rate"]
    automatic = {
        "lr_scale": 1.0 if large else 0.8,
        "dropout_rate": preset_dropout if large else max(preset_dropout, 0.2),
        "label_smoothing": 0.1,
        "precision": "float32",
        "eval_sentences": 500,
        "subword_alpha": 0.0,
    }
    out.update({k: v for k, v in automatic.items() if out[k] is None})
    if out["initial_loss_scale"] is None and out["precision"] == "mixed_float16":
        out["initial_loss_scale"] = INITIAL_LOSS_SCALE
    sized = TrainSettings(**out)
    update_tokens = sized.batch_tokens * sized.accum_steps
    return Sized(sized, counts_needed(sized, args, num_pairs), update_tokens)


def counts_needed(sized: TrainSettings, args: TrainArgs, num_pairs: int | None) -> tuple:
    """The passes `schedule` needs counted, in batches of an update: "sampled" at training's
    segmentation (unless --steps-per-epoch is given), "plain" at the deterministic one too
    (--subword-alpha on a small corpus whose length is the recipe's 20 passes)."""
    if sized.steps_per_epoch is not None:
        return ()
    plain = bool(args.subword_alpha) and args.epochs is None and sized.train_steps is None
    return ("sampled", "plain") if plain and not is_large(num_pairs) else ("sampled",)


def schedule(
    sized: Sized,
    args: TrainArgs,
    *,
    num_pairs: int | None,
    sampled: int | None = None,
    plain: int | None = None,
) -> TrainSettings:
    """Phase 2: the steps (epoch, updates, warmup, checkpoint and validation cadence) from
    the counted batches of a pass: `sampled` at training's segmentation, `plain` at the
    deterministic one (`counts_needed`). A small corpus trains 20 epochs counted at the
    deterministic segmentation (sampled segmentations, --subword-alpha, are longer: the same
    updates and time, fewer passes), with 40% of them warming up; a large one 100k steps
    (big: 300k) with warmup 4000. A count of None (a dry run: no tokenizer to count with)
    leaves what depends on it at None (`COUNTED`)."""
    large = is_large(num_pairs)
    out = dataclasses.asdict(sized.settings)
    if out["steps_per_epoch"] is None and sampled is not None:
        out["steps_per_epoch"] = max(1, sampled)
    spe = out["steps_per_epoch"]
    if args.epochs is not None:
        out["train_steps"] = args.epochs * spe if spe else None
    elif out["train_steps"] is None and large:
        out["train_steps"] = 300_000 if out["preset"] == "big" else 100_000
    elif out["train_steps"] is None:
        budget_pass = max(1, plain) if plain is not None else spe
        out["train_steps"] = SMALL_CORPUS_EPOCHS * budget_pass if budget_pass else None
    if out["train_steps"] is not None:  # else a dry run: the rest follows from the count
        out.update(intervals(out, args, large))
    return TrainSettings(**out)


def intervals(out: dict, args: TrainArgs, large: bool) -> dict:
    """The epoch length, warmup, checkpoint and validation cadence of `out["train_steps"]`.

    A run shorter than one pass is one epoch of its own length (validation and the progress
    bar end where the run does; the data stream is the same). A checkpoint and a BLEU
    evaluation at least once in the run: from 500 updates on (small corpus; 8,000 large) the
    cap never binds, so longer runs (the default recipe among them) resolve as before. Warmup
    is not capped by the run's length: it shapes the weights, and a run stopped early and
    resumed to more steps must train as the longer run does (test_ema's resume), so it keeps
    its floor of 100 (or --warmup-steps)."""
    steps, spe = out["train_steps"], out["steps_per_epoch"]
    got = {"epochs": None}
    if args.steps_per_epoch is None and spe and spe > steps:
        got["steps_per_epoch"] = spe = steps
    if out["warmup_steps"] is None:
        small = min(4000, max(100, int(round(0.4 * steps, -2))))
        got["warmup_steps"] = 4000 if large else small
    if out["checkpoint_every"] is None:
        got["checkpoint_every"] = min(steps, max(100, int(round(steps / 70, -2))))
    if out["eval_every"] is None and spe:
        got["eval_every"] = min(steps, max(spe, int(math.ceil(steps / 10))))
    return got


# Fine-tuning (--init-from): the source's weights are trained already, so the schedule adapts
# them instead of training from scratch. A short warmup, 5% of the updates (rounded to
# hundreds, 100 to 1000: fixed for short runs, as the recipe's, so a resumed run trains as
# the longer run does), to a peak learning rate of FINE_TUNE_PEAK_LR, a third of OPUS-MT's
# training rate (Marian's --learn-rate 0.0003), decaying as the paper's schedule after it.
FINE_TUNE_PEAK_LR = 1e-4


def fine_tune_schedule(settings: TrainSettings, args: TrainArgs, d_model: int) -> TrainSettings:
    """The fine-tuning schedule of a run started from trained weights (`--init-from`), for
    a model of width `d_model`: `settings` with `warmup_steps` and `lr_scale` replaced where
    the user set neither (the paper's schedule peaks at lr_scale / sqrt(d_model x warmup)).
    A dry run with no count of batches (train_steps None) is returned as it is."""
    if settings.train_steps is None:
        return settings
    warmup = settings.warmup_steps
    if args.warmup_steps is None:
        warmup = min(1000, max(100, int(round(0.05 * settings.train_steps, -2))))
    lr_scale = settings.lr_scale
    if args.lr_scale is None:
        lr_scale = round(FINE_TUNE_PEAK_LR * math.sqrt(d_model * warmup), 6)
    return dataclasses.replace(settings, warmup_steps=warmup, lr_scale=lr_scale)


def split_update(out: dict, update_tokens: int, replicas: int) -> dict:
    """`batch_tokens` (micro-batch), `accum_steps` and `micro_batch_memory` from the recipe's
    `update_tokens` per update and the settings `out`. User values win: --batch-tokens alone
    is one micro-batch per update; --accum-steps k alone splits the recipe's update into k.
    With neither, k is the fewest micro-batches that divide the update exactly and keep each
    replica's share under --micro-batch-memory GiB (`settings.memory`), so the update stays
    the recipe's.
    """
    memory = out["micro_batch_memory"]
    if memory is None:
        memory = micro_batch_memory_gib()
    got = {"micro_batch_memory": memory, "batch_tokens": out["batch_tokens"]}
    if out["tokens_per_replica"] is not None:  # fairseq's --max-tokens: a per-replica budget
        got["batch_tokens"] = out["tokens_per_replica"] * replicas
    if got["batch_tokens"] is not None:
        return {**got, "accum_steps": out["accum_steps"] or 1}
    accum = out["accum_steps"]
    if accum is None:
        accum = micro_batches(
            update_tokens, replicas, memory,
            out["preset"], out["vocab_size"], out["max_length"], out["precision"],
        )  # fmt: skip
    return {**got, "accum_steps": accum, "batch_tokens": math.ceil(update_tokens / accum)}


__all__ = [
    "COUNTED",
    "FINE_TUNE_PEAK_LR",
    "LARGE_CORPUS",
    "Sized",
    "counts_needed",
    "is_large",
    "schedule",
    "sizes",
    "fine_tune_schedule",
    "resolve",
    "split_update",
]
