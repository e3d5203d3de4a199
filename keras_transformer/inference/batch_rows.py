"""The search's working batch: which sentences are still live, where they sit in the batch,
and how their rows leave it once settled (compaction), inside a `tf.while_loop`.

A loop carries the live sentences only (b of the B, in batch order) and, for each, its
position in the batch ("index"): at every step the settled ones are written into the output
at their positions (`settle`) and gathered out of every per-sentence tensor and of the step
function's cache, so that the steps that follow compute the live sentences only. The cache's
top-level "sentence" entry (one row per sentence, e.g. cross-attention keys and values) is
gathered only at the steps where a sentence settles; "constant" is never carried.
"""

from __future__ import annotations

import tensorflow as tf

SPECIAL = ("sentence", "constant")


def write(sequences, position, values):
    """sequences (..., L + 1) with `values` (...) written at `position`."""
    slot = tf.equal(tf.range(tf.shape(sequences)[-1]), position)
    return tf.where(slot, values[..., tf.newaxis], sequences)


def free_batch(state):
    """Shape invariants: any axis of the step function's cache (the last entry of `state`)
    may change in the loop (live sentences leave; a self-attention cache grows one position
    per step, a record of positions one column), except the last axis of a floating-point
    tensor of rank >= 2 (its feature depth, which stays known to the step function); the
    search's own tensors keep only their rank."""
    *fixed, cache = state

    def free(t):
        keep = t.dtype.is_floating and t.shape.rank >= 2
        return tf.TensorShape([None] * (t.shape.rank - keep)).concatenate(
            t.shape[-1:] if keep else []
        )

    fixed = tf.nest.map_structure(lambda t: tf.TensorShape([None] * t.shape.rank), fixed)
    return (*fixed, tf.nest.map_structure(free, cache))


def nest_shapes(structure):
    return tf.nest.map_structure(lambda t: t.shape, structure)


def split(cache):
    """(the top-level "sentence" entry or {}, "constant" or {}, the rest of the cache)."""
    if not isinstance(cache, dict):
        return {}, {}, cache
    rest = {k: v for k, v in cache.items() if k not in SPECIAL}
    return cache.get("sentence", {}), cache.get("constant", {}), rest


def joiner(initial_cache):
    """A function (sentence, rest) -> the step function's cache, with the initial "constant"
    entry (a loop invariant, captured by the loop body) and the top-level keys it had."""
    keys = [k for k in SPECIAL if isinstance(initial_cache, dict) and k in initial_cache]
    _, constant, _ = split(initial_cache)

    def join(sentence, rest):
        special = {"sentence": sentence, "constant": constant}
        return {**rest, **{k: special[k] for k in keys}}

    return join


def rows(mask):
    """int32 positions where the (b,) bool `mask` is True."""
    return tf.cast(tf.where(mask)[:, 0], tf.int32)


def settle(out, index, done, values):
    """Write the rows of `values` where `done` into `out` at their batch positions `index`."""
    done_rows = rows(done)
    positions = tf.gather(index, done_rows)[:, tf.newaxis]
    return [
        tf.tensor_scatter_nd_update(o, positions, tf.gather(v, done_rows))
        for o, v in zip(out, values, strict=True)
    ]


def shrink_sentences(sentence, done, stay):
    """Keep the rows (sentences) `stay` of the "sentence" cache, if any sentence is `done`."""
    if not tf.nest.flatten(sentence):
        return sentence

    def shrink():
        return tf.nest.map_structure(lambda t: tf.gather(t, stay), sentence)

    return tf.cond(tf.reduce_any(done), shrink, lambda: sentence)


def per_sentence(value, batch, dtype):
    """A scalar or (B,) option as a (B,) tensor."""
    value = tf.convert_to_tensor(value, dtype)
    return tf.broadcast_to(value, [batch]) if value.shape.rank == 0 else value
