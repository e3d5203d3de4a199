import gzip
import os

import pytest

from keras_transformer.data import DataError, load_parallel, read_parallel_files
from keras_transformer.data.sources import find_multi30k_file


def write(path, lines, raw=False):
    data = b"".join(lines) if raw else "".join(line + "\n" for line in lines).encode()
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as handle:
        handle.write(data)
    return path


def pairs_of(parallel):
    return [(s.decode(), t.decode()) for s, t in parallel.dataset.as_numpy_iterator()]


def test_plain_and_gzip_files(tmp_path):
    src = write(os.path.join(tmp_path, "a.en"), ["one", "two"])
    tgt = write(os.path.join(tmp_path, "a.de.gz"), ["eins", "zwei"])
    assert pairs_of(read_parallel_files(src, tgt)) == [("one", "eins"), ("two", "zwei")]


def test_multi30k_from_data_dir(multi30k_dir):
    parallel = load_parallel("multi30k", "test", "de", "en", data_dir=multi30k_dir)
    first = next(parallel.dataset.as_numpy_iterator())
    assert parallel.num_pairs == 1000 and first[0].decode().startswith("Ein Mann")


def test_mismatched_counts_name_both_files(tmp_path):
    src = write(os.path.join(tmp_path, "x.en"), ["a", "b", "c"])
    tgt = write(os.path.join(tmp_path, "x.de"), ["a", "b"])
    with pytest.raises(DataError, match=r"x\.en has 3 lines, .*x\.de has 2 lines"):
        read_parallel_files(src, tgt)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match="file not found: .*nope.en"):
        read_parallel_files(os.path.join(tmp_path, "nope.en"), os.path.join(tmp_path, "nope.de"))


def test_invalid_utf8_and_empty_lines_are_skipped_and_reported(tmp_path):
    src = write(
        os.path.join(tmp_path, "b.en"), [b"good\n", b"\xff\xfe bad\n", b"\n", b"fine\n"], raw=True
    )
    tgt = write(os.path.join(tmp_path, "b.de"), ["gut", "schlecht", "leer", "gut"])
    parallel = read_parallel_files(src, tgt)
    assert pairs_of(parallel) == [("good", "gut"), ("fine", "gut")]
    assert parallel.skipped_invalid_utf8 == 1 and parallel.skipped_empty == 1
    assert (
        "b.en at line 2" in parallel.report()
        and "skipped 1 pairs with an empty line" in parallel.report()
    )


def test_data_dir_without_multi30k(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", os.path.join(tmp_path, "cache"))
    with pytest.raises(DataError, match=r"train\.en\(\.gz\) not found in: .*empty"):
        find_multi30k_file("train", "en", os.path.join(tmp_path, "empty"), download=False)


def test_relative_data_dir_from_env_is_resolved_once(multi30k_dir, tmp_path, monkeypatch):
    relative = os.path.relpath(multi30k_dir, tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KT_DATA_DIR", relative)
    path = find_multi30k_file("validation", "de")
    assert os.path.isabs(path) and path == os.path.join(multi30k_dir, "val.de.gz")
    # The path stays valid after the working directory changes (a notebook kernel, a child).
    monkeypatch.chdir(os.path.dirname(multi30k_dir))
    assert os.path.isfile(path)


def test_nothing_downloads_when_a_data_dir_is_given(tmp_path, monkeypatch):
    monkeypatch.delenv("KT_OFFLINE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", os.path.join(tmp_path, "cache"))

    def no_network(*args, **kwargs):
        raise AssertionError(f"tried to download {args[0]}")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    empty = os.path.join(tmp_path, "empty")
    with pytest.raises(DataError, match=r"train\.en\(\.gz\) not found in: .*empty.*--data-dir"):
        find_multi30k_file("train", "en", empty)
    monkeypatch.setenv("KT_DATA_DIR", empty)
    with pytest.raises(DataError, match="nothing is downloaded when a data directory is given"):
        load_parallel("multi30k", "train", "en", "de")


def test_unknown_dataset():
    with pytest.raises(DataError, match="unknown --dataset 'wmt99'"):
        load_parallel("wmt99", "train", "en", "de")


class _FakeBuilder:
    class info:  # noqa: N801 - mirrors tfds.core.DatasetInfo
        features = {"de": None, "en": None}


@pytest.mark.parametrize("split,shuffled", [("train", True), ("validation", False)])
def test_tfds_training_files_are_shuffled_with_the_seed(monkeypatch, split, shuffled):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    calls = []

    def fake_load(name, **kwargs):
        calls.append((name, kwargs))
        return tf.data.Dataset.from_tensor_slices({"en": ["a", " ", "b"], "de": ["x", "y", "z"]})

    monkeypatch.setattr(tfds, "builder", lambda name, data_dir=None: _FakeBuilder())
    monkeypatch.setattr(tfds, "load", fake_load)
    parallel = load_parallel("tfds:wmt14_translate/de-en", split, "en", "de", seed=17)
    assert pairs_of(parallel) == [("a", "x"), ("b", "z")]  # empty sides dropped
    [(name, kwargs)] = calls
    assert name == "wmt14_translate/de-en" and kwargs["split"] == split
    assert kwargs["shuffle_files"] is shuffled
    config = kwargs["read_config"]
    if shuffled:
        # Seeded, and the same file order on every pass (a stream position stays restorable).
        assert config.shuffle_seed == 17 and config.shuffle_reshuffle_each_iteration is False
        assert "files shuffled with seed 17" in parallel.report()
    else:
        assert config.shuffle_seed is None
