"""What the commands share: their own flags (`--log-level`, `--version`), the decoding and
sampling flags, and the logging setup; the parser with flag errors in one line is
`cli.parser.ArgumentParser`."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import tempfile

SAMPLING_FLAGS = ("sample_topk", "sample_topp", "temperature", "seed")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# TensorFlow's C++ runtime logs in absl's format at import (oneDNN, CUDA probing), before absl
# is initialized, whatever TF_CPP_MIN_LOG_LEVEL says; `import_tensorflow` keeps them off stderr.
RUNTIME_LOG = re.compile(
    r"^([IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]|[IWEF]0000 )"
    r"|^WARNING: All log messages before absl::InitializeLog\(\) is called"
)


def add_log_level_flag(parser: argparse.ArgumentParser, stream: str = "stdout") -> None:
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=LOG_LEVELS,
        help=f"the package's messages shown on {stream}: DEBUG, INFO (default), WARNING or ERROR",
    )


def add_command_flags(parser: argparse.ArgumentParser, stream: str = "stdout") -> None:
    """Every command's own flags: `--log-level` (the messages shown on `stream`) and
    `--version` (kt-export's --version numbers its export instead: it adds --log-level only)."""
    add_log_level_flag(parser, stream)
    add_version_flag(parser)


def parse_data_command(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse the flags of a command whose stdout is data (kt-translate, kt-evaluate,
    kt-score): adds `--log-level`, then logs to stderr prefixed with the command's name."""
    add_command_flags(parser, "stderr")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, sys.stderr, parser.prog)
    return args


class _Format(logging.Formatter):
    """INFO lines as the message alone (as the commands always printed them); other levels
    prefixed with their name (`WARNING: ...`), or, for a command whose stdout is data, with
    the command's name as its errors are (`kt-translate: warning: ...`)."""

    def __init__(self, prog: str | None = None):
        super().__init__("%(message)s")
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        if record.levelno == logging.INFO:
            return message
        if self.prog:
            return f"{self.prog}: {record.levelname.lower()}: {message}"
        return f"{record.levelname}: {message}"


@contextlib.contextmanager
def runtime_log_dropped():
    """Within: what is written to file descriptor 2 is held back, then written without the
    lines of TensorFlow's C++ runtime log (`RUNTIME_LOG`); Python's warnings and errors are
    kept, in order."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode("utf-8", "replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not RUNTIME_LOG.match(line)))
            sys.stderr.flush()


def import_tensorflow(level: str) -> None:
    """Import TensorFlow for a command whose --log-level is `level`, without its C++ log
    lines unless `level` is DEBUG: TF_CPP_MIN_LOG_LEVEL 3 unless the user set it (an error
    raises a Python exception anyway), and the runtime's lines at import dropped."""
    if level == "DEBUG" or "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with runtime_log_dropped():
        import tensorflow  # noqa: F401


def setup_logging(level: str = "INFO", stream=None, prog: str | None = None) -> logging.Logger:
    """The commands' logging, configured once per process: the `keras_transformer` loggers at
    `level` to `stream` (default stdout, where kt-train's and kt-export's progress messages
    always went; stderr keeps the one-line error of a failure). The commands whose stdout is
    data (kt-translate, kt-evaluate, kt-score) pass stderr. A library caller configures
    logging as it likes instead."""
    logger = logging.getLogger("keras_transformer")
    for handler in [h for h in logger.handlers if getattr(h, "kt_command", False)]:
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stdout if stream is None else stream)
    handler.kt_command = True
    handler.setFormatter(_Format(prog))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # shown once, even when TensorFlow's absl adds a root handler
    return logger


def set_up_command(level: str) -> None:
    """Once a command's flags are checked: its logging at `level` (`setup_logging`, to
    stdout), then TensorFlow imported without its C++ log lines (`import_tensorflow`)."""
    setup_logging(level)
    import_tensorflow(level)


