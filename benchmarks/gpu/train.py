"""The child processes' work: one training row (--mode fixed or kt-train) and the decoding row.

A training row trains what kt-train trains: the Transformer inside `TrainingModel` under
`MirroredStrategy` over the first `devices` GPUs (logical CPUs without GPUs), the paper's
optimizer (under mixed_float16 inside Keras' LossScaleOptimizer), `accum_steps`
micro-batches per update. After the warmup it times `repeats` windows of `steps` optimizer
steps each; every window gives one throughput, and the row reports their median, min and max.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import resource
import shutil
import time

import numpy as np

from gpu.children import layers


def fixed_batches(opts, cfg, devices: int) -> tuple[list, int]:
    """--mode fixed: one random batch of `--rows` rows per replica and micro-batch (the
    global batch grows with the devices: weak scaling) and `--length` tokens."""
    rng = np.random.default_rng(0)
    rows = opts.rows * devices * opts.accum_steps
    src = rng.integers(4, cfg.vocab_size, size=(rows, opts.length)).astype("int32")
    tgt = rng.integers(4, cfg.vocab_size, size=(rows, opts.length + 1)).astype("int32")
    return [((src, tgt[:, :-1]), tgt[:, 1:])], opts.warmup


def timed_windows(times: list[float], start: float, warmup: int, steps: int, tokens: list):
    """(tokens per second of each timed window, seconds of the warmup)."""
    ends = [start, *times]
    rates = []
    for first in range(warmup, len(times), steps):
        seconds = ends[first + steps] - ends[first]
        rates.append(sum(tokens[first : first + steps]) / seconds)
    return rates, ends[warmup] - start


def spread(values: list[float], digits: int = 1) -> dict:
    return {
        "median": round(float(np.median(values)), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "repeats": [round(v, digits) for v in values],
    }


def job_workers() -> int:
    """The tasks of this process's job (TF_CONFIG's chief and workers), 1 without one."""
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    return max(1, len(cluster.get("chief", [])) + len(cluster.get("worker", [])))


def make_strategy(opts):
    """(strategy, this worker's devices): `MirroredStrategy` over the first --devices GPUs (or
    logical CPUs), or in a job of several workers (TF_CONFIG, set by the parent's --workers)
    `MultiWorkerMirroredStrategy` over this worker's devices (made first: collective ops must
    be configured before TensorFlow's context starts)."""
    import tensorflow as tf

    if job_workers() > 1:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        return strategy, list(strategy.extended.worker_devices)
    pool = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    if opts.devices > len(pool):
        raise SystemExit(f"--devices {opts.devices}: only {len(pool)} devices here")
    devices = [d.name for d in pool[: opts.devices]]
    return tf.distribute.MirroredStrategy(devices=devices), devices


XLA_DUMP_SUFFIX = "after_optimizations.txt"  # one optimized HLO module per XLA compilation


def dump_xla_compilations() -> str:
    """A fresh directory XLA dumps every module it compiles into (XLA_FLAGS, read when
    TensorFlow starts: set before it is imported)."""
    import sys
    import tempfile

    assert "tensorflow" not in sys.modules, "XLA_FLAGS must be set before TensorFlow starts"
    folder = tempfile.mkdtemp(prefix="bench-gpu-xla-")
    # removed when the child exits, a failed one too: a base model's dumps are large and
    # only their number is kept
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={folder} --xla_dump_hlo_as_text".strip()
    return folder


def xla_compilations(folder: str | None) -> int:
    """XLA's own count of its compilations: the optimized modules it dumped (every device
    compiles its own; a shape compiled again inside one trace counts again)."""
    if folder is None:
        return 0
    return sum(name.endswith(XLA_DUMP_SUFFIX) for name in os.listdir(folder))


def child_train(opts) -> dict:
    dumps = dump_xla_compilations() if opts.xla == "on" else None
    import keras
    import tensorflow as tf

    from keras_transformer.training.strategy import set_precision, split_cpu

    split_cpu(opts.cpu_devices)
    import keras_transformer as kt
    from gpu import shapes
    from keras_transformer.training.step import TrainingModel

    strategy, devices = make_strategy(opts)
    gpus = tf.config.list_logical_devices("GPU")
    workers = job_workers()
    local = len(devices)  # this worker's replicas
    opts.devices = local * workers  # every replica of the job
    set_precision(opts.precision)
    keras.utils.set_random_seed(0)
    row = {"kind": "train", "mode": opts.mode}
    if opts.mode == "kt-train":
        point = shapes.operating_point(opts, opts.devices)
        row.update(point)
        cfg = kt.TransformerConfig.preset(
            opts.preset, vocab_size=point["vocab_size"], **layers(opts)
        )
        static = local * point["accum_steps"] if opts.xla == "on" else None
        budget = point["update_tokens"] // workers  # a worker's stream, as kt-train's
        batches = shapes.pipeline_batches(opts, cfg.vocab_size, budget, static)
        row.update(shapes.shape_summary(batches), lengths=shapes.length_source(opts))
        warmup, accum = len(batches), point["accum_steps"]
    else:
        cfg = kt.TransformerConfig.preset(
            opts.preset, vocab_size=opts.vocab_size or 32000, **layers(opts)
        )
        batches, warmup = fixed_batches(opts, cfg, local)
        accum = opts.accum_steps

    class Counted(TrainingModel):
        """Counts the traces of the training step (its Python runs once per trace and
        replica)."""

        calls = 0

        def train_step(self, data):
            Counted.calls += 1
            return super().train_step(data)

    with strategy.scope():
        model = Counted(kt.Transformer(cfg), accum_steps=accum)
        optimizer = kt.paper_optimizer(cfg.d_model)
        if opts.precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss=kt.LabelSmoothedCrossEntropy(cfg.label_smoothing),
            jit_compile=opts.xla == "on",
        )
    spec = tf.TensorSpec([None, None], tf.int32)
    data = tf.data.Dataset.from_generator(
        lambda: itertools.cycle(batches), output_signature=((spec, spec), spec)
    ).prefetch(2)
    options = tf.data.Options()  # every worker feeds its own share (kt-train's streams)
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = data.with_options(options)
    total = warmup + opts.repeats * opts.steps
    cycle = [batches[i % len(batches)] for i in range(total)]
    # target tokens (pads excluded) of every worker's batch: the workers' shares are alike
    tokens = [workers * int(np.count_nonzero(b[1])) for b in cycle]
    times = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())

    start = time.perf_counter()
    model.fit(data, steps_per_epoch=total, epochs=1, verbose=0, callbacks=[Clock()])
    rates, warmup_s = timed_windows(times, start, warmup, opts.steps, tokens)
    peaks = [tf.config.experimental.get_memory_info(d)["peak"] for d in devices if gpus]
    micro = getattr(model, "_compiled_micro_batch", None)
    return {
        **row,
        "preset": opts.preset,
        "num_layers": cfg.num_layers,
        "precision": opts.precision,
        "devices": opts.devices,
        "device_type": "GPU" if gpus else "CPU",
        "xla": opts.xla == "on",
        "accum_steps": accum,
        "strategy": "multi_worker" if workers > 1 else "mirrored",
        "workers": workers,
        "global_rows": workers * int(batches[0][1].shape[0]) if opts.mode == "fixed" else None,
        "target_tokens_per_s": spread(rates),
        "step_s_median": round(float(np.median(np.diff([start, *times])[warmup:])), 4),
        "first_step_s": round(times[0] - start, 2),
        "warmup_s": round(warmup_s, 2),
        "warmup_steps": warmup,
        "peak_device_memory_mib": round(max(peaks) / 2**20, 1) if peaks else None,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "traces": Counted.calls // local,
        "xla_traces": int(micro.experimental_get_tracing_count()) // local if micro else 0,
        "xla_compilations": xla_compilations(dumps),
        "optimizer_steps": int(model.optimizer.iterations.numpy()),
        "steps_timed": opts.repeats * opts.steps,
    }


def child_decode(opts) -> dict:
    import keras
    import tensorflow as tf

    from keras_transformer.training.strategy import set_precision

    set_precision(opts.precision)
    import keras_transformer as kt
    from keras_transformer.inference.search import beam_search

    keras.utils.set_random_seed(0)
    cfg = kt.TransformerConfig.preset(
        opts.preset, vocab_size=opts.vocab_size or 32000, **layers(opts)
    )
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
    rates = []
    for _ in range(opts.repeats):
        start = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy(), translate(source))
        rates.append(opts.decode_sentences / (time.perf_counter() - start))
    gpus = tf.config.list_logical_devices("GPU")
    return {
        "kind": "decode",
        "preset": opts.preset,
        "num_layers": cfg.num_layers,
        "precision": opts.precision,
        "device_type": "GPU" if gpus else "CPU",
        "beam_size": 4,
        "sentences": opts.decode_sentences,
        "tokens_per_sentence": steps,
        "sentences_per_s": spread(rates, 2),
    }
