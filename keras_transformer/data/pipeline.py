"""The restartable training stream: full passes of token-budget batches, each pass in an
order of its own drawn from (seed, pass), cut into chunks, every batch tagged with its stream
position, so a run restarts exactly where it stopped.

One pass's batches (`make_batches`: tokenize, drop, shuffle, bucket, pad) are made in
`data.batching`; its names stay importable from here.
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.data.batching import (
    SUBWORD_SALT,
    TOKENIZE_BATCH,
    PipelineError,
    PipelineStats,
    bucket_boundaries,
    check_batch_settings,
    epoch_seed,
    make_batches,
    tokenize_pairs,
)
from keras_transformer.data.tokenizer import SubwordTokenizer

__all__ = [
    "CHUNK_BITS",
    "CHUNK_PAIRS",
    "MAX_CHUNKS",
    "POSITION_BITS",
    "SUBWORD_SALT",
    "TOKENIZE_BATCH",
    "PipelineError",
    "PipelineStats",
    "bucket_boundaries",
    "check_batch_settings",
    "chunk_size",
    "epoch_seed",
    "make_batches",
    "split_position",
    "stream_position",
    "tokenize_pairs",
    "training_batches",
]

POSITION_BITS = 32  # a stream position is pass << POSITION_BITS | index in the pass
CHUNK_BITS = 20  # the index in the pass is chunk << CHUNK_BITS | batch index in the chunk
MAX_CHUNKS = 1 << (POSITION_BITS - CHUNK_BITS)  # chunks per pass (larger corpora: larger chunks)
CHUNK_PAIRS = 100_000  # raw pairs per chunk of a pass: the most a resume tokenizes again


def stream_position(epoch: int, index: int, chunk: int = 0) -> int:
    """The int64 position of batch `index` of chunk `chunk` of pass `epoch` (what
    `training_batches` tags)."""
    return (epoch << POSITION_BITS) | (chunk << CHUNK_BITS) | index


def split_position(position: int) -> tuple[int, int]:
    """(pass, index in the pass: chunk << CHUNK_BITS | batch index in the chunk) of a stream
    position; with one chunk per pass, the batch index in the pass."""
    return position >> POSITION_BITS, position & ((1 << POSITION_BITS) - 1)


def chunk_size(num_pairs: int, chunk_pairs: int = CHUNK_PAIRS) -> int:
    """Raw pairs per chunk of a pass of `num_pairs` pairs: `chunk_pairs`, or more when the
    pass would need more than `MAX_CHUNKS` chunks."""
    return max(chunk_pairs, -(-num_pairs // MAX_CHUNKS), 1)


@tf.autograph.experimental.do_not_convert
def training_batches(
    corpus,
    tokenizer: SubwordTokenizer,
    *,
    batch_tokens: int,
    max_length: int,
    seed: int,
    start: int = 0,
    stats: PipelineStats | None = None,
    positions: bool = False,
    shard: tuple[int, int] | None = None,
    chunk_pairs: int | None = None,
    **kwargs,
) -> tf.data.Dataset:
    """The infinite training stream of `((src, tgt_in), tgt_out)` batches (with `positions`:
    `((src, tgt_in), tgt_out, position)`, which `TrainingModel` reads).

    Pass e (0, 1, ...) is one full pass over `corpus` (a `ParallelText` or `MixedText`): its
    `num_pairs` raw pairs in the order `corpus.passes(seed, ...)` gives, cut into chunks of
    `chunk_size(num_pairs, chunk_pairs or CHUNK_PAIRS)` raw pairs (one chunk when the corpus
    is no larger); each chunk is batched by `make_batches` on its own (shuffled, bucketed, and with
    `subword` its segmentations sampled) from a seed that depends only on (`seed`, e, chunk):
    chunk 0's seed is (`seed`, e), so a corpus of one chunk is batched as one whole pass.
    Every pass sees every pair exactly once (pairs over `max_length` dropped), in an order of
    its own. `position` (rows,) int64 tags every row with `stream_position(pass, index of
    the batch in its chunk, chunk)`, so a training step knows where the stream stands.
    `start` (a stream position) begins at that batch: the raw pairs of the chunks before
    it are read past without being tokenized (`passes` skips them), and only the batches of
    its own chunk before it are rebuilt (the shuffle buffer's state depends on them) but
    never trained on: a resume tokenizes at most one chunk again, whatever the corpus size.
    `shard` (index, count): this stream reads pairs index, index + count, ... of every
    chunk's order only (one worker's share, tokenized by that worker alone); its batches and
    positions are its own. Other keyword arguments go to `make_batches` (shuffle_buffer,
    boundaries, subword).
    """
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise PipelineError(f"start must be a stream position >= 0, got {start!r}")
    stats = stats or PipelineStats()
    check_batch_settings(batch_tokens, max_length)  # before the stream is built
    total, size, chunks = _chunking(corpus.num_pairs, chunk_pairs)
    batch_kwargs = dict(batch_tokens=batch_tokens, max_length=max_length, seed=seed, **kwargs)
    chunk_batches = _chunk_batcher(
        corpus.keep, tokenizer, chunks, start, shard, positions, stats=stats, **batch_kwargs
    )
    data = _by_chunk(corpus, seed, start, (total, size, chunks), chunk_batches)
    return data.prefetch(tf.data.AUTOTUNE)


def _by_chunk(corpus, seed: int, start: int, chunking: tuple[int, int, int], chunk_batches):
    """The raw pairs of the passes from the chunk of `start` on, one window per chunk,
    each window made into its batches by `chunk_batches`."""
    total, size, chunks = chunking
    key, window_size = _windows(total, size, chunks)
    first_pass, index = split_position(start)
    begin = first_pass * total + (index >> CHUNK_BITS) * size
    raw = corpus.passes(seed, begin).enumerate(start=begin)
    return raw.map(lambda i, pair: (i, *pair)).group_by_window(
        key, chunk_batches, window_size_func=window_size
    )


def _chunk_batcher(keep, tokenizer, chunks: int, start: int, shard, positions: bool, **kwargs):
    """`group_by_window`'s reduce function: the batches of one chunk's window of raw pairs
    (`make_batches` with `kwargs`), from the batch at `start` on in its own chunk."""
    first_pass, index = split_position(start)
    first_chunk, skip = index >> CHUNK_BITS, index & ((1 << CHUNK_BITS) - 1)

    def chunk_batches(key, window):
        epoch, chunk = key // chunks, key % chunks
        pairs = window.map(lambda i, src, tgt: (src, tgt))
        pairs = keep(pairs) if keep else pairs
        if shard is not None:
            pairs = pairs.shard(shard[1], shard[0])
        batches = make_batches(
            pairs,
            tokenizer,
            epoch=epoch + tf.bitwise.left_shift(chunk, tf.constant(POSITION_BITS, tf.int64)),
            prefetch=False,
            **kwargs,
        )
        if positions:
            batches = _tag_positions(batches, epoch, chunk)
        resumed = tf.logical_and(epoch == first_pass, chunk == first_chunk)
        return batches.skip(tf.where(resumed, tf.constant(skip, tf.int64), 0))

    return chunk_batches


def _chunking(total: int | None, chunk_pairs: int | None) -> tuple[int, int, int]:
    """(raw pairs per pass, raw pairs per chunk, chunks per pass) of a corpus of `total`."""
    if not total:
        raise PipelineError("the training corpus's number of pairs must be known and positive")
    size = chunk_size(total, chunk_pairs or CHUNK_PAIRS)
    return total, size, -(-total // size)


def _windows(total: int, size: int, chunks: int):
    """`group_by_window`'s key and window size functions: one window per chunk of a pass."""

    def key(i, src, tgt):  # the chunk of raw pair i of the stream, counted over the passes
        return (i // total) * chunks + (i % total) // size

    def window_size(key):  # the last chunk of a pass holds the rest
        last = tf.constant(total - (chunks - 1) * size, tf.int64)
        return tf.where(key % chunks == chunks - 1, last, tf.constant(size, tf.int64))

    return key, window_size


def _tag_positions(batches: tf.data.Dataset, epoch: tf.Tensor, chunk: tf.Tensor):
    """A chunk's batches with every row tagged with its batch's `stream_position`."""

    def tag(index, batch):
        (src, tgt_in), tgt_out = batch
        shifted = tf.bitwise.left_shift(epoch, tf.constant(POSITION_BITS, tf.int64))
        shifted |= tf.bitwise.left_shift(chunk, tf.constant(CHUNK_BITS, tf.int64))
        here = tf.bitwise.bitwise_or(shifted, index)
        return (src, tgt_in), tgt_out, tf.fill(tf.shape(src)[:1], here)

    return batches.enumerate().map(tag)
