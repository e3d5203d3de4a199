"""keras-transformer: the Transformer of "Attention Is All You Need" in TensorFlow/Keras.

The public names below are imported on first use (PEP 562), so that `import
keras_transformer.config` (and every command's `--help`) does not start TensorFlow.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "PRESETS": "keras_transformer.config",
    "TransformerConfig": "keras_transformer.config",
    "Decoder": "keras_transformer.layers",
    "DecoderLayer": "keras_transformer.layers",
    "Encoder": "keras_transformer.layers",
    "EncoderLayer": "keras_transformer.layers",
    "LearnedPositionalEmbedding": "keras_transformer.layers",
    "MultiHeadAttention": "keras_transformer.layers",
    "PositionalEncoding": "keras_transformer.layers",
    "PositionwiseFeedForward": "keras_transformer.layers",
    "Residual": "keras_transformer.layers",
    "ScaledDotProductAttention": "keras_transformer.layers",
    "SharedEmbedding": "keras_transformer.layers",
    "Translator": "keras_transformer.inference.translator",
    "beam_search": "keras_transformer.inference.search",
    "export_run": "keras_transformer.inference.export",
    "export_translator": "keras_transformer.inference.export",
    "LabelSmoothedCrossEntropy": "keras_transformer.losses",
    "MaskedAccuracy": "keras_transformer.losses",
    "Transformer": "keras_transformer.model",
    "WarmupSchedule": "keras_transformer.optimization",
    "paper_optimizer": "keras_transformer.optimization",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
