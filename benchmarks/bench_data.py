"""Input pipeline throughput and memory: Multi30k, and a WMT14-sized corpus (streaming check).

    python benchmarks/bench_data.py   # $KT_DATA_DIR: the directory holding multi30k/
    python benchmarks/bench_data.py --big-pairs 0          # Multi30k only

Each corpus runs in its own subprocess (clean peak RSS). The big corpus is Multi30k repeated
to --big-pairs pairs (default 4.5M, the size of WMT14 en-de) in a temporary directory, gzip
compressed. The pipeline is the training one: SentencePiece in the graph, bos/eos, length
filter, 20k-pair shuffle buffer, token-budget buckets (4096 tokens), prefetch. Reported:
pairs/s, target tokens/s (real, non-pad) over --batches batches after a warm-up, and peak
RSS. Streaming means the big corpus's peak RSS stays within 1.5x of Multi30k's.

Two pipelines are measured, each in its own subprocess: `make_batches(...).repeat()` and
`training_batches` (the restartable training stream: full passes over the corpus, each
shuffled with a seed drawn from (seed, pass)).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from figures import add_record_flag, record

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


PIPELINES = ("make_batches", "training_batches")


def measure(src: str, tgt: str, spm_model: str, batches: int, pipeline: str) -> dict:
    import numpy as np

    from keras_transformer.data import (
        SubwordTokenizer,
        make_batches,
        read_parallel_files,
        training_batches,
    )

    start = time.perf_counter()
    pairs = read_parallel_files(src, tgt)
    scan_s = time.perf_counter() - start
    tokenizer = SubwordTokenizer(spm_model)
    if pipeline == "make_batches":
        data = make_batches(
            pairs.dataset, tokenizer, batch_tokens=4096, max_length=128, seed=0
        ).repeat()
    else:
        data = training_batches(pairs, tokenizer, batch_tokens=4096, max_length=128, seed=0)
    iterator = iter(data)
    for _ in range(20):  # warm-up: fill the shuffle buffer
        next(iterator)
    rows = tokens = 0
    start = time.perf_counter()
    for _ in range(batches):
        (source, _), target = next(iterator)
        rows += int(source.shape[0])
        tokens += int(np.count_nonzero(target.numpy()))
    seconds = time.perf_counter() - start
    return {
        "pairs": pairs.num_pairs,
        "line_check_s": round(scan_s, 1),
        "pairs_per_s": round(rows / seconds, 1),
        "target_tokens_per_s": round(tokens / seconds, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def write_big(data_dir: str, out_dir: str, pairs: int) -> tuple[str, str]:
    paths = []
    for lang in ("en", "de"):
        with gzip.open(os.path.join(data_dir, f"train.{lang}.gz"), "rb") as handle:
            lines = handle.readlines()
        path = os.path.join(out_dir, f"big.{lang}.gz")
        with gzip.open(path, "wb", compresslevel=1) as out:
            for i in range(pairs):
                out.write(lines[i % len(lines)])
        paths.append(path)
    return paths[0], paths[1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-dir", default=os.environ.get("KT_DATA_DIR"), help="folder with Multi30k"
    )
    parser.add_argument("--big-pairs", type=int, default=4_500_000)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--pipelines", nargs="+", choices=PIPELINES, default=list(PIPELINES))
    parser.add_argument(
        "--child", nargs=4, metavar=("SRC", "TGT", "SPM", "PIPELINE"), help=argparse.SUPPRESS
    )
    add_record_flag(parser)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child[:3], args.batches, args.child[3])))
        return

    from keras_transformer.data.sources import find_multi30k_file
    from keras_transformer.data.tokenizer import train_sentencepiece

    src = find_multi30k_file("train", "en", args.data_dir)
    tgt = find_multi30k_file("train", "de", args.data_dir)
    data_dir = os.path.dirname(src)
    tmp = tempfile.mkdtemp(prefix="kt-bench-data-")
    try:
        sentences = []
        for path in (src, tgt):
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                sentences += [line.strip() for line in handle]
        spm_model = os.path.join(tmp, "spm.model")
        with open(spm_model, "wb") as handle:
            handle.write(train_sentencepiece(sentences, 8000))

        def child(a, b, pipeline):
            cmd = [sys.executable, __file__, "--child", a, b, spm_model, pipeline]
            cmd += ["--batches", str(args.batches)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            return json.loads(out.strip().splitlines()[-1])

        report = {"machine": f"{os.cpu_count()} CPU cores"}
        for pipeline in args.pipelines:
            report[pipeline] = {"multi30k": child(src, tgt, pipeline)}
        if args.big_pairs:
            start = time.perf_counter()
            big = write_big(data_dir, tmp, args.big_pairs)
            report["big_corpus_written_s"] = round(time.perf_counter() - start, 1)
            for pipeline in args.pipelines:
                result = report[pipeline]
                result["big"] = child(*big, pipeline)
                result["rss_ratio_big_vs_multi30k"] = round(
                    result["big"]["peak_rss_mb"] / result["multi30k"]["peak_rss_mb"], 2
                )
        print(json.dumps(report, indent=2))
        record(args.record, report)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
