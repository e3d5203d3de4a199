"""Run as a script: dropout on 2 logical CPUs (MirroredStrategy).

The same input on both replicas: in training mode the outputs must differ (each replica
draws its own masks), in inference mode they must be equal; the model is the plain
`Transformer`, called as any Keras code calls it. Then two identical `fit` runs of the
TrainingModel (as train.py runs it), dropout on: their weights must be equal. Prints JSON. Kept out of the pytest process
because logical devices must be configured before TensorFlow starts.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer.training.step import TrainingModel  # noqa: E402
from keras_transformer.training.strategy import make_strategy, split_cpu  # noqa: E402

split_cpu(2)
keras.utils.set_random_seed(0)
import keras_transformer as kt  # noqa: E402

CONFIG = dict(num_layers=1, vocab_size=60, dropout_rate=0.3)


def batch(rows=4):
    rng = np.random.default_rng(0)
    src = rng.integers(4, 60, size=(rows, 9)).astype("int32")
    tgt = rng.integers(4, 60, size=(rows, 7)).astype("int32")
    return (src, tgt), tgt


def replica_outputs(strategy, model, training):
    """The model's output on every replica, each given the same batch."""
    (src, tgt), _ = batch()

    @tf.function
    def step():
        return strategy.run(lambda: model((src, tgt), training=training))

    return [t.numpy() for t in strategy.experimental_local_results(step())]


def fit(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        transformer = kt.Transformer(kt.TransformerConfig.preset("tiny", **CONFIG))
        transformer.build()
        model = TrainingModel(transformer)
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=kt.LabelSmoothedCrossEntropy())
    (src, tgt), out = batch(6)
    data = tf.data.Dataset.from_tensors(((src, tgt), out)).repeat(3)
    model.fit(data, epochs=1, verbose=0)
    return transformer.get_weights()


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


strategy = make_strategy("mirrored")
with strategy.scope():
    transformer = kt.Transformer(kt.TransformerConfig.preset("tiny", **CONFIG))
    transformer.build()
training = replica_outputs(strategy, transformer, True)
inference = replica_outputs(strategy, transformer, False)
result = {
    "replicas": strategy.num_replicas_in_sync,
    "training_diff": float(np.max(np.abs(training[0] - training[1]))),
    "inference_diff": float(np.max(np.abs(inference[0] - inference[1]))),
}
first, second = fit(strategy), fit(strategy)
result["rerun_diff"] = max_diff(first, second)
# the masks differ from one device's (replica 1 draws its own): the weights do too
result["one_device_diff"] = max_diff(first, fit(make_strategy("default")))
print(json.dumps(result))
sys.stdout.flush()
