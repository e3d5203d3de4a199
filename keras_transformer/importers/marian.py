"""Read an OPUS-MT / Marian Transformer from its own files, in either layout it is published in.

- A Marian model directory (what OPUS-MT's zips hold; `marian_npz`): `decoder.yml`, the
  `.npz` with its `special:model.yml`, the vocabulary `.yml`, `source.spm`, `target.spm`.
- A Hugging Face Marian directory (`Helsinki-NLP/opus-mt-*`; `huggingface`): `config.json`,
  `model.safetensors` (no PyTorch), `vocab.json`, `source.spm`, `target.spm`.

Either becomes one `MarianCheckpoint` (`checkpoint`), which `importers.run` turns into a run
directory. Everything is checked before anything is written: a missing file, an `.npz`
without `special:model.yml`, an option this Transformer does not have (named, as Marian's
flag or Hugging Face's config key) or a vocabulary that does not match the embedding raise
`ImportFailure`, which the command prints as one line (exit 2).
"""

from __future__ import annotations

import os

from keras_transformer.importers.checkpoint import (
    HF_FORMAT,
    MARIAN_FORMAT,
    ImportFailure,
    MarianCheckpoint,
    check_vocabulary,
)
from keras_transformer.importers.huggingface import marian_names, read_huggingface
from keras_transformer.importers.marian_npz import read_marian, read_npz, read_vocab_yml


def detect(source_dir: str) -> str:
    """MARIAN_FORMAT or HF_FORMAT, from the directory's files."""
    if not os.path.isdir(source_dir):
        raise ImportFailure(f"{source_dir} is not a directory: give an OPUS-MT model directory")
    names = set(os.listdir(source_dir))
    if "decoder.yml" in names or any(n.endswith(".npz") for n in names):
        return MARIAN_FORMAT
    if "config.json" in names:
        return HF_FORMAT
    raise ImportFailure(
        f"{source_dir} is neither a Marian model directory (decoder.yml, model .npz, "
        "vocabulary .yml, source.spm, target.spm) nor a Hugging Face Marian directory "
        "(config.json, model.safetensors, vocab.json, source.spm, target.spm)"
    )


def read(source_dir: str) -> MarianCheckpoint:
    """The model in `source_dir`, in either layout (see the module docstring)."""
    source_dir = os.fspath(source_dir)
    kind = detect(source_dir)
    checkpoint = read_marian(source_dir) if kind == MARIAN_FORMAT else read_huggingface(source_dir)
    check_vocabulary(checkpoint, source_dir)
    return checkpoint


__all__ = [
    "HF_FORMAT",
    "MARIAN_FORMAT",
    "ImportFailure",
    "MarianCheckpoint",
    "detect",
    "marian_names",
    "read",
    "read_huggingface",
    "read_marian",
    "read_npz",
    "read_vocab_yml",
]
