"""Token embedding shared three ways, and positional encodings (paper sections 3.4, 3.5)."""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf


@keras.saving.register_keras_serializable(package="keras_transformer")
class SharedEmbedding(keras.layers.Layer):
    """Token embedding whose matrix also projects decoder outputs to logits.

    The paper (section 3.4) shares one matrix between the encoder input, the decoder
    input and the pre-softmax projection, and multiplies embeddings by sqrt(d_model).

    Args:
        vocab_size: V.
        d_model: embedding width.
        scale: multiply looked-up embeddings by sqrt(d_model) (paper: True).
        output_bias: add a learned bias (V,) to the logits (paper: False; Marian has one).

    Call arguments:
        inputs: (B, T) int token ids.

    Returns:
        (B, T, d_model) embeddings in the compute dtype. `logits(x)` maps
        (B, T, d_model) -> (B, T, V) float32 with the transposed matrix.

    Example:
        >>> emb = SharedEmbedding(vocab_size=100, d_model=16)
        >>> emb(tf.constant([[5, 7, 0]])).shape
        TensorShape([1, 3, 16])
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        d_model: int,
        scale: bool = True,
        output_bias: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if vocab_size <= 0 or d_model <= 0:
            raise ValueError(
                f"vocab_size and d_model must be positive, got {vocab_size}, {d_model}"
            )
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.scale = scale
        self.output_bias = output_bias

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
        )
        self.bias = None
        if self.output_bias:
            self.bias = self.add_weight(
                name="output_bias", shape=(self.vocab_size,), initializer="zeros"
            )
        self.built = True

    def call(self, inputs):
        x = tf.gather(self.embeddings, tf.cast(inputs, tf.int32))
        if self.scale:
            x = x * tf.cast(math.sqrt(self.d_model), x.dtype)
        return x

    def output_kernel(self, dtype=None):
        """E^T, (d_model, V) in `dtype` (default: the compute dtype), for `logits`."""
        return tf.transpose(tf.cast(self.embeddings, dtype or self.compute_dtype))

    def logits(self, x, kernel=None):
        """(..., d_model) -> (..., V) float32 logits, x @ E^T.

        `kernel`: E^T from `output_kernel()`, for callers that project many times with the
        same weights (a decoding loop): a plain matmul with a transposed copy made once is
        faster than a matmul that transposes E on every call.
        """
        flat = tf.reshape(x, [-1, self.d_model])
        if kernel is None:
            out = tf.matmul(flat, tf.cast(self.embeddings, flat.dtype), transpose_b=True)
        else:
            out = tf.matmul(flat, tf.cast(kernel, flat.dtype))
        out = tf.reshape(out, tf.concat([tf.shape(x)[:-1], [self.vocab_size]], 0))
        out = tf.cast(out, tf.float32)
        if self.bias is not None:  # added in float32, after the matmul
            out = out + self.bias
        return out

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.d_model,)

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "scale": self.scale,
            **({"output_bias": True} if self.output_bias else {}),
        }


SINUSOID_LAYOUTS = ("interleaved", "halves")


def sinusoid_table(positions: tf.Tensor, d_model: int, layout: str = "interleaved") -> tf.Tensor:
    """Paper section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...).

    positions (T,) -> (T, d_model) float32. "interleaved" (the paper's): sines on even and
    cosines on odd channels; "halves": the d/2 sines on channels [0, d/2), the cosines of the
    same frequencies on [d/2, d) (Hugging Face's Marian and CTranslate2; Marian's C++ has
    these halves too, with frequencies 10000^(-i/(d/2 - 1)) instead).
    """
    if layout not in SINUSOID_LAYOUTS:
        raise ValueError(f"layout must be one of {SINUSOID_LAYOUTS}, got {layout!r}")
    inv_freq = 1.0 / np.power(10000.0, np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    angles = tf.cast(positions, tf.float32)[:, tf.newaxis] * tf.constant(inv_freq, tf.float32)
    if layout == "halves":
        return tf.concat([tf.sin(angles), tf.cos(angles)], axis=-1)
    # interleave: stack on a last axis then flatten -> [sin0, cos0, sin1, cos1, ...]
    table = tf.stack([tf.sin(angles), tf.cos(angles)], axis=-1)
    return tf.reshape(table, [-1, (d_model // 2) * 2])[:, :d_model]


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(keras.layers.Layer):
    """Adds the fixed sinusoidal encoding of section 3.5; no weights, no length limit.

    Args:
        d_model: width of the inputs (must be even).
        layout: "interleaved" (the paper's) or "halves" (see `sinusoid_table`).

    Call arguments:
        inputs: (B, T, d_model).
        offset: scalar int, position of the first row (the decoding step).

    Returns:
        (B, T, d_model): inputs + PE[offset : offset + T].
    """

    def __init__(self, *, d_model: int, layout: str = "interleaved", **kwargs):
        super().__init__(**kwargs)
        if d_model <= 0 or d_model % 2:
            raise ValueError(f"d_model must be a positive even number, got {d_model}")
        if layout not in SINUSOID_LAYOUTS:
            raise ValueError(f"layout must be one of {SINUSOID_LAYOUTS}, got {layout!r}")
        self.d_model = d_model
        self.layout = layout

    def build(self, input_shape=None):
        self.built = True

    def call(self, inputs, offset=0):
        positions = tf.range(tf.shape(inputs)[1]) + tf.cast(offset, tf.int32)
        table = sinusoid_table(positions, self.d_model, self.layout)
        return inputs + tf.cast(table, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        # the paper's layout is left out: its config stays as it was saved
        layout = {"layout": self.layout} if self.layout != "interleaved" else {}
        return {**super().get_config(), "d_model": self.d_model, **layout}


@keras.saving.register_keras_serializable(package="keras_transformer")
class LearnedPositionalEmbedding(keras.layers.Layer):
    """Adds a learned position embedding (paper Table 3, row E).

    Args:
        max_length: number of positions learned; longer inputs are an error.
        d_model: width of the inputs.

    Call arguments:
        inputs: (B, T, d_model).
        offset: scalar int, position of the first row.

    Returns:
        (B, T, d_model): inputs + P[offset : offset + T].
    """

    def __init__(self, *, max_length: int, d_model: int, **kwargs):
        super().__init__(**kwargs)
        if max_length <= 0 or d_model <= 0:
            raise ValueError(
                f"max_length and d_model must be positive, got {max_length}, {d_model}"
            )
        self.max_length = max_length
        self.d_model = d_model

    def build(self, input_shape=None):
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(self.max_length, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
        )
        self.built = True

    def call(self, inputs, offset=0):
        length = tf.shape(inputs)[1]
        offset = tf.cast(offset, tf.int32)
        tf.debugging.assert_less_equal(
            offset + length, self.max_length, message="sequence longer than max_length positions"
        )
        table = tf.slice(self.position_embeddings, [offset, 0], [length, self.d_model])
        return inputs + tf.cast(table, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "max_length": self.max_length, "d_model": self.d_model}
