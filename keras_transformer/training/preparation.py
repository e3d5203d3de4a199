"""Before training, in one call (`prepare`): the data, the run's configuration (`RunConfig`)
and its tokenizer.

A new run resolves its automatic settings from the corpus in two pure phases of the recipe
(`recipe.sizes`, then `recipe.schedule` from the batches counted with the tokenizer trained
in between), and writes the tokenizer and config.json (the chief only); a resumed run reads
them back and refuses flags that would change it.
"""

from __future__ import annotations

import dataclasses
import logging
import math

from keras_transformer.config import UNK_ID, TransformerConfig
from keras_transformer.data import SubwordTokenizer, load_parallel
from keras_transformer.data.batching import batch_count
from keras_transformer.data.mixing import TAG, MixedText
from keras_transformer.data.parallel_text import numpy_pairs
from keras_transformer.data.subword import subword_sampler
from keras_transformer.data.tokenizer import TooManyPieces
from keras_transformer.run_dir import Run
from keras_transformer.settings import recipe
from keras_transformer.settings.args import (
    DEFAULT_SPM_MODEL_TYPE,
    ConfigError,
    TrainArgs,
    TrainSettings,
)
from keras_transformer.settings.plan import Plan
from keras_transformer.settings.run_config import RunConfig
from keras_transformer.settings.validation import check_resume
from keras_transformer.training.fine_tune import Source
from keras_transformer.training.job import Job
from keras_transformer.training.workers import GAVE_UP, check_workers, wait_for

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


@dataclasses.dataclass(frozen=True)
class Preparation:
    """What a run trains with: its configuration (`RunConfig`: the model, this session's
    settings, the fine-tuning record), its tokenizer and its data (train, validation)."""

    config: RunConfig
    tokenizer: SubwordTokenizer
    train: object
    valid: object


def prepare(plan: Plan, job: Job) -> Preparation:
    """The data, and the run's configuration and tokenizer: read back from config.json and
    spm.model (a resumed run, with the flags given now where a resume may change them), else
    resolved from the corpus and written by the chief (`new_run`).

    A non-chief worker (`job.task`) waits for the chief's config.json (`workers.wait_for`):
    its run exists then; the chief, once prepared, stops when a worker gave up waiting
    (`workers.check_workers`). The job's replicas bound the automatic micro-batch
    (`recipe.split_update`).
    """
    train, valid = load_data(plan)
    logger.info("train: %s\nvalidation: %s", train.report(), valid.report())
    run, task = job.shared, job.task
    if task is not None:
        wait_for(run.config_file, plan.args.worker_wait, run.path(GAVE_UP.format(task)))
    if job.found.exists or task is not None:  # a worker returns from waiting once it exists
        config, tokenizer = resumed(run, plan.args), run.load_tokenizer()
    else:
        config, tokenizer = new_run(run, plan.args, train, job.strategy.num_replicas_in_sync)
    if task is None:
        check_workers(run)
    check_tag_symbol(tokenizer, config.training)
    return Preparation(config, tokenizer, train, valid)


def new_run(run: Run, args: TrainArgs, train, replicas: int = 1):
    """(RunConfig, tokenizer) of a new run, both written to `run`: the sizes resolved from the
    corpus (`recipe.sizes`), the tokenizer trained at that vocabulary, the schedule from the
    batches it counts (`recipe.schedule`).

    A fine-tuned run (--init-from) takes its model configuration and tokenizer from the
    source run instead (`fine_tune.Source`) and records where it started from.
    """
    source = None
    if args.init_from is not None:
        source, args = Source.of(args)
    sized = recipe.sizes(args, num_pairs=train.num_pairs, replicas=replicas)
    if source is not None:
        tokenizer = source.tokenizer()
    else:
        tokenizer = train_tokenizer(train, sized.settings.vocab_size, args)
    counts = count_passes(train, tokenizer, sized, args)
    settings = recipe.schedule(sized, args, num_pairs=train.num_pairs, **counts)
    if source is not None:
        settings = recipe.fine_tune_schedule(settings, args, source.model.d_model)
        model = source.model_config(settings.dropout_rate, settings.label_smoothing)
    else:
        model = TransformerConfig.preset(
            settings.preset,
            vocab_size=tokenizer.vocab_size,
            max_length=max(settings.max_length, 256),
            dropout_rate=settings.dropout_rate,
            label_smoothing=settings.label_smoothing,
        )
    config = RunConfig.new(model, settings, source.record() if source else None)
    run.create(config, tokenizer)
    return config, tokenizer


