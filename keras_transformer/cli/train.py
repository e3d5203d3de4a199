"""Train a Transformer (default: small preset on Multi30k, en->de).

    kt-train --strategy mirrored
    kt-train --dataset tfds:wmt14_translate/de-en --data-dir ~/tensorflow_datasets \
        --src-lang en --tgt-lang de --preset base --strategy mirrored --precision mixed_float16

Running again with the same --model-dir resumes where it stopped.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None, prog: str = "kt-train"):
    """The command line is built from `TrainArgs`: one definition of every flag."""
    import dataclasses

    from keras_transformer.training.args import TrainArgs, option

    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for field in dataclasses.fields(TrainArgs):
        kind = str(field.type)
        meta = dict(help=field.metadata["help"], default=field.default)
        if kind == "bool":
            parser.add_argument(option(field.name), action="store_true", **meta)
            continue
        convert = int if kind.startswith("int") else float if kind.startswith("float") else str
        if field.name == "data_dir":
            meta["default"] = os.environ.get("KT_DATA_DIR")
        parser.add_argument(
            option(field.name), type=convert, choices=field.metadata["choices"], **meta
        )
    return TrainArgs(**vars(parser.parse_args(argv)))


def main(argv=None, prog: str = "kt-train") -> int:
    args = parse_args(argv, prog)  # no TensorFlow yet: --help and flag errors answer at once
    from keras_transformer.errors import KerasTransformerError
    from keras_transformer.training.plan import Plan

    try:
        plan = Plan.of(args)  # checked once, corpus lists parsed once
        from keras_transformer.training.strategy import configure_devices, split_cpu

        split_cpu(args.cpu_devices)  # before anything starts TensorFlow's runtime
        configure_devices(memory_growth=args.gpu_memory_growth, deterministic=args.deterministic)
        from keras_transformer.training.trainer import train

        train(plan)
    except KerasTransformerError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
