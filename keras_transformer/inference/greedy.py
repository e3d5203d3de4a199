"""Greedy search and sampling: one hypothesis per sentence, in a loop of their own.

Beam search with beam 1 and alpha 0 (`search.beam_search`) gives exactly these outputs: its
best extension of the one live beam is the row's most probable token (the candidates' order
breaks ties by the lower id, and adding the beam's log-probability keeps it first), a
sentence's result is its first hypothesis to end in eos (an alive one can only reach a score
no higher), and scores are the same float32 sums. This loop keeps only that: per step one
candidate per row, one running score and one sequence per live sentence, no finished pool,
no beam bookkeeping, and a sentence settles when its token is eos (chosen, or forced at its
maximum length). (The beam loop also settles a sentence whose log-probability falls to
NEG_INF / 2, -5e8, which no model's log-probabilities reach.)
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.inference import batch_rows as br
from keras_transformer.inference.candidates import NEG_INF, next_tokens


def greedy_loop(step_fn, initial_ids, initial_cache, per, eos_id, min_length, sampling):
    """The most probable (or, with `sampling`, a drawn) token of every sentence at every step.

    Args:
        step_fn, initial_ids, initial_cache: as `search.beam_search` (the cache has one row
            per sentence).
        per: the batch's options, (B, ...) each: "index" (B,) range(B), "max_length" (B,)
            int32, "prefix" (B, P + 1) int32 (-1 after each prefix, a -1 column last) and,
            with `sampling`, "sampling" (see `search.sample`).
        min_length: as `search.beam_search` (None: none).
        sampling: True to draw each token.

    Returns:
        (sequences (B, 1, L) int32 without bos, eos included, 0 after; log-probabilities
         (B, 1) float32), L = max(max_length, 1).
    """
    batch = tf.shape(initial_ids)[0]
    length = tf.maximum(tf.reduce_max(per["max_length"]), 1)
    prefix_end = tf.shape(per["prefix"])[1] - 1
    join = br.joiner(initial_cache)
    sentence, _, rest = br.split(initial_cache)
    seq = br.write(tf.zeros([batch, length + 1], tf.int32), 0, initial_ids)
    out = [tf.zeros_like(seq), tf.fill([batch], NEG_INF)]

    def body(step, out, per, seq, score, sentence, rest):
        logits, cache = step_fn(seq[:, step], step, join(sentence, rest))
        sentence, _, rest = br.split(cache)
        lp, token = next_tokens(logits, step, per, 1, 1, eos_id, min_length, sampling, prefix_end)
        score = score + lp[:, 0]
        seq = br.write(seq, step + 1, token[:, 0])
        done = tf.equal(token[:, 0], eos_id)
        out = br.settle(out, per["index"], done, [seq, score])
        stay = br.rows(tf.logical_not(done))
        gather = lambda t: tf.gather(t, stay)  # noqa: E731
        per, seq, score, rest = tf.nest.map_structure(gather, (per, seq, score, rest))
        sentence = br.shrink_sentences(sentence, done, stay)
        return step + 1, out, per, seq, score, sentence, rest

    def cond(step, out, per, *_):
        return tf.logical_and(step < length, tf.size(per["index"]) > 0)

    state = (per, seq, tf.zeros([batch]), sentence, rest)
    result = tf.while_loop(
        cond,
        body,
        (tf.constant(0), out, *state),
        shape_invariants=(tf.TensorShape([]), br.nest_shapes(out), *br.free_batch(state)),
    )
    out, index = result[1], result[2]["index"]
    # every sentence settles by its maximum length; this only guards the loop's last step
    out = br.settle(out, index, tf.ones_like(index, tf.bool), list(result[3:5]))
    return out[0][:, tf.newaxis, 1:], out[1][:, tf.newaxis]
