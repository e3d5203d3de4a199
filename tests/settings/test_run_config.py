"""`RunConfig`: config.json as a typed, frozen object whose JSON is the one config.json has
always held (fine_tuned_config.json was written by kt-train before RunConfig existed)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from keras_transformer.config import ConfigError, TransformerConfig
from keras_transformer.settings.args import FIXED_ON_RESUME, TrainArgs
from keras_transformer.settings.run_config import InitRecord, RunConfig

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def written_before() -> str:
    with open(os.path.join(DATA, "fine_tuned_config.json")) as handle:
        return handle.read()


def test_a_config_json_of_today_reads_typed_and_writes_back_byte_for_byte():
    config = RunConfig.from_json(json.loads(written_before()))
    assert config.model.d_model == 64 and config.training.preset == "tiny"
    assert config.init == InitRecord(
        "/runs/base", ("/runs/base/checkpoints/ckpt-12", "/runs/base/checkpoints/ckpt-24")
    )
    assert json.dumps(config.to_json(), indent=2, sort_keys=True) == written_before()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.training.train_steps = 5  # type: ignore[misc]


def test_a_config_json_without_training_settings_or_with_old_ones():
    model = TransformerConfig.preset("tiny").to_dict()
    bare = RunConfig.from_json({"model": model})
    assert bare.training is None and bare.recorded_settings() == {} and bare.init is None
    assert bare.to_json() == {"model": model}
    imported = {"model": model, "training": {}, "import": {"source": "x", "format": "npz"}}
    config = RunConfig.from_json(imported)
    assert config.training.dataset is None and config.recorded_settings() == {}
    assert config.to_json() == imported
    assert RunConfig.of_import(TransformerConfig.preset("tiny"), imported["import"]).to_json() == (
        imported
    )
    # a run written before some flags existed, and with one this version no longer has
    old = {"model": model, "training": {"seed": 4, "warmup_steps": 30, "gone_flag": 1}}
    config = RunConfig.from_json(old)
    assert config.recorded == {"seed", "warmup_steps"} and config.training.precision is None
    settings = config.resumed(TrainArgs(train_steps=50, seed=4))
    assert (settings.seed, settings.warmup_steps, settings.train_steps) == (4, 30, 50)
    assert (settings.precision, settings.accum_steps) == ("float32", 1)  # older runs' values


def test_a_resume_takes_the_recorded_settings_and_the_given_flags_that_may_change():
    saved = RunConfig.from_json(json.loads(written_before()))
    settings = saved.resumed(TrainArgs(train_steps=20, epochs=None, log_every=7))
    assert settings.train_steps == 20 and settings.log_every == 7  # a resume may change them
    # an automatic flag not given (None) keeps its recorded value
    assert settings.warmup_steps == saved.training.warmup_steps
    assert settings.init_from == saved.training.init_from
    assert saved.resumed(TrainArgs(epochs=2)).train_steps == 2 * saved.training.steps_per_epoch


def test_a_bad_config_json_is_named():
    with pytest.raises(ConfigError, match='no "model" configuration'):
        RunConfig.from_json({"training": {}})
    with pytest.raises(ConfigError, match="unexpected keyword|unknown"):
        RunConfig.from_json({"model": {"d_model": 8, "no_such_field": 1}})


def test_the_per_flag_policies_are_metadata_of_the_flags():
    fields = {f.name: f for f in dataclasses.fields(TrainArgs)}
    assert FIXED_ON_RESUME == tuple(n for n, f in fields.items() if f.metadata["fixed_on_resume"])
    assert fields["warmup_steps"].metadata["counted"] and fields["preset"].metadata["model"]
    assert fields["epochs"].metadata["alternative"] == "train_steps"
    assert not fields["train_steps"].metadata["fixed_on_resume"]
