"""Boolean masks built once from token ids, and their additive (float32) form.

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


# A finite "minus infinity" for float32 attention scores (the softmax is always in float32,
# also under mixed precision, so the bias never meets float16, whose maximum is 65504)
LARGE_NEGATIVE = -1.0e9


def attention_bias(mask: tf.Tensor | None) -> tf.Tensor | None:
    """Boolean mask -> float32 additive bias of the same shape: 0 where allowed,
    LARGE_NEGATIVE elsewhere.

    Added to float32 scores, a masked key gets exactly zero softmax weight, and a fully
    masked row a uniform (finite) one instead of NaN.
    """
    if mask is None:
        return None
    return tf.where(mask, 0.0, LARGE_NEGATIVE)
