"""The small random OPUS-MT model of `marian_fixture`, written once for the importer tests."""

from __future__ import annotations

import os

import pytest

from tests.importers import marian_fixture as mf


@pytest.fixture(scope="session")
def marian(tmp_path_factory, multi30k_dir):
    """(root, vocabulary, weights, options): the model in Marian's layout at root/marian."""
    root = tmp_path_factory.mktemp("opus")
    vocab, weights, opts = mf.make_marian_dir(str(root / "marian"), multi30k_dir)
    return str(root), vocab, weights, opts


@pytest.fixture(scope="session")
def imported(marian):
    """The run directory that kt-import writes from it (root/run)."""
    from keras_transformer.importers import import_model

    root = marian[0]
    import_model(os.path.join(root, "marian"), os.path.join(root, "run"))
    return os.path.join(root, "run")
