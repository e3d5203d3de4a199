"""`TrainArgs`: every kt-train flag, defined once (the flag schema).

A field left at `None` is "automatic": `settings.recipe.resolve` fills it in from the preset
and the corpus size. `kt-train` builds its command line from these fields (`flag`'s help,
choices and automatic value), `--config FILE` reads the same names, and `config.json` stores
the resolved values (`TrainSettings`), so a resumed run keeps them. The checks of the values
are in `settings.validation`.
"""

from __future__ import annotations

import dataclasses

from keras_transformer.config import BEAM_SIZE, PRESETS, ConfigError
from keras_transformer.files import DATA_DIR_ENV
from keras_transformer.settings.flags import (
    alternatives,
    argument,
    default_text,
    describe,
    flag,
    flags_with,
    frozen_copy,
    option,
)
from keras_transformer.settings.memory import MICRO_BATCH_MEMORY_GIB

# The choices of --strategy and --precision (training.strategy implements them).
STRATEGIES = ("default", "one_device", "mirrored", "multi_worker", "tpu")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# How long a non-chief worker waits for the chief's tokenizer and config.json: the chief
# trains SentencePiece on up to 2M sentences and counts batches first (WMT14: tens of minutes).
WORKER_WAIT_SECONDS = 4 * 3600

# Keras' LossScaleOptimizer default: the loss scale of a new mixed_float16 run.
INITIAL_LOSS_SCALE = 2.0**15

# The model flags' values when neither the user nor a fine-tuned run (--init-from) sets them.
DEFAULT_PRESET = "small"
DEFAULT_SPM_MODEL_TYPE = "bpe"


