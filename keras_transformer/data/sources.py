"""Parallel text as `tf.data` of (source, target) string pairs.

Three kinds of source: local files (plain or .gz, one sentence per line), Multi30k (found in a
local directory, else downloaded into a cache), and TFDS translation datasets by name. Files
are checked in one streaming pass (line counts, UTF-8, empty lines) before training starts, so
bad input fails early with the file and line named.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.request
import zlib
from collections.abc import Callable

import tensorflow as tf

from keras_transformer.data.pieces import index_lines, piece_bounds
from keras_transformer.errors import KerasTransformerError
from keras_transformer.files import DATA_DIR_ENV, data_dir_from_env, write_atomic

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
MULTI30K_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}


class DataError(KerasTransformerError, ValueError):
    """Bad or missing input data; the message names the file, line or flag."""


class DataMissing(DataError):
    """The corpus is not where it is looked for (a file not found, Multi30k not downloaded,
    a TFDS dataset not prepared): `kt-train --dry-run` plans without it."""


@dataclasses.dataclass
class ParallelText:
    """A dataset of (source, target) tf.string pairs and what was skipped to make it."""

    dataset: tf.data.Dataset
    description: str
    num_pairs: int | None = None
    skipped_empty: int = 0
    skipped_invalid_utf8: int = 0
    # Contiguous pieces of the corpus (with their sizes) that `epoch` interleaves in an order
    # drawn from (seed, epoch); None: one piece, read in file order. `keep` filters them.
    pieces: list[tf.data.Dataset] | None = None
    piece_sizes: list[int] | None = None
    keep: Callable[[tf.data.Dataset], tf.data.Dataset] | None = None
    # `dataset` before `keep`: every one of the `num_pairs` pairs (a mixture counts them)
    unfiltered: tf.data.Dataset | None = None
    # `seek(i, k)`: piece i from its pair k on, without reading the pairs before it as
    # tf.data elements (None: `pieces[i].skip(k)`)
    seek: Callable[[int, int], tf.data.Dataset] | None = None

    def epoch(
        self, seed: int, epoch: int | tf.Tensor, filtered: bool = True, start: int | tf.Tensor = 0
    ) -> tf.data.Dataset:
        """Every pair once, in the order of pass `epoch`: the pieces interleaved at random
        (stateless, from `seed` and `epoch`), each read front to back. With `filtered`
        False, `keep` is not applied: exactly `num_pairs` pairs. From the pass's pair
        `start` on (counted before `keep`): each piece skips, unread by anything after it,
        the pairs of it that the order gives before `start` (a Python int `start`, in eager
        mode: through `seek`, reading no pair before it as a tf.data element)."""
        if not self.pieces:
            data = self.dataset if filtered or self.unfiltered is None else self.unfiltered
            return data.skip(tf.cast(start, tf.int64))
        choice = tf.repeat(tf.range(len(self.pieces), dtype=tf.int64), self.piece_sizes)
        pass_seed = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
        order = tf.random.experimental.stateless_shuffle(choice, seed=pass_seed)
        before = drawn(order[: tf.cast(start, tf.int64)], len(self.pieces))
        if isinstance(start, int) and tf.executing_eagerly():
            seek = self.seek or (lambda i, k: self.pieces[i].skip(k))
            pieces = [
                seek(i, int(k)) if k else p
                for i, (p, k) in enumerate(zip(self.pieces, before.numpy()))
            ]
        else:
            pieces = [piece.skip(before[i]) for i, piece in enumerate(self.pieces)]
        start = tf.cast(start, tf.int64)
        pairs = tf.data.Dataset.choose_from_datasets(
            pieces, tf.data.Dataset.from_tensor_slices(order[start:]), stop_on_empty_dataset=False
        )
        return self.keep(pairs) if self.keep and filtered else pairs

    def passes(self, seed: int, start: int = 0) -> tf.data.Dataset:
        """The endless stream of passes (pass p: `epoch(seed, p, filtered=False)`, exactly
        `num_pairs` pairs), from its raw pair `start` (a Python int) on: the pass it falls in
        is placed there by `epoch(..., start=)`, the later ones read from their starts."""
        first, offset = divmod(start, self.num_pairs)
        rest = tf.data.Dataset.counter(first + 1).flat_map(
            lambda p: self.epoch(seed, p, filtered=False)
        )
        return self.epoch(seed, first, filtered=False, start=offset).concatenate(rest)

    def report(self) -> str:
        parts = [self.description]
        if self.num_pairs is not None:
            parts.append(f"{self.num_pairs} pairs")
        if self.skipped_empty:
            parts.append(f"skipped {self.skipped_empty} pairs with an empty line")
        if self.skipped_invalid_utf8:
            parts.append(f"skipped {self.skipped_invalid_utf8} pairs with invalid UTF-8")
        return ", ".join(parts)


def drawn(order: tf.Tensor, count: int) -> tf.Tensor:
    """(count,) int64: how many times `order` (int64 indices < count) gives each index."""
    return tf.math.bincount(
        tf.cast(order, tf.int32), minlength=count, maxlength=count, dtype=tf.int64
    )


FILE_PIECES = 64  # a training file pair is read as up to this many contiguous pieces


def _count_and_check(path: str, bad_utf8: set[int], empty: set[int], pieces: int = 1):
    """Stream one file: its `LineIndex` (line count, marks for up to `pieces` pieces), and
    record invalid-UTF-8 and empty line numbers (0-based)."""

    def visit(number, raw):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            bad_utf8.add(number)
            return
        if not text.strip():
            empty.add(number)

    try:
        return index_lines(path, max_marks=max(1, pieces), visit=visit)
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"cannot read {path}: {err}") from None


def read_parallel_files(
    source_path: str, target_path: str, pieces: int = FILE_PIECES
) -> ParallelText:
    """Line i of `source_path` translates line i of `target_path`.

    Raises DataError for a missing file or mismatched line counts. Pairs where either side
    is empty or not valid UTF-8 are skipped and counted (`ParallelText.report`). With
    `pieces` > 1 the pair of files is also read as up to that many contiguous pieces, each
    from its own starting point (`data.pieces`), which `ParallelText.epoch` interleaves in an
    order drawn from (seed, epoch): a pass then draws from the whole corpus from its first
    pairs on, e.g. a corpus made of concatenated sub-corpora, which a bounded shuffle buffer
    alone cannot mix.
    """
    for path in (source_path, target_path):
        if not os.path.isfile(path):
            raise DataMissing(f"file not found: {path}")
    bad: set[int] = set()
    empty: set[int] = set()
    bad_lines: dict[str, list[int]] = {}
    indexes = []
    for path in (source_path, target_path):
        file_bad: set[int] = set()
        indexes.append(_count_and_check(path, file_bad, empty, pieces))
        bad_lines[path] = sorted(file_bad)
        bad |= file_bad
    counts = [index.count for index in indexes]
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

    dataset = _without_lines(tf.data.Dataset.zip((lines(source_path), lines(target_path))), skip)
    first_bad = "; ".join(
        f"first invalid UTF-8 in {path} at line {lines_[0] + 1}"
        for path, lines_ in bad_lines.items()
        if lines_
    )
    description = f"{source_path} + {target_path}" + (f" ({first_bad})" if first_bad else "")
    parts, sizes, seek = _file_pieces(indexes, skip, pieces)
    return ParallelText(
        dataset=dataset,
        description=description,
        num_pairs=counts[0] - len(skip),
        skipped_empty=len(empty),
        skipped_invalid_utf8=len(bad),
        pieces=parts,
        piece_sizes=sizes,
        seek=seek,
    )


def _file_pieces(indexes, skip: list[int], pieces: int):
    """(piece datasets, their sizes, seek) of a file pair, or (None, None, None) for one
    piece."""
    source, target = indexes
    # both files have marks at the same line numbers (they depend on the line count alone)
    bounds = piece_bounds(source.count, source.marks, pieces)
    if pieces <= 1 or len(bounds) <= 2:
        return None, None, None
    skipped = set(skip)
    spec = (tf.TensorSpec((), tf.string), tf.TensorSpec((), tf.string))

    def piece(first: int, stop: int, offset: int = 0) -> tf.data.Dataset:
        def pairs():
            numbers = range(first, stop)
            left = offset  # kept pairs to pass over in Python, not as tf.data elements
            for number, src, tgt in zip(
                numbers, source.read(first, stop), target.read(first, stop)
            ):
                if number in skipped:
                    continue
                if left:
                    left -= 1
                    continue
                yield src, tgt

        return tf.data.Dataset.from_generator(pairs, output_signature=spec)

    spans = list(zip(bounds[:-1], bounds[1:]))
    sizes = [stop - first - sum(1 for n in skip if first <= n < stop) for first, stop in spans]
    return [piece(first, stop) for first, stop in spans], sizes, lambda i, k: piece(*spans[i], k)


def _without_lines(dataset: tf.data.Dataset, skip: list[int]) -> tf.data.Dataset:
    """`dataset` without the elements at the (sorted, 0-based) positions `skip`."""
    if not skip:
        return dataset
    skip_sorted = tf.constant(skip, tf.int64)

    def keep(i, pair):
        at = tf.searchsorted(skip_sorted, [i])[0]
        return tf.logical_or(
            at >= len(skip), tf.gather(skip_sorted, tf.minimum(at, len(skip) - 1)) != i
        )

    return dataset.enumerate().filter(keep).map(lambda i, pair: pair)


def default_cache_dir() -> str:
    """`$XDG_CACHE_HOME/keras_transformer` (absolute), else `~/.cache/keras_transformer`."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(os.path.abspath(cache_home), "keras_transformer")


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


