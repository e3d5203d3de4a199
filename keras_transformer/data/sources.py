"""Parallel text as `tf.data` of (source, target) string pairs.

Three kinds of source: local files (plain or .gz, one sentence per line), Multi30k (found in a
local directory, else downloaded into a cache), and TFDS translation datasets by name. Files
are checked in one streaming pass (line counts, UTF-8, empty lines) before training starts, so
bad input fails early with the file and line named.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import shutil
import urllib.request

import tensorflow as tf

from keras_transformer.errors import KerasTransformerError

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
MULTI30K_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
DATA_DIR_ENV = "KT_DATA_DIR"


class DataError(KerasTransformerError, ValueError):
    """Bad or missing input data; the message names the file, line or flag."""


@dataclasses.dataclass
class ParallelText:
    """A dataset of (source, target) tf.string pairs and what was skipped to make it."""

    dataset: tf.data.Dataset
    description: str
    num_pairs: int | None = None
    skipped_empty: int = 0
    skipped_invalid_utf8: int = 0

    def report(self) -> str:
        parts = [self.description]
        if self.num_pairs is not None:
            parts.append(f"{self.num_pairs} pairs")
        if self.skipped_empty:
            parts.append(f"skipped {self.skipped_empty} pairs with an empty line")
        if self.skipped_invalid_utf8:
            parts.append(f"skipped {self.skipped_invalid_utf8} pairs with invalid UTF-8")
        return ", ".join(parts)


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _count_and_check(path: str, bad_utf8: set[int], empty: set[int]) -> int:
    """Stream one file: count lines, record invalid-UTF-8 and empty line numbers (0-based)."""
    count = 0
    try:
        with _open(path) as handle:
            for count, raw in enumerate(handle, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    bad_utf8.add(count - 1)
                    continue
                if not text.strip():
                    empty.add(count - 1)
    except (OSError, EOFError) as err:
        raise DataError(f"cannot read {path}: {err}") from None
    return count


def read_parallel_files(source_path: str, target_path: str) -> ParallelText:
    """Line i of `source_path` translates line i of `target_path`.

    Raises DataError for a missing file or mismatched line counts. Pairs where either side
    is empty or not valid UTF-8 are skipped and counted (`ParallelText.report`).
    """
    for path in (source_path, target_path):
        if not os.path.isfile(path):
            raise DataError(f"file not found: {path}")
    bad: set[int] = set()
    empty: set[int] = set()
    bad_lines: dict[str, list[int]] = {}
    counts = []
    for path in (source_path, target_path):
        file_bad: set[int] = set()
        counts.append(_count_and_check(path, file_bad, empty))
        bad_lines[path] = sorted(file_bad)
        bad |= file_bad
    if counts[0] != counts[1]:
        raise DataError(
            f"line counts differ: {source_path} has {counts[0]} lines, "
            f"{target_path} has {counts[1]} lines"
        )
    empty -= bad
    skip = sorted(bad | empty)

    def lines(path):
        return tf.data.TextLineDataset(
            path, compression_type="GZIP" if path.endswith(".gz") else ""
        )

    dataset = tf.data.Dataset.zip((lines(source_path), lines(target_path)))
    if skip:
        skip_sorted = tf.constant(skip, tf.int64)

        def keep(i, pair):
            at = tf.searchsorted(skip_sorted, [i])[0]
            return tf.logical_or(
                at >= len(skip), tf.gather(skip_sorted, tf.minimum(at, len(skip) - 1)) != i
            )

        dataset = dataset.enumerate().filter(keep).map(lambda i, pair: pair)
    first_bad = "; ".join(
        f"first invalid UTF-8 in {path} at line {lines_[0] + 1}"
        for path, lines_ in bad_lines.items()
        if lines_
    )
    description = f"{source_path} + {target_path}" + (f" ({first_bad})" if first_bad else "")
    return ParallelText(
        dataset=dataset,
        description=description,
        num_pairs=counts[0] - len(skip),
        skipped_empty=len(empty),
        skipped_invalid_utf8=len(bad),
    )


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
        raise DataError(
            f"Multi30k file {name}(.gz) not found in: {looked} (--data-dir / {DATA_DIR_ENV}); "
            "nothing is downloaded when a data directory is given"
        )
    if not download or os.environ.get("KT_OFFLINE"):
        raise DataError(f"Multi30k file {name}(.gz) not found in: {looked}")
    url = f"{MULTI30K_URL}/{name}.gz"
    target = os.path.join(cache, f"{name}.gz")
    os.makedirs(cache, exist_ok=True)
    try:
        with (
            urllib.request.urlopen(url, timeout=30) as response,
            open(target + ".part", "wb") as out,
        ):
            shutil.copyfileobj(response, out)
        os.replace(target + ".part", target)
    except OSError as err:
        raise DataError(
            f"Multi30k file {name}(.gz) not found in: {looked}; and downloading {url} failed ({err}). "
            f"Put the files in a directory and pass --data-dir DIR or set {DATA_DIR_ENV}."
        ) from None
    return target


def multi30k(split: str, src_lang: str, tgt_lang: str, data_dir: str | None = None) -> ParallelText:
    """Multi30k task 1 (raw text) as parallel pairs in the given direction."""
    return read_parallel_files(
        find_multi30k_file(split, src_lang, data_dir), find_multi30k_file(split, tgt_lang, data_dir)
    )


def tfds_translation(
    name: str,
    split: str,
    src_lang: str,
    tgt_lang: str,
    data_dir: str | None = None,
    *,
    shuffle_files: bool = False,
    seed: int = 0,
) -> ParallelText:
    """A TFDS translation dataset, e.g. "wmt14_translate/de-en" or "ted_hrlr_translate/pt_to_en".

    `shuffle_files` reads the files in an order drawn from `seed` (the same order on every
    pass, so a stream position stays restorable): WMT14 is stored sub-corpus by sub-corpus,
    which a bounded shuffle buffer alone cannot mix.
    """
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as err:  # tfds raises several types for unknown names
        raise DataError(f"unknown TFDS dataset {name!r}: {err}") from None
    languages = list(builder.info.features.keys())
    for lang in (src_lang, tgt_lang):
        if lang not in languages:
            raise DataError(f"TFDS dataset {name} has languages {languages}, not {lang!r}")
    read_config = tfds.ReadConfig(
        shuffle_seed=seed if shuffle_files else None,
        shuffle_reshuffle_each_iteration=False if shuffle_files else None,
    )
    try:
        dataset = tfds.load(
            name,
            split=split,
            data_dir=data_dir,
            shuffle_files=shuffle_files,
            read_config=read_config,
        )
    except Exception as err:
        raise DataError(
            f"cannot load TFDS dataset {name} split {split!r} from {data_dir}: {err}"
        ) from None
    pairs = dataset.map(lambda ex: (ex[src_lang], ex[tgt_lang])).filter(
        lambda s, t: tf.logical_and(
            tf.strings.length(tf.strings.strip(s)) > 0, tf.strings.length(tf.strings.strip(t)) > 0
        )
    )
    order = f", files shuffled with seed {seed}" if shuffle_files else ""
    return ParallelText(dataset=pairs, description=f"tfds:{name} [{split}]{order}")


def load_parallel(
    dataset: str,
    split: str,
    src_lang: str,
    tgt_lang: str,
    *,
    data_dir: str | None = None,
    files: tuple[str, str] | None = None,
    seed: int = 0,
) -> ParallelText:
    """Dispatch on `--dataset`: "multi30k", "files" (with `files`) or "tfds:NAME".

    TFDS training splits read their files in an order drawn from `seed`."""
    if dataset == "multi30k":
        return multi30k(split, src_lang, tgt_lang, data_dir)
    if dataset == "files":
        if not files or not all(files):
            raise DataError(f"--dataset files needs the {split} source and target files")
        return read_parallel_files(*files)
    if dataset.startswith("tfds:"):
        tfds_split = {"validation": "validation", "train": "train", "test": "test"}[split]
        return tfds_translation(
            dataset[5:],
            tfds_split,
            src_lang,
            tgt_lang,
            data_dir,
            shuffle_files=split == "train",
            seed=seed,
        )
    raise DataError(f"unknown --dataset {dataset!r}: use multi30k, files or tfds:NAME")
