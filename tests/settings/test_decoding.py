"""DecodingOptions: the paper's defaults, the checks naming the option, an export's file."""

import dataclasses
import json

import pytest

from keras_transformer.errors import KerasTransformerError
from keras_transformer.settings.decoding import (
    OPTIONS_FILE,
    DecodingOptions,
    DecodingOptionsError,
    one_object,
    read_options,
    write_options,
)


def test_defaults_are_the_papers_and_the_object_is_frozen():
    options = DecodingOptions()
    assert options.as_dict() == {
        "beam_size": 4, "alpha": 0.6, "max_extra_length": 50, "min_length": 1,
        "stop_rule": "exact", "num_hypotheses": 1,
    }  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beam_size = 2


@pytest.mark.parametrize(
    "values, message",
    [
        ({"beam_size": 0}, "beam_size must be in [1, 64], got 0"),
        ({"alpha": float("nan")}, "alpha must be a finite number >= 0, got nan"),
        ({"max_extra_length": 1025}, "max_extra_length must be in [1, 1024], got 1025"),
        ({"min_length": -1}, "min_length must be an integer >= 0, got -1"),
        ({"stop_rule": "early"}, "stop_rule must be one of exact, finished, top, got 'early'"),
        ({"beam_size": 2, "num_hypotheses": 3}, "num_hypotheses must be in [1, beam_size 2]"),
    ],
)
def test_a_bad_value_names_the_option(values, message):
    with pytest.raises(DecodingOptionsError) as info:
        DecodingOptions(**values)
    assert str(info.value).startswith(message)
    assert info.value.option == message.split()[0]


def test_given_replaces_only_the_values_given_and_checks_them():
    export = DecodingOptions(beam_size=2, max_extra_length=5)
    assert export.given(beam_size=None, alpha=1.0) == DecodingOptions(
        beam_size=2, alpha=1.0, max_extra_length=5
    )
    with pytest.raises(DecodingOptionsError, match="^beam_size"):
        export.given(beam_size=65)


def test_an_exports_file_round_trips_and_a_bad_one_is_named(tmp_path):
    assert read_options(str(tmp_path)) is None  # an export made before the file
    options = DecodingOptions(beam_size=2, alpha=1.5, stop_rule="top")
    path = write_options(str(tmp_path), options)
    assert path == str(tmp_path / OPTIONS_FILE)
    assert read_options(str(tmp_path)) == options
    (tmp_path / OPTIONS_FILE).write_text(json.dumps({"beam_width": 2}))
    with pytest.raises(KerasTransformerError, match=f"^{path} holds no decoding options"):
        read_options(str(tmp_path))


def test_loose_options_or_one_object_not_both():
    assert one_object(None, {"beam_size": 2}) == DecodingOptions(beam_size=2)
    given = DecodingOptions(beam_size=2)
    assert one_object(given, {"beam_size": 4, "alpha": 0.6}) is given  # the defaults
    with pytest.raises(ValueError, match="give alpha in `options`"):
        one_object(given, {"beam_size": 4, "alpha": 1.0})
