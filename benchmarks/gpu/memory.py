"""bench_gpu.py --sweep-memory: the micro-batch sweep to the memory edge, against the model
of `settings.memory` (the bytes a training step keeps per padded token, from which kt-train
splits an update into micro-batches).

One child, one device, the first --precision: micro-batches of `rows` x --max-length tokens
(the length the model assumes), the rows doubling from 1 until a step runs out of memory
(ResourceExhaustedError: the edge) or the tokens pass --sweep-max-tokens. Each size trains two
steps; its measured peak is the device's `get_memory_info` peak (the stats reset before each
size) on a GPU, and on a CPU the growth of the process's peak RSS over its RSS before the
sweep (host memory with TensorFlow's allocator: a rough check only). Both include what does
not grow with the micro-batch (the weights, gradients, Adam's moments), so `ratio` compares the
growth from the smallest size: (peak - its peak) / (predicted - its prediction). Above 1 the
model under-estimates a step and kt-train's automatic micro-batches would not fit.
"""

from __future__ import annotations

import resource

from gpu.children import layers


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_sweep(opts) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer.settings.memory import step_bytes_per_token, tokens_that_fit
    from keras_transformer.training.step import TrainingModel
    from keras_transformer.training.strategy import set_precision

    set_precision(opts.precision)
    keras.utils.set_random_seed(0)
    vocab = opts.vocab_size or 32000
    cfg = kt.TransformerConfig.preset(opts.preset, vocab_size=vocab, **layers(opts))
    gpus = tf.config.list_logical_devices("GPU")
    model = TrainingModel(kt.Transformer(cfg))
    model.compile(
        optimizer=kt.paper_optimizer(cfg.d_model),
        loss=kt.LabelSmoothedCrossEntropy(cfg.label_smoothing),
    )
    length = opts.max_length
    per_token = step_bytes_per_token(
        opts.preset, vocab, length, opts.precision, num_layers=cfg.num_layers
    )
    rng = np.random.default_rng(0)
    baseline = peak_rss_mib()
    points, rows, edge = [], 1, None
    while rows * length <= opts.sweep_max_tokens:
        ids = rng.integers(4, vocab, size=(rows, length + 1)).astype("int32")
        data = tf.data.Dataset.from_tensors(((ids[:, :-1], ids[:, :-1]), ids[:, 1:])).repeat()
        if gpus:
            tf.config.experimental.reset_memory_stats(gpus[0].name)
        try:
            model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)
        except tf.errors.ResourceExhaustedError:
            edge = rows * length
            break
        if gpus:
            peak = tf.config.experimental.get_memory_info(gpus[0].name)["peak"] / 2**20
        else:
            peak = peak_rss_mib() - baseline
        predicted = per_token * rows * length / 2**20
        first = points[0] if points else {"peak_mib": peak, "predicted_mib": predicted}
        grown = predicted - first["predicted_mib"]
        points.append(
            {
                "rows": rows,
                "tokens": rows * length,
                "peak_mib": round(peak, 1),
                "predicted_mib": round(predicted, 1),
                "ratio": round((peak - first["peak_mib"]) / grown, 2) if grown else None,
            }
        )
        rows *= 2
    return {
        "kind": "memory",
        "preset": opts.preset,
        "num_layers": cfg.num_layers,
        "precision": opts.precision,
        "device_type": "GPU" if gpus else "CPU",
        "measured": "device peak" if gpus else "peak RSS growth (host memory: rough)",
        "length": length,
        "predicted_bytes_per_token": per_token,
        "points": points,
        "largest_tokens_run": points[-1]["tokens"] if points else None,
        "out_of_memory_at_tokens": edge,
        "model_tokens_that_fit_1gib": tokens_that_fit(
            1.0, opts.preset, vocab, length, opts.precision, num_layers=cfg.num_layers
        ),
    }
