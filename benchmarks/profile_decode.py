"""Where decoding time goes, op by op, through an export loaded as TF Serving loads it.

    python benchmarks/profile_decode.py [--beam 4] [--top 15]          # W3
    python benchmarks/profile_decode.py --run RUN_DIR [--beam 4]       # real sentences

W3 (see bench_decode.py): exports the W3 decoder as bench_decode.py does and feeds its
"decode" signature one batch of 64 sentences. --run: exports the training run with
export.py (as bench_real.py does) and feeds the first --limit sentences of --source
(default: test_2016_flickr.en.gz under $KT_DATA_DIR/multi30k) in batches of 64 to
`serving_default` (--beam 4: the export's defaults) or to `translate_with_options` (--beam 1:
greedy, alpha 0). Either way the export is loaded in a TF1 session on the "serve" tag (TF
Serving's path), run with FULL_TRACE step stats, and the time of every op execution is
summed by op type (the median of --repeats traced passes), per batch of 64 sentences. With
two threads, op times overlap: their sum can exceed the wall time. Prints JSON: wall time,
op executions per batch and per loop iteration (iterations: executions of `LoopCond`, the
search's loop lowered to TF1 control flow), and the op types that took longest.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench_decode import BATCH, export_w3, w3  # noqa: E402
from bench_real import ROOT, batched, read_lines  # noqa: E402


def op_times(step_stats) -> tuple[dict, collections.Counter]:
    """({op type: milliseconds}, {op type: executions}) of one traced run."""
    totals, count = collections.Counter(), collections.Counter()
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            label = node.timeline_label  # "name = OpType(inputs)"
            if " = " not in label:
                continue
            op = label.split(" = ", 1)[1].split("(", 1)[0]
            totals[op] += node.all_end_rel_micros / 1000.0
            count[op] += 1
    return totals, count


def w3_feeds(beam: int, tmp: str):
    """(export path, signature name, [(input name -> value) per batch]) for W3."""
    _, model, source, cached, _ = w3()
    export_w3(model, cached, tmp)
    return tmp, "decode", [{"src": source.numpy(), "beam": beam}]


def real_feeds(args, tmp: str):
    """The same for --run: the export's serving_default (beam 4) or greedy options."""
    subprocess.run(
        [sys.executable, os.path.join(ROOT, "export.py"), "--model-dir", args.run,
         "--export-dir", tmp],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    sources = read_lines(args.source)[: args.limit or None]
    batches = batched(sources, BATCH)
    if args.beam != 1:
        return (
            os.path.join(tmp, "transformer", "1"),
            "serving_default",
            [{"inputs": batch} for batch in batches],
        )
    options = dict(beam_size=1, alpha=0.0, max_extra_length=50, num_hypotheses=1)
    return (
        os.path.join(tmp, "transformer", "1"),
        "translate_with_options",
        [{"inputs": batch, **options, "target_prefix": ""} for batch in batches],
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--beam", type=int, default=4, help="W3: any; --run: 4 or 1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--run", help="profile this training run's export on real sentences")
    parser.add_argument("--source", help="--run: sentences, one a line (.gz read as gzip)")
    parser.add_argument("--limit", type=int, default=256, help="--run: first N sentences")
    args = parser.parse_args(argv)
    if args.run and args.source is None:
        data = os.environ.get("KT_DATA_DIR", "")
        args.source = os.path.join(data, "multi30k", "test_2016_flickr.en.gz")
    if args.run and args.beam not in (1, 4):
        parser.error(f"--beam with --run must be 4 (the export's defaults) or 1, got {args.beam}")

    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (the SentencePiece ops of a --run export)

    with tempfile.TemporaryDirectory() as tmp:
        path, name, feeds = real_feeds(args, tmp) if args.run else w3_feeds(args.beam, tmp)
        v1 = tf.compat.v1
        with v1.Session(graph=tf.Graph()) as session:
            signature = v1.saved_model.loader.load(session, ["serve"], path).signature_def[name]
            fetch = signature.outputs["outputs" if args.run else "ids"].name

            def feed(values):
                out = {}
                for key, value in values.items():
                    if key not in signature.inputs:
                        continue  # an option this export does not have
                    info = signature.inputs[key]
                    if key != "inputs" and info.tensor_shape.dim and key != "src":
                        value = [value] * len(values["inputs"])  # one per sentence
                    out[info.name] = np.asarray(value)
                return out

            def run_all(**kwargs):
                for values in feeds:
                    session.run(fetch, feed(values), **kwargs)

            run_all()  # warm up
            plain, walls, runs = [], [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                run_all()
                plain.append(time.perf_counter() - start)
            for _ in range(args.repeats):
                totals, count = collections.Counter(), collections.Counter()
                start = time.perf_counter()
                for values in feeds:
                    metadata = v1.RunMetadata()
                    session.run(
                        fetch,
                        feed(values),
                        options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE),
                        run_metadata=metadata,
                    )
                    ms, n = op_times(metadata.step_stats)
                    totals.update(ms)
                    count.update(n)
                walls.append(time.perf_counter() - start)
                runs.append((totals, count))
    batches = len(feeds)
    totals = {
        op: statistics.median(run[0].get(op, 0.0) for run in runs) / batches
        for op in set().union(*(run[0] for run in runs))
    }
    count = runs[-1][1]
    executions = sum(count.values())
    iterations = count.get("LoopCond", 0)
    sentences = sum(len(v["inputs"] if args.run else v["src"]) for v in feeds)
    top = sorted(totals.items(), key=lambda item: -item[1])[: args.top]
    print(
        json.dumps(
            {
                "workload": f"{'real sentences' if args.run else 'W3'} through the export, "
                "TF1 session",
                "command": "python benchmarks/profile_decode.py " + " ".join(argv or sys.argv[1:]),
                "signature": name,
                "beam": args.beam,
                "sentences": sentences,
                "batches": batches,
                "sentences_per_s_untraced": round(sentences / statistics.median(plain), 1),
                "wall_ms_traced_per_batch": round(1000 * statistics.median(walls) / batches, 1),
                "op_executions_per_batch": round(executions / batches),
                "loop_iterations_per_batch": round(iterations / batches, 1),
                "op_executions_per_iteration": round(executions / iterations)
                if iterations
                else None,
                "op_ms_total_per_batch": round(sum(totals.values()), 1),
                "op_ms_per_batch_and_executions_per_batch_by_type": {
                    op: [round(ms, 1), round(count[op] / batches)] for op, ms in top
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
