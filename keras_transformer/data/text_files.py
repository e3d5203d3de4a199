"""Local parallel files (plain or .gz, one sentence per line) as a `ParallelText`.

The files are checked in one streaming pass (line counts, UTF-8, empty lines) before training
starts, so bad input fails early with the file and line named; training files are then read as
contiguous pieces (`data.pieces`), each from its own starting point.
"""

from __future__ import annotations

import os
import zlib

import tensorflow as tf

from keras_transformer.data.parallel_text import DataError, DataMissing, ParallelText
from keras_transformer.data.pieces import index_lines, piece_bounds

FILE_PIECES = 64  # a training file pair is read as up to this many contiguous pieces


def _count_and_check(path: str, bad_utf8: set[int], empty: set[int], pieces: int = 1):
    """Stream one file: its `LineIndex` (line count, marks for up to `pieces` pieces), and
    record invalid-UTF-8 and empty line numbers (0-based)."""

    def visit(number, raw):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            bad_utf8.add(number)
            return
        if not text.strip():
            empty.add(number)

    try:
        return index_lines(path, max_marks=max(1, pieces), visit=visit)
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"cannot read {path}: {err}") from None


def read_parallel_files(
    source_path: str, target_path: str, pieces: int = FILE_PIECES
) -> ParallelText:
    """Line i of `source_path` translates line i of `target_path`.

    Raises DataError for a missing file or mismatched line counts. Pairs where either side
    is empty or not valid UTF-8 are skipped and counted (`ParallelText.report`). With
    `pieces` > 1 the pair of files is also read as up to that many contiguous pieces, each
    from its own starting point (`data.pieces`), which `ParallelText.epoch` interleaves in an
    order drawn from (seed, epoch): a pass then draws from the whole corpus from its first
    pairs on, e.g. a corpus made of concatenated sub-corpora, which a bounded shuffle buffer
    alone cannot mix.
    """
    for path in (source_path, target_path):
        if not os.path.isfile(path):
            raise DataMissing(f"file not found: {path}")
    bad: set[int] = set()
    empty: set[int] = set()
    bad_lines: dict[str, list[int]] = {}
    indexes = []
    for path in (source_path, target_path):
        file_bad: set[int] = set()
        indexes.append(_count_and_check(path, file_bad, empty, pieces))
        bad_lines[path] = sorted(file_bad)
        bad |= file_bad
    counts = [index.count for index in indexes]
    if counts[0] != counts[1]:
        raise DataError(
            f"line counts differ: {source_path} has {counts[0]} lines, "
            f"{target_path} has {counts[1]} lines"
        )
    empty -= bad
    skip = sorted(bad | empty)

    def lines(path):
        return tf.data.TextLineDataset(
            path, compression_type="GZIP" if path.endswith(".gz") else ""
        )

    dataset = _without_lines(tf.data.Dataset.zip((lines(source_path), lines(target_path))), skip)
    first_bad = "; ".join(
        f"first invalid UTF-8 in {path} at line {lines_[0] + 1}"
        for path, lines_ in bad_lines.items()
        if lines_
    )
    description = f"{source_path} + {target_path}" + (f" ({first_bad})" if first_bad else "")
    parts, sizes, seek = _file_pieces(indexes, skip, pieces)
    return ParallelText(
        dataset=dataset,
        description=description,
        num_pairs=counts[0] - len(skip),
        skipped_empty=len(empty),
        skipped_invalid_utf8=len(bad),
        pieces=parts,
        piece_sizes=sizes,
        seek=seek,
    )


def _file_pieces(indexes, skip: list[int], pieces: int):
    """(piece datasets, their sizes, seek) of a file pair, or (None, None, None) for one
    piece."""
    source, target = indexes
    # both files have marks at the same line numbers (they depend on the line count alone)
    bounds = piece_bounds(source.count, source.marks, pieces)
    if pieces <= 1 or len(bounds) <= 2:
        return None, None, None
    skipped = set(skip)
    spec = (tf.TensorSpec((), tf.string), tf.TensorSpec((), tf.string))

    def piece(first: int, stop: int, offset: int = 0) -> tf.data.Dataset:
        def pairs():
            numbers = range(first, stop)
            left = offset  # kept pairs to pass over in Python, not as tf.data elements
            for number, src, tgt in zip(
                numbers, source.read(first, stop), target.read(first, stop)
            ):
                if number in skipped:
                    continue
                if left:
                    left -= 1
                    continue
                yield src, tgt

        return tf.data.Dataset.from_generator(pairs, output_signature=spec)

    spans = list(zip(bounds[:-1], bounds[1:]))
    sizes = [stop - first - sum(1 for n in skip if first <= n < stop) for first, stop in spans]
    return [piece(first, stop) for first, stop in spans], sizes, lambda i, k: piece(*spans[i], k)


def _without_lines(dataset: tf.data.Dataset, skip: list[int]) -> tf.data.Dataset:
    """`dataset` without the elements at the (sorted, 0-based) positions `skip`."""
    if not skip:
        return dataset
    skip_sorted = tf.constant(skip, tf.int64)

    def keep(i, pair):
        at = tf.searchsorted(skip_sorted, [i])[0]
        return tf.logical_or(
            at >= len(skip), tf.gather(skip_sorted, tf.minimum(at, len(skip) - 1)) != i
        )

    return dataset.enumerate().filter(keep).map(lambda i, pair: pair)
