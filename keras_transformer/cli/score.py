"""Score given translations with an exported model (forced decoding); prints JSON lines.

kt-score --model EXPORT/transformer/1 --src F --tgt F

One line per sentence pair, in input order: {"score": the sum of the target pieces'
log-probabilities (eos included), "token_scores": one per target piece, "target_tokens":
the SentencePiece pieces (eos last), "source_tokens", "alignment": for each target piece the
index of the source piece it attends to most (the export's chosen decoder layer, averaged
over heads)}. For reranking, corpus filtering and word alignment.
"""

from __future__ import annotations

import argparse
import json
import sys

from keras_transformer.cli.common import (
    flag_error,
    import_tensorflow,
    parse_data_command,
)
from keras_transformer.cli.parser import ArgumentParser


def records(out, rows):
    """The JSON-ready records of one `score` batch."""
    import numpy as np

    for j in range(len(rows)):
        pieces = [p.decode("utf-8", "replace") for p in out["target_tokens"][j] if p]
        source = [p.decode("utf-8", "replace") for p in out["source_tokens"][j] if p]
        attention = out["attention"][j, : len(pieces), : len(source)]
        yield {
            "score": round(float(out["scores"][j]), 4),
            "token_scores": [round(float(v), 4) for v in out["token_scores"][j, : len(pieces)]],
            "target_tokens": pieces,
            "source_tokens": source,
            "alignment": np.argmax(attention, axis=-1).tolist() if source else [],
        }


def main(argv=None, prog: str = "kt-score") -> int:
    parser = ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="an export version directory")
    parser.add_argument("--src", required=True, help="source sentences (plain or .gz)")
    parser.add_argument("--tgt", required=True, help="their translations (plain or .gz)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentence pairs per request")
    parser.add_argument("--output", default="-", help="where to write (default: stdout)")
    args = parse_data_command(parser, argv)  # stdout is the command's output

    from keras_transformer.errors import KerasTransformerError
    from keras_transformer.inference.evaluation import (
        EvaluationError,
        check_output,
        load_export,
        read_lines,
        report_truncated,
        write_lines,
    )

    try:
        check_output(args.output)
        if args.batch_size < 1:
            raise EvaluationError(f"--batch-size must be >= 1, got {args.batch_size}")
        sources, targets = read_lines(args.src), read_lines(args.tgt)
        if len(sources) != len(targets):
            raise EvaluationError(
                f"{args.src} has {len(sources)} lines, {args.tgt} has {len(targets)} lines; "
                "give one translation per source line"
            )
        import_tensorflow(args.log_level)
        score_fn = load_export(args.model, "score")
    except (KerasTransformerError, OSError) as err:
        return flag_error(prog, err)
    lines, cut, target_cut = _score_all(score_fn, sources, targets, args.batch_size)
    report_truncated(cut, "sources")
    report_truncated(target_cut, "targets")
    write_lines(args.output, lines)
    return 0


def _score_all(score_fn, sources: list[str], targets: list[str], batch_size: int):
    """(one JSON line per pair, its source cut, its target cut), in input order: the pairs
    scored in batches of `batch_size`, sorted by source length."""
    import tensorflow as tf

    from keras_transformer.inference.evaluation import length_order

    order = length_order(sources)
    lines: list[str] = [""] * len(sources)
    cut, target_cut = [False] * len(sources), [False] * len(sources)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        out = score_fn(
            inputs=tf.constant([sources[i] for i in rows]),
            targets=tf.constant([targets[i] for i in rows]),
        )
        out = {name: value.numpy() for name, value in out.items()}
        for j, (i, record) in enumerate(zip(rows, records(out, rows), strict=True)):
            lines[i] = json.dumps(record, ensure_ascii=False)
            cut[i] = bool(out["truncated"][j]) if "truncated" in out else False
            target_cut[i] = bool(out["target_truncated"][j]) if "target_truncated" in out else False
    return lines, cut, target_cut


if __name__ == "__main__":
    sys.exit(main())
