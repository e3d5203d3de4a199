"""What the commands share: flag errors in one line, the decoding and sampling flags, and the
logging setup (`--log-level`)."""

from __future__ import annotations

import argparse
import logging
import sys

SAMPLING_FLAGS = ("sample_topk", "sample_topp", "temperature", "seed")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def add_log_level_flag(parser: argparse.ArgumentParser, stream: str = "stdout") -> None:
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=LOG_LEVELS,
        help=f"the package's messages shown on {stream}: DEBUG, INFO (default), WARNING or ERROR",
    )


def parse_data_command(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse the flags of a command whose stdout is data (kt-translate, kt-evaluate,
    kt-score): adds `--log-level`, then logs to stderr prefixed with the command's name."""
    add_log_level_flag(parser, "stderr")
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


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the commands' failure contract: a flag error is one line on stderr,
    `<prog>: error: <message> (see <prog> --help)`, and exit status 2 (argparse itself
    prints the whole usage first)."""

    def error(self, message: str):
        message = " ".join(message.split())  # argparse wraps long choice lists over lines
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `translate` and `evaluate`."""
    parser.add_argument("--model", required=True, help="an export version directory")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per request")
    parser.add_argument("--beam-size", type=int, help="per-request beam size (default: export's)")
    parser.add_argument("--alpha", type=float, help="per-request length penalty exponent")
    parser.add_argument("--max-extra-length", type=int, help="per-request output length bound")
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

    Raises KerasTransformerError; `flag_error` turns it into a message naming the flag.
    """
    from keras_transformer import config
    from keras_transformer.inference.evaluation import EvaluationError, load_export
    from keras_transformer.inference.options import check_options, check_sampling

    if args.batch_size < 1:
        raise EvaluationError(f"--batch-size must be >= 1, got {args.batch_size}")
    sampling = any(getattr(args, flag, None) is not None for flag in SAMPLING_FLAGS)
    prefixes = getattr(args, "prefix", None)
    stop_rule = getattr(args, "stop_rule", None)
    given = (args.beam_size, args.alpha, args.max_extra_length, prefixes, stop_rule)
    if sampling:
        if any(value is not None for value in given):
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
        return load_export(args.model, "sample"), options
    if all(value is None for value in given):
        return load_export(args.model), {}
    beam, alpha, extra = (
        config.BEAM_SIZE if args.beam_size is None else args.beam_size,
        config.ALPHA if args.alpha is None else args.alpha,
        config.MAX_EXTRA_LENGTH if args.max_extra_length is None else args.max_extra_length,
    )
    check_options(beam, alpha, extra)
    options = {"beam_size": beam, "alpha": alpha, "max_extra_length": extra, "num_hypotheses": 1}
    options["target_prefix"] = prefixes if prefixes is not None else ""
    if stop_rule is None:
        return load_export(args.model, "translate_with_options"), options
    options["stop_rule"] = stop_rule
    return load_export(args.model, "translate_with_stop_rule"), options


def flag_error(prog: str, err: Exception) -> int:
    """Print a library error as a command-line error (naming the flag); exit status 2."""
    option = getattr(err, "option", None)
    flag = {"top_k": "sample_topk", "top_p": "sample_topp"}.get(option, option)
    message = f"--{flag.replace('_', '-')}: {err}" if option else str(err)
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2
