"""The candidate step of sampling: one token drawn per row, with temperature, top-k and top-p
(nucleus, Holtzman et al., 2020), reproducible per sentence and seed.

Each row draws one uniform number from a stateless random op seeded with (its sentence's seed,
the step), so a sentence's output depends only on its own logits, options and seed, never on
the other sentences in the batch (TF Serving's batcher may put any requests together).
"""

from __future__ import annotations

import tensorflow as tf

NEG_INF = -1.0e9


def row_uniforms(seeds, step):
    """(N,) float32 in [0, 1): row n's draw from `tf.random.stateless_uniform` seeded with
    (seeds[n], step)."""
    step = tf.cast(step, tf.int64)

    def draw(seed):
        return tf.random.stateless_uniform([], seed=tf.stack([seed, step]), dtype=tf.float32)

    return tf.map_fn(draw, tf.cast(seeds, tf.int64), fn_output_signature=tf.float32)


def sampled_log_probs(logits, step, count, options, eos_id=None, min_length=None):
    """(log-probs (N, count), ids (N, count), logsumexp (N, 1)): column 0 holds the drawn
    token and its log-probability under the model (temperature 1, before any cut), the other
    columns NEG_INF.

    The token is drawn from softmax(logits / temperature) restricted to the `top_k` most
    probable tokens (0: no limit), renormalized over them, then to the smallest set of the
    most probable of those whose (renormalized) probability reaches `top_p` (1: no limit),
    renormalized again: top_p applies to what top_k kept, as in Hugging Face's and fairseq's
    sampling; top_k 1 is the argmax. Before
    `min_length` (step + 1 < min_length, eos included) eos is never drawn: it is left out
    before the cuts and the draw, as in `candidates.top_log_probs`, and the
    drawn token's log-probability stays the model's (not renormalized).

    Args:
        logits: (N, V) float32.
        options: {"temperature", "top_k", "top_p", "seed"}, each (N,).
        eos_id, min_length: eos and the shortest output, eos included; min_length None
            (the default): no minimum.
    """
    vocab = tf.shape(logits)[1]
    rows = tf.shape(logits)[0]
    normalizer = tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
    temperature = tf.cast(options["temperature"], tf.float32)[:, tf.newaxis]
    tempered = logits / temperature
    if min_length is not None:
        is_eos = tf.equal(tf.range(vocab), eos_id)[tf.newaxis, :]
        tempered = tf.where(tf.logical_and(is_eos, step + 1 < min_length), NEG_INF, tempered)
    ordered, order = tf.math.top_k(tempered, k=vocab)  # (N, V), best first
    cdf, kept = _kept_cdf(ordered, vocab, options)
    threshold = row_uniforms(options["seed"], step)[:, tf.newaxis] * cdf[:, -1:]
    position = tf.reduce_sum(tf.cast(cdf <= threshold, tf.int32), axis=1)
    position = tf.minimum(position, tf.reduce_sum(tf.cast(kept, tf.int32), axis=1) - 1)
    token = tf.gather(order, position[:, tf.newaxis], batch_dims=1)  # (N, 1)
    token_lp = tf.gather(logits, token, batch_dims=1) - normalizer
    first = tf.equal(tf.range(count), 0)[tf.newaxis, :]
    return (
        tf.where(first, token_lp, NEG_INF),
        tf.where(first, token, tf.zeros([rows, count], tf.int32)),
        normalizer,
    )


def _kept_cdf(ordered, vocab, options):
    """(cdf (N, V), kept (N, V) bool) of `ordered` (tempered logits, best first): `kept` marks
    the tokens that the top_k cut, then the top_p cut keep, `cdf` the running sum of their
    probabilities renormalized over what top_k kept (flat past the last kept token)."""
    probs = tf.nn.softmax(ordered)
    rank = tf.range(vocab)[tf.newaxis, :]
    top_k = tf.cast(options["top_k"], tf.int32)[:, tf.newaxis]
    top_k = tf.where(top_k > 0, top_k, vocab)
    in_top_k = rank < top_k
    probs = tf.where(in_top_k, probs, 0.0)
    probs = probs / tf.reduce_sum(probs, axis=1, keepdims=True)  # over what top_k kept
    before = tf.math.cumsum(probs, axis=1, exclusive=True)  # probability of the better ones
    top_p = tf.cast(options["top_p"], tf.float32)[:, tf.newaxis]
    kept = tf.logical_and(in_top_k, tf.logical_or(rank == 0, before < top_p))
    return tf.math.cumsum(tf.where(kept, probs, 0.0), axis=1), kept
