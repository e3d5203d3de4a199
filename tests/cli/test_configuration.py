"""docs/configuration.md is generated from the flag schema: it fails here when it is stale."""

from __future__ import annotations

import dataclasses
import os

from keras_transformer.cli import configuration
from keras_transformer.settings.args import TrainArgs, option

PAGE = os.path.join(configuration.ROOT, "docs", "configuration.md")


def test_docs_configuration_md_is_up_to_date():
    with open(PAGE, encoding="utf-8") as handle:
        page = handle.read()
    assert page == configuration.markdown(), (
        "docs/configuration.md is stale: python -m keras_transformer.cli.configuration "
        "> docs/configuration.md"
    )


def test_the_page_lists_every_flag_and_recipe():
    page = configuration.markdown()
    for field in dataclasses.fields(TrainArgs):
        assert f"| `{option(field.name)}` (`{field.name}`) |" in page
    for recipe in ("multi30k-small", "wmt14-base", "wmt14-big"):
        assert f"| `recipes/{recipe}.yaml` |" in page
    for option_ in ("--config FILE", "--dry-run", "--log-level"):
        assert f"| `{option_}` |" in page


def test_help_and_the_page_show_the_same_default_for_every_flag():
    """`kt-train --help` and docs/configuration.md take each default from the schema
    (`default_text`): the same text in both, for every flag."""
    import re

    from keras_transformer.cli.train import build_parser
    from keras_transformer.settings.args import default_text

    helps = {
        action.dest: " ".join(action.help.split())
        for action in build_parser()._actions
        if action.help
    }
    page = configuration.markdown()
    for field in dataclasses.fields(TrainArgs):
        text = default_text(field)
        assert helps[field.name].endswith(f"(default: {text})"), (field.name, helps[field.name])
        row = next(
            line for line in page.splitlines() if line.startswith(f"| `{option(field.name)}`")
        )
        shown = re.sub(r"`|\\", "", row.split(" | ")[2].replace("&lt;", "<").replace("&gt;", ">"))
        assert shown == text, (field.name, shown, text)
