"""benchmarks/figures.py: the measured figures have one source (docs/figures/measured.json),
every page's figures are generated from it, and a page that disagrees fails here."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import figures  # noqa: E402

REQUIRED = ("id", "what", "value", "unit", "command", "date", "commit", "machine", "version")


@pytest.fixture(scope="module")
def data():
    with open(figures.DATA, encoding="utf-8") as handle:
        return json.load(handle)


def test_every_page_agrees_with_the_data():
    stale = figures.stale_pages()
    assert not stale, f"{stale}: regenerate with python benchmarks/figures.py"


def test_a_changed_figure_makes_the_pages_that_quote_it_stale(data):
    changed = copy.deepcopy(data)
    for rec in changed["records"]:
        if rec["id"] == "w1-ours":
            rec["value"] = 9999
    stale = figures.stale_pages(figures.Figures(changed))
    assert stale == ["README.md", "docs/results.md", "docs/benchmarks.md", "docs/training.md"]
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        text = figures.render(handle.read(), figures.Figures(changed))
    assert "9,999 target tokens/s" in text


def test_every_record_says_how_when_and_where_it_was_measured(data):
    assert all(set(m) == {"name", "description"} for m in data["machines"].values())
    ids = [r["id"] for r in data["records"]]
    assert len(ids) == len(set(ids))
    for rec in data["records"]:
        assert all(rec.get(key) not in (None, "") for key in REQUIRED), rec["id"]
        assert rec["machine"] in data["machines"], rec["id"]
        assert re.fullmatch(r"2\d{3}-\d\d-\d\d", rec["date"]), rec["id"]
        assert re.fullmatch(r"[0-9a-f]{7,40}", rec["commit"]), rec["id"]


def test_the_recipe_on_the_pages_is_what_kt_train_resolves(data):
    """The Quick start's updates, warmup and BLEU interval come from the recipe module."""
    recipe = figures.default_recipe(figures.Figures(data))
    assert (recipe.steps_per_epoch, recipe.train_steps) == (151, 3020)
    assert (recipe.warmup_steps, recipe.eval_every) == (1200, 302)
    with open(os.path.join(ROOT, "docs", "quickstart.md"), encoding="utf-8") as handle:
        page = " ".join(handle.read().split())
    assert "151 updates per pass x 20 passes = 3,020 updates, warmup 1,200" in page
    assert "every 302 updates" in page and "2,940 updates, warmup" not in page
    with open(os.path.join(ROOT, "docs", "training.md"), encoding="utf-8") as handle:
        assert f"(Multi30k: {recipe.eval_every})" in handle.read()


def test_the_readme_quotes_figures_only_from_the_data():
    """Outside the generated blocks the README names none of the figures of the data."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        text = figures.BLOCK.sub("", handle.read())
    for quoted in ("39.86", "41.25", "2,165", "298 target", "0.67x", "0.55x", "65 min", "2,940"):
        assert quoted not in text, quoted


def test_an_unknown_block_is_named():
    with pytest.raises(KeyError, match="nope"):
        figures.render("<!-- figures:nope -->\nx\n<!-- /figures -->", figures.load(), "page.md")


def test_record_appends_the_result_with_its_provenance(tmp_path):
    path = str(tmp_path / "recorded.json")
    argv = [os.path.join(ROOT, "benchmarks", "bench_data.py"), "--batches", "3"]
    first = figures.record(path, {"pairs_per_s": 1.5}, argv)
    figures.record(path, {"pairs_per_s": 2.5}, argv)
    with open(path, encoding="utf-8") as handle:
        records = json.load(handle)
    assert records[0] == first and [r["result"]["pairs_per_s"] for r in records] == [1.5, 2.5]
    assert first["command"] == "python benchmarks/bench_data.py --batches 3"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", first["date"]) and first["cpu"]
    assert figures.record(None, {"x": 1}) is None


def test_the_check_command_fails_on_a_stale_page(tmp_path, monkeypatch):
    page = tmp_path / "README.md"
    page.write_text("<!-- figures:machines -->\nold\n<!-- /figures -->\n", encoding="utf-8")
    monkeypatch.setattr(figures, "ROOT", str(tmp_path))
    monkeypatch.setattr(figures, "PAGES", ("README.md",))
    assert figures.main(["--check"]) == 1
    assert figures.main([]) == 0 and figures.main(["--check"]) == 0
    assert "Intel Xeon Processor" in page.read_text(encoding="utf-8")


def test_the_script_runs_without_tensorflow():
    code = (
        "import sys; sys.path.insert(0, 'benchmarks'); import figures; "
        "figures.stale_pages(); assert 'tensorflow' not in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
