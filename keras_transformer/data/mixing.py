"""Several training corpora drawn from with sampling weights, as one training source.

A `MixedText` has the interface `training_batches` reads from a `ParallelText` (`epoch`,
`dataset`, `num_pairs`, `report`), so the training stream, its stream positions and an exact
resume work as for one corpus:

- Every corpus streams on its own: pass p of corpus i is every pair of it once, in the order
  `ParallelText.epoch(seed, p)` gives (TFDS pieces interleaved), shuffled with a buffer whose
  seed depends only on (seed, i, p). The passes follow each other without end.
- A mixed pass (one "epoch" of the training stream) draws as many pairs as the corpora hold
  together, N = n_1 + ... + n_k, and takes exactly q_i of them from corpus i, q_i
  proportional to its weight (largest remainder). Which corpus gives the j-th pair is a
  stateless shuffle of the quotas seeded by (seed, epoch), read by
  `tf.data.Dataset.choose_from_datasets`. Corpus i therefore stands at pair e * q_i of its own
  stream when mixed pass e starts: a pass is rebuilt from (seed, e) alone, and the stream
  position `training_batches` checkpoints (pass, batch in the pass) is enough to resume.
- Weights omitted: proportional to the sizes, so a mixed pass is one pass over every corpus.
- A tagged corpus's sources start with `TAG` and a space (Caswell et al., 2019, tagged
  back-translation); `TAG` is a user-defined SentencePiece symbol, so it is one id.
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.data.pipeline import _shuffle_with_seed
from keras_transformer.data.sources import DataError, ParallelText

TAG = "<BT>"  # the reserved SentencePiece symbol of a tagged corpus
SHUFFLE_BUFFER = 20_000  # pairs in each corpus's own shuffle buffer
_MIX_SALT = 0x6D6978  # separates the mix's seed from the corpora's ("mix")


def quotas(sizes: list[int], weights: list[float]) -> list[int]:
    """Pairs taken from each corpus in one mixed pass of sum(sizes) pairs: proportional to
    `weights`, rounded by largest remainder (ties to the first), at least 1 each."""
    total, norm = sum(sizes), sum(weights)
    exact = [total * w / norm for w in weights]
    out = [max(1, int(x)) for x in exact]
    by_remainder = sorted(range(len(out)), key=lambda i: (-(exact[i] - int(exact[i])), i))
    for i in by_remainder[: max(0, total - sum(out))]:
        out[i] += 1
    return out


class MixedText:
    """Several `ParallelText` training corpora mixed with `weights` (None: by size).

    `tagged` holds the (0-based) indices of the corpora whose sources get `TAG`.
    """

    def __init__(
        self,
        corpora: list[ParallelText],
        weights: list[float] | None = None,
        tagged: tuple[int, ...] = (),
        shuffle_buffer: int = SHUFFLE_BUFFER,
    ):
        sizes = [c.num_pairs for c in corpora]
        for corpus, size in zip(corpora, sizes):
            if not size:
                raise DataError(f"training corpus {corpus.description} has no pairs")
        self.corpora, self.sizes, self.tagged = list(corpora), sizes, tuple(tagged)
        self.weights = list(weights) if weights else [float(n) for n in sizes]
        self.quotas = quotas(sizes, self.weights)
        self.num_pairs = sum(self.quotas)
        self.shuffle_buffer = shuffle_buffer
        self.description = " + ".join(c.description for c in corpora)

    @property
    def dataset(self) -> tf.data.Dataset:
        """Every corpus once, one after the other, untagged (what SentencePiece trains on)."""
        data = self.corpora[0].dataset
        for corpus in self.corpora[1:]:
            data = data.concatenate(corpus.dataset)
        return data

    def stream(self, index: int, seed: int, start: int | tf.Tensor) -> tf.data.Dataset:
        """Corpus `index`'s endless stream of passes, from its pair `start` on."""
        corpus, size = self.corpora[index], self.sizes[index]
        start = tf.cast(start, tf.int64)

        def one_pass(p):
            pass_seed = tf.random.stateless_uniform(
                [], seed=tf.stack([tf.constant(seed, tf.int64) * 1_000 + index, p]),
                minval=None, maxval=None, dtype=tf.int64,
            )  # fmt: skip
            pairs = corpus.epoch(seed, p, filtered=False)
            return _shuffle_with_seed(pairs, self.shuffle_buffer, pass_seed)

        passes = tf.data.Dataset.range(start // size, tf.int64.max).flat_map(one_pass)
        data = passes.skip(start % size)
        if index in self.tagged:
            data = data.map(lambda s, t: (tf.strings.join([TAG, s], separator=" "), t))
        return data

    def epoch(self, seed: int, epoch: int | tf.Tensor) -> tf.data.Dataset:
        """Mixed pass `epoch`: `num_pairs` pairs, `quotas[i]` of them from corpus i, in an
        order that depends only on (`seed`, `epoch`)."""
        epoch = tf.cast(epoch, tf.int64)
        streams = [self.stream(i, seed, epoch * q) for i, q in enumerate(self.quotas)]
        choice = tf.repeat(tf.range(len(self.quotas), dtype=tf.int64), self.quotas)
        mix_seed = tf.random.experimental.stateless_fold_in(
            tf.stack([tf.constant(seed, tf.int64), epoch]), _MIX_SALT
        )
        order = tf.random.experimental.stateless_shuffle(choice, seed=mix_seed)
        pairs = tf.data.Dataset.choose_from_datasets(
            streams, tf.data.Dataset.from_tensor_slices(order), stop_on_empty_dataset=True
        )
        keep = next((c.keep for c in self.corpora if c.keep), None)
        return keep(pairs) if keep else pairs  # after the choice: counts stay exact

    def report(self) -> str:
        share = [q / self.num_pairs for q in self.quotas]
        parts = [
            f"[{i + 1}] {c.report()}, {100 * s:.1f}% of the mix"
            + (f", tagged {TAG}" if i in self.tagged else "")
            for i, (c, s) in enumerate(zip(self.corpora, share))
        ]
        return f"{len(self.corpora)} corpora, {self.num_pairs} pairs per epoch: " + "; ".join(parts)


__all__ = ["TAG", "MixedText", "quotas"]
