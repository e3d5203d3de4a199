"""Before training: the data, the resolved settings and the tokenizer of a run.

A new run resolves its automatic settings from the corpus (`recipe.resolve`), trains the
SentencePiece model and writes both to the run directory (the chief only); a resumed run reads
them back and refuses flags that would change it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time

import tensorflow as tf

from keras_transformer.config import UNK_ID, TransformerConfig
from keras_transformer.data import (
    SubwordTokenizer,
    load_parallel,
    make_batches,
    train_sentencepiece,
)
from keras_transformer.data.mixing import TAG, MixedText
from keras_transformer.data.subword import SubwordSampler
from keras_transformer.data.tokenizer import TooManyPieces
from keras_transformer.files import write_atomic
from keras_transformer.run_dir import CONFIG_FILE, Run
from keras_transformer.settings.args import (
    DEFAULT_SPM_MODEL_TYPE,
    ConfigError,
    TrainArgs,
    TrainSettings,
)
from keras_transformer.settings.plan import Plan
from keras_transformer.settings.recipe import fine_tune_schedule, resolve
from keras_transformer.settings.validation import check_resume
from keras_transformer.training.fine_tune import Source
from keras_transformer.training.strategy import chief_task

logger = logging.getLogger(__name__)


def load_data(plan: Plan, download: bool = True):
    """(train, validation) from the plan's corpora: train a ParallelText, or a MixedText of
    several corpora; validation the first corpus's. `download=False`: nothing is downloaded
    (Multi30k's cache; TFDS follows --tfds-download)."""
    args, corpora = plan.args, plan.corpora

    def load(kind: str, split: str, files):
        return load_parallel(
            kind,
            split,
            args.src_lang,
            args.tgt_lang,
            data_dir=args.data_dir,
            files=files,
            tfds_download=args.tfds_download,
            download=download,
        )

    train = [load(kind, "train", files) for kind, files in corpora.sources]
    valid = load(corpora.sources[0][0], "validation", (args.valid_src, args.valid_tgt))
    if len(train) == 1:
        return train[0], valid
    weights = list(corpora.weights) if corpora.weights else None
    return MixedText(train, weights, corpora.tagged), valid


def check_tag_symbol(tokenizer: SubwordTokenizer, settings: TrainSettings) -> None:
    """A run with tagged corpora needs the tag as a reserved piece of its tokenizer."""
    if settings.tag_corpus and int(tokenizer.tokenizer.string_to_id(TAG)) == UNK_ID:
        raise ConfigError(
            f"--tag-corpus {settings.tag_corpus}: the SentencePiece model of this run has no "
            f"{TAG} symbol (it was trained without --tag-corpus); use a new --model-dir"
        )


GAVE_UP = "worker_{}.gave_up"  # a non-chief worker that stopped waiting leaves this file


def settle(run_dir: Run, args: TrainArgs, train, task: int | None = None, replicas: int = 1):
    """(resolved settings, tokenizer): from config.json when resuming (refusing flags that
    would change the run), else resolved from the corpus and written by the chief.

    `task` is the index of a non-chief worker (None for the chief): it waits for the chief's
    config.json. One that gives up leaves a note, and the chief, finding it once its own
    preparation is done, stops too instead of blocking in its first collective. `replicas`
    (of the whole job) bounds the automatic micro-batch (`recipe.split_update`).
    """
    if task is not None:
        wait_for(run_dir.path(CONFIG_FILE), args.worker_wait, run_dir.path(GAVE_UP.format(task)))
    if run_dir.exists:
        settings, tokenizer = resumed_settings(run_dir, args), run_dir.load_tokenizer()
    else:
        settings, tokenizer = new_settings(run_dir, args, train, replicas)
    if task is None:
        check_workers(run_dir)
    return settings, tokenizer


def check_workers(run_dir: Run) -> None:
    """The chief stops when a worker gave up waiting for it (and clears the note)."""
    notes = sorted(tf.io.gfile.glob(run_dir.path(GAVE_UP.format("*"))))
    if notes:
        for note in notes:
            tf.io.gfile.remove(note)
        raise ConfigError(
            f"{', '.join(os.path.basename(n).split('.')[0] for n in notes)} gave up waiting for "
            f"this chief (--worker-wait) and exited: start every worker again, with a larger "
            "--worker-wait if the chief's preparation takes longer"
        )


def new_settings(run_dir: Run, args: TrainArgs, train, replicas: int = 1):
    """Resolve the automatic settings from the corpus, train the tokenizer, write both.

    A fine-tuned run (--init-from) takes its model configuration and tokenizer from the
    source run instead (`fine_tune.Source`) and records where it started from.
    """
    source = None
    if args.init_from is not None:
        source, args = Source.of(args)
    tokenizers: dict[int, SubwordTokenizer] = {}

    def tokenizer_for(vocab_size: int) -> SubwordTokenizer:
        if vocab_size not in tokenizers:
            tokenizers[vocab_size] = (
                source.tokenizer() if source else train_tokenizer(train, vocab_size, args)
            )
        return tokenizers[vocab_size]

    settings = resolve(
        args,
        num_pairs=train.num_pairs,
        batches_per_pass=batch_counter(train, args, tokenizer_for),
        replicas=replicas,
    )
    if source is not None:
        fine_tune_schedule(settings, args, source.model.d_model)
    tokenizer = tokenizer_for(settings.vocab_size)
    if source is not None:
        model_config = source.model_config(settings.dropout_rate, settings.label_smoothing)
    else:
        model_config = TransformerConfig.preset(
            settings.preset,
            vocab_size=tokenizer.vocab_size,
            max_length=max(settings.max_length, 256),
            dropout_rate=settings.dropout_rate,
            label_smoothing=settings.label_smoothing,
        )
    run_dir.save_tokenizer(tokenizer)  # before config.json: other workers wait for config.json
    config = {"model": model_config.to_dict(), "training": dataclasses.asdict(settings)}
    if source is not None:
        config["init"] = source.record()
    run_dir.write_config(config)
    return settings, tokenizer


def batch_counter(train, args: TrainArgs, tokenizer_for):
    """`batches_per_pass(vocab_size, batch_tokens, sampled=True)` of `recipe.resolve`, counted
    with the tokenizer `tokenizer_for(vocab_size)`."""

    def batches_per_pass(vocab_size: int, batch_tokens: int, sampled: bool = True) -> int:
        tokenizer = tokenizer_for(vocab_size)
        subword = subword_sampler(tokenizer, args.subword_alpha) if sampled else None
        return count_batches(train, tokenizer, batch_tokens, args.max_length, subword=subword)

    return batches_per_pass


def planned_settings(run_dir: Run, args: TrainArgs, train, replicas: int = 1) -> TrainSettings:
    """The settings `settle` would give, without training a tokenizer or writing anything
    (--dry-run): a resumed run's from its config.json; a new run's resolved from the corpus,
    with the settings counted in batches (`recipe.COUNTED`) left at None unless a fine-tuned
    run's source tokenizer (--init-from) can count them. `train` None: a corpus not at hand,
    of unknown size (the large-corpus recipe)."""
    if run_dir.exists:
        return resumed_settings(run_dir, args)
    if train is None:
        return resolve(args, num_pairs=None, batches_per_pass=None, replicas=replicas)
    counter = None
    if args.init_from is not None:
        source, args = Source.of(args)
        tokenizer = source.tokenizer()
        counter = batch_counter(train, args, lambda _: tokenizer)
    settings = resolve(args, num_pairs=train.num_pairs, batches_per_pass=counter, replicas=replicas)
    if args.init_from is not None:
        fine_tune_schedule(settings, args, source.model.d_model)
    return settings


def resumed_settings(run_dir: Run, args: TrainArgs) -> TrainSettings:
    """The saved settings, with the flags given now for what a resume may change."""
    saved = run_dir.read_config().get("training")
    if not isinstance(saved, dict):
        raise ConfigError(f'{run_dir.path(CONFIG_FILE)} has no "training" settings')
    check_resume(args, saved, run_dir.path(CONFIG_FILE))
    known = {f.name for f in dataclasses.fields(TrainArgs)}
    given = dataclasses.asdict(args)
    settings = TrainSettings(
        **{**given, **{k: v for k, v in saved.items() if k in known and given[k] is None}}
    )
    if args.epochs is not None:
        settings.train_steps = args.epochs * settings.steps_per_epoch
    settings.epochs = None
    settings.precision = settings.precision or "float32"  # runs written before the flag
    settings.accum_steps = settings.accum_steps or 1
    return settings


def train_tokenizer(train, vocab_size: int, args: TrainArgs) -> SubwordTokenizer:
    def sentences():
        for src, tgt in train.dataset.as_numpy_iterator():
            yield src.decode("utf-8")
            yield tgt.decode("utf-8")

    model_type = args.spm_model_type or DEFAULT_SPM_MODEL_TYPE
    logger.info("training a %d-piece %s SentencePiece model", vocab_size, model_type)
    try:
        proto = train_sentencepiece(
            sentences(),
            vocab_size,
            model_type=model_type,
            seed=args.seed,
            user_symbols=(TAG,) if args.tag_corpus else (),
        )
    except TooManyPieces as err:
        if args.vocab_size is not None:
            raise
        raise ConfigError(
            f"the automatic --vocab-size {vocab_size} is more pieces than the training text of "
            f"{train.num_pairs} pairs allows: pass --vocab-size {err.largest} or less"
        ) from None
    return SubwordTokenizer(proto)


def subword_sampler(tokenizer: SubwordTokenizer, alpha: float | None) -> SubwordSampler | None:
    """The training sentences' segmentation sampler of --subword-alpha (None: off)."""
    return SubwordSampler(tokenizer, alpha) if alpha else None


def count_batches(
    train, tokenizer, batch_tokens: int, max_length: int, sample: int = 20_000, subword=None
):
    """Batches in one pass over the corpus: counted on up to `sample` pairs of the first
    pass's order (pieces interleaved over the whole corpus, not storage order), then scaled.
    (A MixedText: its first mixed pass, tags included; with `subword`, sampled as in
    training: longer.)"""
    pairs = train.epoch(0, 0)
    batches = make_batches(
        pairs.take(sample),
        tokenizer,
        batch_tokens=batch_tokens,
        max_length=max_length,
        shuffle=False,
        subword=subword,
    )
    counted = int(batches.reduce(0, lambda n, _: n + 1))
    if train.num_pairs <= sample:
        return counted
    return math.ceil(counted * train.num_pairs / sample)


def wait_for(path: str, timeout: float, gave_up: str) -> None:
    """A non-chief worker waits for the chief to write the run's config.json; when it gives
    up it writes `gave_up` (read by the chief) and says so."""
    deadline = time.monotonic() + timeout
    while not tf.io.gfile.exists(path):  # the run directory may be gs://...
        if time.monotonic() > deadline:
            tf.io.gfile.makedirs(os.path.dirname(gave_up))
            write_atomic(gave_up, f"gave up after {timeout:.0f} s\n")
            raise ConfigError(
                f"waited {timeout:.0f} s (--worker-wait) for the chief to write {path}: start "
                f"the chief (TF_CONFIG task {chief_task()}) with the same --model-dir (a "
                "directory every worker can read), or raise --worker-wait"
            )
        time.sleep(1.0)


__all__ = [
    "check_tag_symbol",
    "check_workers",
    "count_batches",
    "load_data",
    "planned_settings",
    "settle",
    "subword_sampler",
    "train_tokenizer",
    "wait_for",
]
