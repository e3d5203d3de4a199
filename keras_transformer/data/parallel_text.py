"""`ParallelText`: a corpus as `tf.data` of (source, target) string pairs, and the errors of
bad input data.

A corpus is read whole (`dataset`) or, for training, as contiguous pieces that every pass
interleaves in an order of its own drawn from (seed, pass) (`ParallelText.epoch`). The
sources that make one: `text_files` (local files), `multi30k`, `tfds_source`; `sources`
dispatches on `--dataset`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from keras_transformer.errors import KerasTransformerError

BLOCK_SPEC = (tf.TensorSpec((None,), tf.string), tf.TensorSpec((None,), tf.string))


class DataError(KerasTransformerError, ValueError):
    """Bad or missing input data; the message names the file, line or flag."""


class DataMissing(DataError):
    """The corpus is not where it is looked for (a file not found, Multi30k not downloaded,
    a TFDS dataset not prepared): `kt-train --dry-run` plans without it."""


@dataclasses.dataclass
class ParallelText:
    """A dataset of (source, target) tf.string pairs and what was skipped to make it."""

    dataset: tf.data.Dataset
    description: str
    num_pairs: int | None = None
    skipped_empty: int = 0
    skipped_invalid_utf8: int = 0
    # Contiguous pieces of the corpus (with their sizes) that `epoch` interleaves in an order
    # drawn from (seed, epoch), as datasets or read by `read_order`; sizes None: one piece,
    # read in file order. `keep` filters them.
    pieces: list[tf.data.Dataset] | None = None
    piece_sizes: list[int] | None = None
    keep: Callable[[tf.data.Dataset], tf.data.Dataset] | None = None
    # `dataset` before `keep`: every one of the `num_pairs` pairs (a mixture counts them)
    unfiltered: tf.data.Dataset | None = None
    # `seek(i, k)`: piece i from its pair k on, without reading the pairs before it as
    # tf.data elements (None: `pieces[i].skip(k)`)
    seek: Callable[[int, int], tf.data.Dataset] | None = None
    # `read_order(order, before)`: instead of `pieces` (a file corpus), one generator of the
    # pairs of the pieces in `order` (NumPy int64, the piece of each pair), piece i read
    # from its pair before[i] on, in blocks (a list of sources, a list of targets): no
    # dataset per piece to build at every pass, and not one Python call per pair
    read_order: Callable[[np.ndarray, np.ndarray], Iterator[tuple[list, list]]] | None = None

    @tf.autograph.experimental.do_not_convert
    def epoch(
        self, seed: int, epoch: int | tf.Tensor, filtered: bool = True, start: int | tf.Tensor = 0
    ) -> tf.data.Dataset:
        """Every pair once, in the order of pass `epoch`: the pieces interleaved at random
        (stateless, from `seed` and `epoch`), each read front to back. With `filtered`
        False, `keep` is not applied: exactly `num_pairs` pairs. From the pass's pair
        `start` on (counted before `keep`): each piece skips, unread by anything after it,
        the pairs of it that the order gives before `start` (`read_order`: in Python; else,
        for a Python int `start` in eager mode, through `seek`, reading no pair before it as
        a tf.data element)."""
        if not self.piece_sizes:
            data = self.dataset if filtered or self.unfiltered is None else self.unfiltered
            return data.skip(tf.cast(start, tf.int64))
        count = len(self.piece_sizes)
        choice = tf.repeat(tf.range(count, dtype=tf.int64), self.piece_sizes)
        pass_seed = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
        order = tf.random.experimental.stateless_shuffle(choice, seed=pass_seed)
        before = drawn(order[: tf.cast(start, tf.int64)], count)
        rest = order[tf.cast(start, tf.int64) :]
        if self.read_order is not None:
            pairs = tf.data.Dataset.from_generator(
                self.read_order, output_signature=BLOCK_SPEC, args=(rest, before)
            ).unbatch()
        else:
            pairs = tf.data.Dataset.choose_from_datasets(
                self._skipped_pieces(start, before),
                tf.data.Dataset.from_tensor_slices(rest),
                stop_on_empty_dataset=False,
            )
        return self.keep(pairs) if self.keep and filtered else pairs

    def _skipped_pieces(self, start, before: tf.Tensor) -> list[tf.data.Dataset]:
        """`pieces`, piece i without its first before[i] pairs."""
        if isinstance(start, int) and tf.executing_eagerly():
            seek = self.seek or (lambda i, k: self.pieces[i].skip(k))
            return [
                seek(i, int(k)) if k else p
                for i, (p, k) in enumerate(zip(self.pieces, before.numpy()))
            ]
        return [piece.skip(before[i]) for i, piece in enumerate(self.pieces)]

    @tf.autograph.experimental.do_not_convert
    def passes(self, seed: int, start: int = 0) -> tf.data.Dataset:
        """The endless stream of passes (pass p: `epoch(seed, p, filtered=False)`, exactly
        `num_pairs` pairs), from its raw pair `start` (a Python int) on: the pass it falls in
        is placed there by `epoch(..., start=)`, the later ones read from their starts."""
        first, offset = divmod(start, self.num_pairs)
        rest = tf.data.Dataset.counter(first + 1).flat_map(
            lambda p: self.epoch(seed, p, filtered=False)
        )
        return self.epoch(seed, first, filtered=False, start=offset).concatenate(rest)

    def report(self) -> str:
        parts = [self.description]
        if self.num_pairs is not None:
            parts.append(f"{self.num_pairs} pairs")
        if self.skipped_empty:
            parts.append(f"skipped {self.skipped_empty} pairs with an empty line")
        if self.skipped_invalid_utf8:
            parts.append(f"skipped {self.skipped_invalid_utf8} pairs with invalid UTF-8")
        return ", ".join(parts)


def drawn(order: tf.Tensor, count: int) -> tf.Tensor:
    """(count,) int64: how many times `order` (int64 indices < count) gives each index."""
    return tf.math.bincount(
        tf.cast(order, tf.int32), minlength=count, maxlength=count, dtype=tf.int64
    )


def numpy_pairs(dataset: tf.data.Dataset, block: int = 1024):
    """The (source, target) pairs of `dataset` as bytes, in order, read `block` at a time
    (eager iteration costs about as much per block as per pair)."""
    for sources, targets in dataset.batch(block).as_numpy_iterator():
        yield from zip(sources, targets)
