"""Scaled dot-product attention (paper section 3.2.1).

Shapes: B batch, h heads, T query length, S key length, d_k query/key and d_v value depth.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_transformer.layers import masks
from keras_transformer.layers.dropout import Dropout


@keras.saving.register_keras_serializable(package="keras_transformer")
class ScaledDotProductAttention(keras.layers.Layer):
    """softmax(Q K^T / sqrt(d_k) + bias) V, with the softmax in float32.

    Args:
        attention_dropout: dropout on the attention weights (paper: 0).

    Call arguments:
        query: (B, h, T, d_k).
        key: (B, h, S, d_k), or a list of blocks (B, h, S_i, d_k) that make the S keys
            together, in order (a decoding cache kept in two blocks): the scores of each
            block are formed apart, so the blocks are never copied into one tensor.
        value: (B, h, S, d_v), or a list of blocks as `key`.
        attention_mask: bool broadcastable to (B, h, T, S), True where allowed, or None.
        training: dropout on or off.

    Returns:
        (outputs (B, h, T, d_v) in the compute dtype, weights (B, h, T, S) float32).
        Masked keys get weight 0; a fully masked row gets uniform (finite) weights.
    """

    def __init__(self, *, attention_dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"attention_dropout must be in [0, 1), got {attention_dropout}")
        self.attention_dropout = attention_dropout

    def build(self, input_shape=None):
        self.dropout = Dropout(self.attention_dropout, dtype=self.dtype_policy, name="dropout")
        self.built = True

    def call(self, query, key, value, attention_mask=None, training=None):
        keys = list(key) if isinstance(key, (list, tuple)) else [key]
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        depth = tf.cast(tf.shape(query)[-1], query.dtype)
        query = query * tf.math.rsqrt(depth)  # scale the smaller tensor
        scores = [tf.cast(tf.matmul(query, k, transpose_b=True), tf.float32) for k in keys]
        scores = scores[0] if len(scores) == 1 else tf.concat(scores, axis=-1)  # (B, h, T, S)
        if attention_mask is not None:
            scores += masks.attention_bias(attention_mask)
        weights = tf.nn.softmax(scores, axis=-1)
        dropped = self.dropout(tf.cast(weights, values[0].dtype), training=training)
        if len(values) == 1:
            return tf.matmul(dropped, values[0]), weights
        blocks = tf.split(dropped, [tf.shape(k)[2] for k in keys], axis=-1)
        return tf.add_n([tf.matmul(w, v) for w, v in zip(blocks, values)]), weights

    def get_config(self):
        return {**super().get_config(), "attention_dropout": self.attention_dropout}
