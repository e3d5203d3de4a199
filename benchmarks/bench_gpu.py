"""The GPU run, one command away: training and decoding throughput on 1 and N devices, in
one JSON on stdout. Nothing of it has run on a GPU yet (tested on CPU only).

    python benchmarks/bench_gpu.py --mode kt-train      # kt-train's operating point: the
                                                        # resolved budget, real shapes, 1 and
                                                        # all GPUs, mixed_float16 and bfloat16
    python benchmarks/bench_gpu.py --mode fixed --devices 1 8 --xla off on --steps 50
    python benchmarks/bench_gpu.py --preset tiny --cpu-devices 2 --steps 3   # on a CPU
    python benchmarks/bench_gpu.py --preset tiny --num-layers 1 ...   # the tests: 1 layer

Modes (docs/benchmarks.md has every field):
  kt-train  strong scaling, as kt-train: the update's tokens as kt-train's recipe resolves
            them for the replicas at hand (--recipe-pairs picks the recipe; --batch-tokens,
            --tokens-per-replica, --accum-steps as kt-train's flags), shared by the replicas;
            batches of the shapes kt-train's pipeline cuts from a corpus (Multi30k unless
            --corpus), chunk ends included (`gpu/shapes.py`). `efficiency` =
            throughput(N) / (N x throughput(1)).
  fixed     weak scaling: one random batch of --rows rows per replica x --length tokens
            (one compiled shape); `efficiency` as above, at a growing batch.

Every (mode, devices, XLA, precision) row trains in its own process, killed after
--timeout seconds; a failed row carries its error and the last 50 lines of its stderr, and
the command then exits 1 (after printing the JSON). --sweep-memory adds a micro-batch sweep
to the memory edge against settings.memory's model (`gpu/memory.py`). --workers N adds a row
of N local worker processes of one MultiWorkerMirroredStrategy job (TF_CONFIG). Each row times --repeats windows of
--steps steps after its warmup and reports the median, min and max throughput. The JSON's
`environment` block records TensorFlow, CUDA, cuDNN, the GPUs, NCCL and the driver.
--num-layers N builds the preset with N layers (every row records `num_layers`; the tests use
one): kt-train's budget stays the preset's, and the memory sweep's prediction counts N layers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from gpu.children import child_command, run_child, run_workers  # noqa: E402

PRECISIONS = ["float32", "mixed_float16", "mixed_bfloat16"]


def parse(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--mode", nargs="+", default=["kt-train"], choices=["kt-train", "fixed"])
    add("--preset", default="base")
    add("--num-layers", type=int, help="the model's layers (default: the preset's)")
    add("--vocab-size", type=int, help="default: the recipe's (kt-train), 32000 (fixed)")
    add("--precision", nargs="+", default=["mixed_float16", "mixed_bfloat16"], choices=PRECISIONS)
    add("--devices", nargs="+", default=["1", "all"], help="replica counts to run ('all')")
    add("--xla", nargs="+", default=["off"], choices=["off", "on"])
    add("--repeats", type=int, default=3, help="timed windows per row (median, min, max)")
    add("--steps", type=int, default=30, help="optimizer steps per timed window")
    add("--warmup", type=int, default=5, help="untimed first steps (fixed; kt-train: a pass)")
    add("--timeout", type=float, default=3600.0, help="seconds before a child is killed")
    fixed = parser.add_argument_group("--mode fixed")
    fixed.add_argument("--rows", type=int, default=64, help="rows per replica micro-batch")
    fixed.add_argument("--length", type=int, default=40, help="source and target tokens")
    fixed.add_argument("--accum-steps", type=int, help="micro-batches per update (fixed: 1)")
    point = parser.add_argument_group("--mode kt-train (kt-train's flags where named alike)")
    point.add_argument("--recipe-pairs", type=int, default=4_500_000, help="corpus size seen")
    point.add_argument("--batch-tokens", type=int)
    point.add_argument("--tokens-per-replica", type=int)
    point.add_argument("--micro-batch-memory", type=float)
    point.add_argument("--max-length", type=int, default=128)
    point.add_argument("--corpus", nargs=2, metavar=("SRC", "TGT"), help="default: Multi30k")
    point.add_argument("--pairs", type=int, default=29000, help="the corpus's first pairs")
    point.add_argument("--chunk-pairs", type=int, default=100_000, help="pairs per chunk")
    point.add_argument(
        "--pieces-per-word", type=float, default=1.3, help="without --tokenizer: an estimate"
    )
    point.add_argument("--tokenizer", metavar="RUN_DIR", help="lengths by this run's tokenizer")
    add("--decode-sentences", type=int, default=256, help="0: no decoding row")
    add("--decode-length", type=int, default=40)
    add("--workers", type=int, default=0, help="also a row of N local worker processes")
    add("--sweep-memory", action="store_true", help="micro-batch sweep to the memory edge")
    add("--sweep-max-tokens", type=int, default=1 << 20, help="the sweep's largest micro-batch")
    add("--cpu-devices", type=int, default=1, help="logical CPUs to split (no GPU: tests)")
    add("--child", choices=["env", "train", "decode", "memory"], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def child(opts) -> dict:
    """One child's row (the last value of each list flag is this child's)."""
    if opts.child == "env":
        from gpu.environment import environment

        return environment()
    if opts.child == "memory":
        from gpu.memory import child_sweep

        opts.precision = opts.precision[-1]
        return child_sweep(opts)
    from gpu.train import child_decode, child_train

    opts.devices = int(opts.devices[-1])
    opts.xla, opts.mode, opts.precision = opts.xla[-1], opts.mode[-1], opts.precision[-1]
    if opts.mode == "fixed":
        opts.accum_steps = opts.accum_steps or 1
    return child_train(opts) if opts.child == "train" else child_decode(opts)


def add_efficiency(rows: list[dict]) -> None:
    """`efficiency` = throughput(N) / (N x throughput(1)) of the same mode, XLA and
    precision (None without a 1-device row)."""
    single = {
        (r["mode"], r["xla"], r["precision"]): r["target_tokens_per_s"]["median"]
        for r in rows
        if r.get("devices") == 1 and "error" not in r
    }
    for row in rows:
        if row["kind"] != "train" or "error" in row:
            continue
        one = single.get((row["mode"], row["xla"], row["precision"]))
        row["scaling"] = "strong" if row["mode"] == "kt-train" else "weak"
        rate = row["target_tokens_per_s"]["median"]
        row["efficiency"] = round(rate / (row["devices"] * one), 3) if one else None


def worker_rows(opts, script: str, argv: list[str]) -> list[dict]:
    """--workers N: per (mode, XLA, precision), one row of N local processes of one
    `MultiWorkerMirroredStrategy` job (TF_CONFIG), one device each."""
    rows = []
    for mode in opts.mode:
        for xla in opts.xla:
            for precision in opts.precision:
                config = dict(mode=mode, xla=xla, precision=precision)
                command = child_command(script, argv, "train", devices=1, cpu_devices=1, **config)
                row = {"kind": "train", "devices": opts.workers, **config}
                row = run_workers(command, opts.workers, opts.timeout, row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = parse(argv)
    if opts.child:
        print(json.dumps(child(opts)))
        return 0
    script = os.path.abspath(__file__)
    env = run_child(child_command(script, argv, "env"), opts.timeout, {"kind": "env"})
    available = len(env.get("gpus") or []) or opts.cpu_devices
    counts = sorted({available if d == "all" else int(d) for d in opts.devices})
    rows = []
    for mode in opts.mode:
        for devices in counts:
            for xla in opts.xla:
                for precision in opts.precision:
                    config = dict(mode=mode, devices=devices, xla=xla, precision=precision)
                    command = child_command(script, argv, "train", **config)
                    row = run_child(command, opts.timeout, {"kind": "train", **config})
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    rows.append(row)
    if opts.workers:
        rows += worker_rows(opts, script, argv)
    add_efficiency(rows)
    if opts.decode_sentences:
        config = dict(devices=1, precision=opts.precision[0])
        command = child_command(script, argv, "decode", **config)
        rows.append(run_child(command, opts.timeout, {"kind": "decode", **config}))
    if opts.sweep_memory:
        config = dict(devices=1, precision=opts.precision[0])
        command = child_command(script, argv, "memory", **config)
        rows.append(run_child(command, opts.timeout, {"kind": "memory", **config}))
    report = {"environment": env, "devices_available": available, "results": rows}
    print(json.dumps(report, indent=2))
    return 1 if any("error" in row for row in [env, *rows]) else 0


if __name__ == "__main__":
    sys.exit(main())