TFDS_PIECES = 64  # a TFDS training split is read as up to this many contiguous pieces


def tfds_builder(name: str, data_dir: str | None, *, download: bool = False):
    """The TFDS builder of `name`, prepared in `data_dir` (TFDS's default when None).

    Nothing is downloaded unless `download`: a dataset that is not prepared there fails with
    one line saying how to prepare it. TFDS's own errors (an unknown name lists the whole
    catalogue) are cut to their first line.
    """
    import absl.logging
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core.registered import (
        DatasetCollectionNotFoundError,
        DatasetNotFoundError,
    )

    verbosity = absl.logging.get_verbosity()
    absl.logging.set_verbosity(absl.logging.ERROR)  # "no dataset_info.json" for unprepared dirs
    try:
        builder = tfds.builder(name, data_dir=data_dir)
        prepared = builder.is_prepared()
    except (DatasetNotFoundError, DatasetCollectionNotFoundError) as err:
        raise DataError(
            f"unknown TFDS dataset {name!r} (--dataset tfds:NAME): {_first_line(err)}"
        ) from None
    except (ValueError, AssertionError) as err:
        if not any(words in str(err) for words in ("not found", "cannot be loaded at version")):
            raise  # not a name TFDS lacks: a bug to see whole
        raise DataError(  # a config or version it does not have
            f"unknown TFDS dataset {name!r} (--dataset tfds:NAME[/CONFIG][:VERSION]): "
            f"{_first_line(err)}"
        ) from None
    except OSError as err:
        raise DataError(
            f"TFDS cannot read {name!r} in --data-dir {data_dir}: {_first_line(err)}"
        ) from None
    finally:
        absl.logging.set_verbosity(verbosity)
    if prepared:
        return builder
    root = os.fspath(builder.data_dir_root)
    if not download:
        manual = os.path.join(root, "downloads", "manual")
        raise DataMissing(
            f"TFDS dataset {name} is not prepared in {root} (--data-dir): copy a prepared "
            f"{os.path.join(root, name.split('/')[0])} there (made where there is internet by "
            f"`tfds build {name} --data_dir DIR` or by --tfds-download), or pass --tfds-download "
            f"here; archives that TFDS cannot download go in {manual}"
        )
    try:
        builder.download_and_prepare()
    except Exception as err:
        raise DataError(
            f"--tfds-download: TFDS could not download and prepare {name} in {root}: "
            f"{_first_line(err)}"
        ) from None
    return builder


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def check_shards(builder, name: str, split: str) -> None:
    """Raise DataError when a shard file of `split` is missing (a half-copied dataset), now
    rather than as a NotFoundError when reading reaches it."""
    try:
        paths = [os.fspath(p) for p in builder.info.splits[split].filepaths]
    except (AttributeError, KeyError, TypeError):  # a TFDS without SplitInfo.filepaths
        return
    missing = [p for p in paths if not tf.io.gfile.exists(p)]
    if missing:
        raise DataError(
            f"TFDS dataset {name} is missing {len(missing)} of the {len(paths)} shard files of "
            f"its {split!r} split (first: {missing[0]}): copy the prepared dataset again, or "
            "prepare it anew (--tfds-download)"
        )


