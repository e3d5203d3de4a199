"""`RunConfig`: a run's config.json as a frozen, typed object (no TensorFlow).

    {"model": TransformerConfig.to_dict(),
     "training": the resolved TrainSettings (absent or partial in older and imported runs),
     "init": {"run": ..., "checkpoints": [...]}   (a fine-tuned run, --init-from),
     "import": {...}}                             (a model imported by kt-import)

`Run.read_run_config` and `Run.write_run_config` (run_dir.py) are its only readers and
writers; the JSON written is the one config.json has always held, so an existing run resumes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from keras_transformer.config import ConfigError, TransformerConfig
from keras_transformer.settings.args import TrainArgs, TrainSettings


@dataclasses.dataclass(frozen=True)
class InitRecord:
    """Where a fine-tuned run (--init-from) started: the source run and the checkpoint(s)
    whose weights (their mean) it loaded."""

    run: str
    checkpoints: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"run": self.run, "checkpoints": list(self.checkpoints)}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A run's configuration.

    Args:
        model: the model's configuration.
        training: the resolved training settings; None when config.json has no "training"
            object. A setting config.json does not record (a run written before its flag
            existed, an imported model's empty settings) is None here.
        recorded: the names of the settings config.json records (a resume keeps those).
        init: the fine-tuning record (--init-from), or None.
        imported: kt-import's record of where an imported model came from, or None.
    """

    model: TransformerConfig
    training: TrainSettings | None = None
    recorded: frozenset[str] = frozenset()
    init: InitRecord | None = None
    imported: Mapping[str, Any] | None = None

    @classmethod
    def new(cls, model: TransformerConfig, training: TrainSettings, init=None) -> RunConfig:
        """A new run's configuration: every setting recorded."""
        names = frozenset(f.name for f in dataclasses.fields(TrainSettings))
        return cls(model, training, names, init)

    @classmethod
    def of_import(cls, model: TransformerConfig, origin: Mapping[str, Any]) -> RunConfig:
        """A model imported by kt-import: no training setting recorded, and its origin."""
        empty = TrainSettings(**{f.name: None for f in dataclasses.fields(TrainSettings)})
        return cls(model, empty, frozenset(), None, dict(origin))

    @classmethod
    def from_json(cls, data: Any) -> RunConfig:
        """From config.json's JSON; ConfigError says what is wrong (the caller names the
        file). Keys of settings this version has no flag for are left out."""
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise ConfigError('no "model" configuration: is it a run\'s config.json?')
        try:
            model = TransformerConfig.from_dict(data["model"])
        except TypeError as err:
            raise ConfigError(str(err)) from None
        training, recorded = None, frozenset()
        if isinstance(data.get("training"), dict):
            known = {f.name for f in dataclasses.fields(TrainSettings)}
            recorded = frozenset(data["training"]) & known
            values = {f.name: None for f in dataclasses.fields(TrainSettings)}
            values.update({k: data["training"][k] for k in recorded})
            training = TrainSettings(**values)
        init = data.get("init")
        if isinstance(init, dict):
            init = InitRecord(str(init["run"]), tuple(init["checkpoints"]))
        return cls(model, training, recorded, init or None, data.get("import"))

    def to_json(self) -> dict:
        """config.json's JSON (the recorded settings only)."""
        data: dict[str, Any] = {"model": self.model.to_dict()}
        if self.training is not None:
            data["training"] = {k: getattr(self.training, k) for k in sorted(self.recorded)}
        if self.init is not None:
            data["init"] = self.init.to_dict()
        if self.imported is not None:
            data["import"] = dict(self.imported)
        return data

    def recorded_settings(self) -> dict:
        """The settings config.json records, by name ({} without "training")."""
        if self.training is None:
            return {}
        return {name: getattr(self.training, name) for name in self.recorded}

    def resumed(self, given: TrainArgs) -> TrainSettings:
        """The settings of a resume: the recorded ones, and the flags `given` now for those
        it does not record or that a resume may change (the caller checks `FIXED_ON_RESUME`
        first). --epochs counts in the run's epochs."""
        saved = self.recorded_settings()
        values = dataclasses.asdict(given)
        values.update({k: v for k, v in saved.items() if values[k] is None})
        if given.epochs is not None:
            values["train_steps"] = given.epochs * values["steps_per_epoch"]
        values["epochs"] = None
        values["precision"] = values["precision"] or "float32"  # runs written before the flag
        values["accum_steps"] = values["accum_steps"] or 1
        return TrainSettings(**values)

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)


__all__ = ["InitRecord", "RunConfig"]
