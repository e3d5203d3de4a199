"""Export a training run as a SavedModel for TensorFlow Serving.

kt-export --model-dir runs/en-de --export-dir exports --model-name transformer

Averages the last 5 checkpoints by default (the paper's practice; `--average-last 1` turns
it off; a run trained with --ema-decay contributes its moving averages unless --no-ema),
adds or replaces this model's entry in <export-dir>/models.config (other models' entries
are kept) and prints what it wrote: paths, signatures with their inputs and outputs, size
on disk.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from keras_transformer.cli.common import (
    add_log_level_flag,
    flag_error,
    set_up_command,
    version_text,
)
from keras_transformer.cli.parser import ArgumentParser


class VersionOrNumber(argparse.Action):
    """`--version N` numbers the export (TF Serving's version directory, the flag's meaning
    since 0.1.0); `--version` alone prints the program's version, as every command does."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            print(version_text(parser.prog))
            parser.exit(0)
        setattr(namespace, self.dest, values)


def build_parser(prog: str = "kt-export") -> argparse.ArgumentParser:
    """The command line, built from `ExportArgs` (one definition of every flag, in the groups
    of its fields) plus the command's own --log-level."""
    from keras_transformer.settings.args import option
    from keras_transformer.settings.export_args import GROUPS, ExportArgs

    parser = ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    for field in dataclasses.fields(ExportArgs):
        groups[field.metadata["group"]].add_argument(option(field.name), **_argument(field))
    add_log_level_flag(parser)
    return parser


def _argument(field: dataclasses.Field) -> dict:
    """add_argument's keywords for a field of `ExportArgs`."""
    from keras_transformer.settings.export_args import default_text

    about = field.metadata["about"].replace("%", "%%")
    if field.default is dataclasses.MISSING:
        return dict(required=True, help=about)
    if field.type == "bool":
        return dict(action="store_true", help=about)
    meta = dict(default=field.default, help=f"{about} (default: {default_text(field)})")
    kind = str(field.type)
    convert = int if kind.startswith("int") else float if kind.startswith("float") else str
    if field.name == "version":  # alone: the program's version
        return dict(type=convert, nargs="?", action=VersionOrNumber, **meta)
    return dict(type=convert, choices=field.metadata["choices"], **meta)


def parse_command(argv=None, prog: str = "kt-export"):
    """(ExportArgs, the command's --log-level)."""
    from keras_transformer.settings.export_args import ExportArgs

    given = vars(build_parser(prog).parse_args(argv))
    log_level = given.pop("log_level")
    return ExportArgs(**given), log_level


def parse_args(argv=None, prog: str = "kt-export"):
    """The `ExportArgs` of a command line."""
    return parse_command(argv, prog)[0]


def main(argv=None, prog: str = "kt-export") -> int:
    args, log_level = parse_command(argv, prog)
    set_up_command(log_level)
    from keras_transformer.errors import KerasTransformerError
    from keras_transformer.inference.export import export_run

    try:
        path = export_run(args)
    except KerasTransformerError as err:
        return flag_error(prog, err)
    except json.JSONDecodeError as err:
        config = os.path.join(args.model_dir, "config.json")
        return flag_error(prog, f"{config} is not valid JSON ({err}); restore it or retrain")
    except OSError as err:  # an export dir that cannot be written, a file that cannot be read
        return flag_error(
            prog, f"{err.filename}: {err.strerror}; check the path and its permissions"
        )
    print_written(args, path)
    return 0


def print_written(args, path: str) -> None:
    """What the export wrote: its files (CTranslate2) or its signatures, and the agreement."""
    from keras_transformer.inference.export import describe_export

    if args.format == "ctranslate2":
        print(f"{path}: CTranslate2 model ({args.quantization or 'float32'})")
        for name in sorted(os.listdir(path)):
            print(f"  {os.path.join(path, name)}")
    else:
        print(describe_export(path))
        print(f"  {os.path.join(args.export_dir, 'models.config')} (model {args.model_name!r})")
    print(weights_line(args))
    print(agreement_line(path))


def weights_line(args) -> str:
    """Which checkpoints the export's weights come from (as `Run.load_model` chose them)."""
    from keras_transformer.run_dir import Run, has_averages

    paths = Run(args.model_dir).checkpoints(best=args.best)
    if args.best:
        return f"  weights: {paths[-1]} (best/: the best validation BLEU)"
    used = paths[-args.average_last :]
    steps = ", ".join(path.rsplit("-", 1)[-1] for path in used)
    what = f"the mean of {len(used)} checkpoints" if len(used) > 1 else "1 checkpoint"
    line = f"  weights: {what} (step {steps}) of {os.path.dirname(used[-1])}"
    if not args.no_ema and any(has_averages(path) for path in used):
        line += ", their moving averages (--ema-decay)"
    if len(used) < args.average_last:
        line += f"; --average-last {args.average_last} asked for more: the run has {len(used)}"
    return line


def agreement_line(path: str) -> str:
    """One line on the agreement report of the export at `path`."""
    report_path = os.path.join(path, "assets.extra", "agreement.json")
    with open(report_path, encoding="utf-8") as handle:
        report = json.load(handle)
    if not report.get("sentences"):
        return f"  {report_path}: no comparison ({report.get('skipped')})"
    return (
        f"  {report_path}: {report['identical']} of {report['sentences']} outputs identical "
        f"to the float32 exact-rule search's, BLEU {report['bleu']['delta']:+.2f}, "
        f"chrF {report['chrf']['delta']:+.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
