"""Where decoding time goes: W3 (see bench_decode.py) through the export, op by op.

    python benchmarks/profile_decode.py [--beam 4] [--top 15]

Exports the W3 decoder as bench_decode.py does, loads it the way TensorFlow Serving does (a
TF1 session on the "serve" tag and the "decode" signature), runs it with FULL_TRACE step
stats and sums the time of every op execution by op type, per batch of 64 sentences (the
median of --repeats traced runs). With two threads, op times overlap: their sum can exceed
the wall time. Prints JSON: wall time, op executions, and the op types that took longest.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench_decode import BATCH, export_w3, w3  # noqa: E402


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)

    import tensorflow as tf

    _, model, source, cached, _ = w3()
    with tempfile.TemporaryDirectory() as tmp:
        export_w3(model, cached, tmp)
        v1 = tf.compat.v1
        with v1.Session(graph=tf.Graph()) as session:
            signature = v1.saved_model.loader.load(session, ["serve"], tmp).signature_def
            decode = signature["decode"]
            feed = {
                decode.inputs["src"].name: source.numpy(),
                decode.inputs["beam"].name: args.beam,
            }
            fetch = decode.outputs["ids"].name
            session.run(fetch, feed)  # warm up
            walls, plain = [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                session.run(fetch, feed)
                plain.append(time.perf_counter() - start)
            runs = []
            for _ in range(args.repeats):
                metadata = v1.RunMetadata()
                start = time.perf_counter()
                session.run(
                    fetch,
                    feed,
                    options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE),
                    run_metadata=metadata,
                )
                walls.append(time.perf_counter() - start)
                runs.append(op_times(metadata.step_stats))
    totals = {
        op: statistics.median(run[0].get(op, 0.0) for run in runs)
        for op in set().union(*(run[0] for run in runs))
    }
    top = sorted(totals.items(), key=lambda item: -item[1])[: args.top]
    print(
        json.dumps(
            {
                "workload": "W3 through the export, TF1 session",
                "beam": args.beam,
                "sentences_per_s_untraced": round(BATCH / statistics.median(plain), 1),
                "wall_ms_traced": round(1000 * statistics.median(walls), 1),
                "op_executions": sum(runs[-1][1].values()),
                "op_ms_total": round(sum(totals.values()), 1),
                "op_ms_and_executions_by_type": {
                    op: [round(ms, 1), runs[-1][1][op]] for op, ms in top
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
