"""Subword regularization of training sentences, in the graph and deterministic.

tensorflow-text's `SentencepieceTokenizer(alpha=..., nbest_size=...)` samples through
SentencePiece's own thread-local random generator: it takes no seed, `tf.random.set_seed`
does not reach it, and which tf.data thread tokenizes which batch is not fixed, so the same
command would give other segmentations (and an exact resume would be impossible). Here the
randomness is TensorFlow's stateless RNG instead, seeded per tokenization call from
(seed, pass, index of the call in the pass), and SentencePiece only contributes deterministic
output:

- unigram (Kudo, 2018): the `UNIGRAM_NBEST` best segmentations of each sentence
  (SentencePiece's n-best, deterministic), one drawn with P proportional to
  exp(alpha * log P(segmentation)), the log-probability being the sum of the pieces' scores:
  what SentencePiece's own `nbest_size=64` sampling does.
- bpe (BPE-dropout, Provilkov et al., 2020): every merge is dropped with probability alpha,
  on the merge tree of each piece of the deterministic segmentation. A piece survives only if
  none of the merges that built it is dropped; otherwise it falls apart into the two pieces
  its last merge joined, which survive or fall apart in turn (sampled exactly, top-down,
  conditioned on their parent having fallen apart). Unlike SentencePiece's BPE-dropout, a
  dropped merge never lets a merge across two pieces of the deterministic segmentation
  happen instead: the segmentations are refinements of the deterministic one.

Every sampled segmentation decodes to the same text as the deterministic one.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_transformer.data.tokenizer import SubwordTokenizer, TokenizerError

UNIGRAM_NBEST = 64  # Kudo (2018): l = 64


def merge_tree(proto: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(left, right) (V,) int32: the two pieces the last BPE merge of piece i joined, or -1
    for a piece no merge made (characters, bytes, special and user-defined pieces).

    Found by running SentencePiece's BPE on the piece's characters alone (highest-scoring
    pair first, the leftmost of equal ones), which within a piece's span of a sentence
    makes the same merges, in the same order.
    """
    model = _model(proto)
    size = len(model.pieces)
    normal = {p.piece: i for i, p in enumerate(model.pieces) if p.type == p.NORMAL}
    score = [p.score for p in model.pieces]
    left, right = np.full(size, -1, np.int32), np.full(size, -1, np.int32)
    for piece, index in normal.items():
        symbols = list(piece)
        if len(symbols) < 2 or any(s not in normal for s in symbols):
            continue
        while len(symbols) > 2:
            best, at = None, -1
            for i in range(len(symbols) - 1):
                merged = normal.get(symbols[i] + symbols[i + 1])
                if merged is not None and (best is None or score[merged] > best):
                    best, at = score[merged], i
            if at < 0:
                break
            symbols[at : at + 2] = [symbols[at] + symbols[at + 1]]
        if len(symbols) == 2 and all(s in normal for s in symbols):
            left[index], right[index] = normal[symbols[0]], normal[symbols[1]]
    return left, right


