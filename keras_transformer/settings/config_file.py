"""`kt-train --config FILE`: a recipe as a YAML file whose keys are the flag names.

    preset: base
    dataset: tfds:wmt14_translate/de-en
    batch_tokens: 25000

Keys are the flags without their dashes, with underscores (`batch_tokens`; `batch-tokens`
is read the same); `null` leaves a value automatic. A run's `config.json` is a valid FILE too
(JSON is YAML): its "training" section is read. Precedence: built-in defaults < automatic
recipe < FILE < the flags given on the command line.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any

from keras_transformer.config import ConfigError
from keras_transformer.settings.args import TrainArgs

# The flags that hold comma-separated lists: a YAML list is read as the same list.
LIST_FLAGS = ("dataset", "train_src", "train_tgt", "train_weights", "tag_corpus")


def read_config_file(path: str) -> dict[str, Any]:
    """The flag values of `path`, by field name, checked against `TrainArgs`'s types and
    choices; ConfigError naming the file, the key and what was expected."""
    import yaml

    if not os.path.isfile(path):
        raise ConfigError(
            f"--config {path}: no such file; give a YAML recipe such as "
            "recipes/multi30k-small.yaml or a run's config.json"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"--config {path}:{where}: not valid YAML ({problem})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--config {path}: cannot be read ({err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"--config {path}: expected a mapping of flag names to values (key: value "
            f"lines), got a {type(data).__name__}"
        )
    if isinstance(data.get("training"), dict) and isinstance(data.get("model"), dict):
        data = data["training"]  # a run's config.json: its training settings
    # null is "not set": automatic, or the default (data_dir: KT_DATA_DIR)
    return {name: value for name, value in _checked(path, data) if value is not None}


def _checked(path: str, data: dict):
    fields = {field.name: field for field in dataclasses.fields(TrainArgs)}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            close = difflib.get_close_matches(name, fields, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(
                f"--config {path}: unknown key {key!r}{hint}; expected a kt-train flag name "
                "such as batch_tokens (see docs/configuration.md)"
            )
        yield name, _value(path, key, fields[name], value)


def _value(path: str, key, field: dataclasses.Field, value):
    kind = str(field.type)
    optional = "None" in kind
    expected = kind.split(" |")[0]
    if value is None:
        if optional:
            return None
        raise ConfigError(f"--config {path}: {key}: expected {_a(expected)}, got null")
    if field.name in LIST_FLAGS and isinstance(value, list):
        value = ",".join(str(item) for item in value)
    if expected == "bool":
        ok = isinstance(value, bool)
    elif expected == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:  # str: numbers are read as their text (tag_corpus: 2), booleans are refused
        ok = isinstance(value, (str, int, float)) and not isinstance(value, bool)
        value = str(value) if ok else value
    if not ok:
        got = "a boolean (quote it)" if isinstance(value, bool) else f"{value!r}"
        raise ConfigError(f"--config {path}: {key}: expected {_a(expected)}, got {got}")
    choices = field.metadata.get("choices")
    if choices and value not in choices:
        raise ConfigError(
            f"--config {path}: {key}: expected one of {', '.join(map(str, choices))}, got {value!r}"
        )
    return value


def _a(kind: str) -> str:
    return {"bool": "true or false", "int": "an integer", "float": "a number"}.get(kind, "a string")


__all__ = ["LIST_FLAGS", "read_config_file"]
