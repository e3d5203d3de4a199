"""Parallel text as `tf.data` of (source, target) string pairs: `load_parallel` dispatches on
`--dataset` to one of three kinds of source.

Local files (`text_files`: plain or .gz, one sentence per line, checked in one streaming pass
before training starts, so bad input fails early with the file and line named), Multi30k
(`multi30k`: found in a local directory, else downloaded into a cache), and TFDS translation
datasets by name (`tfds_source`). The names of those modules stay importable from here.
"""

from __future__ import annotations

from keras_transformer.data.multi30k import (
    DATA_DIR_ENV,
    MULTI30K_SPLITS,
    MULTI30K_URL,
    data_dir_from_env,
    default_cache_dir,
    find_multi30k_file,
    multi30k,
)
from keras_transformer.data.parallel_text import DataError, DataMissing, ParallelText, drawn
from keras_transformer.data.text_files import FILE_PIECES, read_parallel_files
from keras_transformer.data.tfds_source import (
    TFDS_PIECES,
    check_shards,
    tfds_builder,
    tfds_translation,
)

__all__ = [
    "DATA_DIR_ENV",
    "FILE_PIECES",
    "MULTI30K_SPLITS",
    "MULTI30K_URL",
    "TFDS_PIECES",
    "DataError",
    "DataMissing",
    "ParallelText",
    "check_shards",
    "data_dir_from_env",
    "default_cache_dir",
    "drawn",
    "find_multi30k_file",
    "load_parallel",
    "multi30k",
    "read_parallel_files",
    "tfds_builder",
    "tfds_translation",
]


def load_parallel(
    dataset: str,
    split: str,
    src_lang: str,
    tgt_lang: str,
    *,
    data_dir: str | None = None,
    files: tuple[str, str] | None = None,
    tfds_download: bool = False,
    download: bool = True,
) -> ParallelText:
    """Dispatch on `--dataset`: "multi30k", "files" (with `files`) or "tfds:NAME".
    `download=False`: Multi30k is not downloaded to the cache either."""
    if dataset == "multi30k":
        return multi30k(split, src_lang, tgt_lang, data_dir, download)
    if dataset == "files":
        if not files or not all(files):
            flags = (
                "--train-src and --train-tgt" if split == "train" else "--valid-src and --valid-tgt"
            )
            raise DataError(f"--dataset files needs the {split} files: pass {flags}")
        return read_parallel_files(*files, pieces=FILE_PIECES if split == "train" else 1)
    if dataset.startswith("tfds:"):
        tfds_split = {"validation": "validation", "train": "train", "test": "test"}[split]
        return tfds_translation(
            dataset[5:],
            tfds_split,
            src_lang,
            tgt_lang,
            data_dir,
            download=tfds_download,
            pieces=TFDS_PIECES if split == "train" else 1,  # only training reorders
        )
    raise DataError(f"unknown --dataset {dataset!r}: use multi30k, files or tfds:NAME")
