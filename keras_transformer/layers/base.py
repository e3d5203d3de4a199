"""Arguments shared by the encoder/decoder layers and stacks, validated and serialized once."""

from __future__ import annotations

import keras

_BLOCK_ARGS = (
    "d_model",
    "num_heads",
    "d_ff",
    "dropout_rate",
    "attention_dropout",
    "ffn_dropout",
    "norm_first",
    "layer_norm_epsilon",
)


class BlockLayer(keras.layers.Layer):
    """Base of EncoderLayer, DecoderLayer, Encoder and Decoder: the paper's argument names."""

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout_rate: float = 0.1,
        attention_dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        norm_first: bool = False,
        layer_norm_epsilon: float = 1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if d_model <= 0 or num_heads <= 0 or d_model % num_heads:
            raise ValueError(
                f"d_model ({d_model}) must be a positive multiple of num_heads ({num_heads})"
            )
        if d_ff <= 0:
            raise ValueError(f"d_ff must be positive, got {d_ff}")
        for name, rate in (
            ("dropout_rate", dropout_rate),
            ("attention_dropout", attention_dropout),
            ("ffn_dropout", ffn_dropout),
        ):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {rate}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout_rate = dropout_rate
        self.attention_dropout = attention_dropout
        self.ffn_dropout = ffn_dropout
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon

    def block_kwargs(self) -> dict:
        """The shared arguments, to build sublayers with the same settings."""
        return {name: getattr(self, name) for name in _BLOCK_ARGS}

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), **self.block_kwargs()}


class StackLayer(BlockLayer):
    """A BlockLayer made of `num_layers` identical layers."""

    def __init__(self, *, num_layers: int, **kwargs):
        super().__init__(**kwargs)
        if num_layers <= 0:
            raise ValueError(f"num_layers must be positive, got {num_layers}")
        self.num_layers = num_layers

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers}
