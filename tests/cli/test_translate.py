"""kt-translate / kt-evaluate's decoding options: the export's own for those not given."""

import argparse
import gzip
import json
import logging
import os

import pytest

from keras_transformer.cli import common
from keras_transformer.settings.decoding import (
    DecodingOptions,
    DecodingOptionsError,
    write_options,
)

SOURCES = ["A man rides a bike.", "Two dogs play in the snow.", "A girl.", ""]


def flags(model, **given):
    values = dict(batch_size=64, beam_size=None, alpha=None, max_extra_length=None)
    values.update(stop_rule=None, prefix=None)
    return argparse.Namespace(model=str(model), **{**values, **given})


@pytest.fixture
def loaded(monkeypatch):
    """The signature `decoder` loads, recorded instead of loaded."""
    from keras_transformer.inference import evaluation

    calls = []
    # seen by caplog even after a command's logging setup (which stops propagation)
    monkeypatch.setattr(logging.getLogger("keras_transformer"), "propagate", True)
    monkeypatch.setattr(
        evaluation, "load_export", lambda path, sig="serving_default": calls.append(sig) or sig
    )
    return calls


def test_a_search_flag_keeps_the_exports_other_options(tmp_path, loaded, caplog):
    """--alpha alone decodes at the export's beam size, length and stop rule (the library's
    beam 4 and +50 tokens before), and says so in one line."""
    write_options(str(tmp_path / "assets"), DecodingOptions(beam_size=2, max_extra_length=5))
    with caplog.at_level(logging.INFO, "keras_transformer"):
        fn, request = common.decoder(flags(tmp_path, alpha=1.0))
    assert fn == "translate_with_options" and loaded == [fn]
    assert request == {
        "beam_size": 2, "alpha": 1.0, "max_extra_length": 5, "num_hypotheses": 1,
        "target_prefix": "",
    }  # fmt: skip
    assert caplog.messages == [
        "decoding with beam size 2 (the export's), alpha 1 (--alpha), max extra length 5 "
        "(the export's), min length 1 (the export's), stop rule exact (the export's)"
    ]
    fn, request = common.decoder(flags(tmp_path, stop_rule="top"))
    assert fn == "translate_with_stop_rule"
    assert (request["beam_size"], request["alpha"], request["stop_rule"]) == (2, 0.6, "top")


def test_without_flags_the_default_signature_and_a_bad_flag_named_first(tmp_path, loaded):
    write_options(str(tmp_path / "assets"), DecodingOptions(beam_size=2))
    assert common.decoder(flags(tmp_path)) == ("serving_default", {})
    with pytest.raises(DecodingOptionsError, match="^beam_size must be in") as info:
        common.decoder(flags(tmp_path, beam_size=0))
    assert info.value.option == "beam_size" and loaded == ["serving_default"]


def test_an_export_without_its_options_file_takes_the_librarys(tmp_path, loaded, caplog):
    with caplog.at_level(logging.INFO, "keras_transformer"):
        _, request = common.decoder(flags(tmp_path, beam_size=3))
        common.decoder(flags(tmp_path))
    assert (request["beam_size"], request["alpha"], request["max_extra_length"]) == (3, 0.6, 50)
    assert "alpha 0.6 (the library's: the export has no assets/decoding.json)" in caplog.messages[0]
    assert caplog.messages[1] == (
        "decoding with the export's own options (it has no assets/decoding.json)"
    )


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory, multi30k_dir):
    """An untrained tiny model exported with beam 2 and +5 tokens, and its Translator. Seeded
    first (a seed after the tokenizer would clear its SentencePiece resource), so that the
    random weights do not depend on which tests ran before in the same worker."""
    import keras

    import keras_transformer as kt
    from keras_transformer.data import SubwordTokenizer, train_sentencepiece
    from keras_transformer.inference.export import export_translator
    from keras_transformer.inference.translator import Translator

    keras.utils.set_random_seed(0)
    with gzip.open(os.path.join(multi30k_dir, "train.en.gz"), "rt", encoding="utf-8") as handle:
        sentences = [line.strip() for _, line in zip(range(500), handle)]
    tokenizer = SubwordTokenizer(train_sentencepiece(sentences, 400))
    cfg = kt.TransformerConfig.preset("tiny", vocab_size=tokenizer.vocab_size, max_length=32)
    model = kt.Transformer(cfg)
    model.build()
    translator = Translator(model, tokenizer, DecodingOptions(beam_size=2, max_extra_length=5))
    path = export_translator(translator, str(tmp_path_factory.mktemp("exports")))
    return path, model, tokenizer


@pytest.mark.slow
def test_kt_translate_alpha_alone_decodes_at_the_exports_beam(tiny_export, tmp_path, capsys):
    import tensorflow as tf

    from keras_transformer.cli import translate
    from keras_transformer.inference.translator import Translator

    path, model, tokenizer = tiny_export
    with open(os.path.join(path, "assets", "decoding.json")) as handle:
        assert json.load(handle)["beam_size"] == 2
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(SOURCES) + "\n")
    argv = ["--model", path, "--input", str(src), "--output", str(out), "--alpha", "1.0"]
    assert translate.main(argv) == 0

    def outputs(**options):
        translator = Translator(model, tokenizer, DecodingOptions(**options))
        return [t.decode() for t in translator(tf.constant(SOURCES))["outputs"].numpy()]

    expected = outputs(beam_size=2, alpha=1.0, max_extra_length=5)
    assert out.read_text().split("\n")[:-1] == expected  # not splitlines: \x1e is a break
    assert expected != outputs(alpha=1.0)  # what the library's defaults give: the test can fail
    err = capsys.readouterr().err
    assert "decoding with beam size 2 (the export's), alpha 1 (--alpha), max extra length 5" in err
    assert "kt-translate: " not in err  # no warning, no error
