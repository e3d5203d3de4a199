"""The residual connection around every sublayer, written once (paper sections 3.1, 5.4)."""

from __future__ import annotations

import keras

from keras_transformer.layers.dropout import Dropout


@keras.saving.register_keras_serializable(package="keras_transformer")
class Residual(keras.layers.Layer):
    """LayerNorm(x + Dropout(Sublayer(x))), or pre-norm x + Dropout(Sublayer(LayerNorm(x))).

    The paper's sublayer connection (section 3.1) with residual dropout (section 5.4),
    wrapped around a layer as OpenNMT-tf's `TransformerLayerWrapper` does. The wrapped
    layer's return structure passes through: if it returns `(outputs, *extras)`, the
    wrapper returns `(residual_outputs, *extras)` (attention weights, a cache).

    Args:
        sublayer: the wrapped layer; called as `sublayer(x, *args, training=..., **kwargs)`
            and returns (B, T, d_model), or a tuple whose first item is.
        dropout_rate: dropout on the sublayer output before the sum.
        norm_first: pre-norm (normalize the sublayer input; the sum is not normalized)
            instead of the paper's post-norm.
        layer_norm_epsilon: LayerNormalization epsilon.

    Call arguments:
        inputs: (B, T, d_model).
        *args, **kwargs: passed to `sublayer` (nested arguments must be all tensors or None).
        training: dropout on or off; also passed to `sublayer`.

    Returns:
        (B, T, d_model), followed by the sublayer's extra outputs if it returns a tuple.

    Example:
        >>> ffn = PositionwiseFeedForward(d_model=8, d_ff=16)
        >>> Residual(ffn, dropout_rate=0.1)(tf.zeros([2, 3, 8])).shape
        TensorShape([2, 3, 8])
    """

    def __init__(
        self,
        sublayer: keras.layers.Layer,
        *,
        dropout_rate: float = 0.1,
        norm_first: bool = False,
        layer_norm_epsilon: float = 1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}")
        self.sublayer = sublayer
        self.dropout_rate = dropout_rate
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon

    def build(self, input_shape):
        """`input_shape`: (B, T, d_model); d_model sizes the norm."""
        if not self.sublayer.built:
            self.sublayer.build(input_shape)
        self.norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="norm"
        )
        self.norm.build(input_shape)
        self.dropout = Dropout(self.dropout_rate, dtype=self.dtype_policy, name="dropout")
        self.built = True

    def call(self, inputs, *args, training=None, **kwargs):
        y = self.norm(inputs) if self.norm_first else inputs
        outputs = self.sublayer(y, *args, training=training, **kwargs)
        extras = ()
        if isinstance(outputs, (tuple, list)):
            outputs, *extras = outputs
        x = inputs + self.dropout(outputs, training=training)
        if not self.norm_first:
            x = self.norm(x)
        return (x, *extras) if extras else x

    def get_config(self):
        return {
            **super().get_config(),
            "sublayer": keras.saving.serialize_keras_object(self.sublayer),
            "dropout_rate": self.dropout_rate,
            "norm_first": self.norm_first,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["sublayer"] = keras.saving.deserialize_keras_object(config["sublayer"])
        return cls(**config)
