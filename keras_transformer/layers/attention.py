"""Multi-head attention (paper section 3.2.2), over `ScaledDotProductAttention` (3.2.1,
scaled_dot_product.py), with the decoding cache of attention_cache.py.

Glossary of shapes: B batch, S source (key) length, T target (query) length, h heads,
d_k query/key depth and d_v value depth per head (both d_model / h unless set, Table 3
rows A and B); with a decoding cache, t steps decoded so far and R = B / G key rows, each
shared by G consecutive query rows (the beams of a sentence).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_transformer.layers.attention_cache import append_step
from keras_transformer.layers.projection import add_projection, project
from keras_transformer.layers.scaled_dot_product import ScaledDotProductAttention


def head_depths(d_model: int, num_heads: int, d_k: int | None, d_v: int | None):
    """(d_k, d_v) per head, each d_model / h unless given; a clear error if impossible."""
    if num_heads <= 0 or d_model <= 0:
        raise ValueError(f"d_model ({d_model}) and num_heads ({num_heads}) must be positive")
    for name, depth in (("d_k", d_k), ("d_v", d_v)):
        if depth is None and d_model % num_heads:
            raise ValueError(
                f"d_model ({d_model}) must be a positive multiple of num_heads ({num_heads}) "
                f"unless {name} is given"
            )
        if depth is not None and (not isinstance(depth, int) or depth <= 0):
            raise ValueError(f"{name} must be a positive integer, got {depth!r}")
    return d_k or d_model // num_heads, d_v or d_model // num_heads


def with_extras(outputs, cache=None, weights=None):
    """The one return rule of the attention layers and blocks: `outputs`, then the updated
    cache if a cache was given, then the attention weights if the layer was built with
    `return_attention_scores` (callers pass None for what is absent)."""
    extras = tuple(extra for extra in (cache, weights) if extra is not None)
    return (outputs, *extras) if extras else outputs


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention with fused projections and an optional decoding cache.

    Self-attention projects Q, K and V with one (d_model, h d_k + h d_k + h d_v) matmul;
    cross-attention projects Q from the decoder (d_model, h d_k) and K, V from the encoder
    memory with one (d_model, h d_k + h d_v) matmul. The output projection is
    (h d_v, d_model). The paper's d_k = d_v = d_model / h is the default.

    Args:
        num_heads: h.
        d_model: model width.
        d_k: query/key depth per head; default d_model / h (then `d_model` must be a
            multiple of `num_heads`).
        d_v: value depth per head; default d_model / h.
        self_attention: True for self-attention (keys from the query sequence), False for
            encoder-decoder attention (keys from `memory`).
        attention_dropout: dropout on attention weights.
        use_bias: biases on the projections.
        return_attention_scores: also return the (B, h, T, S) float32 attention weights.

    Call arguments:
        query: (B, T, d_model).
        memory: (B, S, d_model) for cross-attention; None for self-attention.
        attention_mask: bool broadcastable to (B, h, T, S), True where allowed.
        projected_memory: cross-attention only, instead of `memory`: {"k", "v"} from
            `project_memory(memory)`, computed once per source. It may have B / G rows,
            each shared by G consecutive query rows (the G beams of a sentence), with
            `attention_mask` of B / G rows too: the queries are grouped per source row
            instead of the keys and values being copied G times.
        cache: self-attention only, for incremental decoding: {"k": (R, h, t G, d_k),
            "v": (R, h, t G, d_v)}, the keys and values of the t = `step` positions decoded
            so far (t = 0: an empty cache), with R = B / G rows, each shared by G
            consecutive query rows (the G beams of a sentence): position tau G + g holds
            what query row g of the group wrote at step tau. `query` is then
            (B, 1, d_model); this step's G keys and values of each group are appended, and
            each query attends to the positions that `attention_mask` allows, (R, 1, G,
            (t + 1) G): its own hypothesis' past, since beam search reorders the beams
            without moving the cache. With G = 1 (one row per query) the mask may be None:
            every cached position is in the query's past. The cache may also hold
            "recent_k" and "recent_v": then the positions are kept in two blocks, "k"/"v"
            followed by the last steps in "recent_k"/"recent_v"; a step appends to the
            recent block only (a copy of at most RECENT_STEPS steps instead of all t), and
            every RECENT_STEPS steps the recent block moves to the end of the main one
            (attention_cache.py).
        step: scalar int, the position being decoded (with `cache` only).
        training: dropout on or off.

    Returns:
        One fixed structure: `outputs` (B, T, d_model), then the updated cache if a cache
        was given, then the weights if built with `return_attention_scores`:
        `outputs`, `(outputs, cache)`, `(outputs, weights)` or `(outputs, cache, weights)`.

    Example:
        >>> mha = MultiHeadAttention(num_heads=2, d_model=8, return_attention_scores=True)
        >>> out, weights = mha(tf.zeros([1, 3, 8]))
        >>> weights.shape
        TensorShape([1, 2, 3, 3])
    """

    def __init__(
        self,
        *,
        num_heads: int,
        d_model: int,
        d_k: int | None = None,
        d_v: int | None = None,
        self_attention: bool = True,
        attention_dropout: float = 0.0,
        use_bias: bool = True,
        return_attention_scores: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_k, self.d_v = head_depths(d_model, num_heads, d_k, d_v)
        self.num_heads = num_heads
        self.d_model = d_model
        self.self_attention = self_attention
        self.attention_dropout = attention_dropout
        self.use_bias = use_bias
        self.return_attention_scores = return_attention_scores

    def build(self, input_shape=None):
        h, d, keys, values = self.num_heads, self.d_model, self.d_k, self.d_v
        if self.self_attention:
            self.qkv_kernel, self.qkv_bias = add_projection(
                self, "qkv", (d, h * (2 * keys + values)), self.use_bias
            )
        else:
            self.q_kernel, self.q_bias = add_projection(self, "q", (d, h * keys), self.use_bias)
            self.kv_kernel, self.kv_bias = add_projection(
                self, "kv", (d, h * (keys + values)), self.use_bias
            )
        self.output_kernel, self.output_bias = add_projection(
            self, "output", (h * values, d), self.use_bias
        )
        self.attention = ScaledDotProductAttention(
            attention_dropout=self.attention_dropout, dtype=self.dtype_policy, name="attention"
        )
        self.attention.build()
        self.built = True

    def _split_heads(self, flat, batch, length, depths, rows=None):
        """(B*T, h * sum(depths)) -> one (B, h, T, depth) tensor per depth.

        With `rows` = R (grouped attention, B = R G): one (R, h, G T, depth) tensor per
        depth instead, the G consecutive rows of each group side by side (row g's T
        positions at g T ... g T + T - 1), still with one transpose.
        """
        h = self.num_heads
        n = len(depths)
        if rows is None:
            if len(set(depths)) == 1:  # equal depths: one reshape and one transpose for all
                x = tf.reshape(flat, [batch, length, n, h, depths[0]])
                return tf.unstack(tf.transpose(x, [2, 0, 3, 1, 4]))
            parts = tf.split(flat, [h * depth for depth in depths], axis=-1)
            return [
                tf.transpose(tf.reshape(part, [batch, length, h, depth]), [0, 2, 1, 3])
                for part, depth in zip(parts, depths)
            ]
        group = batch // rows
        if len(set(depths)) == 1:
            x = tf.reshape(flat, [rows, group, length, n, h, depths[0]])
            x = tf.transpose(x, [3, 0, 4, 1, 2, 5])  # (n, R, h, G, T, depth)
            return tf.unstack(tf.reshape(x, [n, rows, h, group * length, depths[0]]))
        parts = tf.split(flat, [h * depth for depth in depths], axis=-1)
        return [
            tf.reshape(
                tf.transpose(tf.reshape(part, [rows, group, length, h, depth]), [0, 3, 1, 2, 4]),
                [rows, h, group * length, depth],
            )
            for part, depth in zip(parts, depths)
        ]

    def project_memory(self, memory):
        """Cross-attention keys and values, once per source: {"k": (B, h, S, d_k),
        "v": (B, h, S, d_v)}."""
        if self.self_attention:
            raise ValueError("project_memory is for cross-attention layers")
        shape = tf.shape(memory)
        flat = project(memory, self.kv_kernel, self.kv_bias)
        k, v = self._split_heads(flat, shape[0], shape[1], (self.d_k, self.d_v))
        return {"k": k, "v": v}

    def _check_arguments(self, memory, projected_memory, cache, step):
        if self.self_attention:
            if memory is not None or projected_memory is not None:
                raise ValueError("a self-attention layer takes no `memory`/`projected_memory`")
            if (cache is None) != (step is None):
                raise ValueError("a self-attention cache and `step` go together")
        else:
            if cache is not None or step is not None:
                raise ValueError(
                    "cross-attention keeps no cache: pass `projected_memory` "
                    "from project_memory(memory) instead"
                )
            if (memory is None) == (projected_memory is None):
                raise ValueError(
                    "cross-attention needs exactly one of `memory` and `projected_memory`"
                )

    def _grouped(self, q, k, v, attention_mask, training, batch, length, rows):
        """Attention of grouped queries q (R, h, G T, d_k) (from `_split_heads` with
        `rows` = R) over k, v of R rows (tensors or lists of blocks), each shared by the
        G = B / R consecutive query rows of a group: (context (B, T, h, d_v), weights
        (B, h, T, S) or None when the layer does not return them)."""
        h, group = self.num_heads, batch // rows
        context, weights = self.attention(q, k, v, attention_mask, training=training)
        context = tf.reshape(context, [rows, h, group, length, self.d_v])
        context = tf.reshape(tf.transpose(context, [0, 2, 3, 1, 4]), [batch, length, h, self.d_v])
        if not self.return_attention_scores:
            return context, None
        weights = tf.reshape(weights, [rows, h, group, length, -1])
        weights = tf.reshape(tf.transpose(weights, [0, 2, 1, 3, 4]), [batch, h, length, -1])
        return context, weights

    def call(
        self,
        query,
        memory=None,
        attention_mask=None,
        projected_memory=None,
        cache=None,
        step=None,
        training=None,
    ):
        self._check_arguments(memory, projected_memory, cache, step)
        shape = tf.shape(query)
        batch, length = shape[0], shape[1]
        # grouped: the keys and values have R = B / G rows (a decoding cache, or a
        # projected memory shared by the beams of a sentence), and q is split into groups
        shared = cache if cache is not None else projected_memory
        rows = None if shared is None else tf.shape(next(iter(shared.values())))[0]
        if self.self_attention:
            flat = project(query, self.qkv_kernel, self.qkv_bias)
            q, k, v = self._split_heads(
                flat, batch, length, (self.d_k, self.d_k, self.d_v), rows=rows
            )
            if cache is not None:
                k, v, cache = append_step(cache, k, v, batch // rows, step)
        else:
            flat = project(query, self.q_kernel, self.q_bias)
            (q,) = self._split_heads(flat, batch, length, (self.d_k,), rows=rows)
            kv = projected_memory if projected_memory is not None else self.project_memory(memory)
            k, v = kv["k"], kv["v"]
        k, v = tf.nest.map_structure(lambda t: tf.cast(t, q.dtype), (k, v))
        if rows is not None:
            context, weights = self._grouped(q, k, v, attention_mask, training, batch, length, rows)
        else:
            context, weights = self.attention(q, k, v, attention_mask, training=training)
            context = tf.transpose(context, [0, 2, 1, 3])  # (B, T, h, d_v)
        outputs = tf.reshape(
            project(context, self.output_kernel, self.output_bias),
            [batch, length, self.d_model],
        )
        return with_extras(outputs, cache, weights if self.return_attention_scores else None)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "d_model": self.d_model,
            "d_k": self.d_k,
            "d_v": self.d_v,
            "self_attention": self.self_attention,
            "attention_dropout": self.attention_dropout,
            "use_bias": self.use_bias,
            "return_attention_scores": self.return_attention_scores,
        }
