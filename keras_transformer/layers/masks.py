"""Boolean masks built once from token ids, and their dtype-safe additive form.

Convention: a mask is a boolean tensor, True where attention is allowed. Masks broadcast
against attention scores of shape (B, h, T, S).
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.config import PAD_ID


def padding_mask(ids: tf.Tensor) -> tf.Tensor:
    """(B, S) int ids -> (B, S) bool, True on real tokens."""
    return tf.not_equal(ids, PAD_ID)


def key_padding_mask(ids: tf.Tensor) -> tf.Tensor:
    """(B, S) int ids -> (B, 1, 1, S) bool attention mask over keys."""
    return padding_mask(ids)[:, tf.newaxis, tf.newaxis, :]


def causal_mask(length: tf.Tensor | int) -> tf.Tensor:
    """(1, 1, T, T) bool, True where key position <= query position."""
    positions = tf.range(length)
    return (positions[tf.newaxis, :] <= positions[:, tf.newaxis])[tf.newaxis, tf.newaxis]


def step_mask(step: tf.Tensor | int, max_length: tf.Tensor | int) -> tf.Tensor:
    """(1, 1, 1, L) bool, True on cache slots 0..step (incremental decoding)."""
    return (tf.range(max_length) <= step)[tf.newaxis, tf.newaxis, tf.newaxis, :]


def history_mask(slots: tf.Tensor, groups: tf.Tensor | int) -> tf.Tensor:
    """(N, t) int32 slots -> (R, 1, G, t G) bool, R = `groups`, G = N / R: for incremental
    decoding with a cache shared by G consecutive rows (the beams of a sentence), where
    position tau G + g holds what row g of the group wrote at step tau and `slots[n, tau]`
    is the g whose key row n's hypothesis wrote at step tau (its own history, as beam
    search reorders the beams). True where query row n may attend."""
    slots = tf.convert_to_tensor(slots, tf.int32)
    group = tf.shape(slots)[0] // groups
    allowed = tf.equal(slots[:, :, tf.newaxis], tf.range(group))  # (N, t, G)
    return tf.reshape(allowed, [groups, 1, group, -1])


def large_negative(dtype: tf.DType) -> float:
    """A finite "minus infinity" that is safe in `dtype` (never -1e9 in float16)."""
    dtype = tf.as_dtype(dtype)
    if dtype == tf.float16:
        return -3.0e4  # float16 max is 65504; leave headroom so sums stay finite
    return -1.0e9


def attention_bias(mask: tf.Tensor | None, dtype: tf.DType = tf.float32) -> tf.Tensor | None:
    """Boolean mask -> additive bias in `dtype`: 0 where allowed, a large finite negative elsewhere.

    A fully masked row therefore gives a uniform (finite) softmax instead of NaN.
    """
    if mask is None:
        return None
    return tf.where(mask, tf.zeros([], dtype), tf.constant(large_negative(dtype), dtype))
