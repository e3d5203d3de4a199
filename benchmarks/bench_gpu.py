"""The GPU run, one command away: training and decoding throughput on 1 and N devices.

    python benchmarks/bench_gpu.py                       # base, mixed_float16, 1 and all GPUs,
                                                         # XLA off and on; JSON on stdout
    python benchmarks/bench_gpu.py --devices 1 8 --xla off on --steps 50
    python benchmarks/bench_gpu.py --preset tiny --cpu-devices 2 --steps 3   # on a CPU

Every (devices, XLA) configuration trains in its own process (its own device memory peak,
its own compilations) what train.py runs: the Transformer inside `TrainingModel` under
`MirroredStrategy` over the first `devices` GPUs (logical CPUs without GPUs, see
--cpu-devices), the paper's optimizer (under mixed_float16 inside Keras'
LossScaleOptimizer), --accum-steps micro-batches, on fixed-shape random batches
(`--rows` x `--length` tokens per replica, so one compiled shape). Reported per
configuration:

    target_tokens_per_s     target tokens (all replicas) per second, median step
    step_s_median           seconds per optimizer step after --warmup steps
    first_step_s            the first step (tracing and, with XLA, compiling)
    peak_device_memory_mib  the largest peak of tf.config.experimental.get_memory_info
                            over the devices used (None on CPU: peak_rss_mib instead)
    traces                  the training step's traces (graphs: one per input shape)
    xla_programs            with XLA: the per-replica forward and backward programs XLA
                            compiled (one per micro-batch shape and replica)

and one decoding row: sentences/s of beam search (beam 4, `--decode-length` steps) on
GPU:0 (or the CPU), the model's weights random. Nothing here is a quality figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def child_train(opts) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer.training.strategy import set_precision, split_cpu

    split_cpu(opts.cpu_devices)
    import keras_transformer as kt
    from keras_transformer.training.step import TrainingModel

    gpus = tf.config.list_logical_devices("GPU")
    pool = gpus or tf.config.list_logical_devices("CPU")
    if opts.devices > len(pool):
        raise SystemExit(f"--devices {opts.devices}: only {len(pool)} devices here")
    devices = [d.name for d in pool[: opts.devices]]
    strategy = tf.distribute.MirroredStrategy(devices=devices)
    set_precision(opts.precision)
    keras.utils.set_random_seed(0)
    cfg = kt.TransformerConfig.preset(opts.preset, vocab_size=opts.vocab_size)

    class Counted(TrainingModel):
        """Counts the traces of the training step (its Python runs once per trace and
        replica)."""

        calls = 0

        def train_step(self, data):
            Counted.calls += 1
            return super().train_step(data)

    with strategy.scope():
        model = Counted(kt.Transformer(cfg), accum_steps=opts.accum_steps)
        optimizer = kt.paper_optimizer(cfg.d_model)
        if opts.precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss=kt.LabelSmoothedCrossEntropy(cfg.label_smoothing),
            jit_compile=opts.xla == "on",
        )
    rng = np.random.default_rng(0)
    rows = opts.rows * opts.devices * opts.accum_steps  # the global batch
    src = rng.integers(4, cfg.vocab_size, size=(rows, opts.length)).astype("int32")
    tgt = rng.integers(4, cfg.vocab_size, size=(rows, opts.length + 1)).astype("int32")
    data = tf.data.Dataset.from_tensors(((src, tgt[:, :-1]), tgt[:, 1:])).repeat().prefetch(2)

    times = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())

    start = time.perf_counter()
    model.fit(
        data, steps_per_epoch=opts.warmup + opts.steps, epochs=1, verbose=0, callbacks=[Clock()]
    )
    step_s = float(np.median(np.diff([start, *times])[opts.warmup :]))
    peaks = [tf.config.experimental.get_memory_info(d)["peak"] for d in devices if gpus]
    return {
        "kind": "train",
        "preset": opts.preset,
        "precision": opts.precision,
        "devices": opts.devices,
        "device_type": "GPU" if gpus else "CPU",
        "xla": opts.xla == "on",
        "accum_steps": opts.accum_steps,
        "global_rows": rows,
        "step_s_median": round(step_s, 4),
        "target_tokens_per_s": round(rows * opts.length / step_s, 1),
        "first_step_s": round(times[0] - start, 2),
        "peak_device_memory_mib": round(max(peaks) / 2**20, 1) if peaks else None,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "traces": Counted.calls // opts.devices,
        "xla_programs": (
            int(model._compiled_micro_batch.experimental_get_tracing_count())
            if model._compiled_micro_batch is not None
            else 0
        ),
        "optimizer_steps": int(model.optimizer.iterations.numpy()),
        "steps_timed": opts.steps,
    }


def child_decode(opts) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer.training.strategy import set_precision

    set_precision(opts.precision)
    import keras_transformer as kt
    from keras_transformer.inference.search import beam_search

    keras.utils.set_random_seed(0)
    cfg = kt.TransformerConfig.preset(opts.preset, vocab_size=opts.vocab_size)
    model = kt.Transformer(cfg)
    model.build()
    rng = np.random.default_rng(0)
    size = (opts.decode_sentences, opts.length)
    source = tf.constant(rng.integers(4, cfg.vocab_size, size=size).astype("int32"))
    steps = opts.decode_length

    @tf.function
    def translate(src):
        memory = model.encode(src)
        batch = tf.shape(src)[0]
        return beam_search(
            model.decode_step,
            tf.fill([batch], 2),
            model.init_cache(memory, src),
            tf.fill([batch], steps),
            3,
            beam_size=4,
            alpha=0.6,
            min_length=steps,  # every sentence decodes `steps` tokens: a fixed workload
        )

    translate(source)  # trace
    seconds = []
    for _ in range(opts.decode_rounds):
        start = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy(), translate(source))
        seconds.append(time.perf_counter() - start)
    gpus = tf.config.list_logical_devices("GPU")
    return {
        "kind": "decode",
        "preset": opts.preset,
        "precision": opts.precision,
        "device_type": "GPU" if gpus else "CPU",
        "beam_size": 4,
        "sentences": opts.decode_sentences,
        "tokens_per_sentence": steps,
        "sentences_per_s": round(opts.decode_sentences / float(np.median(seconds)), 2),
    }


def parse(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument(
        "--precision",
        default="mixed_float16",
        choices=["float32", "mixed_float16", "mixed_bfloat16"],
    )
    parser.add_argument(
        "--devices", nargs="+", default=["1", "all"], help="replica counts to run ('all')"
    )
    parser.add_argument("--xla", nargs="+", default=["off", "on"], choices=["off", "on"])
    parser.add_argument("--rows", type=int, default=64, help="rows per replica micro-batch")
    parser.add_argument("--length", type=int, default=40, help="source and target tokens")
    parser.add_argument("--accum-steps", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed first steps")
    parser.add_argument("--decode-sentences", type=int, default=256)
    parser.add_argument("--decode-length", type=int, default=40)
    parser.add_argument("--decode-rounds", type=int, default=3)
    parser.add_argument(
        "--cpu-devices", type=int, default=1, help="logical CPUs to split (no GPU: tests)"
    )
    parser.add_argument("--child", choices=["train", "decode"], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def count_devices(cpu_devices: int) -> int:
    """GPUs here (a child process asks TensorFlow), else the logical CPUs of --cpu-devices."""
    code = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) or cpu_devices


def run_child(argv, kind: str, **overrides) -> dict:
    args = list(argv)
    for name, value in overrides.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    out = subprocess.run(
        [sys.executable, __file__, *args, "--child", kind],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        return {"kind": kind, **overrides, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = parse(argv)
    if opts.child:
        opts.devices = int(opts.devices[-1])
        opts.xla = opts.xla[-1]
        print(json.dumps(child_train(opts) if opts.child == "train" else child_decode(opts)))
        return
    available = count_devices(opts.cpu_devices)
    counts = sorted({available if d == "all" else int(d) for d in opts.devices})
    results = []
    for devices in counts:
        for xla in opts.xla:
            row = run_child(argv, "train", devices=devices, xla=xla)
            print(json.dumps(row), file=sys.stderr, flush=True)
            results.append(row)
    results.append(run_child(argv, "decode", devices=1, xla="off"))
    print(json.dumps({"devices_available": available, "results": results}, indent=2))


if __name__ == "__main__":
    main()
