"""One Keras layer per component of the paper's Transformer."""

from keras_transformer.layers.attention import MultiHeadAttention, ScaledDotProductAttention
from keras_transformer.layers.decoder import Decoder, DecoderLayer
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.embedding import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    SharedEmbedding,
)
from keras_transformer.layers.encoder import Encoder, EncoderLayer
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.residual import Residual

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Dropout",
    "Encoder",
    "EncoderLayer",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "Residual",
    "ScaledDotProductAttention",
    "SharedEmbedding",
]
