"""The dense projection of attention (Q/K/V and output) and of the feed-forward network:
weights created on the layer that owns them, applied as one 2-D matmul.

The weights stay plain variables of the owning layer (`<name>_kernel`, `<name>_bias`), not
a sublayer of their own, so checkpoint paths are those of the owning layer.
"""

from __future__ import annotations

import keras
import tensorflow as tf


def add_projection(layer: keras.layers.Layer, name: str, shape: tuple, use_bias: bool = True):
    """Create `{name}_kernel` (shape (width_in, width_out), Glorot uniform) and, if
    `use_bias`, `{name}_bias` ((width_out,), zeros) on `layer`, in that order.

    Returns:
        (kernel, bias), bias None without `use_bias`.
    """
    kernel = layer.add_weight(
        name=f"{name}_kernel", shape=shape, initializer=keras.initializers.GlorotUniform()
    )
    bias = None
    if use_bias:
        bias = layer.add_weight(name=f"{name}_bias", shape=shape[-1:], initializer="zeros")
    return kernel, bias


def project(x: tf.Tensor, kernel, bias=None) -> tf.Tensor:
    """x W + b as one 2-D matmul in x's dtype (the float32 variables are cast to it).

    Args:
        x: (..., width_in), e.g. (B, T, width_in) or already (N, width_in).
        kernel: (width_in, width_out).
        bias: (width_out,) or None.

    Returns:
        (N, width_out), N the product of x's leading dimensions (the caller reshapes back).
    """
    out = tf.matmul(tf.reshape(x, [-1, kernel.shape[0]]), tf.cast(kernel, x.dtype))
    if bias is not None:
        out = tf.nn.bias_add(out, tf.cast(bias, x.dtype))
    return out
