"""One pass of string pairs as `((source_ids, target_in_ids), target_out_ids)` batches.

tokenize -> bos/eos -> drop pairs over `max_length` (counted) -> shuffle (bounded buffer) ->
bucket by length with a token budget -> pad to the bucket boundary -> prefetch.

`make_batches` is one pass (validation, or one seeded epoch); `pipeline.training_batches`
builds the training stream from it, chunk by chunk.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from keras_transformer.config import BOS_ID, EOS_ID
from keras_transformer.data.tokenizer import SubwordTokenizer
from keras_transformer.errors import KerasTransformerError

TOKENIZE_BATCH = 512
SUBWORD_SALT = 0x737562  # separates the segmentation sampling's seed from the shuffle's


class PipelineError(KerasTransformerError, ValueError):
    """A bad pipeline setting; the message names the flag."""


def bucket_boundaries(max_length: int, granularity: int = 8) -> list[int]:
    """Padded lengths 8, 16, 24, ... then ~10% steps, ending at max_length.

    Fine steps keep the padding waste below one granule per row; a bounded number of
    distinct shapes keeps retracing rare.
    """
    lengths, length = [], granularity
    while length < max_length:
        lengths.append(length)
        step = max(granularity, int(length * 0.1) // granularity * granularity)
        length += step
    lengths.append(max_length)
    return lengths


def _cpu_counter(name: str) -> tf.Variable:
    with tf.device("/CPU:0"):  # the input pipeline runs on the host: its state stays there
        return tf.Variable(0, dtype=tf.int64, trainable=False, name=name)


@dataclasses.dataclass
class PipelineStats:
    """Counters that fill in as the dataset is iterated (variables on the CPU, where the
    input pipeline runs, not on the first accelerator)."""

    too_long: tf.Variable = dataclasses.field(default_factory=lambda: _cpu_counter("too_long"))


@tf.autograph.experimental.do_not_convert
def tokenize_pairs(
    pairs: tf.data.Dataset, tokenizer: SubwordTokenizer, subword=None, seed=None
) -> tf.data.Dataset:
    """(src str, tgt str) -> (src ids + eos, bos + tgt ids + eos), int32 1-D each.

    With `subword` (a `data.subword.SubwordSampler`), each side's segmentation is sampled
    with a seed drawn from `seed` ((2,) int64) and the index of the tokenization batch, so
    it depends only on (`seed`, the order of `pairs`)."""

    def encode(src, tgt, call=None):
        src_ids, tgt_ids = _token_ids(tokenizer, subword, seed, src, tgt, call)
        n = tf.shape(src)[0]
        eos = tf.fill([n, 1], EOS_ID)
        bos = tf.fill([n, 1], BOS_ID)
        return tf.concat([src_ids, eos], axis=1), tf.concat([bos, tgt_ids, eos], axis=1)

    batches = pairs.batch(TOKENIZE_BATCH)
    if subword is not None:
        batches = batches.enumerate().map(lambda call, pair: (*pair, call))
    return batches.map(encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()


def _token_ids(tokenizer, subword, seed, src, tgt, call):
    """The ragged ids (no bos, no eos) of tokenization batch `call` of (src, tgt) strings."""
    if subword is None:
        # an imported OPUS-MT model cuts its targets with their own SentencePiece model
        tokenize_target = getattr(tokenizer, "tokenize_target", tokenizer.tokenize)
        return tokenizer.tokenize(src), tokenize_target(tgt)
    call_seed = tf.random.experimental.stateless_fold_in(seed, call)
    return tuple(
        subword(text, tf.random.experimental.stateless_fold_in(call_seed, side))
        for side, text in enumerate((src, tgt))
    )


def batch_count(
    pairs: tf.data.Dataset,
    tokenizer: SubwordTokenizer,
    *,
    batch_tokens: int,
    max_length: int,
    seed: int = 0,
    subword=None,
) -> int:
    """The batches `make_batches(pairs, ..., shuffle=False)` gives (with `seed` and no
    `epoch`), without building it: the pairs are tokenized eagerly, batch by batch as
    `tokenize_pairs` does, and the batches counted from their lengths (a bucket of n
    pairs within `max_length` and r rows per batch gives ceil(n / r) batches), so no
    function of a dataset is traced."""
    check_batch_settings(batch_tokens, max_length)
    sample_seed = None if subword is None else _subword_seed(seed, None)
    lengths = []  # per tokenization batch: (source + eos, bos + target) token counts
    for call, (src, tgt) in enumerate(pairs.batch(TOKENIZE_BATCH)):
        ids = _token_ids(tokenizer, subword, sample_seed, src, tgt, tf.constant(call, tf.int64))
        lengths.append(np.stack([x.row_lengths().numpy() + 1 for x in ids], axis=1))
    lengths = np.concatenate(lengths) if lengths else np.zeros((0, 2), np.int64)
    return batches_of_lengths(lengths, batch_tokens, max_length)


def batches_of_lengths(lengths: np.ndarray, batch_tokens: int, max_length: int) -> int:
    """The batches `_bucket` makes of pairs of (n, 2) (source, target in) `lengths` after
    `_fits` dropped the ones over `max_length` (no `static_rows`): ceil(n_b / rows_b) for
    each bucket b, whatever the order of the pairs."""
    boundaries = bucket_boundaries(max_length)
    rows = np.array(_bucket_rows(boundaries, batch_tokens) + [1], np.int64)
    kept = lengths[(lengths <= max_length).all(axis=1)].max(axis=1, initial=0)
    # bucket_by_sequence_length's bucket: the number of its boundaries (ours + 1) <= length
    bucket = np.searchsorted(np.array(boundaries) + 1, kept, side="right")
    per_bucket = np.bincount(bucket, minlength=len(rows))
    return int((-(-per_bucket // rows)).sum())


def check_batch_settings(batch_tokens, max_length) -> None:
    """Raise PipelineError naming the flag for a token budget or length no batch can use."""
    if not isinstance(batch_tokens, int) or batch_tokens <= 0:
        raise PipelineError(f"--batch-tokens must be a positive integer, got {batch_tokens!r}")
    if not isinstance(max_length, int) or max_length <= 1:
        raise PipelineError(f"--max-length must be an integer > 1, got {max_length!r}")
    if batch_tokens < max_length:
        raise PipelineError(
            f"--batch-tokens ({batch_tokens}) must be at least --max-length ({max_length}) "
            "so that the longest pair fits in a batch"
        )


@tf.autograph.experimental.do_not_convert
def make_batches(
    pairs: tf.data.Dataset,
    tokenizer: SubwordTokenizer,
    *,
    batch_tokens: int,
    max_length: int,
    shuffle: bool = True,
    shuffle_buffer: int = 20_000,
    seed: int = 0,
    boundaries: list[int] | None = None,
    stats: PipelineStats | None = None,
    epoch: int | tf.Tensor | None = None,
    prefetch: bool = True,
    subword=None,
    static_rows: int | None = None,
) -> tf.data.Dataset:
    """Token-budget batches: every batch has rows x padded length <= `batch_tokens`.

    `max_length` bounds the source (with eos) and the shifted target (with bos or eos);
    longer pairs are dropped and counted in `stats.too_long`. Rows are padded to the
    bucket boundary, so a whole epoch uses only `len(boundaries)` distinct lengths.

    Without `epoch`, the shuffle is seeded by `seed` and reshuffles on every iteration of
    the returned dataset. With `epoch` (an int, or a scalar tensor inside
    `Dataset.flat_map`), the order depends only on (`seed`, `epoch`): the same on every
    iteration, different from one epoch to the next.

    `subword` (a `data.subword.SubwordSampler`, training only) samples every sentence's
    segmentation, from (`seed`, `epoch`) and the sentence's place in `pairs`.

    `static_rows` m (kt-train --jit-compile: replicas x accumulation steps): every batch of
    a bucket has the bucket's row count, its budget's rows rounded down to a multiple of m
    (at least m); a bucket's last, partial batch is filled with padding rows (all pad ids:
    no tokens, so no loss and no gradient). A pass then has at most one shape per bucket,
    which XLA compiles once. None (the default) leaves the batches as they were.
    """
    check_batch_settings(batch_tokens, max_length)
    boundaries = boundaries or bucket_boundaries(max_length)
    stats = stats or PipelineStats()
    sample_seed = None if subword is None else _subword_seed(seed, epoch)
    data = tokenize_pairs(pairs, tokenizer, subword, sample_seed).map(_split_target)
    data = data.filter(_fits(max_length, stats))
    if shuffle and epoch is None:
        data = data.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    elif shuffle:
        data = _shuffle_with_seed(data, shuffle_buffer, epoch_seed(seed, epoch))
    data = _bucket(data, boundaries, batch_tokens, static_rows)
    data = data.map(lambda src, tgt_in, tgt_out: ((src, tgt_in), tgt_out))
    return data.prefetch(tf.data.AUTOTUNE) if prefetch else data


def _split_target(src, tgt):
    """(src, tgt_in, tgt_out): the target shifted for teacher forcing."""
    return src, tgt[:-1], tgt[1:]


def _fits(max_length: int, stats: PipelineStats):
    """The filter keeping pairs within `max_length`, counting the others in `stats.too_long`."""

    def fits(src, tgt_in, tgt_out):
        ok = tf.logical_and(tf.size(src) <= max_length, tf.size(tgt_in) <= max_length)
        counter = stats.too_long.assign_add(tf.cast(tf.logical_not(ok), tf.int64))
        with tf.control_dependencies([counter]):
            return tf.identity(ok)

    return fits


def _subword_seed(seed: int, epoch: int | tf.Tensor | None) -> tf.Tensor:
    """The (2,) int64 seed of the sampled segmentations of (`seed`, `epoch`, None: 0)."""
    return tf.random.experimental.stateless_fold_in(
        tf.stack([tf.constant(seed, tf.int64), tf.cast(0 if epoch is None else epoch, tf.int64)]),
        SUBWORD_SALT,
    )


def _bucket(
    data: tf.data.Dataset, boundaries: list[int], batch_tokens: int, static_rows=None
) -> tf.data.Dataset:
    """(src, tgt_in, tgt_out) rows -> batches of <= `batch_tokens`, padded to the boundary
    (with `static_rows`: every batch of a bucket padded to its rows, see `make_batches`)."""
    sizes = _bucket_rows(boundaries, batch_tokens)
    if static_rows:
        sizes = [max(static_rows, size // static_rows * static_rows) for size in sizes]
    # bucket_by_sequence_length pads to (boundary - 1), so shift the boundaries by one
    data = data.bucket_by_sequence_length(
        element_length_func=lambda src, tgt_in, tgt_out: tf.maximum(tf.size(src), tf.size(tgt_in)),
        bucket_boundaries=[b + 1 for b in boundaries],
        bucket_batch_sizes=sizes + [1],
        padded_shapes=([None], [None], [None]),
        padding_values=(0, 0, 0),
        pad_to_bucket_boundary=True,
    )
    if not static_rows:
        return data
    rows_of_length = [0] * (max(boundaries) + 1)  # a bucket's padded length -> its rows
    for boundary, size in zip(boundaries, sizes):
        rows_of_length[boundary] = size
    rows_of_length = tf.constant(rows_of_length, tf.int32)

    def fill(*batch):  # every tensor is (rows, the bucket's length)
        rows = rows_of_length[tf.shape(batch[0])[1]]
        return tuple(tf.pad(t, [[0, rows - tf.shape(t)[0]], [0, 0]]) for t in batch)

    return data.map(fill)


def _bucket_rows(boundaries: list[int], batch_tokens: int) -> list[int]:
    """The rows of a batch of each bucket: as many as `batch_tokens` holds at its length."""
    return [max(1, batch_tokens // b) for b in boundaries]


def epoch_seed(seed: int, epoch: int | tf.Tensor) -> tf.Tensor:
    """The shuffle seed of `epoch` (int64 scalar): distinct for every (seed, epoch < 1e6)."""
    return tf.constant(seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64)


def _shuffle_with_seed(data: tf.data.Dataset, buffer: int, seed: tf.Tensor) -> tf.data.Dataset:
    """A shuffle whose order depends only on `seed` (an int64 scalar tensor).

    Built inside a one-element `flat_map` whose function graph has no graph-level seed, so
    the global seed does not enter the order (and tf.data's Python check of the seed pair
    against (0, 0), which fails for a tensor seed under global seed 0, is never reached).
    """

    def shuffled(op_seed):
        tf.compat.v1.get_default_graph().seed = None  # this function's graph only
        return data.shuffle(buffer, seed=op_seed, reshuffle_each_iteration=False)

    return tf.data.Dataset.from_tensors(tf.cast(seed, tf.int64)).flat_map(shuffled)
