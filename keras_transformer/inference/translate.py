"""Translate a file or stdin through an exported SavedModel, in batches.

python -m keras_transformer.inference.translate --model EXPORT/transformer/1 < in.txt > out.txt

The whole input is read first (it is sorted by length into batches, and written back in
input order). `--beam-size`, `--alpha` or `--max-extra-length` decode through the export's
`translate_with_options` signature; without them, through `serving_default` (the settings
chosen at export).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `translate` and `evaluate`."""
    parser.add_argument("--model", required=True, help="an export version directory")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per request")
    parser.add_argument("--beam-size", type=int, help="per-request beam size (default: export's)")
    parser.add_argument("--alpha", type=float, help="per-request length penalty exponent")
    parser.add_argument("--max-extra-length", type=int, help="per-request output length bound")


def decoder(args):
    """(translate_fn, options) for `evaluation.translate_all`, from the shared flags.

    Raises KerasTransformerError; `flag_error` turns it into a message naming the flag.
    """
    from keras_transformer import config
    from keras_transformer.inference.evaluation import EvaluationError, load_export
    from keras_transformer.inference.translator import check_options

    if args.batch_size < 1:
        raise EvaluationError(f"--batch-size must be >= 1, got {args.batch_size}")
    given = (args.beam_size, args.alpha, args.max_extra_length)
    if all(value is None for value in given):
        return load_export(args.model), {}
    import tensorflow as tf

    beam, alpha, extra = (
        config.BEAM_SIZE if args.beam_size is None else args.beam_size,
        config.ALPHA if args.alpha is None else args.alpha,
        config.MAX_EXTRA_LENGTH if args.max_extra_length is None else args.max_extra_length,
    )
    check_options(beam, alpha, extra)
    options = {
        "beam_size": tf.constant(beam),
        "alpha": tf.constant(alpha, tf.float32),
        "max_extra_length": tf.constant(extra),
        "num_hypotheses": tf.constant(1),
    }
    return load_export(args.model, "translate_with_options"), options


def flag_error(prog: str, err: Exception) -> int:
    """Print a library error as a command-line error (naming the flag); exit status 2."""
    option = getattr(err, "option", None)
    message = f"--{option.replace('_', '-')}: {err}" if option else str(err)
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_decoding_flags(parser)
    parser.add_argument("--input", default="-", help="file to translate (default: stdin)")
    parser.add_argument("--output", default="-", help="where to write (default: stdout)")
    args = parser.parse_args(argv)

    from keras_transformer.errors import KerasTransformerError
    from keras_transformer.inference.evaluation import read_lines, translate_all

    try:
        if args.input == "-":
            lines = [line.rstrip("\n") for line in sys.stdin]
        else:
            lines = read_lines(args.input)
        translate_fn, options = decoder(args)
    except (KerasTransformerError, OSError) as err:
        return flag_error("translate", err)
    texts, _ = translate_all(translate_fn, lines, args.batch_size, **options)
    sink = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    with sink:
        sink.write("".join(text + "\n" for text in texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
