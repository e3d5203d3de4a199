"""Reference decoders for the search tests: plain Python loops over the whole batch, with no
sentence leaving it, written for clarity rather than speed."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def greedy(step_fn, initial_ids, cache, max_lengths, eos_id, min_length=None):
    """The most probable token at every step (eos banned before `min_length`, forced at a
    sentence's max length): (sequences (B, L) int32 with 0 after eos, log-probs (B,))."""
    ids = np.asarray(initial_ids, np.int32)
    max_lengths = np.asarray(max_lengths)
    batch, length = len(ids), int(max(max_lengths.max(initial=0), 1))
    out = np.zeros([batch, length], np.int32)
    scores = np.zeros([batch], np.float64)
    done = np.zeros([batch], bool)
    for step in range(length):
        if done.all():
            break
        logits, cache = step_fn(tf.constant(ids), tf.constant(step), cache)
        lp = tf.nn.log_softmax(tf.cast(logits, tf.float32)).numpy()
        choice = lp.copy()
        if min_length is not None and step + 1 < min_length:
            choice[:, eos_id] = -np.inf
        token = choice.argmax(-1).astype(np.int32)
        token[step + 1 >= max_lengths] = eos_id
        for i in np.flatnonzero(~done):
            out[i, step] = token[i]
            scores[i] += lp[i, token[i]]
        done |= token == eos_id
        ids = np.where(done, eos_id, token).astype(np.int32)
    return out, scores.astype(np.float32)


def model_greedy(model, source, max_lengths, bos_id, eos_id, min_length=None):
    """`greedy` over a Transformer's `decode_step` for (B, S) source ids."""
    cache = model.init_cache(model.encode(source), source)
    bos = np.full([int(tf.shape(source)[0])], bos_id, np.int32)
    return greedy(model.decode_step, bos, cache, max_lengths, eos_id, min_length)
