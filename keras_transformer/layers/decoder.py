"""Decoder layer and decoder stack (paper section 3.1), with an incremental-decoding cache."""

from __future__ import annotations

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.base import BlockLayer, StackLayer
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.residual import make_norm_and_dropout, residual


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(BlockLayer):
    """Causal self-attention, encoder-decoder attention, feed-forward; each residual-wrapped.

    Args:
        As `EncoderLayer`.

    Call arguments:
        inputs: (B, T, d_model).
        memory: (B, S, d_model) encoder output; may be None when `cross_cache` is given.
        self_attention_mask: bool (1, 1, T, T) causal mask (ignored with `self_cache`).
        memory_mask: bool (B, 1, 1, S), True on real source tokens.
        self_cache: {"k", "v"} (B, h, L, d_k) for incremental decoding; T must be 1.
        cross_cache: {"k", "v"} (B, h, S, d_k) from `cross_attention.project_memory`.
        step: scalar int position being decoded (with `self_cache`).
        training: dropout on or off.
        return_attention_scores: also return {"self": (B, h, T, T), "cross": (B, h, T, S)}.

    Returns:
        (B, T, d_model); `(outputs, self_cache)` with a cache; `(outputs, weights)` with
        `return_attention_scores`.
    """

    def build(self, input_shape=None):
        def attention(name, self_attention):
            layer = MultiHeadAttention(
                num_heads=self.num_heads,
                d_model=self.d_model,
                self_attention=self_attention,
                attention_dropout=self.attention_dropout,
                dtype=self.dtype_policy,
                name=name,
            )
            layer.build()
            return layer

        self.self_attention = attention("self_attention", True)
        self.cross_attention = attention("cross_attention", False)
        self.feed_forward = PositionwiseFeedForward(
            d_model=self.d_model,
            d_ff=self.d_ff,
            ffn_dropout=self.ffn_dropout,
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.feed_forward.build()
        self.self_norm, self.self_dropout = make_norm_and_dropout(self, "self", self.d_model)
        self.cross_norm, self.cross_dropout = make_norm_and_dropout(self, "cross", self.d_model)
        self.ffn_norm, self.ffn_dropout_layer = make_norm_and_dropout(self, "ffn", self.d_model)
        self.built = True

    def call(
        self,
        inputs,
        memory=None,
        self_attention_mask=None,
        memory_mask=None,
        self_cache=None,
        cross_cache=None,
        step=None,
        training=None,
        return_attention_scores=False,
    ):
        def self_block(y):
            if self_cache is not None:
                return self.self_attention(y, cache=self_cache, step=step, training=training)
            return self.self_attention(
                y,
                attention_mask=self_attention_mask,
                training=training,
                return_attention_scores=True,
            )

        def cross_block(y):
            if cross_cache is not None:
                out, _ = self.cross_attention(
                    y, attention_mask=memory_mask, cache=cross_cache, training=training
                )
                return out, None
            return self.cross_attention(
                y,
                memory,
                attention_mask=memory_mask,
                training=training,
                return_attention_scores=True,
            )

        norm_first = self.norm_first
        x, self_extra = residual(
            inputs,
            self_block,
            self.self_norm,
            self.self_dropout,
            norm_first=norm_first,
            training=training,
        )
        x, cross_weights = residual(
            x,
            cross_block,
            self.cross_norm,
            self.cross_dropout,
            norm_first=norm_first,
            training=training,
        )
        x, _ = residual(
            x,
            lambda y: (self.feed_forward(y, training=training), None),
            self.ffn_norm,
            self.ffn_dropout_layer,
            norm_first=norm_first,
            training=training,
        )
        if self_cache is not None:
            return x, self_extra
        if return_attention_scores:
            return x, {"self": self_extra, "cross": cross_weights}
        return x


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(StackLayer):
    """N decoder layers (plus a final norm when `norm_first`).

    Args:
        num_layers: N.
        Other arguments: as `EncoderLayer`.

    Call arguments:
        inputs: (B, T, d_model) embedded target (positions added).
        memory: (B, S, d_model), or None with `cross_cache`.
        self_attention_mask: bool (1, 1, T, T) causal mask.
        memory_mask: bool (B, 1, 1, S).
        self_cache: {"layer_i": {"k", "v"}} with (B, h, L, d_k) tensors; T must be 1.
        cross_cache: {"layer_i": {"k", "v"}} from `project_memory`.
        step: scalar int position being decoded.
        training: dropout on or off.
        return_attention_scores: also return {"self": [...], "cross": [...]} per layer.

    Returns:
        (B, T, d_model); `(outputs, self_cache)` with a cache; `(outputs, weights)` with
        `return_attention_scores`.
    """

    def build(self, input_shape=None):
        # each block is also an attribute of its own: TensorFlow's checkpoint tracking
        # does not see into a list attribute of a Keras 3 layer
        blocks = [
            DecoderLayer(**self.block_kwargs(), dtype=self.dtype_policy, name=f"layer_{i}")
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

    def project_memory(self, memory):
        """Cross-attention keys/values for every layer, computed once per source."""
        return {
            f"layer_{i}": layer.cross_attention.project_memory(memory)
            for i, layer in enumerate(self.blocks)
        }

    def call(
        self,
        inputs,
        memory=None,
        self_attention_mask=None,
        memory_mask=None,
        self_cache=None,
        cross_cache=None,
        step=None,
        training=None,
        return_attention_scores=False,
    ):
        x, new_cache, weights = inputs, {}, {"self": [], "cross": []}
        for i, layer in enumerate(self.blocks):
            key = f"layer_{i}"
            if self_cache is not None:
                x, new_cache[key] = layer(
                    x,
                    memory,
                    memory_mask=memory_mask,
                    self_cache=self_cache[key],
                    cross_cache=None if cross_cache is None else cross_cache[key],
                    step=step,
                    training=training,
                )
            else:
                x, layer_weights = layer(
                    x,
                    memory,
                    self_attention_mask=self_attention_mask,
                    memory_mask=memory_mask,
                    training=training,
                    return_attention_scores=True,
                )
                weights["self"].append(layer_weights["self"])
                weights["cross"].append(layer_weights["cross"])
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self_cache is not None:
            return x, new_cache
        return (x, weights) if return_attention_scores else x