class SubwordSampler(tf.Module):
    """Samples the segmentation of training sentences (module docstring).

    Args:
        tokenizer: the run's `SubwordTokenizer` (its model type decides the method).
        alpha: > 0; BPE: the probability of dropping a merge (< 1); unigram: the inverse
            temperature of the sampling over the n-best segmentations.

    `__call__(strings (N,) string, seed (2,) int64) -> RaggedTensor (N, None) int32`: a
    function of (strings, seed) only.
    """

    def __init__(self, tokenizer: SubwordTokenizer, alpha: float):
        super().__init__(name="subword_sampler")
        if not alpha > 0:
            raise TokenizerError(f"--subword-alpha must be > 0 to sample, got {alpha!r}")
        self.tokenizer, self.alpha = tokenizer, float(alpha)
        model = _model(tokenizer.proto)
        self.model_type = "bpe" if model.trainer_spec.model_type == BPE else "unigram"
        if self.model_type == "bpe":
            if not alpha < 1:
                raise TokenizerError(
                    f"--subword-alpha is a BPE-dropout probability < 1, got {alpha}"
                )
            self._init_bpe(tokenizer.proto)
        else:
            import tensorflow_text as tf_text

            self.scores = tf.constant([p.score for p in model.pieces], tf.float32)
            self.nbest = tf_text.SentencepieceTokenizer(
                model=tokenizer.proto, out_type=tf.int32, nbest_size=UNIGRAM_NBEST,
                return_nbest=True,
            )  # fmt: skip

    def _init_bpe(self, proto: bytes) -> None:
        left, right = merge_tree(proto)
        merges = np.zeros(len(left), np.int64)  # merges in each piece's tree
        depth = np.zeros(len(left), np.int64)
        for i in np.argsort([len(p.piece) for p in _model(proto).pieces], kind="stable"):
            if left[i] >= 0:
                merges[i] = 1 + merges[left[i]] + merges[right[i]]
                depth[i] = 1 + max(depth[left[i]], depth[right[i]])
        self.depth = int(depth.max())
        self.left = tf.constant(np.where(left >= 0, left, np.arange(len(left))), tf.int32)
        self.right = tf.constant(np.maximum(right, 0), tf.int32)
        # the probability that piece i forms: no merge of its tree dropped
        self.forms = tf.constant((1.0 - self.alpha) ** merges, tf.float32)

    def __call__(self, strings: tf.Tensor, seed: tf.Tensor) -> tf.RaggedTensor:
        if self.model_type == "bpe":
            return self._bpe_dropout(strings, seed)
        return self._unigram(strings, seed)

    def _unigram(self, strings, seed):
        candidates = self.nbest.tokenize(strings)  # (sum of c_i, None): c_i <= UNIGRAM_NBEST
        starts = _candidates_per_sentence(self.tokenizer, strings, candidates)
        grouped = tf.RaggedTensor.from_row_splits(
            self.alpha * tf.reduce_sum(tf.gather(self.scores, candidates), axis=1), starts
        )
        logits = grouped.to_tensor(default_value=float("-inf"))
        pick = tf.random.stateless_categorical(logits, 1, seed=seed, dtype=tf.int64)[:, 0]
        return tf.gather(candidates, starts[:-1] + pick)

    def _bpe_dropout(self, strings, seed):
        ids = self.tokenizer.tokenize(strings)
        values, rows = ids.flat_values, ids.value_rowids()
        draw = tf.random.stateless_uniform(tf.shape(values), seed=seed)
        split = draw >= tf.gather(self.forms, values)
        for level in range(self.depth):
            values, rows, split = self._unmerge(values, rows, split, seed, level + 1)
        return tf.RaggedTensor.from_value_rowids(values, rows, nrows=ids.nrows())

    def _unmerge(self, values, rows, split, seed, level):
        """Every piece marked `split` becomes its two children, each marked with whether it
        falls apart too, drawn given that their parent did: P(both form) is
        drop * a * b / Z, P(only the left forms) a (1 - b) / Z, P(only the right forms)
        (1 - a) b / Z, P(neither) (1 - a)(1 - b) / Z, a and b the children's `forms`,
        Z = 1 - (1 - drop) a b."""
        left, right = tf.gather(self.left, values), tf.gather(self.right, values)
        a, b = tf.gather(self.forms, left), tf.gather(self.forms, right)
        weights = tf.stack(
            [self.alpha * a * b, a * (1 - b), (1 - a) * b, (1 - a) * (1 - b)], axis=1
        )
        cumulative = tf.cumsum(weights, axis=1) / (1 - (1 - self.alpha) * a * b)[:, tf.newaxis]
        draw = tf.random.stateless_uniform(
            tf.shape(values), seed=tf.random.experimental.stateless_fold_in(seed, level)
        )
        outcome = tf.reduce_sum(tf.cast(draw[:, tf.newaxis] >= cumulative[:, :3], tf.int32), 1)
        left_splits = tf.logical_and(split, outcome >= 2)
        right_splits = tf.logical_and(split, tf.equal(outcome % 2, 1))
        pieces = tf.stack([tf.where(split, left, values), right], axis=1)
        marks = tf.stack([tf.where(split, left_splits, False), right_splits], axis=1)
        keep = tf.stack([tf.ones_like(split), split], axis=1)
        return (
            tf.boolean_mask(pieces, keep),
            tf.boolean_mask(tf.stack([rows, rows], axis=1), keep),
            tf.boolean_mask(marks, keep),
        )


def _candidates_per_sentence(tokenizer, strings, candidates) -> tf.Tensor:
    """Row splits (N + 1,) of SentencePiece's flat n-best output: where each sentence's
    candidates start (the op gives fewer than n for short sentences and does not say how
    many). A sentence's candidates are contiguous and all decode to its normalized text;
    a run of equal sentences shares its run of candidates evenly."""
    texts = tokenizer.detokenize(candidates)
    norm = tokenizer.detokenize(tokenizer.tokenize(strings))

    def runs(values):
        new = tf.concat([[True], tf.not_equal(values[1:], values[:-1])], axis=0)
        ids = tf.cumsum(tf.cast(new, tf.int64)) - 1
        return ids, tf.math.bincount(ids, dtype=tf.int64)

    block, block_size = runs(norm)
    _, run_length = runs(texts)
    check = tf.debugging.assert_equal(
        tf.size(block_size), tf.size(run_length), message="n-best output out of step"
    )
    with tf.control_dependencies([check]):
        counts = tf.gather(run_length // block_size, block)
    return tf.concat([[0], tf.cumsum(counts)], axis=0)


def _model(proto: bytes):
    """The parsed SentencePiece ModelProto."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    model = model_pb2.ModelProto()
    model.ParseFromString(proto)
    return model


BPE = 2  # sentencepiece_model_pb2.TrainerSpec.BPE


def subword_sampler(tokenizer: SubwordTokenizer, alpha: float | None) -> SubwordSampler | None:
    """The training sentences' segmentation sampler of --subword-alpha (None: off)."""
    return SubwordSampler(tokenizer, alpha) if alpha else None


__all__ = ["UNIGRAM_NBEST", "SubwordSampler", "merge_tree", "subword_sampler"]
