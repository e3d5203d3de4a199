"""keras-transformer: the Transformer of "Attention Is All You Need" in TensorFlow/Keras."""

from keras_transformer.config import PRESETS, TransformerConfig
from keras_transformer.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    Residual,
    ScaledDotProductAttention,
    SharedEmbedding,
)
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.optimization import WarmupSchedule, paper_optimizer

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "LabelSmoothedCrossEntropy",
    "LearnedPositionalEmbedding",
    "MaskedAccuracy",
    "MultiHeadAttention",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "Residual",
    "ScaledDotProductAttention",
    "SharedEmbedding",
    "Transformer",
    "TransformerConfig",
    "WarmupSchedule",
    "paper_optimizer",
]
