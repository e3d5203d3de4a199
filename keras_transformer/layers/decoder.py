"""Decoder layer and decoder stack (paper section 3.1), with an incremental-decoding cache."""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_transformer.layers.attention import with_extras
from keras_transformer.layers.base import BlockLayer, StackLayer


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(BlockLayer):
    """Causal self-attention, encoder-decoder attention, feed-forward; each residual-wrapped.

    Sublayers (also the checkpoint names): `self_attention`, `cross_attention` and
    `feed_forward`, each a `Residual` (its `sublayer` and its `norm`), as in `EncoderLayer`.

    Args:
        As `EncoderLayer`; `return_attention_scores` returns
        {"self": (B, h, T, T), or (B, h, 1, (t + 1) G) with a `cache`, "cross": (B, h, T, S)}.

    Call arguments:
        inputs: (B, T, d_model).
        memory: (B, S, d_model) encoder output; None when `projected_memory` is given.
        self_attention_mask: bool (1, 1, T, T) causal mask; with a `cache` of R = B / G
            rows, the (R, 1, G, (t + 1) G) mask of each beam's own past, or None if G = 1
            (see `MultiHeadAttention`).
        memory_mask: bool (B, 1, 1, S), True on real source tokens.
        projected_memory: {"k", "v"} (B, h, S, d_k / d_v) from
            `cross_attention.sublayer.project_memory(memory)`, instead of `memory`.
        cache: self-attention {"k": (R, h, t G, d_k), "v": (R, h, t G, d_v)} for
            incremental decoding, R = B / G rows each shared by G consecutive rows (the
            beams of a sentence; G = 1 without beams); T must be 1.
        step: scalar int position being decoded (with `cache` only).
        training: dropout on or off.

    Returns:
        `outputs` (B, T, d_model), then the updated cache if a `cache` was given, then the
        weights if built with `return_attention_scores`.
    """

    def build(self, input_shape=None):
        self.self_attention = self._attention_block("self_attention", self_attention=True)
        self.cross_attention = self._attention_block("cross_attention", self_attention=False)
        self.feed_forward = self._feed_forward_block()
        self.built = True

    def call(
        self,
        inputs,
        memory=None,
        self_attention_mask=None,
        memory_mask=None,
        projected_memory=None,
        cache=None,
        step=None,
        training=None,
    ):
        if cache is None:
            x, self_weights = self.self_attention(
                inputs, attention_mask=self_attention_mask, training=training
            )
        else:  # a tensor step: nested sublayer arguments must all be tensors
            step = step if step is None else tf.convert_to_tensor(step, tf.int32)
            x, cache, self_weights = self.self_attention(
                inputs,
                attention_mask=self_attention_mask,
                cache=cache,
                step=step,
                training=training,
            )
        x, cross_weights = self.cross_attention(
            x,
            memory,
            attention_mask=memory_mask,
            projected_memory=projected_memory,
            training=training,
        )
        x = self.feed_forward(x, training=training)
        weights = {"self": self_weights, "cross": cross_weights}
        return with_extras(x, cache, weights if self.return_attention_scores else None)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(StackLayer):
    """N decoder layers (plus a final norm when `norm_first`).

    Args:
        num_layers: N.
        return_attention_scores: also return {"self": [N weights], "cross": [N weights]}.
        Other arguments: as `EncoderLayer`.

    Call arguments:
        inputs: (B, T, d_model) embedded target (positions added).
        memory: (B, S, d_model), or None with `projected_memory`.
        self_attention_mask: bool (1, 1, T, T) causal mask, or with a `cache` the mask of
            `DecoderLayer`.
        memory_mask: bool (B, 1, 1, S).
        projected_memory: {"layer_i": {"k", "v"}} from `project_memory(memory)`.
        cache: {"layer_i": {"k", "v"}} self-attention keys/values (R, h, t G, d_k / d_v), as
            in `DecoderLayer`; T must be 1.
        step: scalar int position being decoded (with `cache` only).
        training: dropout on or off.

    Returns:
        `outputs` (B, T, d_model), then the updated cache if a `cache` was given, then the
        weights if built with `return_attention_scores`.
    """

    block_class = DecoderLayer

    def project_memory(self, memory):
        """Cross-attention keys/values for every layer, computed once per source."""
        return {
            f"layer_{i}": block.cross_attention.sublayer.project_memory(memory)
            for i, block in enumerate(self.blocks)
        }

    def call(
        self,
        inputs,
        memory=None,
        self_attention_mask=None,
        memory_mask=None,
        projected_memory=None,
        cache=None,
        step=None,
        training=None,
    ):
        x, new_cache, weights = inputs, {}, {"self": [], "cross": []}
        for i, block in enumerate(self.blocks):
            key = f"layer_{i}"
            kwargs = dict(
                self_attention_mask=self_attention_mask,
                memory_mask=memory_mask,
                projected_memory=None if projected_memory is None else projected_memory[key],
                training=training,
            )
            if cache is None:
                x, block_weights = block(x, memory, **kwargs)
            else:
                x, new_cache[key], block_weights = block(
                    x, memory, cache=cache[key], step=step, **kwargs
                )
            for kind in ("self", "cross"):
                weights[kind].append(block_weights[kind])
        if self.final_norm is not None:
            x = self.final_norm(x)
        new_cache = None if cache is None else new_cache
        return with_extras(x, new_cache, weights if self.return_attention_scores else None)
