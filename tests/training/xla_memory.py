"""Run as a script: the peak memory of one training step under XLA (jit_compile=True) on
the CPU, from TensorFlow's allocator (tf.config.experimental.get_memory_info), for
`rows` x `length` batches split into `k` micro-batches: k=4 must peak near one micro-batch
(rows/4), not near the whole batch. Prints JSON {"rows,k": peak MiB}. Each configuration
traces and compiles its own step; the peak is reset before each.

The CPU allocator keeps these statistics only as a BFC allocator: oneDNN's, which TensorFlow
turns on by default only on some x86 CPUs (on an Intel Xeon, not on an AMD EPYC), or the one
TF_CPU_ALLOCATOR_USE_BFC selects; set here so the measure exists on every CPU.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # read when the CPU device starts (below)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.training.step import TrainingModel  # noqa: E402

ROWS, LENGTH, VOCAB = 64, 48, 4000


def peak_mib(rows, k):
    keras.utils.set_random_seed(0)
    cfg = kt.TransformerConfig.preset("tiny", num_layers=1, vocab_size=VOCAB, max_length=LENGTH + 1)
    model = TrainingModel(kt.Transformer(cfg), accum_steps=k)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=kt.LabelSmoothedCrossEntropy(), jit_compile=True
    )
    rng = np.random.default_rng(0)
    src = rng.integers(4, VOCAB, size=(rows, LENGTH)).astype("int32")
    tgt = rng.integers(4, VOCAB, size=(rows, LENGTH + 1)).astype("int32")
    data = tf.data.Dataset.from_tensors(((src, tgt[:, :-1]), tgt[:, 1:])).repeat(2)
    model.fit(data.take(1), epochs=1, verbose=0)  # trace and compile
    tf.config.experimental.reset_memory_stats("CPU:0")
    model.fit(data.take(1), epochs=1, verbose=0)
    return round(tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20, 1)


configs = [(ROWS // 4, 1), (ROWS, 4), (ROWS, 1)]
print(json.dumps({f"{rows},{k}": peak_mib(rows, k) for rows, k in configs}))
sys.stdout.flush()
