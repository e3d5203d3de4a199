"""ExportArgs: kt-export's flags defined once, its parser generated from them, its checks."""

import dataclasses
import re

import pytest

from keras_transformer import config
from keras_transformer.cli.export import build_parser, parse_args
from keras_transformer.settings.export_args import QUANTIZATIONS, ExportArgs, ExportError

REQUIRED = ["--model-dir", "r", "--export-dir", "e"]


def test_every_flag_is_a_field_and_the_parser_gives_its_defaults():
    flags = {a.dest for a in build_parser()._actions} - {"help", "log_level"}
    assert flags == {field.name for field in dataclasses.fields(ExportArgs)}
    assert parse_args(REQUIRED) == ExportArgs("r", "e")
    args = ExportArgs("r", "e")
    assert (args.beam_size, args.alpha, args.max_extra_length, args.min_length) == (
        config.BEAM_SIZE, config.ALPHA, config.MAX_EXTRA_LENGTH, config.MIN_LENGTH,
    )  # fmt: skip
    assert parse_args([*REQUIRED, "--best", "--xla", "--beam-size", "2"]) == ExportArgs(
        "r", "e", best=True, xla=True, beam_size=2
    )


def test_help_shows_the_defaults_and_quantizations_come_from_the_schema():
    text = " ".join(build_parser().format_help().split())
    assert "(default: 5)" in text and "(default: the next free one)" in text
    quantization = next(a for a in build_parser()._actions if a.dest == "quantization")
    assert tuple(quantization.choices) == QUANTIZATIONS


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"version": 0}, "--version must be >= 1, got 0"),
        ({"xla_max_batch": 0}, "--xla-max-batch must be >= 1, got 0"),
        ({"average_last": 0}, "--average-last must be >= 1, got 0"),
        ({"agreement_sentences": -1}, "--agreement-sentences must be >= 0 (0: skip), got -1"),
        ({"dtype": "int8"}, "--dtype must be one of float32, bfloat16, float16, got 'int8'"),
        ({"format": "onnx"}, "--format must be one of savedmodel, ctranslate2, got 'onnx'"),
        (
            {"xla": True, "format": "ctranslate2"},
            "--xla compiles a SavedModel's search; --format ctranslate2 runs its own",
        ),
        ({"quantization": "int8"}, "--quantization applies to --format ctranslate2 only"),
        ({"format": "ctranslate2", "dtype": "float16"}, "--dtype applies to --format"),
    ],
)
def test_check_names_the_flag(tmp_path, fields, message):
    with pytest.raises(ExportError, match="^" + re.escape(message)):
        ExportArgs("r", str(tmp_path), **fields).check()
    ExportArgs("r", str(tmp_path)).check()  # the defaults pass
