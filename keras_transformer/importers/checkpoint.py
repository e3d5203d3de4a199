"""What both readers of an OPUS-MT model produce: one `MarianCheckpoint`, and the checks and
files they share.

A checkpoint holds the options as a `TransformerConfig`, the weights under Marian's names
(a Hugging Face checkpoint is renamed to them), the vocabulary in Marian's id order (`</s>` 0,
`<unk>` 1) and the two SentencePiece models. Anything that cannot be imported raises
`ImportFailure`, which the command prints as one line (exit 2), before anything is written.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from keras_transformer.config import TransformerConfig
from keras_transformer.errors import KerasTransformerError

MARIAN_FORMAT, HF_FORMAT = "marian", "huggingface"
SPM_FILES = ("source.spm", "target.spm")
# the inputs an import reads longest (truncation of longer ones: the translator's); Marian
# itself crops at --max-length (its decoder.yml default: 1000 with --max-length-crop)
MAX_LENGTH = 512
# Marian's layer normalization epsilon (marian's layerNorm(..., eps = 1e-9))
MARIAN_EPSILON = 1e-9


class ImportFailure(KerasTransformerError, ValueError):
    """A source directory that cannot be imported; the message names the file or option."""


@dataclasses.dataclass
class MarianCheckpoint:
    """One Marian Transformer, whatever layout it came in."""

    config: TransformerConfig
    weights: dict[str, np.ndarray]  # Marian's names and shapes
    vocab: list[str]  # the pieces in Marian's id order: </s> 0, <unk> 1, ...
    source_spm: bytes
    target_spm: bytes
    origin: dict  # {"format": ..., "source": the directory}


def model_config(*, vocab, d_model, d_ff, heads, encoder_layers, decoder_layers, activation, where):
    """The TransformerConfig of a Marian Transformer with these dimensions (the options
    every OPUS-MT model shares: post-norm, an output bias, sin/cos halves, a zero start)."""
    from keras_transformer.config import ConfigError

    try:
        return TransformerConfig(
            vocab_size=int(vocab) + 2,  # pad and bos join Marian's ids (see run.py)
            num_layers=int(encoder_layers),
            decoder_layers=int(decoder_layers),
            d_model=int(d_model),
            d_ff=int(d_ff),
            num_heads=int(heads),
            dropout_rate=0.1,
            max_length=MAX_LENGTH,
            layer_norm_epsilon=MARIAN_EPSILON,
            ffn_activation=activation,
            output_bias=True,
            sinusoid_layout="halves",
            decoder_start_zero=True,
        )
    except (ConfigError, TypeError, ValueError) as err:
        raise ImportFailure(f"{where}: {err}") from None


def source_file(source_dir: str, name: str, what: str) -> str:
    """The path of `name` in `source_dir`; ImportFailure saying `what` it is when missing."""
    path = os.path.join(source_dir, name)
    if not os.path.isfile(path):
        raise ImportFailure(f"{path} not found: {what}")
    return path


def read_spm(source_dir: str) -> tuple[bytes, bytes]:
    """(source.spm, target.spm) as bytes."""
    protos = []
    for name in SPM_FILES:
        path = source_file(
            source_dir, name, "OPUS-MT models ship their SentencePiece models with them"
        )
        with open(path, "rb") as handle:
            protos.append(handle.read())
    return protos[0], protos[1]


def check_vocabulary(checkpoint: MarianCheckpoint, source_dir: str) -> None:
    """The vocabulary is the embedding's, and starts as Marian's does."""
    rows = checkpoint.weights["Wemb"].shape[0]
    if len(checkpoint.vocab) != rows:
        raise ImportFailure(
            f"{source_dir}: the vocabulary has {len(checkpoint.vocab)} pieces but the "
            f"embedding has {rows} rows: the vocabulary is not this model's"
        )
    if checkpoint.vocab[:2] != ["</s>", "<unk>"]:
        raise ImportFailure(
            f"{source_dir}: the vocabulary must start with </s> (id 0) and <unk> (id 1), as "
            f"Marian writes it, got {checkpoint.vocab[:2]}"
        )


__all__ = [
    "HF_FORMAT",
    "MARIAN_FORMAT",
    "ImportFailure",
    "MarianCheckpoint",
    "check_vocabulary",
    "model_config",
    "read_spm",
    "source_file",
]
