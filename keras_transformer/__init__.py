"""keras-transformer: the Transformer of "Attention Is All You Need" in TensorFlow/Keras.

The public names below are imported on first use (PEP 562), so that `import
keras_transformer.config` (and every command's `--help`) does not start TensorFlow. When
TensorFlow or Keras is already imported, they are all imported at once instead (it costs
nothing more), so that Keras knows every registered class: `keras.saving.load_model` of a
`.keras` file finds `Transformer` and its layers. Otherwise touching any public name
(e.g. `kt.Transformer`) registers them all.

The distribution is `keras-transformer-nmt`, installed from a checkout (`pip install -e .`; it
is not on PyPI). PyPI's `keras-transformer` is an unrelated project that installs
this same import package: when it is installed too, importing warns
(`keras_transformer_nmt.other_distribution`).
"""

from __future__ import annotations

import importlib
import sys

__version__ = "0.2.0"  # setup.py reads it

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


def _import_all() -> None:
    """Imports every public name (and so registers every class with Keras)."""
    for public, module in _EXPORTS.items():
        globals()[public] = getattr(importlib.import_module(module), public)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
    _import_all()  # later lookups skip __getattr__
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


def _warn_other_distribution() -> None:
    try:
        from keras_transformer_nmt import other_distribution
    except ImportError:  # the package without its distribution's launcher module
        return
    other = other_distribution()
    if other is not None:
        import warnings

        warnings.warn(
            f"keras-transformer {other[0]} is installed ({other[1]}): an unrelated package that installs "
            "the same import package, keras_transformer, as keras-transformer-nmt (this one); "
            "each shadows files of the other. Remove it: pip uninstall keras-transformer, then "
            "in your checkout of this project, pip install --force-reinstall -e . "
            "(keras-transformer-nmt is not on PyPI)",
            stacklevel=3,
        )


_warn_other_distribution()

if "tensorflow" in sys.modules or "keras" in sys.modules:
    _import_all()
