"""Arguments shared by the encoder/decoder layers and stacks, validated and serialized once,
and the sublayers every block is made of (residual-wrapped attention and feed-forward)."""

from __future__ import annotations

import keras

from keras_transformer.layers.attention import MultiHeadAttention, head_depths
from keras_transformer.layers.feed_forward import PositionwiseFeedForward, check_activation
from keras_transformer.layers.residual import Residual

_BLOCK_ARGS = (
    "d_model",
    "num_heads",
    "d_ff",
    "d_k",
    "d_v",
    "dropout_rate",
    "attention_dropout",
    "ffn_dropout",
    "norm_first",
    "layer_norm_epsilon",
)


class BlockLayer(keras.layers.Layer):
    """Base of EncoderLayer, DecoderLayer, Encoder and Decoder: the paper's argument names.

    `return_attention_scores` fixes the return structure at construction: `outputs`, or
    `(outputs, weights)` (with a decoding cache, the cache comes between them).
    """

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        d_ff: int,
        d_k: int | None = None,
        d_v: int | None = None,
        dropout_rate: float = 0.1,
        attention_dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        norm_first: bool = False,
        layer_norm_epsilon: float = 1e-6,
        ffn_activation: str = "relu",
        return_attention_scores: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_k, self.d_v = head_depths(d_model, num_heads, d_k, d_v)
        check_activation(ffn_activation)
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
        self.ffn_activation = ffn_activation
        self.return_attention_scores = return_attention_scores

    def block_kwargs(self) -> dict:
        """The shared arguments, to build sublayers with the same settings (an activation
        other than the paper's ReLU included; ReLU is left out, so the configs of the
        paper's layers stay as they were saved)."""
        kwargs = {name: getattr(self, name) for name in _BLOCK_ARGS}
        if self.ffn_activation != "relu":
            kwargs["ffn_activation"] = self.ffn_activation
        return kwargs

    def _residual(self, sublayer: keras.layers.Layer, name: str) -> Residual:
        """`sublayer` wrapped in residual + dropout + norm, built, named by its role."""
        block = Residual(
            sublayer,
            dropout_rate=self.dropout_rate,
            norm_first=self.norm_first,
            layer_norm_epsilon=self.layer_norm_epsilon,
            dtype=self.dtype_policy,
            name=name,
        )
        block.build((None, None, self.d_model))
        return block

    def _attention_block(self, name: str, self_attention: bool) -> Residual:
        """Residual-wrapped multi-head attention that returns its weights (to the block)."""
        attention = MultiHeadAttention(
            num_heads=self.num_heads,
            d_model=self.d_model,
            d_k=self.d_k,
            d_v=self.d_v,
            self_attention=self_attention,
            attention_dropout=self.attention_dropout,
            return_attention_scores=True,
            dtype=self.dtype_policy,
            name="sublayer",
        )
        return self._residual(attention, name)

    def _feed_forward_block(self) -> Residual:
        ffn = PositionwiseFeedForward(
            d_model=self.d_model,
            d_ff=self.d_ff,
            ffn_dropout=self.ffn_dropout,
            activation=self.ffn_activation,
            dtype=self.dtype_policy,
            name="sublayer",
        )
        return self._residual(ffn, "feed_forward")

    def get_config(self):
        return {
            **super().get_config(),
            **self.block_kwargs(),
            "return_attention_scores": self.return_attention_scores,
        }


class StackLayer(BlockLayer):
    """A BlockLayer made of `num_layers` identical `block_class` layers (plus a final norm
    when `norm_first`), each returning its attention weights to the stack."""

    block_class: type[BlockLayer]

    def __init__(self, *, num_layers: int, **kwargs):
        super().__init__(**kwargs)
        if num_layers <= 0:
            raise ValueError(f"num_layers must be positive, got {num_layers}")
        self.num_layers = num_layers

    def build(self, input_shape=None):
        blocks = []
        for i in range(self.num_layers):
            block = self.block_class(
                **self.block_kwargs(),
                return_attention_scores=True,
                dtype=self.dtype_policy,
                name=f"layer_{i}",
            )
            block.build()
            # each block is also an attribute of its own: TensorFlow's checkpoint tracking
            # does not see into a list attribute of a Keras 3 layer
            setattr(self, f"layer_{i}", block)
            blocks.append(block)
        self.blocks = blocks
        self.final_norm = None
        if self.norm_first:
            self.final_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="final_norm"
            )
            self.final_norm.build((None, None, self.d_model))
        self.built = True

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers}
