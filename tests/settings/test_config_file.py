"""`kt-train --config FILE`: recipes as files, their precedence, a run's settings read back."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from keras_transformer.cli import train
from keras_transformer.settings.args import ConfigError, TrainArgs
from keras_transformer.settings.config_file import read_config_file
from keras_transformer.settings.recipe import resolve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = os.path.join(ROOT, "recipes")


def never(*_):
    raise AssertionError("batches_per_pass must not be called")


def small_corpus(*_args, **_kwargs):
    return 110  # batches per pass of a Multi30k-sized corpus


@pytest.fixture(autouse=True)
def _no_data_dir(monkeypatch):
    monkeypatch.delenv("KT_DATA_DIR", raising=False)


def test_the_multi30k_recipe_is_the_default_plan():
    """recipes/multi30k-small.yaml resolves to exactly the settings of no flags."""
    args = train.parse_args(["--config", os.path.join(RECIPES, "multi30k-small.yaml")])
    assert args != TrainArgs()  # it spells the recipe out...
    given = resolve(args, num_pairs=29_000, batches_per_pass=small_corpus)
    default = resolve(TrainArgs(), num_pairs=29_000, batches_per_pass=small_corpus)
    assert given == default  # ...and it is the same plan


@pytest.mark.parametrize("size,steps,dropout", [("base", 100_000, 0.1), ("big", 300_000, 0.3)])
def test_the_wmt14_recipes_are_the_papers(size, steps, dropout):
    args = train.parse_args(["--config", os.path.join(RECIPES, f"wmt14-{size}.yaml")])
    assert (args.dataset, args.src_lang, args.tgt_lang) == (
        "tfds:wmt14_translate/de-en",
        "en",
        "de",
    )
    assert (args.strategy, args.precision) == ("mirrored", "mixed_float16")
    for replicas in (1, 8):
        out = resolve(
            args, num_pairs=4_500_000, batches_per_pass=lambda *_: 4500, replicas=replicas
        )
        assert (out.preset, out.vocab_size, out.spm_model_type) == (size, 37000, "bpe")
        assert out.batch_tokens * out.accum_steps == 25000  # tokens per update, all replicas
        assert (out.train_steps, out.warmup_steps, out.dropout_rate) == (steps, 4000, dropout)
        assert (out.lr_scale, out.label_smoothing) == (1.0, 0.1)


def test_a_runs_saved_settings_are_a_valid_file(tmp_path):
    """config.json (whole, or its "training" section) read back gives the run's settings."""
    flags = TrainArgs(preset="tiny", ema_decay=0.99, train_weights="3,1", dataset="multi30k,files",
                      train_src="a.en", train_tgt="a.de", tag_corpus="2", jit_compile=True)  # fmt: skip
    settings = resolve(flags, num_pairs=29_000, batches_per_pass=small_corpus)
    whole = {"model": {"vocab_size": 8000}, "training": dataclasses.asdict(settings)}
    (tmp_path / "config.json").write_text(json.dumps(whole, indent=2, sort_keys=True))
    (tmp_path / "training.json").write_text(json.dumps(whole["training"]))
    for name in ("config.json", "training.json"):
        args = train.parse_args(["--config", str(tmp_path / name)])
        assert dataclasses.asdict(args) == dataclasses.asdict(settings)
        assert resolve(args, num_pairs=29_000, batches_per_pass=never) == settings


def test_command_line_flags_win_over_the_file_which_wins_over_the_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max-length: 64\nwarmup_steps: 123\nlr_scale: 2.0\njit_compile: true\n")
    args = train.parse_args(["--config", str(recipe)])
    assert (args.max_length, args.warmup_steps, args.lr_scale, args.jit_compile) == (
        64, 123, 2.0, True,
    )  # fmt: skip
    out = resolve(args, num_pairs=29_000, batches_per_pass=small_corpus)
    assert (out.warmup_steps, out.lr_scale) == (123, 2.0)  # not the recipe's 900 and 0.8
    # a flag given wins, even when it equals its default (--max-length 128)
    args = train.parse_args(
        ["--max-length", "128", "--config", str(recipe), "--lr-scale", "0.5", "--no-jit-compile"]
    )
    assert (args.max_length, args.warmup_steps, args.lr_scale, args.jit_compile) == (
        128, 123, 0.5, False,
    )  # fmt: skip


def test_epochs_given_replaces_the_files_train_steps(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train_steps: 500\n")
    assert train.parse_args(["--config", str(recipe)]).train_steps == 500
    args = train.parse_args(["--config", str(recipe), "--epochs", "3"])
    assert (args.epochs, args.train_steps) == (3, None)


def test_file_values_are_read_as_the_flags_types(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "dataset: [multi30k, files]\ntrain_weights: [3, 1.5]\ntag_corpus: 2\n"
        "label_smoothing: 0\npreset: null\ndata_dir: null\n"
    )
    values = read_config_file(str(recipe))
    assert values == {
        "dataset": "multi30k,files", "train_weights": "3,1.5", "tag_corpus": "2",
        "label_smoothing": 0.0,
    }  # fmt: skip
    assert isinstance(values["label_smoothing"], float)
    # null leaves the default: here KT_DATA_DIR
    os.environ["KT_DATA_DIR"] = "/data"
    try:
        assert train.parse_args(["--config", str(recipe)]).data_dir == "/data"
    finally:
        del os.environ["KT_DATA_DIR"]


@pytest.mark.parametrize(
    "text,message",
    [
        ("warmup: 4000\n", r"unknown key 'warmup' \(did you mean warmup_steps\?\)"),
        ("train_steps: 1.5\n", r"train_steps: expected an integer, got 1\.5"),
        ("max_length: null\n", r"max_length: expected an integer, got null"),
        ("lr_scale: fast\n", r"lr_scale: expected a number, got 'fast'"),
        ("tfds_download: 1\n", r"tfds_download: expected true or false, got 1"),
        ("src_lang: no\n", r"src_lang: expected a string, got a boolean \(quote it\)"),
        ("strategy: gpus\n", r"strategy: expected one of default, one_device, mirrored"),
        ("[1, 2]\n", r"expected a mapping of flag names to values .*got a list"),
        ("a: 1\n b: 2\n", r": line 2: not valid YAML"),
    ],
)
def test_a_bad_file_names_the_file_the_key_and_what_was_expected(tmp_path, text, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=rf"^--config {recipe}.*{message}"):
        read_config_file(str(recipe))
