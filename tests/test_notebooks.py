"""The notebooks run top to bottom on a fresh kernel (fast mode, offline data), and the committed
files show their pictures (executed at full settings) without anyone running them."""

import hashlib
import os
import re

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO

NOTEBOOKS = sorted(
    os.path.join(REPO, "notebooks", name)
    for name in os.listdir(os.path.join(REPO, "notebooks"))
    if name.endswith(".ipynb")
)
MAX_TOTAL_BYTES = 3_000_000


def digest(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def outputs_of(book):
    return [o for cell in book.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, multi30k_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("KT_NOTEBOOK_FAST", os.environ.get("KT_NOTEBOOK_FAST", "1"))
    monkeypatch.setenv("KT_DATA_DIR", multi30k_dir)
    before = digest(path)
    book = nbformat.read(path, as_version=4)
    for cell in book.cells:  # run from a clean slate, not on the committed outputs
        if cell.cell_type == "code":
            cell.outputs = []
    NotebookClient(
        book, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = outputs_of(book)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any(o.get("output_type") == "display_data" for o in outputs), "no plot was drawn"
    assert "fast mode" in "".join(o.get("text", "") for o in outputs)
    assert digest(path) == before, "the test must not write the notebook back"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_committed_notebook_shows_its_full_run(path):
    book = nbformat.read(path, as_version=4)
    code = [cell for cell in book.cells if cell.cell_type == "code"]
    assert all(cell.get("execution_count") for cell in code), "executed top to bottom"
    outputs = outputs_of(book)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "full mode" in text and "fast mode" not in text
    # no path of the machine that ran it: a reader has none of them
    assert not re.search(r"(/work/|/root/|/home/|/tmp/)", text), re.findall(r"/\S+", text)[:3]
    pictures = [o for o in outputs if "image/png" in o.get("data", {})]
    # 01: learning curves; 02: positional encoding and three attention maps (one per head)
    expected = {"01": 1, "02": 4}[os.path.basename(path)[:2]]
    assert len(pictures) >= expected, "the plots are saved in the notebook"


def test_committed_notebooks_stay_small():
    total = sum(os.path.getsize(path) for path in NOTEBOOKS)
    assert total < MAX_TOTAL_BYTES, f"notebooks take {total} bytes; strip noisy output"
