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


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    from tests.data import tfds_fixture

    return tfds_fixture.prepare(str(tmp_path_factory.mktemp("tfds")))


def test_tfds_size_and_pairs_come_from_the_prepared_dataset(tfds_dir):
    from tests.data.tfds_fixture import NAME, sentence_pairs

    train = load_parallel(f"tfds:{NAME}", "train", "en", "de", data_dir=tfds_dir)
    assert train.num_pairs == 1200 and "1200 pairs" in train.report()
    valid = load_parallel(f"tfds:{NAME}", "validation", "de", "en", data_dir=tfds_dir)
    assert valid.num_pairs == 40 and not valid.pieces
    # the whole split (in TFDS's stored order), pairs with an empty side dropped
    assert sorted(pairs_of(valid)) == sorted(
        (de, en) for en, de in sentence_pairs("validation", 40)
    )
    assert sorted(pairs_of(train)) == sorted(
        (en, de) for en, de in sentence_pairs("train", 1200) if de
    )


def test_tfds_not_prepared_in_the_data_dir_says_how_to_prepare_it(tmp_path, monkeypatch):
    """wmt14 (TFDS's own builder: its module imports what setup.py must install) in an empty
    data dir: one message, nothing downloaded."""

    def no_network(*args, **kwargs):
        raise AssertionError("tried to download")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    monkeypatch.setattr("requests.Session.request", no_network)
    empty = str(tmp_path / "empty")
    with pytest.raises(DataError) as err:
        load_parallel("tfds:wmt14_translate/de-en", "train", "en", "de", data_dir=empty)
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert f"wmt14_translate/de-en is not prepared in {empty}" in message
    assert os.path.join(empty, "downloads", "manual") in message and "--tfds-download" in message


@pytest.mark.parametrize("name", ["nope_not_a_dataset", "wmt14_translate/xx-yy"])
def test_unknown_tfds_name_is_one_line(tmp_path, name):
    with pytest.raises(DataError, match=f"unknown TFDS dataset '{name}'") as err:
        load_parallel(f"tfds:{name}", "train", "en", "de", data_dir=str(tmp_path))
    assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize(
    "error, expected",
    [
        (
            PermissionError(13, "Permission denied", "/data/wmt"),
            "cannot read 'wmt_x' in --data-dir",
        ),
        (RuntimeError("a bug inside TFDS"), None),
    ],
)
def test_only_tfds_not_found_errors_read_unknown_dataset(monkeypatch, tmp_path, error, expected):
    """An unreadable --data-dir is said as such; an error that is not about the name
    keeps its traceback (a bug), neither becomes "unknown TFDS dataset"."""
    import tensorflow_datasets as tfds

    def builder(*args, **kwargs):
        raise error

    monkeypatch.setattr(tfds, "builder", builder)
    if expected is None:
        with pytest.raises(type(error)):
            load_parallel("tfds:wmt_x", "train", "en", "de", data_dir=str(tmp_path))
        return
    with pytest.raises(DataError, match=expected) as err:
        load_parallel("tfds:wmt_x", "train", "en", "de", data_dir=str(tmp_path))
    assert "unknown" not in str(err.value)


def test_files_without_files_names_the_flags():
    with pytest.raises(DataError, match="pass --train-src and --train-tgt"):
        load_parallel("files", "train", "en", "de", files=(None, None))
    with pytest.raises(DataError, match="pass --valid-src and --valid-tgt"):
        load_parallel("files", "validation", "en", "de", files=("a", None))