def tfds_translation(
    name: str,
    split: str,
    src_lang: str,
    tgt_lang: str,
    data_dir: str | None = None,
    *,
    download: bool = False,
    pieces: int = TFDS_PIECES,
) -> ParallelText:
    """A TFDS translation dataset, e.g. "wmt14_translate/de-en" or "ted_hrlr_translate/pt_to_en".

    The size comes from the builder's split info. The split is also read as up to `pieces`
    contiguous pieces (`tfds.even_splits`), which `ParallelText.epoch` interleaves in an order
    drawn from (seed, epoch): WMT14 is stored sub-corpus by sub-corpus, which a bounded shuffle
    buffer alone cannot mix.
    """
    import tensorflow_datasets as tfds

    builder = tfds_builder(name, data_dir, download=download)
    languages = list(builder.info.features.keys())
    for lang in (src_lang, tgt_lang):
        if lang not in languages:
            raise DataError(f"TFDS dataset {name} has languages {languages}, not {lang!r}")
    if split not in builder.info.splits:
        raise DataError(
            f"TFDS dataset {name} has no {split!r} split (it has {sorted(builder.info.splits)})"
        )
    check_shards(builder, name, split)
    size = builder.info.splits[split].num_examples

    def read(subsplit: str) -> tf.data.Dataset:
        data = builder.as_dataset(split=subsplit, shuffle_files=False)
        return data.map(lambda ex: (ex[src_lang], ex[tgt_lang]))

    names = tfds.even_splits(split, n=max(1, min(pieces, size)))
    sizes = [builder.info.splits[s].num_examples for s in names]
    parts = [read(s) for s in names] if len(names) > 1 else None
    starts = [sum(sizes[:i]) for i in range(len(sizes))]  # even splits follow each other

    def seek(i: int, k: int) -> tf.data.Dataset:  # TFDS skips the records unparsed
        if k >= sizes[i]:
            return read(names[i]).take(0)  # TFDS refuses an empty slice
        return read(f"{split}[{starts[i] + k}:{starts[i] + sizes[i]}]")

    return ParallelText(
        dataset=_drop_empty(read(split)),
        description=f"tfds:{name} [{split}]",
        num_pairs=size,
        pieces=parts,
        piece_sizes=sizes if parts else None,
        keep=_drop_empty,
        unfiltered=read(split),
        seek=seek if parts else None,
    )


def _drop_empty(pairs: tf.data.Dataset) -> tf.data.Dataset:
    return pairs.filter(
        lambda s, t: tf.logical_and(
            tf.strings.length(tf.strings.strip(s)) > 0, tf.strings.length(tf.strings.strip(t)) > 0
        )
    )


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
