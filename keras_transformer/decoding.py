"""Beam search and greedy search over a step function, in one `tf.while_loop`.

The search knows the model only through

    step_fn(ids_t (N,) int32, step scalar int32, cache) -> (logits (N, V), cache)

where N is batch (greedy) or batch * beam (beam search), and `cache` is a nested structure
of tensors whose first axis is N. Beam search reorders the cache with one gather per step,
except a top-level "static" entry (e.g. cross-attention keys and values), which is the same
for every beam of a sentence and is never reordered.

Shapes: B batch, K beam size, L maximum decode length, V vocabulary.
"""

from __future__ import annotations

import tensorflow as tf

NEG_INF = -1.0e9  # finite: float32 log-probabilities only, never float16


def length_penalty(length, alpha: float):
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016)."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _log_probs(logits, step, max_lengths, eos_id, repeat):
    """float32 log-softmax; where step + 1 reaches a sentence's max length only eos is allowed."""
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    must_end = tf.repeat(step + 1 >= max_lengths, repeat)  # (N,)
    vocab = tf.shape(log_probs)[-1]
    only_eos = tf.equal(tf.range(vocab), eos_id)[tf.newaxis, :]
    allowed = tf.logical_or(tf.logical_not(must_end)[:, tf.newaxis], only_eos)
    return tf.where(allowed, log_probs, NEG_INF)


def _write(sequences, position, values):
    """sequences (..., L + 1) with `values` (...) written at `position`."""
    slot = tf.equal(tf.range(tf.shape(sequences)[-1]), position)
    return tf.where(slot, values[..., tf.newaxis], sequences)


def _keep_shapes(new, old):
    """Give loop outputs the static shapes of the loop inputs (tf.while_loop needs them equal)."""

    def keep(n, o):
        n.set_shape(o.shape)
        return n

    return tf.nest.map_structure(keep, new, old)


def _map_cache(fn, cache):
    """Apply fn to every tensor of the cache except those under a top-level "static" key."""
    if isinstance(cache, dict) and "static" in cache:
        return {k: (v if k == "static" else tf.nest.map_structure(fn, v)) for k, v in cache.items()}
    return tf.nest.map_structure(fn, cache)


def greedy_search(step_fn, initial_ids, initial_cache, max_lengths, eos_id: int):
    """Most probable token at every step.

    Args:
        initial_ids: (B,) int32 first input ids (bos).
        initial_cache: the step function's cache for batch B.
        max_lengths: (B,) int32 longest output per sentence, eos included.
        eos_id: end-of-sequence id.

    Returns:
        (sequences (B, L) int32 without bos, eos included, 0 after; log-probs (B,) float32).
    """
    initial_ids = tf.convert_to_tensor(initial_ids, tf.int32)
    max_lengths = tf.convert_to_tensor(max_lengths, tf.int32)
    batch = tf.shape(initial_ids)[0]
    length = tf.maximum(tf.reduce_max(max_lengths), 1)  # an empty batch still has shapes
    sequences = _write(tf.zeros([batch, length + 1], tf.int32), 0, initial_ids)

    def body(step, sequences, scores, finished, cache):
        inputs = (sequences, scores, finished, cache)
        logits, cache = step_fn(sequences[:, step], step, cache)
        log_probs = _log_probs(logits, step, max_lengths, eos_id, 1)
        token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        token_lp = tf.reduce_max(log_probs, axis=-1)
        token = tf.where(finished, 0, token)
        scores += tf.where(finished, 0.0, token_lp)
        sequences = _write(sequences, step + 1, token)
        finished = tf.logical_or(finished, tf.equal(token, eos_id))
        return (step + 1, *_keep_shapes((sequences, scores, finished, cache), inputs))

    def cond(step, sequences, scores, finished, cache):
        return tf.logical_and(step < length, tf.logical_not(tf.reduce_all(finished)))

    _, sequences, scores, _, _ = tf.while_loop(
        cond,
        body,
        (tf.constant(0), sequences, tf.zeros([batch]), tf.zeros([batch], tf.bool), initial_cache),
    )
    return sequences[:, 1:], scores


