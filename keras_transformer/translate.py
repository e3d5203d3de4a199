"""Translate a file or stdin through an exported SavedModel, in batches.

python -m keras_transformer.translate --model EXPORT/transformer/1 < in.txt > out.txt
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def batched(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for line in lines:
        batch.append(line.rstrip("\n"))
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def load_signature(model_path: str):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    if not os.path.isfile(os.path.join(model_path, "saved_model.pb")):
        raise FileNotFoundError(f"no saved_model.pb in {model_path}")
    return tf.saved_model.load(model_path).signatures["serving_default"]


def translate_lines(
    signature, lines: Iterable[str], batch_size: int = 64, total: int | None = None
):
    """Yield (translation, score) for each line, batch by batch, with a progress bar."""
    import tensorflow as tf
    from tqdm import tqdm

    with tqdm(total=total, unit="sent", file=sys.stderr, disable=None) as progress:
        for batch in batched(lines, batch_size):
            result = signature(inputs=tf.constant(batch))
            for text, score in zip(result["outputs"].numpy(), result["scores"].numpy()):
                yield text.decode("utf-8"), float(score)
            progress.update(len(batch))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="an export version directory")
    parser.add_argument("--input", default="-", help="file to translate (default: stdin)")
    parser.add_argument("--output", default="-", help="where to write (default: stdout)")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    try:
        signature = load_signature(args.model)
    except (FileNotFoundError, OSError) as err:
        print(f"translate: error: {err}", file=sys.stderr)
        return 2
    source = (
        sys.stdin if args.input == "-" else open(args.input, encoding="utf-8", errors="replace")
    )
    sink = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    with source, sink:
        for text, _ in translate_lines(signature, source, args.batch_size):
            sink.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
