"""Encoder layer and encoder stack (paper section 3.1)."""

from __future__ import annotations

import keras

from keras_transformer.layers.attention import with_extras
from keras_transformer.layers.base import BlockLayer, StackLayer


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(BlockLayer):
    """Self-attention then feed-forward, each wrapped in residual + dropout + norm.

    Sublayers (also the checkpoint names): `self_attention` and `feed_forward`, each a
    `Residual` whose `sublayer` is the attention or feed-forward layer and whose `norm`
    is its LayerNormalization.

    Args:
        d_model, num_heads, d_ff: widths (paper notation).
        d_k, d_v: query/key and value depth per head (default d_model / num_heads).
        dropout_rate: residual dropout (section 5.4).
        attention_dropout, ffn_dropout: optional extra dropouts (paper: 0).
        norm_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: LayerNormalization epsilon.
        return_attention_scores: also return the self-attention weights.

    Call arguments:
        inputs: (B, S, d_model).
        attention_mask: bool (B, 1, 1, S), True on real source tokens.
        training: dropout on or off.

    Returns:
        (B, S, d_model), or `(outputs, weights (B, h, S, S) float32)` if built with
        `return_attention_scores`.

    Example:
        >>> layer = EncoderLayer(d_model=8, num_heads=2, d_ff=16)
        >>> layer(tf.zeros([2, 5, 8])).shape
        TensorShape([2, 5, 8])
    """

    def build(self, input_shape=None):
        self.self_attention = self._attention_block("self_attention", self_attention=True)
        self.feed_forward = self._feed_forward_block()
        self.built = True

    def call(self, inputs, attention_mask=None, training=None):
        x, weights = self.self_attention(inputs, attention_mask=attention_mask, training=training)
        x = self.feed_forward(x, training=training)
        return with_extras(x, weights=weights if self.return_attention_scores else None)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(StackLayer):
    """N encoder layers (plus a final norm when `norm_first`).

    Args:
        num_layers: N.
        return_attention_scores: also return the self-attention weights of every layer.
        Other arguments: as `EncoderLayer`.

    Call arguments:
        inputs: (B, S, d_model) embedded source (positions added).
        attention_mask: bool (B, 1, 1, S), True on real source tokens.
        training: dropout on or off.

    Returns:
        memory (B, S, d_model), or `(memory, [N weights (B, h, S, S)])` if built with
        `return_attention_scores`.
    """

    block_class = EncoderLayer

    def call(self, inputs, attention_mask=None, training=None):
        x, weights = inputs, []
        for block in self.blocks:
            x, block_weights = block(x, attention_mask=attention_mask, training=training)
            weights.append(block_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return with_extras(x, weights=weights if self.return_attention_scores else None)