def beam_search(
    step_fn,
    initial_ids,
    initial_cache,
    max_lengths,
    eos_id: int,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
):
    """Beam search with GNMT length normalization and early stopping.

    Alive and finished hypotheses are kept apart. At every step the 2K best extensions of
    the alive beams are ranked; those ending in eos within the top K join the finished pool
    (scored log p / length_penalty), the K best others stay alive. The search stops when no
    alive hypothesis can still beat the worst finished one (log-probabilities only fall, and
    the penalty is largest at the maximum length), or at the maximum length, where eos is
    forced. With beam_size 1 and alpha 0 this is greedy search.

    Args:
        initial_ids: (B,) int32 first input ids (bos).
        initial_cache: the step function's cache for batch B (tiled to B*K here).
        max_lengths: (B,) int32 longest output per sentence, eos included.
        eos_id: end-of-sequence id.
        beam_size: K (paper: 4).
        alpha: length-penalty exponent (paper: 0.6).

    Returns:
        (sequences (B, K, L) int32 best first, without bos, eos included, 0 after;
         scores (B, K) float32 length-normalized log-probabilities, best first).
    """
    k = beam_size
    if k < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    initial_ids = tf.convert_to_tensor(initial_ids, tf.int32)
    max_lengths = tf.convert_to_tensor(max_lengths, tf.int32)
    batch = tf.shape(initial_ids)[0]
    length = tf.maximum(tf.reduce_max(max_lengths), 1)
    cache = tf.nest.map_structure(lambda t: tf.repeat(t, k, axis=0), initial_cache)  # (B*K, ...)
    alive_seq = tf.zeros([batch, k, length + 1], tf.int32)
    alive_seq = _write(alive_seq, 0, tf.tile(initial_ids[:, tf.newaxis], [1, k]))
    # only the first beam is live at step 0, so the K beams do not start as copies
    alive_lp = tf.tile(tf.concat([[0.0], tf.fill([k - 1], NEG_INF)], 0)[tf.newaxis], [batch, 1])
    finished_seq = tf.zeros_like(alive_seq)
    finished_scores = tf.fill([batch, k], NEG_INF)
    max_penalty = length_penalty(max_lengths, alpha)  # (B,)

    def body(step, alive_seq, alive_lp, finished_seq, finished_scores, cache):
        inputs = (alive_seq, alive_lp, finished_seq, finished_scores, cache)
        logits, cache = step_fn(tf.reshape(alive_seq[:, :, step], [-1]), step, cache)
        log_probs = _log_probs(logits, step, max_lengths, eos_id, k)
        vocab = tf.shape(log_probs)[-1]
        candidates = tf.reshape(
            alive_lp[:, :, tf.newaxis] + tf.reshape(log_probs, [batch, k, vocab]), [batch, -1]
        )
        top_lp, top_index = tf.math.top_k(candidates, k=2 * k)  # (B, 2K)
        origin = top_index // vocab
        token = top_index % vocab
        top_seq = _write(tf.gather(alive_seq, origin, batch_dims=1), step + 1, token)
        is_eos = tf.equal(token, eos_id)
        dead = top_lp <= NEG_INF / 2  # extensions of beams that were never alive

        # finished pool: eos among the top K candidates, length-normalized
        in_top_k = tf.range(2 * k)[tf.newaxis, :] < k
        new_finished = tf.logical_and(tf.logical_and(is_eos, in_top_k), tf.logical_not(dead))
        new_scores = tf.where(new_finished, top_lp / length_penalty(step + 1, alpha), NEG_INF)
        pool_scores = tf.concat([finished_scores, new_scores], axis=1)
        pool_seq = tf.concat([finished_seq, top_seq], axis=1)
        finished_scores, keep = tf.math.top_k(pool_scores, k=k)
        finished_seq = tf.gather(pool_seq, keep, batch_dims=1)

        # alive: the K best extensions that did not end
        alive_candidates = tf.where(is_eos, NEG_INF, top_lp)
        alive_lp, keep = tf.math.top_k(alive_candidates, k=k)
        alive_seq = tf.gather(top_seq, keep, batch_dims=1)
        beam_origin = tf.gather(origin, keep, batch_dims=1)
        flat_index = tf.reshape(beam_origin + k * tf.range(batch)[:, tf.newaxis], [-1])
        cache = _map_cache(lambda t: tf.gather(t, flat_index), cache)
        outputs = (alive_seq, alive_lp, finished_seq, finished_scores, cache)
        return (step + 1, *_keep_shapes(outputs, inputs))

    def cond(step, alive_seq, alive_lp, finished_seq, finished_scores, cache):
        # upper bound of any alive hypothesis's final score: log-probs only fall, and the
        # penalty is largest at the maximum length
        best_alive = alive_lp[:, 0] / max_penalty
        worst_finished = finished_scores[:, -1]
        can_improve = tf.logical_and(alive_lp[:, 0] > NEG_INF / 2, best_alive >= worst_finished)
        return tf.logical_and(step < length, tf.reduce_any(can_improve))

    _, alive_seq, alive_lp, finished_seq, finished_scores, _ = tf.while_loop(
        cond, body, (tf.constant(0), alive_seq, alive_lp, finished_seq, finished_scores, cache)
    )
    return finished_seq[:, :, 1:], finished_scores
