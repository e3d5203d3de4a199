"""Run as a script: `fit` of a TrainingModel on 2 logical CPUs (MirroredStrategy) and on the
default strategy; how many times each built and read its training stream, and where the
pipeline's counter variable sits when it is made under another device's scope.

Prints JSON. Kept out of the pytest process because logical devices must be configured
before TensorFlow starts.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer.data import PipelineStats  # noqa: E402
from keras_transformer.training.step import TrainingModel  # noqa: E402
from keras_transformer.training.strategy import make_strategy, split_cpu  # noqa: E402

split_cpu(2)
keras.utils.set_random_seed(0)
import keras_transformer as kt  # noqa: E402


def stream(starts: tf.Variable) -> tf.data.Dataset:
    """Endless batches of 5 rows (replicas get 3 and 2); `starts` counts how many times the
    stream was built and its first batch read."""
    rng = np.random.default_rng(0)
    src = rng.integers(4, 60, size=(5, 9)).astype("int32")
    tgt = rng.integers(4, 60, size=(5, 7)).astype("int32")

    def batch(index):
        first = tf.cond(index == 0, lambda: starts.assign_add(1), lambda: starts.read_value())
        with tf.control_dependencies([first]):
            return (tf.identity(src), tgt), tgt, tf.fill([5], index)

    return tf.data.Dataset.counter().map(batch)


def reads(strategy_name: str) -> int:
    strategy = make_strategy(strategy_name)
    with strategy.scope():
        cfg = kt.TransformerConfig.preset("tiny", vocab_size=60, dropout_rate=0.0)
        model = TrainingModel(kt.Transformer(cfg))
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=kt.LabelSmoothedCrossEntropy())
    with tf.device("/CPU:0"):
        starts = tf.Variable(0, dtype=tf.int64)
    model.fit(stream(starts), steps_per_epoch=2, epochs=1, verbose=0)
    assert int(model.data_next.numpy()) == 2  # the stream positions of 2 batches were read
    return int(starts.numpy())


with tf.device("/CPU:1"):
    stats = PipelineStats()
result = {
    "replicas": make_strategy("mirrored").num_replicas_in_sync,
    "mirrored_reads": reads("mirrored"),
    "default_reads": reads("default"),
    "counter_device": stats.too_long.device,
}
print(json.dumps(result))
sys.stdout.flush()
