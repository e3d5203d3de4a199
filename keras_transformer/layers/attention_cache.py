"""The self-attention cache of incremental decoding: one step's keys and values appended.

A cache is {"k": (R, h, t G, d_k), "v": (R, h, t G, d_v)} after t steps, R rows each shared
by G consecutive query rows (the G beams of a sentence): position tau G + g holds what query
row g of the group wrote at step tau (see `MultiHeadAttention`). It may also hold "recent_k"
and "recent_v": the positions are then kept in two blocks, "k"/"v" followed by the last
steps in "recent_k"/"recent_v".

A fixed-capacity cache (for XLA, whose loops need static shapes) is instead
{"buffer_k": (R, h, C G, d_k), "buffer_v": (R, h, C G, d_v)}, room for C steps in the same
layout: a step writes its G positions in place and attention runs over all C G positions, the
ones not written yet masked by the caller (`Transformer.decode_step`).
"""

from __future__ import annotations

import tensorflow as tf

RECENT_STEPS = 8  # decoding steps a cache's recent block holds before it joins the main one


def append_step(cache: dict, k: tf.Tensor, v: tf.Tensor, group, step=None):
    """Append this step's (R, h, G, d) keys/values as positions t G ... t G + G - 1.

    O(t) per step, not O(L) as a fixed L-slot cache written with a mask; the attention runs
    over the decoded positions only, and beam search never has to reorder (copy) the cache.
    With the two blocks, a step copies only the recent block (at most RECENT_STEPS steps),
    and every RECENT_STEPS steps the recent block moves to the end of the main one.

    Args:
        cache: as in the module docstring, in its own dtype (k and v are cast to it).
        k: (R, h, G, d_k) this step's keys; v: (R, h, G, d_v) its values.
        group: G.
        step: the step being decoded (a fixed-capacity cache only: its positions are
            written at step G ... step G + G - 1).

    Returns:
        (keys, values, new cache): keys and values a tensor each, or with two blocks the
        lists [main, recent] (attend to both in order; see `ScaledDotProductAttention`).
    """
    if "buffer_k" in cache:
        return write_step(cache, k, v, group, step)
    k, v = tf.cast(k, cache["k"].dtype), tf.cast(v, cache["v"].dtype)
    if "recent_k" not in cache:
        cache = {"k": tf.concat([cache["k"], k], 2), "v": tf.concat([cache["v"], v], 2)}
        return cache["k"], cache["v"], cache
    recent_k = tf.concat([cache["recent_k"], k], 2)
    recent_v = tf.concat([cache["recent_v"], v], 2)
    blocks = [cache["k"], recent_k], [cache["v"], recent_v]

    def move():  # the recent block joins the main one, and starts again empty
        return (tf.concat(blocks[0], 2), tf.concat(blocks[1], 2),
                recent_k[:, :, :0], recent_v[:, :, :0])  # fmt: skip

    full = tf.shape(recent_k)[2] >= RECENT_STEPS * group
    moved = tf.cond(full, move, lambda: (cache["k"], cache["v"], recent_k, recent_v))
    return (*blocks, dict(zip(("k", "v", "recent_k", "recent_v"), moved)))


def write_step(cache: dict, k: tf.Tensor, v: tf.Tensor, group, step):
    """A fixed-capacity cache with this step's (R, h, G, d) keys/values written at positions
    step G ... step G + G - 1: (keys, values, new cache), the keys and values being the whole
    buffers (C G positions)."""
    size = tf.shape(cache["buffer_k"])[2]
    # position tau G + g holds row g's key of step tau: the step's G keys tiled over C
    here = tf.equal(tf.range(size) // group, step)[tf.newaxis, tf.newaxis, :, tf.newaxis]
    new = {}
    for name, x in (("buffer_k", k), ("buffer_v", v)):
        buffer = cache[name]
        x = tf.tile(tf.cast(x, buffer.dtype), [1, 1, size // group, 1])
        new[name] = tf.where(here, x, buffer)
    return new["buffer_k"], new["buffer_v"], new
