"""Several training corpora drawn from with sampling weights, as one training source.

A `MixedText` has the interface `training_batches` reads from a `ParallelText` (`passes`,
`epoch`, `keep`, `dataset`, `num_pairs`, `report`), so the training stream, its stream
positions and an exact resume work as for one corpus:

- Every corpus streams on its own: pass p of corpus i is every pair of it once, in the order
  `ParallelText.epoch(seed, p)` gives (pieces interleaved), cut into chunks of
  `shuffle_buffer` pairs, each shuffled whole with a seed that depends only on (seed, i, p,
  chunk). The passes follow each other without end.
- A mixed pass (one "epoch" of the training stream) draws as many pairs as the corpora hold
  together, N = n_1 + ... + n_k, and takes exactly q_i of them from corpus i, q_i
  proportional to its weight (largest remainder). Which corpus gives the j-th pair is a
  stateless shuffle of the quotas seeded by (seed, epoch), read by
  `tf.data.Dataset.choose_from_datasets`. Corpus i therefore stands at pair e * q_i of its own
  stream when mixed pass e starts, and at e * q_i plus its draws among the first j when draw
  j of it starts: `passes(seed, start)` positions every corpus's stream there once (reading
  past whole chunks of it without shuffling them) and reads each corpus on from pass to
  pass, once per pass.
- Weights omitted: proportional to the sizes, so a mixed pass is one pass over every corpus.
- A tagged corpus's sources start with `TAG` and a space (Caswell et al., 2019, tagged
  back-translation); `TAG` is a user-defined SentencePiece symbol, so it is one id.
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.data.parallel_text import DataError, ParallelText, drawn

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

    @property
    def keep(self):
        """The filter applied after the choice (a TFDS corpus's empty pairs), or None."""
        return next((c.keep for c in self.corpora if c.keep), None)

    @tf.autograph.experimental.do_not_convert
    def stream(self, index: int, seed: int, start: int) -> tf.data.Dataset:
        """Corpus `index`'s endless stream of passes, from its pair `start` (a Python int)
        on: pass p cut into chunks of `shuffle_buffer` pairs, each shuffled whole with a seed
        of (seed, index, p, chunk), so the chunks before `start` are passed over unread
        (`ParallelText.epoch(..., start=)`), and the one it falls in is read from its start."""
        corpus, size, buffer = self.corpora[index], self.sizes[index], self.shuffle_buffer

        def one_pass(p, chunk=0):
            corpus_seed = tf.constant(seed, tf.int64) * 1_000 + index
            pass_seed = tf.random.stateless_uniform(
                [], seed=tf.stack([corpus_seed, tf.cast(p, tf.int64)]),
                minval=None, maxval=None, dtype=tf.int64,
            )  # fmt: skip

            def shuffled(c, pair):
                order = tf.random.experimental.stateless_shuffle(
                    tf.range(tf.shape(pair[0])[0]), seed=tf.stack([pass_seed, c])
                )
                return tf.data.Dataset.from_tensor_slices(tuple(tf.gather(x, order) for x in pair))

            pairs = corpus.epoch(seed, p, filtered=False, start=chunk * buffer).batch(buffer)
            return pairs.enumerate(start=chunk).flat_map(shuffled)

        first, at = divmod(int(start), size)
        head = one_pass(first, at // buffer).skip(at % buffer)
        data = head.concatenate(tf.data.Dataset.range(first + 1, tf.int64.max).flat_map(one_pass))
        if index in self.tagged:
            data = data.map(lambda s, t: (tf.strings.join([TAG, s], separator=" "), t))
        return data

    def order(self, seed: int, epoch: int | tf.Tensor) -> tf.Tensor:
        """(num_pairs,) int64: the corpus of each draw of mixed pass `epoch`."""
        choice = tf.repeat(tf.range(len(self.quotas), dtype=tf.int64), self.quotas)
        mix_seed = tf.random.experimental.stateless_fold_in(
            tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)]), _MIX_SALT
        )
        return tf.random.experimental.stateless_shuffle(choice, seed=mix_seed)

    @tf.autograph.experimental.do_not_convert
    def passes(self, seed: int, start: int = 0) -> tf.data.Dataset:
        """The endless stream of mixed passes (`num_pairs` draws each, `keep` not applied)
        from its draw `start` (a Python int) on: every corpus's stream is built once,
        positioned where the draws before `start` left it, and read on from pass to pass."""
        first, offset = divmod(int(start), self.num_pairs)
        before = drawn(self.order(seed, first)[:offset], len(self.quotas)).numpy()
        streams = [
            self.stream(i, seed, first * q + int(before[i])) for i, q in enumerate(self.quotas)
        ]

        def draws(e):
            return tf.data.Dataset.from_tensor_slices(
                self.order(seed, e)[tf.where(e == first, offset, 0) :]
            )

        choice = tf.data.Dataset.counter(first).flat_map(draws)
        return tf.data.Dataset.choose_from_datasets(streams, choice, stop_on_empty_dataset=True)

    @tf.autograph.experimental.do_not_convert
    def epoch(self, seed: int, epoch: int, filtered: bool = True) -> tf.data.Dataset:
        """Mixed pass `epoch`: `num_pairs` pairs, `quotas[i]` of them from corpus i, in an
        order that depends only on (`seed`, `epoch`)."""
        pairs = self.passes(seed, int(epoch) * self.num_pairs).take(self.num_pairs)
        keep = self.keep
        return keep(pairs) if keep and filtered else pairs  # after the choice: counts stay exact

    def report(self) -> str:
        share = [q / self.num_pairs for q in self.quotas]
        parts = [
            f"[{i + 1}] {c.report()}, {100 * s:.1f}% of the mix"
            + (f", tagged {TAG}" if i in self.tagged else "")
            for i, (c, s) in enumerate(zip(self.corpora, share))
        ]
        return f"{len(self.corpora)} corpora, {self.num_pairs} pairs per epoch: " + "; ".join(parts)


__all__ = ["TAG", "MixedText", "quotas"]
