"""Run as a script: XLA (jit_compile=True) on 2 logical CPUs under MirroredStrategy, 2
micro-batches per replica, in float32 and mixed_bfloat16, against the same training without
XLA (dropout off: XLA draws other random bits from the same stateless seeds); with dropout,
two XLA runs. Prints JSON. Kept out of the pytest process because logical devices must be
configured before TensorFlow starts.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer.training.step import TrainingModel  # noqa: E402
from keras_transformer.training.strategy import make_strategy, set_precision, split_cpu  # noqa: E402

split_cpu(2)
import keras_transformer as kt  # noqa: E402


def batches():
    rng = np.random.default_rng(0)
    out = []
    for _ in range(3):
        src = rng.integers(4, 60, size=(8, 9)).astype("int32")
        tgt = rng.integers(4, 60, size=(8, 8)).astype("int32")
        for row, n in enumerate([8, 7, 5, 2, 8, 3, 6, 1]):
            tgt[row, n:] = 0
            src[row, 9 - row % 4 :] = 0
        out.append(((src, tgt[:, :-1]), tgt[:, 1:]))
    return tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(lambda *xs: np.stack(xs), *out))


def train(jit_compile, precision, dropout=0.0):
    keras.backend.clear_session()  # the runs before: 26 s instead of 14 for the last
    keras.utils.set_random_seed(0)
    set_precision(precision)
    strategy = make_strategy("mirrored")
    with strategy.scope():
        cfg = kt.TransformerConfig.preset("tiny", num_layers=1, vocab_size=60, dropout_rate=dropout)
        transformer = kt.Transformer(cfg)
        transformer.build()
        model = TrainingModel(transformer, accum_steps=2)
        model.compile(
            optimizer=keras.optimizers.SGD(0.5),
            loss=kt.LabelSmoothedCrossEntropy(),
            jit_compile=jit_compile,
        )
    start = transformer.get_weights()
    history = model.fit(batches(), epochs=1, verbose=0)
    traces = model._compiled_micro_batch
    return {
        "weights": transformer.get_weights(),
        "start": start,
        "loss": history.history["loss"][0],
        "steps": int(model.optimizer.iterations.numpy()),
        "xla_traces": traces.experimental_get_tracing_count() if traces else 0,
        "replicas": strategy.num_replicas_in_sync,
    }


def update_diff(first, second):
    """|update(second) - update(first)| / |update(first)| over all weights (L2)."""
    pairs = [(a - s, b - s) for a, b, s in zip(first["weights"], second["weights"], first["start"])]
    return float(
        np.sqrt(sum(np.sum((u - v) ** 2) for u, v in pairs))
        / np.sqrt(sum(np.sum(u**2) for u, _ in pairs))
    )


f32 = train(False, "float32")
f32_xla = train(True, "float32")
bf16 = train(False, "mixed_bfloat16")
bf16_xla = train(True, "mixed_bfloat16")
dropout = [train(True, "mixed_bfloat16", dropout=0.1) for _ in range(2)]
print(
    json.dumps(
        {
            "replicas": bf16_xla["replicas"],
            "steps": [r["steps"] for r in (f32_xla, bf16_xla, dropout[0])],
            "losses": [r["loss"] for r in (f32_xla, bf16_xla, *dropout)],
            "float32_xla_vs_plain": update_diff(f32, f32_xla),
            "bfloat16_xla_vs_plain": update_diff(bf16, bf16_xla),
            "bfloat16_plain_vs_float32": update_diff(f32, bf16),
            "bfloat16_xla_vs_float32": update_diff(f32, bf16_xla),
            "dropout_xla_rerun_diff": max(
                float(np.max(np.abs(a - b)))
                for a, b in zip(dropout[0]["weights"], dropout[1]["weights"])
            ),
            "xla_traces": bf16_xla["xla_traces"],
        }
    )
)
sys.stdout.flush()
