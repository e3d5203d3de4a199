"""Encoder layer and encoder stack (paper section 3.1)."""

from __future__ import annotations

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.base import BlockLayer, StackLayer
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.residual import make_norm_and_dropout, residual


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(BlockLayer):
    """Self-attention then feed-forward, each wrapped in residual + dropout + norm.

    Args:
        d_model, num_heads, d_ff: widths (paper notation).
        dropout_rate: residual dropout (section 5.4).
        attention_dropout, ffn_dropout: optional extra dropouts (paper: 0).
        norm_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: LayerNormalization epsilon.

    Call arguments:
        inputs: (B, S, d_model).
        attention_mask: bool (B, 1, 1, S), True on real source tokens.
        training: dropout on or off.
        return_attention_scores: also return (B, h, S, S) self-attention weights.

    Returns:
        (B, S, d_model), or `(outputs, weights)`.
    """

    def build(self, input_shape=None):
        self.self_attention = MultiHeadAttention(
            num_heads=self.num_heads,
            d_model=self.d_model,
            self_attention=True,
            attention_dropout=self.attention_dropout,
            dtype=self.dtype_policy,
            name="self_attention",
        )
        self.self_attention.build()
        self.feed_forward = PositionwiseFeedForward(
            d_model=self.d_model,
            d_ff=self.d_ff,
            ffn_dropout=self.ffn_dropout,
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.feed_forward.build()
        self.attention_norm, self.attention_dropout_layer = make_norm_and_dropout(
            self, "attention", self.d_model
        )
        self.ffn_norm, self.ffn_dropout_layer = make_norm_and_dropout(self, "ffn", self.d_model)
        self.built = True

    def call(self, inputs, attention_mask=None, training=None, return_attention_scores=False):
        x, weights = residual(
            inputs,
            lambda y: self.self_attention(
                y, attention_mask=attention_mask, training=training, return_attention_scores=True
            ),
            self.attention_norm,
            self.attention_dropout_layer,
            norm_first=self.norm_first,
            training=training,
        )
        x, _ = residual(
            x,
            lambda y: (self.feed_forward(y, training=training), None),
            self.ffn_norm,
            self.ffn_dropout_layer,
            norm_first=self.norm_first,
            training=training,
        )
        return (x, weights) if return_attention_scores else x


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(StackLayer):
    """N encoder layers (plus a final norm when `norm_first`).

    Args:
        num_layers: N.
        Other arguments: as `EncoderLayer`.

    Call arguments:
        inputs: (B, S, d_model) embedded source (positions added).
        attention_mask: bool (B, 1, 1, S), True on real source tokens.
        training: dropout on or off.
        return_attention_scores: also return a list of N (B, h, S, S) weights.

    Returns:
        memory (B, S, d_model), or `(memory, [weights per layer])`.
    """

    def build(self, input_shape=None):
        # each block is also an attribute of its own: TensorFlow's checkpoint tracking
        # does not see into a list attribute of a Keras 3 layer
        blocks = [
            EncoderLayer(**self.block_kwargs(), dtype=self.dtype_policy, name=f"layer_{i}")
            for i in range(self.num_layers)
        ]
        for i, layer in enumerate(blocks):
            layer.build()
            setattr(self, f"layer_{i}", layer)
        self.blocks = blocks
        self.final_norm = None
        if self.norm_first:
            self.final_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="final_norm"
            )
            self.final_norm.build((None, None, self.d_model))
        self.built = True

    def call(self, inputs, attention_mask=None, training=None, return_attention_scores=False):
        x, all_weights = inputs, []
        for layer in self.blocks:
            x, weights = layer(
                x, attention_mask=attention_mask, training=training, return_attention_scores=True
            )
            all_weights.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return (x, all_weights) if return_attention_scores else x
