"""Score an exported model on a test set with sacreBLEU; prints JSON.

kt-evaluate --model EXPORT/transformer/1 --src F --ref F

`seconds` is the translation time (the export is loaded before the clock starts);
`target_tokens_per_s` counts the export's own SentencePiece pieces of the translations,
eos included.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from keras_transformer.cli.common import (
    add_decoding_flags,
    decoder,
    flag_error,
    import_tensorflow,
    parse_data_command,
)
from keras_transformer.cli.parser import ArgumentParser


def target_tokens(model_path: str, texts: list[str]) -> int | None:
    """SentencePiece pieces of `texts` (plus one eos each) with the export's spm.model."""
    path = os.path.join(model_path, "assets", "spm.model")
    if not os.path.isfile(path):
        return None
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=path)
    return sum(len(ids) + 1 for ids in processor.encode(texts))


def main(argv=None, prog: str = "kt-evaluate") -> int:
    parser = ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_decoding_flags(parser)
    parser.add_argument("--src", required=True, help="source sentences (plain or .gz)")
    parser.add_argument("--ref", required=True, help="reference translations (plain or .gz)")
    parser.add_argument("--output", help="also write the translations here")
    args = parse_data_command(parser, argv)  # stdout is the command's output

    from keras_transformer.errors import KerasTransformerError
    from keras_transformer.inference.evaluation import (
        EvaluationError,
        check_output,
        read_lines,
        translate_all,
    )

    try:
        check_output(args.output)
        sources, references = read_lines(args.src), read_lines(args.ref)
        if len(sources) != len(references):
            raise EvaluationError(
                f"{args.src} has {len(sources)} lines, {args.ref} has {len(references)} lines"
            )
        if not sources:
            raise EvaluationError(f"--src {args.src} is empty: no sentence to score")
        import_tensorflow(args.log_level)
        translate_fn, options = decoder(args, len(sources))
    except (KerasTransformerError, OSError) as err:
        return flag_error(prog, err)
    truncated: list[bool] = []
    start = time.perf_counter()
    hypotheses, _ = translate_all(
        translate_fn, sources, args.batch_size, truncated=truncated, **options
    )
    seconds = time.perf_counter() - start
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write("".join(h + "\n" for h in hypotheses))
    print(json.dumps(_result(args, hypotheses, references, sum(truncated), seconds), indent=2))
    return 0


def _result(args, hypotheses: list[str], references: list[str], cut: int, seconds: float):
    """kt-evaluate's JSON: the scores, what was scored, the time and the speeds."""
    from keras_transformer.inference.evaluation import score

    result = score(hypotheses, references)
    result.update(model=args.model, src=args.src, ref=args.ref, seconds=round(seconds, 1))
    result["truncated_inputs"] = cut
    if seconds:
        result["sentences_per_s"] = round(len(hypotheses) / seconds, 1)
        tokens = target_tokens(args.model, hypotheses)
        if tokens is not None:
            result["target_tokens_per_s"] = round(tokens / seconds, 1)
    return result


if __name__ == "__main__":
    sys.exit(main())
