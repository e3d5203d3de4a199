"""Position-wise feed-forward network (paper section 3.3)."""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.projection import add_projection, project

# name -> the function; the names are TransformerConfig.ffn_activation's
ACTIVATIONS = {
    "relu": tf.nn.relu,
    "swish": tf.nn.silu,  # x sigmoid(x)
    "gelu": lambda x: tf.nn.gelu(x, approximate=False),  # x Phi(x)
    "gelu_sigmoid": lambda x: x * tf.sigmoid(tf.cast(1.702, x.dtype) * x),  # Marian's gelu
}


def check_activation(name: str) -> None:
    if name not in ACTIVATIONS:
        raise ValueError(f"ffn_activation must be one of {tuple(ACTIVATIONS)}, got {name!r}")


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to every position alike.

    Args:
        d_model: input and output width.
        d_ff: inner width.
        ffn_dropout: dropout after the activation (paper: 0).
        activation: "relu" (the paper's max(0, .)), "swish", "gelu" or "gelu_sigmoid"
            (see `ACTIVATIONS`).

    Call arguments:
        inputs: (B, T, d_model).
        training: dropout on or off.

    Returns:
        (B, T, d_model).
    """

    def __init__(
        self,
        *,
        d_model: int,
        d_ff: int,
        ffn_dropout: float = 0.0,
        activation: str = "relu",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if d_model <= 0 or d_ff <= 0:
            raise ValueError(f"d_model and d_ff must be positive, got {d_model}, {d_ff}")
        check_activation(activation)
        self.activation = activation
        self.d_model = d_model
        self.d_ff = d_ff
        self.ffn_dropout = ffn_dropout

    def build(self, input_shape=None):
        self.inner_kernel, self.inner_bias = add_projection(
            self, "inner", (self.d_model, self.d_ff)
        )
        self.output_kernel, self.output_bias = add_projection(
            self, "output", (self.d_ff, self.d_model)
        )
        self.dropout = Dropout(self.ffn_dropout, dtype=self.dtype_policy, name="dropout")
        self.built = True

    def call(self, inputs, training=None):
        # (B*T, d_model) -> (B*T, d_ff) -> (B*T, d_model): plain 2-D matmuls
        hidden = ACTIVATIONS[self.activation](project(inputs, self.inner_kernel, self.inner_bias))
        hidden = self.dropout(hidden, training=training)
        out = project(hidden, self.output_kernel, self.output_bias)
        return tf.reshape(out, tf.shape(inputs))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "d_ff": self.d_ff,
            "ffn_dropout": self.ffn_dropout,
            # the paper's ReLU is left out: its config stays as it was saved
            **({"activation": self.activation} if self.activation != "relu" else {}),
        }
