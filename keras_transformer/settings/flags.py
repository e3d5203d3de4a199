"""The machinery of a flag schema (`settings.args.TrainArgs`): `flag` declares a field with
its help and its policies; `option`, `default_text` and `describe` show flags and values."""

from __future__ import annotations

import dataclasses
from typing import Any


def flag(
    default: Any = None,
    help: str = "",  # noqa: A002
    choices=None,
    auto: str = "",
    *,
    fixed_on_resume: bool = False,
    model: bool = False,
    counted: bool = False,
    alternative: str | None = None,
    env: str | None = None,
) -> Any:
    """A field of `TrainArgs`: its default, help, choices and (for a None default resolved by
    the recipe) what the automatic value is; kt-train and docs/configuration.md show them.

    Its policies: `fixed_on_resume` (a resumed run refuses a new value: it defines the model,
    the schedule or the data order), `model` (it defines the model or the tokenizer: a
    fine-tuned run takes it from its source), `counted` (resolved from the batches of a pass,
    counted with the tokenizer), `alternative` (the flag that says the same thing another way:
    giving both is an error; one given on the command line replaces the other from --config),
    `env` (the environment variable of its default)."""
    meta = {
        "help": help,
        "choices": choices,
        "about": help,
        "auto": auto,
        "fixed_on_resume": fixed_on_resume,
        "model": model,
        "counted": counted,
        "alternative": alternative,
        "env": env,
    }
    return dataclasses.field(default=default, metadata=meta)


def default_text(field: dataclasses.Field) -> str:
    """A flag's default as `kt-train --help` and docs/configuration.md both show it."""
    if field.metadata.get("env"):
        return "$" + field.metadata["env"]
    if field.metadata.get("auto"):
        return f"automatic: {field.metadata['auto']}"
    if field.default is None:
        return "none"
    if isinstance(field.default, bool):
        return str(field.default).lower()
    return str(field.default)


def flags_with(schema: type, policy: str) -> tuple[str, ...]:
    """The names of the flags of `schema` (a dataclass of `flag` fields) that have `policy` (a `flag` keyword), in order."""
    return tuple(f.name for f in dataclasses.fields(schema) if f.metadata.get(policy))


def alternatives(schema: type) -> tuple[tuple[str, str], ...]:
    """The pairs of flags that say the same thing two ways (`flag(alternative=...)`)."""
    fields = dataclasses.fields(schema)
    return tuple((f.name, f.metadata["alternative"]) for f in fields if f.metadata["alternative"])


def frozen_copy(cls: type, name: str, doc: str) -> type:
    """A frozen dataclass with the fields (defaults, metadata) of the dataclass `cls`."""
    fields = [
        (f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata))
        for f in dataclasses.fields(cls)
    ]
    return dataclasses.make_dataclass(
        name, fields, frozen=True, namespace={"__doc__": doc, "__module__": __name__}
    )


def option(name: str) -> str:
    return "--" + name.replace("_", "-")


def argument(field: dataclasses.Field) -> tuple[str, str]:
    """A flag's option and its help ending with its default (`default_text`), as
    `kt-train --help` shows them (argparse's help: "%" escaped)."""
    about = field.metadata["about"].replace("%", "%%")
    return option(field.name), f"{about} (default: {default_text(field)})"


def describe(args, given, pending=()) -> str:
    """The resolved settings `args`, one line each, marking those that were resolved
    automatically (None in `given`); those named in `pending` and still None are counted when
    training (a dry run's)."""
    lines = []
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        auto = getattr(given, field.name) is None and value is not None
        mark = "  (auto)" if auto else ""
        if value is None and field.name in pending:
            value, mark = "?", "  (auto: counted with the tokenizer when training)"
        lines.append(f"  {option(field.name):20} {value}{mark}")
    return "\n".join(lines)


__all__ = [
    "alternatives",
    "argument",
    "default_text",
    "describe",
    "flag",
    "flags_with",
    "frozen_copy",
    "option",
]
