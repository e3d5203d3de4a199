"""Scaled dot-product attention and multi-head attention (paper sections 3.2.1, 3.2.2).

Glossary of shapes: B batch, S source (key) length, T target (query) length, h heads,
d_k = d_model / h head depth, L cache length.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_transformer.layers import masks


@keras.saving.register_keras_serializable(package="keras_transformer")
class ScaledDotProductAttention(keras.layers.Layer):
    """softmax(Q K^T / sqrt(d_k) + bias) V, with the softmax in float32.

    Args:
        attention_dropout: dropout on the attention weights (paper: 0).

    Call arguments:
        query: (B, h, T, d_k).
        key: (B, h, S, d_k).
        value: (B, h, S, d_k).
        attention_mask: bool broadcastable to (B, h, T, S), True where allowed, or None.
        training: dropout on or off.

    Returns:
        (outputs (B, h, T, d_k) in the compute dtype, weights (B, h, T, S) float32).
        Masked keys get weight 0; a fully masked row gets uniform (finite) weights.
    """

    def __init__(self, *, attention_dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"attention_dropout must be in [0, 1), got {attention_dropout}")
        self.attention_dropout = attention_dropout

    def build(self, input_shape=None):
        self.dropout = keras.layers.Dropout(
            self.attention_dropout, dtype=self.dtype_policy, name="dropout"
        )
        self.built = True

    def call(self, query, key, value, attention_mask=None, training=None):
        depth = tf.cast(tf.shape(query)[-1], query.dtype)
        query = query * tf.math.rsqrt(depth)  # scale the smaller tensor
        scores = tf.cast(tf.matmul(query, key, transpose_b=True), tf.float32)  # (B, h, T, S)
        if attention_mask is not None:
            scores += masks.attention_bias(attention_mask, tf.float32)
        weights = tf.nn.softmax(scores, axis=-1)
        dropped = self.dropout(tf.cast(weights, value.dtype), training=training)
        return tf.matmul(dropped, value), weights

    def get_config(self):
        return {**super().get_config(), "attention_dropout": self.attention_dropout}


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention with fused projections and an optional decoding cache.

    Self-attention projects Q, K and V with one (d_model, 3 d_model) matmul;
    cross-attention projects Q from the decoder and K, V from the encoder memory with one
    (d_model, 2 d_model) matmul. Heads have depth d_model / h as in the paper.

    Args:
        num_heads: h.
        d_model: model width; divisible by `num_heads`.
        self_attention: True for self-attention (keys from the query sequence), False for
            encoder-decoder attention (keys from `memory`).
        attention_dropout: dropout on attention weights.
        use_bias: biases on the projections.

    Call arguments:
        query: (B, T, d_model).
        memory: (B, S, d_model) for cross-attention; must be None for self-attention.
        attention_mask: bool broadcastable to (B, h, T, S), True where allowed.
        cache: for incremental decoding. Self-attention: {"k", "v"} of shape (B, h, L, d_k),
            written at `step`, and `query` is (B, 1, d_model). Cross-attention: {"k", "v"}
            from `project_memory(memory)`, computed once.
        step: scalar int, the position being decoded (self-attention cache only).
        training: dropout on or off.
        return_attention_scores: also return the (B, h, T, S) float32 weights.

    Returns:
        (B, T, d_model); `(outputs, cache)` whenever a cache is given;
        `(outputs, weights)` with `return_attention_scores`.
    """

    def __init__(
        self,
        *,
        num_heads: int,
        d_model: int,
        self_attention: bool = True,
        attention_dropout: float = 0.0,
        use_bias: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if num_heads <= 0 or d_model <= 0 or d_model % num_heads:
            raise ValueError(
                f"d_model ({d_model}) must be a positive multiple of num_heads ({num_heads})"
            )
        self.num_heads = num_heads
        self.d_model = d_model
        self.self_attention = self_attention
        self.attention_dropout = attention_dropout
        self.use_bias = use_bias
        self.depth = d_model // num_heads

    def _projection(self, name, width):
        kernel = self.add_weight(
            name=f"{name}_kernel",
            shape=(self.d_model, width),
            initializer=keras.initializers.GlorotUniform(),
        )
        bias = (
            self.add_weight(name=f"{name}_bias", shape=(width,), initializer="zeros")
            if self.use_bias
            else None
        )
        return kernel, bias

    def build(self, input_shape=None):
        if self.self_attention:
            self.qkv_kernel, self.qkv_bias = self._projection("qkv", 3 * self.d_model)
        else:
            self.q_kernel, self.q_bias = self._projection("q", self.d_model)
            self.kv_kernel, self.kv_bias = self._projection("kv", 2 * self.d_model)
        self.output_kernel, self.output_bias = self._projection("output", self.d_model)
        self.attention = ScaledDotProductAttention(
            attention_dropout=self.attention_dropout, dtype=self.dtype_policy, name="attention"
        )
        self.attention.build()
        self.built = True

    def _dense(self, x, kernel, bias):
        """(B, T, d_model) -> (B*T, width), one 2-D matmul."""
        out = tf.matmul(tf.reshape(x, [-1, self.d_model]), tf.cast(kernel, x.dtype))
        if bias is not None:
            out = tf.nn.bias_add(out, tf.cast(bias, x.dtype))
        return out

    def _split_heads(self, flat, batch, length, parts):
        """(B*T, parts*d_model) -> `parts` tensors (B, h, T, d_k), with one transpose."""
        if parts == 1:
            x = tf.reshape(flat, [batch, length, self.num_heads, self.depth])
            return [tf.transpose(x, [0, 2, 1, 3])]
        x = tf.reshape(flat, [batch, length, parts, self.num_heads, self.depth])
        return tf.unstack(tf.transpose(x, [2, 0, 3, 1, 4]))

    def project_memory(self, memory):
        """Cross-attention keys and values, once per source: {"k", "v"} (B, h, S, d_k)."""
        if self.self_attention:
            raise ValueError("project_memory is for cross-attention layers")
        shape = tf.shape(memory)
        kv = self._split_heads(
            self._dense(memory, self.kv_kernel, self.kv_bias), shape[0], shape[1], 2
        )
        return {"k": kv[0], "v": kv[1]}

    def call(
        self,
        query,
        memory=None,
        attention_mask=None,
        cache=None,
        step=None,
        training=None,
        return_attention_scores=False,
    ):
        if self.self_attention and memory is not None:
            raise ValueError("a self-attention layer takes no `memory`")
        shape = tf.shape(query)
        batch, length = shape[0], shape[1]
        if self.self_attention:
            q, k, v = self._split_heads(
                self._dense(query, self.qkv_kernel, self.qkv_bias), batch, length, 3
            )
            if cache is not None:
                if step is None:
                    raise ValueError("a self-attention cache needs `step`")
                # write this step's key/value into the fixed-size cache: (B, h, L, d_k)
                slot = tf.equal(tf.range(tf.shape(cache["k"])[2]), step)[:, tf.newaxis]
                k = tf.where(slot, tf.cast(k, cache["k"].dtype), cache["k"])
                v = tf.where(slot, tf.cast(v, cache["v"].dtype), cache["v"])
                cache = {"k": k, "v": v}
                attention_mask = masks.step_mask(step, tf.shape(k)[2])
        else:
            q = self._split_heads(self._dense(query, self.q_kernel, self.q_bias), batch, length, 1)[
                0
            ]
            if cache is not None:
                k, v = cache["k"], cache["v"]
            elif memory is None:
                raise ValueError("cross-attention needs `memory` or a cache from project_memory")
            else:
                kv = self.project_memory(memory)
                k, v = kv["k"], kv["v"]
        k, v = tf.cast(k, q.dtype), tf.cast(v, q.dtype)
        context, weights = self.attention(q, k, v, attention_mask=attention_mask, training=training)
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch, length, self.d_model])
        outputs = tf.reshape(
            self._dense(context, self.output_kernel, self.output_bias),
            [batch, length, self.d_model],
        )
        if cache is not None:
            return outputs, cache
        if return_attention_scores:
            return outputs, weights
        return outputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "d_model": self.d_model,
            "self_attention": self.self_attention,
            "attention_dropout": self.attention_dropout,
            "use_bias": self.use_bias,
        }
