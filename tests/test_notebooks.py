"""The notebooks run top to bottom on a fresh kernel (fast mode, offline data)."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO

NOTEBOOKS = sorted(
    os.path.join(REPO, "notebooks", name)
    for name in os.listdir(os.path.join(REPO, "notebooks"))
    if name.endswith(".ipynb")
)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, multi30k_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("KT_NOTEBOOK_FAST", os.environ.get("KT_NOTEBOOK_FAST", "1"))
    monkeypatch.setenv("KT_DATA_DIR", multi30k_dir)
    book = nbformat.read(path, as_version=4)
    NotebookClient(
        book, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [
        o for cell in book.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
    ]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any(o.get("output_type") == "display_data" for o in outputs), "no plot was drawn"
