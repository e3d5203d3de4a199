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
import json
import os
import sys

from keras_transformer.cli.common import add_log_level_flag, flag_error, setup_logging

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# the library's defaults; keras_transformer.config imports no TensorFlow, so --help is quick
from keras_transformer.config import (  # noqa: E402
    ALPHA,
    AVERAGE_LAST,
    BEAM_SIZE,
    MAX_EXTRA_LENGTH,
    MIN_LENGTH,
)


def parse_args(argv=None, prog: str = "kt-export") -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model-dir", required=True, help="the training run (config.json, spm.model, checkpoints/)"
    )
    parser.add_argument(
        "--export-dir", required=True, help="writes <export-dir>/<model-name>/<version>/"
    )
    parser.add_argument("--model-name", default="transformer")
    parser.add_argument("--version", type=int, default=None, help="default: the next free version")
    parser.add_argument("--beam-size", type=int, default=BEAM_SIZE)
    parser.add_argument("--alpha", type=float, default=ALPHA, help="length penalty exponent")
    parser.add_argument(
        "--max-extra-length",
        type=int,
        default=MAX_EXTRA_LENGTH,
        help="output may exceed input by this",
    )
    parser.add_argument(
        "--min-length",
        type=int,
        default=MIN_LENGTH,
        help=f"shortest translation of a non-empty input, in tokens before eos (default "
        f"{MIN_LENGTH}: never an empty one; 0: no minimum, the paper's search)",
    )
    parser.add_argument(
        "--average-last",
        type=int,
        default=AVERAGE_LAST,
        help="average the last K checkpoints (default 5; 1: the last one only)",
    )
    parser.add_argument(
        "--attention-layer",
        type=int,
        help="the decoder layer whose cross-attention `score` returns (default: the penultimate)",
    )
    parser.add_argument(
        "--best", action="store_true", help="export the best-BLEU checkpoint instead"
    )
    parser.add_argument(
        "--no-ema",
        action="store_true",
        help="a run trained with --ema-decay: export the raw weights, not their moving average",
    )
    add_log_level_flag(parser)
    return parser.parse_args(argv)


def main(argv=None, prog: str = "kt-export") -> int:
    args = parse_args(argv, prog)
    setup_logging(args.log_level)
    from keras_transformer.errors import KerasTransformerError
    from keras_transformer.inference.export import describe_export, export_run
    from keras_transformer.inference.options import check_min_length, check_options

    try:
        if os.path.exists(args.export_dir) and not os.path.isdir(args.export_dir):
            raise KerasTransformerError(
                f"--export-dir {args.export_dir} is a file; give a directory (new or existing)"
            )
        check_options(args.beam_size, args.alpha, args.max_extra_length)
        check_min_length(args.min_length)
        if args.version is not None and args.version < 1:
            raise KerasTransformerError(f"--version must be >= 1, got {args.version}")
        if args.average_last < 1:
            raise KerasTransformerError(f"--average-last must be >= 1, got {args.average_last}")
        path = export_run(
            args.model_dir,
            args.export_dir,
            model_name=args.model_name,
            version=args.version,
            beam_size=args.beam_size,
            alpha=args.alpha,
            max_extra_length=args.max_extra_length,
            min_length=args.min_length,
            average_last=args.average_last,
            use_best=args.best,
            attention_layer=args.attention_layer,
            ema=not args.no_ema,
        )
    except KerasTransformerError as err:
        return flag_error(prog, err)
    except json.JSONDecodeError as err:
        config = os.path.join(args.model_dir, "config.json")
        return flag_error(prog, f"{config} is not valid JSON ({err}); restore it or retrain")
    except OSError as err:  # an export dir that cannot be written, a file that cannot be read
        return flag_error(
            prog, f"{err.filename}: {err.strerror}; check the path and its permissions"
        )
    print(describe_export(path))
    print(f"  {os.path.join(args.export_dir, 'models.config')} (model {args.model_name!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
