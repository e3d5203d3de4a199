"""TFDS translation datasets by name as a `ParallelText`: prepared in a data directory, or
downloaded and prepared on request (--tfds-download), read in pieces for training."""

from __future__ import annotations

import os

import tensorflow as tf

from keras_transformer.data.parallel_text import DataError, DataMissing, ParallelText

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
