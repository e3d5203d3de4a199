"""Multi30k task 1 (raw text): found in a local directory, else downloaded into a cache."""

from __future__ import annotations

import os
import urllib.request

from keras_transformer.data.parallel_text import DataError, DataMissing, ParallelText
from keras_transformer.data.text_files import FILE_PIECES, read_parallel_files
from keras_transformer.files import write_atomic

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
MULTI30K_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
DATA_DIR_ENV = "KT_DATA_DIR"


def default_cache_dir() -> str:
    """`$XDG_CACHE_HOME/keras_transformer` (absolute), else `~/.cache/keras_transformer`."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(os.path.abspath(cache_home), "keras_transformer")


def data_dir_from_env() -> str | None:
    """$KT_DATA_DIR as an absolute path (resolved against the current directory), or None."""
    value = os.environ.get(DATA_DIR_ENV)
    return os.path.abspath(value) if value else None


def find_multi30k_file(
    split: str, lang: str, data_dir: str | None = None, download: bool = True
) -> str:
    """Absolute path of Multi30k `split` ("train", "validation", "test") in `lang`.

    With a data directory (`data_dir`, else $KT_DATA_DIR) the file must be there, directly or
    in its `multi30k/` folder, as `<name>.<lang>.gz` or `<name>.<lang>`: nothing is downloaded.
    Without one it is taken from the cache, downloaded there first from the dataset's public
    repository (multi30k/dataset, data/task1/raw) when `download` and $KT_OFFLINE is unset.
    """
    if split not in MULTI30K_SPLITS:
        raise DataError(f"unknown Multi30k split {split!r}; choose from {sorted(MULTI30K_SPLITS)}")
    name = f"{MULTI30K_SPLITS[split]}.{lang}"
    data_dir = os.path.abspath(data_dir) if data_dir else data_dir_from_env()
    cache = os.path.join(default_cache_dir(), "multi30k")
    folders = [data_dir, os.path.join(data_dir, "multi30k")] if data_dir else [cache]
    for folder in folders:
        for candidate in (f"{name}.gz", name):
            path = os.path.join(folder, candidate)
            if os.path.isfile(path):
                return path
    looked = ", ".join(folders)
    if data_dir:
        raise DataMissing(
            f"Multi30k file {name}(.gz) not found in: {looked} (--data-dir / {DATA_DIR_ENV}); "
            "nothing is downloaded when a data directory is given"
        )
    if not download or os.environ.get("KT_OFFLINE"):
        raise DataMissing(f"Multi30k file {name}(.gz) not found in: {looked}")
    url = f"{MULTI30K_URL}/{name}.gz"
    target = os.path.join(cache, f"{name}.gz")
    os.makedirs(cache, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            write_atomic(target, response.read())  # a Multi30k file is at most a few MB
    except OSError as err:
        raise DataMissing(
            f"Multi30k file {name}(.gz) not found in: {looked}; and downloading {url} failed ({err}). "
            f"Put the files in a directory and pass --data-dir DIR or set {DATA_DIR_ENV}."
        ) from None
    return target


def multi30k(
    split: str, src_lang: str, tgt_lang: str, data_dir: str | None = None, download: bool = True
) -> ParallelText:
    """Multi30k task 1 (raw text) as parallel pairs in the given direction (the training
    split in pieces, as `read_parallel_files` reads training files); `download`: see
    `find_multi30k_file`."""
    return read_parallel_files(
        find_multi30k_file(split, src_lang, data_dir, download),
        find_multi30k_file(split, tgt_lang, data_dir, download),
        pieces=FILE_PIECES if split == "train" else 1,
    )
