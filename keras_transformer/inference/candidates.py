"""The candidate step of the search: every live row's most probable next tokens and their
log-probabilities, with eos kept out before a minimum length and tokens forced (a prefix,
eos at the maximum length).

Shapes: N live rows, V vocabulary, b live sentences (N = b x G rows each).
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.inference.sampling import sampled_log_probs

NEG_INF = -1.0e9  # finite: float32 log-probabilities only, never float16
TOP_K_BLOCK = 64  # vocabulary block of the two-stage top-k


def row_top_k(logits, count):
    """Exact top `count` of every row of (N, V) float32 logits, in two small stages:
    (values (N, count), ids (N, count) int32, row max (N, 1)).

    The row is cut into blocks of TOP_K_BLOCK; every one of the `count` largest entries lies
    in one of the `count` blocks with the largest maxima (a block ranked lower has `count`
    larger entries elsewhere), so one max-reduction over the row and two top-k's over
    (N, V / 64) and (N, count x 64) replace a top-k over (N, V), the slowest op of a step.
    """
    vocab = logits.shape[-1]
    if vocab is None or vocab < 4 * TOP_K_BLOCK:
        values, ids = tf.math.top_k(logits, k=count)
        return values, ids, tf.reduce_max(logits, axis=-1, keepdims=True)
    blocks = -(-vocab // TOP_K_BLOCK)
    if blocks * TOP_K_BLOCK != vocab:
        logits = tf.pad(
            logits, [[0, 0], [0, blocks * TOP_K_BLOCK - vocab]], constant_values=-float("inf")
        )
    rows = tf.shape(logits)[0]
    x = tf.reshape(logits, [rows, blocks, TOP_K_BLOCK])
    block_max = tf.reduce_max(x, axis=-1)  # (N, blocks)
    _, top_blocks = tf.math.top_k(block_max, k=tf.minimum(count, blocks))
    candidates = tf.reshape(tf.gather(x, top_blocks, batch_dims=1), [rows, -1])
    values, position = tf.math.top_k(candidates, k=count)
    block = tf.gather(top_blocks, position // TOP_K_BLOCK, batch_dims=1)
    ids = block * TOP_K_BLOCK + position % TOP_K_BLOCK
    return values, ids, tf.reduce_max(block_max, axis=-1, keepdims=True)


def top_log_probs(logits, step, count, eos_id, min_length=None):
    """The `count` most probable next tokens of every row: (log-probs (N, count) float32,
    ids (N, count) int32, logsumexp (N, 1)), best first (ties: the lower id first).

    Before `min_length` (step + 1 < min_length) eos is not a candidate: the top count + 1
    are formed and eos dropped from them, so the other tokens keep their log-probabilities
    under the full distribution (not renormalized over the tokens allowed: the score stays
    the model's log-probability of the output, as `score` gives it). CTranslate2's
    min_decoding_length differs there: it masks eos before its log-softmax, which
    renormalizes; its scores are then higher by -log(1 - p(eos)) at every step before the
    minimum, and the candidates of a row rank the same either way.
    Log-probabilities are logits - logsumexp(logits) in float32; only the top `count` of each
    row are ever formed (the full (N, V) log-softmax and masking would be four more passes
    over the largest tensor of the step). logsumexp = max + log(sum(exp(logits - max))) is
    read off the fused softmax op (one kernel, faster than Sub, Exp and Sum): the row
    maximum's probability is exactly 1 / sum(exp(logits - max)), and it is >= 1 / V, so its
    log is well conditioned.
    """
    # one more, to drop eos from, when the vocabulary has one more
    formed = count if min_length is None else tf.minimum(count + 1, tf.shape(logits)[-1])
    top_logits, top_ids, row_max = row_top_k(logits, formed)
    max_prob = tf.gather(tf.nn.softmax(logits), top_ids[:, :1], batch_dims=1)  # (N, 1)
    normalizer = row_max - tf.math.log(max_prob)  # logsumexp (N, 1)
    if min_length is not None:
        banned = tf.logical_and(tf.equal(top_ids, eos_id), step + 1 < min_length)
        top_logits, keep = tf.math.top_k(tf.where(banned, NEG_INF, top_logits), k=count)
        top_ids = tf.gather(top_ids, keep, batch_dims=1)
    return top_logits - normalizer, top_ids, normalizer


def with_forced(logits, normalizer, top_lp, top_ids, forced):
    """Rows whose `forced` (N,) token is >= 0 (a prefix token, or eos at the max length) get
    that token's log-prob first and NEG_INF after it; the other rows keep their candidates."""
    token = tf.maximum(forced, 0)[:, tf.newaxis]
    forced_lp = tf.gather(logits, token, batch_dims=1) - normalizer  # (N, 1)
    first = tf.equal(tf.range(tf.shape(top_lp)[1]), 0)[tf.newaxis, :]
    is_forced = (forced >= 0)[:, tf.newaxis]
    return (
        tf.where(is_forced, tf.where(first, forced_lp, NEG_INF), top_lp),
        tf.where(is_forced, token, top_ids),
    )


def next_tokens(logits, step, per, count, group, eos_id, min_length, sampling, prefix_end):
    """(log-probs (N, count), ids (N, count)) of every row's next token, best first.

    Args:
        logits: (N, V) the step's logits, N = b x `group` rows (G consecutive per sentence).
        per: the live sentences' options, (b, ...) each: "max_length" (b,), "prefix"
            (b, P + 1) (-1 after a sentence's prefix) and, when `sampling`, "sampling".
        group: G, a Python int or a scalar tensor.
        sampling: True to draw the token (`sampling.sampled_log_probs`), else the most
            probable ones (`top_log_probs`); either way eos is kept out before `min_length`.
        prefix_end: P, the column of "prefix" read once every prefix is done.
    """
    logits = tf.cast(logits, tf.float32)
    if sampling:
        top_lp, top_ids, normalizer = sampled_log_probs(
            logits, step, count, per["sampling"], eos_id, min_length
        )
    else:
        top_lp, top_ids, normalizer = top_log_probs(logits, step, count, eos_id, min_length)
    ct2 = per.get("ctranslate2", tf.zeros_like(per["max_length"], tf.bool))  # (b,)
    token = tf.gather(per["prefix"], tf.minimum(step, prefix_end), axis=1)  # (b,)
    # eos forced at the maximum length, but under the finish rule "ctranslate2"
    at_max = tf.logical_and(step + 1 >= per["max_length"], tf.logical_not(ct2))
    forced = tf.where(at_max, eos_id, token)
    if not (isinstance(group, int) and group == 1):
        forced, ct2 = tf.repeat(forced, group), tf.repeat(ct2, group)
    if min_length is not None and not sampling:
        top_lp, normalizer = without_eos(logits, normalizer, top_lp, eos_id, ct2, step, min_length)
    return with_forced(logits, normalizer, top_lp, top_ids, forced)


def without_eos(logits, normalizer, top_lp, eos_id, rows, step, min_length):
    """The log-probabilities of the `rows` (N,) bool renormalized without eos before
    `min_length`, as CTranslate2's min_decoding_length masks eos before its log-softmax:
    (top_lp, normalizer) raised by -log(1 - p(eos))."""
    p_eos = tf.exp(logits[:, eos_id : eos_id + 1] - normalizer)  # (N, 1)
    renormalize = tf.logical_and(rows, step + 1 < min_length)[:, tf.newaxis]
    shift = tf.where(renormalize, tf.math.log1p(-tf.minimum(p_eos, 1.0 - 1e-7)), 0.0)
    return top_lp - shift, normalizer + shift
