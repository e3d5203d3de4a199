"""Translate a file or stdin through an exported SavedModel, in batches.

python -m keras_transformer.inference.translate --model EXPORT/transformer/1 < in.txt > out.txt

The whole input is read first (it is sorted by length into batches, and written back in
input order). `--beam-size`, `--alpha`, `--max-extra-length` or `--prefix-file` decode through
the export's `translate_with_options` signature; `--sample-topk`, `--sample-topp`,
`--temperature` or `--seed` draw one translation per sentence through `sample` (sentence i
uses seed + i, so a run is reproducible); without them, `serving_default` (the settings
chosen at export).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SAMPLING_FLAGS = ("sample_topk", "sample_topp", "temperature", "seed")


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `translate` and `evaluate`."""
    parser.add_argument("--model", required=True, help="an export version directory")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per request")
    parser.add_argument("--beam-size", type=int, help="per-request beam size (default: export's)")
    parser.add_argument("--alpha", type=float, help="per-request length penalty exponent")
    parser.add_argument("--max-extra-length", type=int, help="per-request output length bound")


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
    given = (args.beam_size, args.alpha, args.max_extra_length, prefixes)
    if sampling:
        if any(value is not None for value in given):
            raise EvaluationError(
                "--sample-* / --temperature / --seed draw one translation: drop --beam-size, "
                "--alpha, --max-extra-length and --prefix-file, or the sampling flags"
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
    return load_export(args.model, "translate_with_options"), options


def flag_error(prog: str, err: Exception) -> int:
    """Print a library error as a command-line error (naming the flag); exit status 2."""
    option = getattr(err, "option", None)
    flag = {"top_k": "sample_topk", "top_p": "sample_topp"}.get(option, option)
    message = f"--{flag.replace('_', '-')}: {err}" if option else str(err)
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_decoding_flags(parser)
    add_sampling_flags(parser)
    parser.add_argument("--input", default="-", help="file to translate (default: stdin)")
    parser.add_argument("--output", default="-", help="where to write (default: stdout)")
    parser.add_argument(
        "--prefix-file", help='one target prefix per input line ("" = none): outputs start with it'
    )
    args = parser.parse_args(argv)

    from keras_transformer.errors import KerasTransformerError
    from keras_transformer.inference.evaluation import (
        EvaluationError,
        check_output,
        read_lines,
        translate_all,
        write_lines,
    )

    try:
        check_output(args.output)
        lines = read_lines(args.input)
        args.prefix = None
        if args.prefix_file is not None:
            args.prefix = read_lines(args.prefix_file)
            if len(args.prefix) != len(lines):
                raise EvaluationError(
                    f"--prefix-file {args.prefix_file} has {len(args.prefix)} lines, "
                    f"the input has {len(lines)}; give one prefix per line"
                )
        translate_fn, options = decoder(args, len(lines))
    except (KerasTransformerError, OSError) as err:
        return flag_error("translate", err)
    texts, _ = translate_all(translate_fn, lines, args.batch_size, **options)
    write_lines(args.output, texts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
