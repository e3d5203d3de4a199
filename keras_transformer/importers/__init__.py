"""Pretrained models from other toolkits, imported as run directories (`kt-import`).

marian: OPUS-MT / Marian Transformers, from Marian's own files or Hugging Face's layout;
run: the run directory written from them (the id mapping, the weights' places).
"""

from __future__ import annotations


def import_model(source_dir: str, model_dir: str):
    """Read the OPUS-MT / Marian model in `source_dir` (either layout) and write it as a run
    directory in `model_dir`; returns the `Run`. Raises `ImportFailure` (nothing written)
    for a model it cannot import."""
    from keras_transformer.importers.marian import read

    checkpoint = read(source_dir)  # before TensorFlow is imported: a bad source fails at once
    from keras_transformer.importers.run import write_run

    return write_run(checkpoint, model_dir)


__all__ = ["import_model"]