def count_passes(train, tokenizer, sized: recipe.Sized, args: TrainArgs) -> dict:
    """The passes `recipe.schedule` needs counted (`sized.counts`), in batches of an update:
    {"sampled": at training's segmentation, "plain": at the deterministic one}."""
    counts = {}
    for name in sized.counts:
        subword = subword_sampler(tokenizer, args.subword_alpha) if name == "sampled" else None
        tokens = sized.update_tokens
        counts[name] = count_batches(train, tokenizer, tokens, args.max_length, subword=subword)
    return counts


def planned_settings(run: Run, args: TrainArgs, train, replicas: int = 1) -> TrainSettings:
    """The settings `prepare` would give, without training a tokenizer or writing anything
    (--dry-run): a resumed run's from its config.json; a new run's resolved from the corpus,
    with the settings counted in batches (`COUNTED`) left at None unless a fine-tuned
    run's source tokenizer (--init-from) can count them. `train` None: a corpus not at hand,
    of unknown size (the large-corpus recipe)."""
    if run.exists:
        return resumed(run, args).training
    if train is None or args.init_from is None:
        num_pairs = None if train is None else train.num_pairs
        return recipe.resolve(args, num_pairs=num_pairs, replicas=replicas)
    source, args = Source.of(args)
    sized = recipe.sizes(args, num_pairs=train.num_pairs, replicas=replicas)
    counts = count_passes(train, source.tokenizer(), sized, args)
    settings = recipe.schedule(sized, args, num_pairs=train.num_pairs, **counts)
    return recipe.fine_tune_schedule(settings, args, source.model.d_model)


def resumed(run: Run, args: TrainArgs) -> RunConfig:
    """(the saved RunConfig with this session's settings: the flags given now for what a
    resume may change, `RunConfig.resumed`), after refusing a flag that would change the run."""
    config = run.read_run_config()
    if config.training is None:
        raise ConfigError(f'{run.config_file} has no "training" settings')
    check_resume(args, config.recorded_settings(), run.config_file)
    return config.replace(training=config.resumed(args))


def train_tokenizer(train, vocab_size: int, args: TrainArgs) -> SubwordTokenizer:
    model_type = args.spm_model_type or DEFAULT_SPM_MODEL_TYPE
    logger.info("training a %d-piece %s SentencePiece model", vocab_size, model_type)
    try:
        return SubwordTokenizer.trained_on(
            numpy_pairs(train.dataset),
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


def count_batches(
    train, tokenizer, batch_tokens: int, max_length: int, sample: int = 20_000, subword=None
):
    """Batches in one pass over the corpus: counted on up to `sample` pairs of the first
    pass's order (pieces interleaved over the whole corpus, not storage order), then scaled.
    (A MixedText: its first mixed pass, tags included; with `subword`, sampled as in
    training: longer.)"""
    counted = batch_count(
        train.epoch(0, 0).take(sample),
        tokenizer,
        batch_tokens=batch_tokens,
        max_length=max_length,
        subword=subword,
    )
    if train.num_pairs <= sample:
        return counted
    return math.ceil(counted * train.num_pairs / sample)


__all__ = [
    "GAVE_UP",
    "Preparation",
    "check_tag_symbol",
    "check_workers",
    "count_batches",
    "count_passes",
    "load_data",
    "new_run",
    "planned_settings",
    "prepare",
    "resumed",
    "train_tokenizer",
    "wait_for",
]
