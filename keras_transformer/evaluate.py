"""Score an exported model on a test set with sacreBLEU; prints JSON.

python -m keras_transformer.evaluate --model EXPORT/transformer/1 --src F --ref F
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        return [line.rstrip("\n") for line in handle]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="an export version directory")
    parser.add_argument("--src", required=True, help="source sentences (plain or .gz)")
    parser.add_argument("--ref", required=True, help="reference translations (plain or .gz)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output", help="also write the translations here")
    args = parser.parse_args(argv)

    from keras_transformer.evaluation import score
    from keras_transformer.translate import load_signature, translate_lines

    try:
        sources, references = read_lines(args.src), read_lines(args.ref)
        if len(sources) != len(references):
            raise ValueError(
                f"{args.src} has {len(sources)} lines, {args.ref} has {len(references)} lines"
            )
        signature = load_signature(args.model)
    except (OSError, ValueError) as err:
        print(f"evaluate: error: {err}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    hypotheses = [
        text for text, _ in translate_lines(signature, sources, args.batch_size, len(sources))
    ]
    seconds = time.perf_counter() - start
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write("".join(h + "\n" for h in hypotheses))
    result = score(hypotheses, references)
    result.update(model=args.model, src=args.src, ref=args.ref, seconds=round(seconds, 1))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
