"""Import a pretrained OPUS-MT / Marian model as a run directory.

kt-import SOURCE_DIR --model-dir RUN

SOURCE_DIR is the model as downloaded, in either layout: a Marian model directory (decoder.yml,
the model .npz, the vocabulary .yml, source.spm, target.spm: what OPUS-MT's zips hold) or a
Hugging Face Marian directory (config.json, model.safetensors, vocab.json, source.spm,
target.spm). Nothing is downloaded. RUN is then used as a trained run: kt-export --model-dir
RUN, kt-translate, kt-evaluate, kt-score. See docs/migrating.md.
"""

from __future__ import annotations

import argparse
import sys

from keras_transformer.cli.common import (
    add_command_flags,
    flag_error,
    set_up_command,
)
from keras_transformer.cli.parser import ArgumentParser


def main(argv=None, prog: str = "kt-import") -> int:
    parser = ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source_dir", metavar="SOURCE_DIR", help="the downloaded model directory")
    parser.add_argument("--model-dir", required=True, help="the run directory to write (new)")
    add_command_flags(parser)
    args = parser.parse_args(argv)
    set_up_command(args.log_level)

    from keras_transformer.errors import KerasTransformerError
    from keras_transformer.importers import import_model

    try:
        import_model(args.source_dir, args.model_dir)
    except (KerasTransformerError, OSError) as err:
        return flag_error(prog, err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
