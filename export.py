"""Export a training run as a SavedModel for TensorFlow Serving.

python export.py --model-dir runs/en-de --export-dir exports --model-name transformer
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model-dir", required=True, help="the training run (config.json, spm.model, checkpoints/)"
    )
    parser.add_argument(
        "--export-dir", required=True, help="writes <export-dir>/<model-name>/<version>/"
    )
    parser.add_argument("--model-name", default="transformer")
    parser.add_argument("--version", type=int, default=None, help="default: the next free version")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent")
    parser.add_argument(
        "--max-extra-length", type=int, default=50, help="output may exceed input by this"
    )
    parser.add_argument(
        "--average-last", type=int, default=1, help="average the last K checkpoints"
    )
    parser.add_argument(
        "--best", action="store_true", help="export the best-BLEU checkpoint instead"
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from keras_transformer.run_dir import RunDirError
    from keras_transformer.serving import ExportError, export_run

    try:
        path = export_run(
            args.model_dir,
            args.export_dir,
            model_name=args.model_name,
            version=args.version,
            beam_size=args.beam_size,
            alpha=args.alpha,
            max_extra_length=args.max_extra_length,
            average_last=args.average_last,
            use_best=args.best,
        )
    except (RunDirError, ExportError, ValueError) as err:
        print(f"export.py: error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
