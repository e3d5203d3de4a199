"""The self-attention cache of incremental decoding: one step's keys and values appended.

A cache is {"k": (R, h, t G, d_k), "v": (R, h, t G, d_v)} after t steps, R rows each shared
by G consecutive query rows (the G beams of a sentence): position tau G + g holds what query
row g of the group wrote at step tau (see `MultiHeadAttention`). It may also hold "recent_k"
and "recent_v": the positions are then kept in two blocks, "k"/"v" followed by the last
steps in "recent_k"/"recent_v".
"""

from __future__ import annotations

import tensorflow as tf

RECENT_STEPS = 8  # decoding steps a cache's recent block holds before it joins the main one


def append_step(cache: dict, k: tf.Tensor, v: tf.Tensor, group):
    """Append this step's (R, h, G, d) keys/values as positions t G ... t G + G - 1.

    O(t) per step, not O(L) as a fixed L-slot cache written with a mask; the attention runs
    over the decoded positions only, and beam search never has to reorder (copy) the cache.
    With the two blocks, a step copies only the recent block (at most RECENT_STEPS steps),
    and every RECENT_STEPS steps the recent block moves to the end of the main one.

    Args:
        cache: as in the module docstring, in its own dtype (k and v are cast to it).
        k: (R, h, G, d_k) this step's keys; v: (R, h, G, d_v) its values.
        group: G.

    Returns:
        (keys, values, new cache): keys and values a tensor each, or with two blocks the
        lists [main, recent] (attend to both in order; see `ScaledDotProductAttention`).
    """
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
