"""From string pairs to `((source_ids, target_in_ids), target_out_ids)` batches, streaming.

tokenize -> bos/eos -> drop pairs over `max_length` (counted) -> shuffle (bounded buffer) ->
bucket by length with a token budget -> pad to the bucket boundary -> prefetch.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, SubwordTokenizer
from keras_transformer.errors import KerasTransformerError

TOKENIZE_BATCH = 512


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


@dataclasses.dataclass
class PipelineStats:
    """Counters that fill in as the dataset is iterated."""

    too_long: tf.Variable = dataclasses.field(
        default_factory=lambda: tf.Variable(0, dtype=tf.int64, trainable=False, name="too_long")
    )
    kept: tf.Variable = dataclasses.field(
        default_factory=lambda: tf.Variable(0, dtype=tf.int64, trainable=False, name="kept")
    )


def tokenize_pairs(pairs: tf.data.Dataset, tokenizer: SubwordTokenizer) -> tf.data.Dataset:
    """(src str, tgt str) -> (src ids + eos, bos + tgt ids + eos), int32 1-D each."""

    def encode(src, tgt):
        src_ids = tokenizer.tokenize(src)
        tgt_ids = tokenizer.tokenize(tgt)
        n = tf.shape(src)[0]
        eos = tf.fill([n, 1], EOS_ID)
        bos = tf.fill([n, 1], BOS_ID)
        return tf.concat([src_ids, eos], axis=1), tf.concat([bos, tgt_ids, eos], axis=1)

    return (
        pairs.batch(TOKENIZE_BATCH)
        .map(encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .unbatch()
    )


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
) -> tf.data.Dataset:
    """Token-budget batches: every batch has rows x padded length <= `batch_tokens`.

    `max_length` bounds the source (with eos) and the shifted target (with bos or eos);
    longer pairs are dropped and counted in `stats.too_long`. Rows are padded to the
    bucket boundary, so a whole epoch uses only `len(boundaries)` distinct lengths.
    """
    if not isinstance(batch_tokens, int) or batch_tokens <= 0:
        raise PipelineError(f"--batch-tokens must be a positive integer, got {batch_tokens!r}")
    if not isinstance(max_length, int) or max_length <= 1:
        raise PipelineError(f"--max-length must be an integer > 1, got {max_length!r}")
    if batch_tokens < max_length:
        raise PipelineError(
            f"--batch-tokens ({batch_tokens}) must be at least --max-length ({max_length}) "
            "so that the longest pair fits in a batch"
        )
    boundaries = boundaries or bucket_boundaries(max_length)
    stats = stats or PipelineStats()

    def split(src, tgt):
        return src, tgt[:-1], tgt[1:]

    def fits(src, tgt_in, tgt_out):
        ok = tf.logical_and(tf.size(src) <= max_length, tf.size(tgt_in) <= max_length)
        counter = tf.cond(
            ok, lambda: stats.kept.assign_add(1), lambda: stats.too_long.assign_add(1)
        )
        with tf.control_dependencies([counter]):
            return tf.identity(ok)

    data = tokenize_pairs(pairs, tokenizer).map(split).filter(fits)
    if shuffle:
        data = data.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    # bucket_by_sequence_length pads to (boundary - 1), so shift the boundaries by one
    data = data.bucket_by_sequence_length(
        element_length_func=lambda src, tgt_in, tgt_out: tf.maximum(tf.size(src), tf.size(tgt_in)),
        bucket_boundaries=[b + 1 for b in boundaries],
        bucket_batch_sizes=[max(1, batch_tokens // b) for b in boundaries] + [1],
        padded_shapes=([None], [None], [None]),
        padding_values=(0, 0, 0),
        pad_to_bucket_boundary=True,
    )
    return data.map(lambda src, tgt_in, tgt_out: ((src, tgt_in), tgt_out)).prefetch(
        tf.data.AUTOTUNE
    )


def window_shuffle(pairs: tf.data.Dataset, window: int, seed) -> tf.data.Dataset:
    """Shuffle each consecutive window of `window` pairs with a stateless RNG.

    The order is a pure function of `seed` (an int64 [2] tensor) and the window index, not of
    how many times the dataset was iterated: what an exact resume needs.
    """

    def permute(index, block):
        src, tgt = block
        order = tf.random.experimental.stateless_shuffle(
            tf.range(tf.shape(src)[0]), seed=seed + tf.stack([tf.constant(0, tf.int64), index])
        )
        return tf.gather(src, order), tf.gather(tgt, order)

    return pairs.batch(window).enumerate().map(permute).unbatch()


def training_batches(
    pairs: tf.data.Dataset,
    tokenizer: SubwordTokenizer,
    *,
    batch_tokens: int,
    max_length: int,
    seed: int,
    steps_per_epoch: int,
    start_step: int = 0,
    shuffle_buffer: int = 20_000,
    stats: PipelineStats | None = None,
    **kwargs,
) -> tf.data.Dataset:
    """An endless stream of training batches whose position can be restored exactly.

    Epoch e (0, 1, ...) is `steps_per_epoch` batches of the corpus (repeated within the
    epoch if it is shorter), each window of `shuffle_buffer` pairs permuted with a seed
    that depends only on (`seed`, e), so batch i of the stream depends only on (`seed`, i).
    `start_step` s starts at batch s: at epoch s // steps_per_epoch, skipping only the
    s % steps_per_epoch batches before it.
    """
    if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
        raise PipelineError(
            f"--steps-per-epoch must be a positive integer, got {steps_per_epoch!r}"
        )
    start_epoch, offset = divmod(int(start_step), steps_per_epoch)
    stats = stats or PipelineStats()

    def epoch(e):
        seed_e = tf.stack([tf.constant(seed, tf.int64), e])
        return make_batches(
            window_shuffle(pairs.repeat(), shuffle_buffer, seed_e),
            tokenizer,
            batch_tokens=batch_tokens,
            max_length=max_length,
            shuffle=False,
            stats=stats,
            **kwargs,
        ).take(steps_per_epoch)

    stream = tf.data.Dataset.counter(start_epoch).flat_map(epoch).skip(offset)
    return stream.prefetch(tf.data.AUTOTUNE)
