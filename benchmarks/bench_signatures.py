"""Time the export's `score` and `sample` signatures on test_2016_flickr (1,000 pairs); JSON.

    python benchmarks/bench_signatures.py --export EXPORT_VERSION_DIR \
        --data-dir $KT_DATA_DIR/multi30k

Loads the SavedModel as a client would (TensorFlow and TensorFlow Text only), sends batches
of 64 sentences, longest first, and reports the median of 3 timed passes after one warm-up
pass: `score(inputs, targets)` with the reference translations, and `sample(inputs,
temperature 1, top_k 10, top_p 1, seed = the sentence's index)`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time

from figures import add_record_flag, record

BATCH = 64
PASSES = 3


def read(path: str) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", required=True, help="an export version directory")
    parser.add_argument("--data-dir", required=True, help="the Multi30k files")
    add_record_flag(parser)
    args = parser.parse_args()

    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (the SentencePiece ops of the export)

    sources = read(os.path.join(args.data_dir, "test_2016_flickr.en.gz"))
    targets = read(os.path.join(args.data_dir, "test_2016_flickr.de.gz"))
    loaded = tf.saved_model.load(args.export)
    score, sample = loaded.signatures["score"], loaded.signatures["sample"]
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i].split()))
    batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]

    def run_score():
        for rows in batches:
            score(
                inputs=tf.constant([sources[i] for i in rows]),
                targets=tf.constant([targets[i] for i in rows]),
            )

    def run_sample():
        for rows in batches:
            n = len(rows)
            sample(
                inputs=tf.constant([sources[i] for i in rows]),
                temperature=tf.fill([n], 1.0),
                top_k=tf.fill([n], 10),
                top_p=tf.fill([n], 1.0),
                seed=tf.constant(rows, tf.int64),
            )

    result = {"export": args.export, "sentences": len(sources), "batch": BATCH}
    for name, run in (("score", run_score), ("sample", run_sample)):
        run()  # warm-up: traces nothing new, but fills oneDNN's caches
        seconds = []
        for _ in range(PASSES):
            start = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - start)
        median = statistics.median(seconds)
        result[name] = {
            "median_seconds": round(median, 2),
            "sentences_per_s": round(len(sources) / median, 1),
        }
    print(json.dumps(result))
    record(args.record, result)


if __name__ == "__main__":
    main()