@dataclasses.dataclass
class TrainArgs:
    """The flags of kt-train (DESIGN.md section 8); `None` means "resolved automatically"."""

    model_dir: str = flag("runs/multi30k-en-de", "checkpoints, tokenizer, config.json, logs")
    preset: str | None = flag(
        None,
        "model size (paper Table 3: base, big)",
        tuple(PRESETS),
        auto=DEFAULT_PRESET,
        fixed_on_resume=True,
        model=True,
    )
    src_lang: str = flag("en", "source language", fixed_on_resume=True)
    tgt_lang: str = flag("de", "target language", fixed_on_resume=True)
    dataset: str = flag(
        "multi30k",
        "multi30k | files | tfds:NAME (e.g. tfds:wmt14_translate/de-en); a comma-separated "
        "list mixes several training corpora (validation: the first's)",
        fixed_on_resume=True,
    )
    train_src: str | None = flag(None, "training source file(s), comma-separated (--dataset files)")
    train_tgt: str | None = flag(None, "training target file(s), comma-separated (--dataset files)")
    train_weights: str | None = flag(
        None,
        "sampling weights of the training corpora, comma-separated",
        auto="their sizes",
        fixed_on_resume=True,
    )
    tag_corpus: str | None = flag(
        None,
        "1-based indices of training corpora whose sources get the <BT> tag, e.g. 2",
        fixed_on_resume=True,
    )
    subword_alpha: float | None = flag(
        None,
        "subword regularization of training sentences: BPE-dropout probability (bpe), "
        "sampling smoothness over the n-best segmentations (unigram)",
        auto="0: off",
        fixed_on_resume=True,
    )
    valid_src: str | None = flag(None, "validation source file (--dataset files)")
    valid_tgt: str | None = flag(None, "validation target file (--dataset files)")
    data_dir: str | None = flag(
        None, "local data: Multi30k files or a TFDS data_dir (env KT_DATA_DIR)", env=DATA_DIR_ENV
    )
    tfds_download: bool = flag(
        False, "let TFDS download and prepare a --dataset tfds:NAME missing from --data-dir"
    )
    strategy: str = flag("default", "distribution strategy", STRATEGIES)
    worker_wait: int = flag(
        WORKER_WAIT_SECONDS, "seconds a non-chief worker waits for the chief's config.json"
    )
    cpu_devices: int | None = flag(
        None,
        "split the CPU into N logical devices (multi-device paths without GPUs); given, "
        "it also says the run is meant for the CPU (mixed_float16 without a GPU is allowed)",
        auto="1",
    )
    precision: str | None = flag(
        None, "dtype policy", PRECISIONS, auto="float32", fixed_on_resume=True
    )
    initial_loss_scale: float | None = flag(
        None,
        "float16 loss scale at step 0 (halved at every overflow, doubled after 2000 finite "
        "steps; a resumed run continues from the saved scale)",
        auto=f"{INITIAL_LOSS_SCALE:g}, Keras' default, with mixed_float16",
        fixed_on_resume=True,
    )
    vocab_size: int | None = flag(
        None,
        "joint SentencePiece vocabulary",
        auto="8000; 37000 for a large corpus",
        fixed_on_resume=True,
        model=True,
    )
    spm_model_type: str | None = flag(
        None,
        "SentencePiece model type",
        ("bpe", "unigram"),
        auto=DEFAULT_SPM_MODEL_TYPE,
        fixed_on_resume=True,
        model=True,
    )
    batch_tokens: int | None = flag(
        None,
        "padded tokens per micro-batch, all replicas (an update is --accum-steps of them)",
        auto="the recipe's tokens per update (4096; 25000 for a large corpus) split into "
        "--accum-steps micro-batches",
        fixed_on_resume=True,
    )
    accum_steps: int | None = flag(
        None,
        "micro-batches per update (the same update as one k-times larger batch)",
        auto="the fewest that divide the recipe's update into micro-batches within "
        "--micro-batch-memory; 1 when --batch-tokens is given",
        fixed_on_resume=True,
    )
    tokens_per_replica: int | None = flag(
        None,
        "padded tokens per replica per micro-batch (fairseq's --max-tokens): sets "
        "--batch-tokens to N x replicas, and --accum-steps to 1 unless given",
        auto="the recipe's update shared by the replicas",
        fixed_on_resume=True,
    )
    micro_batch_memory: float | None = flag(
        None,
        "GiB per replica that one micro-batch's training step may keep (estimated from the "
        "vocabulary, the preset, --max-length and --precision); bounds the automatic "
        "--accum-steps",
        auto=f"a quarter of the GPU's memory; {MICRO_BATCH_MEMORY_GIB:g} without a GPU",
    )
    max_length: int = flag(
        128, "longest source or target in tokens; longer pairs are dropped", fixed_on_resume=True
    )
    epochs: int | None = flag(
        None, "train for N epochs (sets --train-steps)", alternative="train_steps"
    )
    train_steps: int | None = flag(
        None,
        "optimizer updates",
        auto="20 epochs (counted without --subword-alpha's sampling); "
        "100000 (big: 300000) for a large corpus",
        counted=True,
    )
    steps_per_epoch: int | None = flag(
        None,
        "batches per epoch; each epoch reshuffles",
        auto="one pass over the corpus (at most train steps)",
        fixed_on_resume=True,
        counted=True,
    )
    checkpoint_every: int | None = flag(
        None,
        "save every N steps",
        auto="train steps / 70, at least 100 (at most train steps)",
        counted=True,
    )
    keep_checkpoints: int = flag(5, "checkpoints kept in checkpoints/")
    async_checkpoint: bool = flag(
        False,
        "write each checkpoint in a background thread: a save blocks only while it copies the "
        "variables to host memory (one write at a time, joined before exit)",
    )
    eval_every: int | None = flag(
        None,
        "validation BLEU every N steps",
        auto="train steps / 10, at least an epoch",
        counted=True,
    )
    eval_sentences: int | None = flag(None, "validation sentences for BLEU (0: all)", auto="500")
    eval_beam_size: int = flag(BEAM_SIZE, "beam size of the validation BLEU")
    patience: int = flag(0, "early stop after N BLEU evaluations without gain (0: never)")
    log_every: int = flag(
        100,
        "metrics.jsonl and TensorBoard every N steps; also a progress line (loss, learning "
        "rate, tokens/s, ETA) when there is no progress bar (stdout not a terminal)",
    )
    warmup_steps: int | None = flag(
        None,
        "learning-rate warmup",
        auto="4000; 0.4 x train steps (at most 4000) for a small corpus",
        fixed_on_resume=True,
        counted=True,
    )
    lr_scale: float | None = flag(
        None,
        "multiplies the paper's schedule",
        auto="1.0; 0.8 for a small corpus",
        fixed_on_resume=True,
    )
    dropout_rate: float | None = flag(
        None,
        "residual dropout",
        auto="the preset's; at least 0.2 for a small corpus",
        fixed_on_resume=True,
    )
    label_smoothing: float | None = flag(None, "epsilon_ls", auto="0.1", fixed_on_resume=True)
    jit_compile: bool = flag(
        False,
        "XLA on each replica's forward and backward pass of a micro-batch (every strategy; "
        "one compilation per micro-batch shape and replica; measure first: slower on CPU)",
    )
    # -- fine-tuning and weight averaging (training.fine_tune, training.ema) --
    init_from: str | None = flag(
        None,
        "fine-tune: a run directory whose model configuration, SentencePiece model and "
        "weights (its best/) this new run starts from; optimizer, step and schedule are new",
        fixed_on_resume=True,
    )
    init_checkpoint: str | None = flag(
        None,
        "with --init-from: the weights of this checkpoint instead of best/",
        fixed_on_resume=True,
        alternative="init_average_last",
    )
    init_average_last: int | None = flag(
        None,
        "with --init-from: the mean of its last K checkpoints instead of best/",
        fixed_on_resume=True,
    )
    ema_decay: float | None = flag(
        None,
        "keep an exponential moving average of the weights with this decay (e.g. 0.999); "
        "validation BLEU, best/ and export use it",
        auto="off",
        fixed_on_resume=True,
    )
    nonfinite_steps: int = flag(
        3,
        "mixed_float16: stop after N steps in a row with a NaN/Inf loss (an isolated one is "
        "skipped, as the loss scaler skips an overflow); float32 and bfloat16 stop at the first",
    )
    seed: int = flag(0, "seed of the weights, the data order and dropout", fixed_on_resume=True)
    verbose: int | None = flag(
        None, "Keras fit verbosity", (0, 1, 2), auto="1 on a terminal, else 2"
    )
    # -- clusters and devices (training.strategy, training.preemption) --
    collective_timeout: float | None = flag(
        None,
        "--strategy multi_worker: seconds without progress (a batch, a validation batch, an "
        "epoch end; from the first batch's end) before a task logs one line and exits with "
        "status 1 instead of hanging on a dead peer; longer than a validation on the chief",
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


TrainSettings = frozen_copy(
    TrainArgs,
    "TrainSettings",
    """A run's resolved settings (config.json "training"), frozen: the flags with every
    automatic value filled in (`recipe.resolve`, or read back on a resume).""",
)


# The per-flag policies, read from the fields (`flag`'s keywords).
FIXED_ON_RESUME = flags_with(TrainArgs, "fixed_on_resume")
MODEL_FLAGS = flags_with(TrainArgs, "model")
COUNTED = flags_with(TrainArgs, "counted")
ALTERNATIVES = alternatives(TrainArgs)

__all__ = [
    "ALTERNATIVES", "COUNTED", "ConfigError", "FIXED_ON_RESUME", "MODEL_FLAGS", "TrainArgs",
    "TrainSettings", "argument", "default_text", "describe", "flag", "flags_with", "option",
]  # fmt: skip
