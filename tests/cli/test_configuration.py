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
