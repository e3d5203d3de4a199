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
ORDER_BLOCK = 1024  # pairs a pass's generator reads and hands to tf.data at a time


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
    indexes, bad, empty, bad_lines = _check_files(source_path, target_path, pieces)
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
    sizes, read_order = _file_pieces(indexes, skip, pieces)
    return ParallelText(
        dataset=dataset,
        description=description,
        num_pairs=indexes[0].count - len(skip),
        skipped_empty=len(empty),
        skipped_invalid_utf8=len(bad),
        piece_sizes=sizes,
        read_order=read_order,
    )


def _check_files(source_path: str, target_path: str, pieces: int):
    """Check a file pair in one streaming pass: (its two `LineIndex`es, the line numbers of
    pairs with invalid UTF-8, of the other pairs with an empty side, and the invalid lines of
    each file); DataMissing or DataError when a file is missing or the line counts differ."""
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
    return indexes, bad, empty - bad, bad_lines


def _file_pieces(indexes, skip: list[int], pieces: int):
    """(the pieces' sizes, `ParallelText.read_order` reading them interleaved) of a file
    pair, or (None, None) for one piece."""
    source, target = indexes
    # both files have marks at the same line numbers (they depend on the line count alone)
    bounds = piece_bounds(source.count, source.marks, pieces)
    if pieces <= 1 or len(bounds) <= 2:
        return None, None
    skipped = set(skip)
    spans = list(zip(bounds[:-1], bounds[1:]))

    def piece(first: int, stop: int, offset: int):
        """The kept pairs of lines `first` <= i < `stop`, from the `offset`-th on (the ones
        before it passed over in Python)."""
        numbers = range(first, stop)
        for number, src, tgt in zip(numbers, source.read(first, stop), target.read(first, stop)):
            if number in skipped:
                continue
            if offset:
                offset -= 1
                continue
            yield src, tgt

    def read_order(order, before):
        readers = {}  # a piece's reader opens at its first pair in `order`
        for at in range(0, len(order), ORDER_BLOCK):
            block = ([], [])
            for i in order[at : at + ORDER_BLOCK].tolist():
                reader = readers.get(i)
                if reader is None:
                    reader = readers[i] = piece(*spans[i], int(before[i]))
                src, tgt = next(reader)
                block[0].append(src)
                block[1].append(tgt)
            yield block

    sizes = [stop - first - sum(1 for n in skip if first <= n < stop) for first, stop in spans]
    return sizes, read_order


@tf.autograph.experimental.do_not_convert
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