def version_text(prog: str) -> str:
    """`kt-train 0.2.0`: what `--version` prints."""
    from keras_transformer import __version__

    return f"{prog} {__version__}"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version",
        action="version",
        version=version_text(parser.prog),
        help="print the version and exit",
    )


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `translate` and `evaluate`."""
    parser.add_argument("--model", required=True, help="an export version directory")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per request")
    parser.add_argument("--beam-size", type=int, help="per-request beam size (default: export's)")
    parser.add_argument(
        "--alpha", type=float, help="per-request length penalty exponent (default: export's)"
    )
    parser.add_argument(
        "--max-extra-length", type=int, help="per-request output length bound (default: export's)"
    )
    parser.add_argument(
        "--stop-rule",
        choices=("exact", "finished", "top"),
        help="per-request stop rule of the beam search (default: the export's; see kt-export)",
    )


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sample-topk", type=int, help="sample among the k best (0: all)")
    parser.add_argument("--sample-topp", type=float, help="sample within probability p (0, 1]")
    parser.add_argument("--temperature", type=float, help="sampling temperature (> 0)")
    parser.add_argument("--seed", type=int, help="sampling seed; sentence i uses seed + i")


def decoder(args, lines: int = 0):
    """(translate_fn, options) for `evaluation.translate_all`, from the shared flags.

    A search flag decodes through `translate_with_options` (`translate_with_stop_rule` with
    --stop-rule), the options not given taken from the export's own (its
    assets/decoding.json; the library's defaults for an export made before 0.3); without
    one, through `serving_default`. Logs the options used, in one line.

    Raises KerasTransformerError; `flag_error` turns it into a message naming the flag.
    """
    from keras_transformer.inference.evaluation import EvaluationError, load_export

    if args.batch_size < 1:
        raise EvaluationError(f"--batch-size must be >= 1, got {args.batch_size}")
    sampling = any(getattr(args, flag, None) is not None for flag in SAMPLING_FLAGS)
    prefixes = getattr(args, "prefix", None)
    stop_rule = getattr(args, "stop_rule", None)
    given = {"beam_size": args.beam_size, "alpha": args.alpha}
    given.update(max_extra_length=args.max_extra_length, stop_rule=stop_rule)
    if sampling:
        options = sampling_options(args, given, prefixes, lines)
        return load_export(args.model, "sample"), options
    options, used = export_options(args.model, given)  # checks the flags first
    if all(value is None for value in given.values()) and prefixes is None:
        translate_fn, request = load_export(args.model), {}
    else:
        request = {"beam_size": options.beam_size, "alpha": options.alpha}
        request.update(max_extra_length=options.max_extra_length, num_hypotheses=1)
        request["target_prefix"] = prefixes if prefixes is not None else ""
        if stop_rule is not None:
            request["stop_rule"] = options.stop_rule
        signature = "translate_with_options" if stop_rule is None else "translate_with_stop_rule"
        translate_fn = load_export(args.model, signature)
    logging.getLogger("keras_transformer.cli").info("decoding with %s", used)
    return translate_fn, request


def export_options(model: str, given: dict):
    """(the export's `DecodingOptions` with the values `given` (not None), a description of
    them: `beam size 2 (the export's), alpha 1 (--alpha), ...`). Raises
    KerasTransformerError (a bad value: DecodingOptionsError naming the option)."""
    from keras_transformer.settings.decoding import DecodingOptions, read_options

    export = read_options(os.path.join(model, "assets"))
    origin = "the export's"
    if export is None:
        options = DecodingOptions().given(**given)
        if all(value is None for value in given.values()):
            return options, "the export's own options (it has no assets/decoding.json)"
        origin = "the library's: the export has no assets/decoding.json"
    else:
        options = export.given(**given)
    parts = [
        f"{name.replace('_', ' ')} {getattr(options, name):g}"
        if name == "alpha" else f"{name.replace('_', ' ')} {getattr(options, name)}"
        for name in ("beam_size", "alpha", "max_extra_length", "min_length", "stop_rule")
    ]  # fmt: skip
    notes = [
        f" (--{name.replace('_', '-')})" if given.get(name) is not None else f" ({origin})"
        for name in ("beam_size", "alpha", "max_extra_length", "min_length", "stop_rule")
    ]
    return options, ", ".join(part + note for part, note in zip(parts, notes, strict=True))


def sampling_options(args, given: dict, prefixes, lines: int) -> dict:
    """The `sample` signature's options from the sampling flags (none of `given` or
    `prefixes` may be set beside them)."""
    from keras_transformer.inference.evaluation import EvaluationError
    from keras_transformer.settings.decoding import check_sampling

    if prefixes is not None or any(value is not None for value in given.values()):
        raise EvaluationError(
            "--sample-* / --temperature / --seed draw one translation: drop --beam-size, "
            "--alpha, --max-extra-length, --stop-rule and --prefix-file, or the sampling "
            "flags"
        )
    options = {
        "temperature": 1.0 if args.temperature is None else args.temperature,
        "top_k": 0 if args.sample_topk is None else args.sample_topk,
        "top_p": 1.0 if args.sample_topp is None else args.sample_topp,
    }
    check_sampling(options["temperature"], options["top_k"], options["top_p"])
    seed = 0 if args.seed is None else args.seed
    options["seed"] = [seed + i for i in range(lines)]
    return options


def flag_error(prog: str, err: Exception) -> int:
    """Print a library error as a command-line error (naming the flag); exit status 2."""
    option = getattr(err, "option", None)
    flag = {"top_k": "sample_topk", "top_p": "sample_topp"}.get(option, option)
    message = f"--{flag.replace('_', '-')}: {err}" if option else str(err)
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2
