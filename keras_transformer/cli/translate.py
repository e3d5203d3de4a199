"""Translate a file or stdin through an exported SavedModel, in batches.

kt-translate --model EXPORT/transformer/1 < in.txt > out.txt

The whole input is read first (it is sorted by length into batches, and written back in
input order). `--beam-size`, `--alpha`, `--max-extra-length` or `--prefix-file` decode through
the export's `translate_with_options` signature (`--stop-rule`: `translate_with_stop_rule`),
the options not given being the export's own (its assets/decoding.json); `--sample-topk`,
`--sample-topp`, `--temperature` or `--seed` draw one translation per sentence through
`sample` (sentence i uses seed + i, so a run is reproducible); without them,
`serving_default` (the settings chosen at export). The options used are named on stderr.
"""

from __future__ import annotations

import argparse
import sys

from keras_transformer.cli.common import (
    add_decoding_flags,
    add_sampling_flags,
    decoder,
    flag_error,
    import_tensorflow,
    parse_data_command,
)
from keras_transformer.cli.parser import ArgumentParser


def main(argv=None, prog: str = "kt-translate") -> int:
    parser = ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_decoding_flags(parser)
    add_sampling_flags(parser)
    parser.add_argument("--input", default="-", help="file to translate (default: stdin)")
    parser.add_argument("--output", default="-", help="where to write (default: stdout)")
    parser.add_argument(
        "--prefix-file", help='one target prefix per input line ("" = none): outputs start with it'
    )
    args = parse_data_command(parser, argv)  # stdout is the command's output

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
        import_tensorflow(args.log_level)
        translate_fn, options = decoder(args, len(lines))
    except (KerasTransformerError, OSError) as err:
        return flag_error(prog, err)
    texts, _ = translate_all(translate_fn, lines, args.batch_size, **options)
    write_lines(args.output, texts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
