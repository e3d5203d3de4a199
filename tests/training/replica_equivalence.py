"""Run as a script: one training step on 1 device and on 2 logical CPUs, same global batch.

Prints JSON with the losses and the max weight difference. Kept out of the pytest process
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
from keras_transformer.training.strategy import make_strategy, set_precision, split_cpu  # noqa: E402

split_cpu(2)
keras.utils.set_random_seed(0)
import keras_transformer as kt  # noqa: E402


def batch():
    # 5 rows: the replicas get 3 and 2 rows with very different numbers of real tokens
    rng = np.random.default_rng(0)
    src = rng.integers(4, 60, size=(5, 9)).astype("int32")
    tgt_in = rng.integers(4, 60, size=(5, 7)).astype("int32")
    tgt_out = rng.integers(4, 60, size=(5, 7)).astype("int32")
    lengths = [7, 6, 5, 2, 1]
    for row, n in enumerate(lengths):
        tgt_in[row, n:] = 0
        tgt_out[row, n:] = 0
        src[row, 9 - row :] = 0
    return (src, tgt_in), tgt_out


def train(strategy_name, weights):
    set_precision("float32")
    strategy = make_strategy(strategy_name)
    with strategy.scope():
        cfg = kt.TransformerConfig.preset("tiny", vocab_size=60, dropout_rate=0.0)
        transformer = kt.Transformer(cfg)
        transformer.build()
        if weights is not None:
            transformer.set_weights(weights)
        model = TrainingModel(transformer)
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss=kt.LabelSmoothedCrossEntropy())
    data = tf.data.Dataset.from_tensors(batch())
    history = model.fit(data, epochs=1, verbose=0)
    return transformer, history.history["loss"][0]


initial = kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=60, dropout_rate=0.0))
initial.build()
start = initial.get_weights()
one, loss_one = train("one_device", start)
two, loss_two = train("mirrored", start)
diff = max(float(np.max(np.abs(a - b))) for a, b in zip(one.get_weights(), two.get_weights()))
moved = max(float(np.max(np.abs(a - b))) for a, b in zip(one.get_weights(), start))
replicas = make_strategy("mirrored").num_replicas_in_sync
print(
    json.dumps(
        {
            "loss_one": loss_one,
            "loss_two": loss_two,
            "max_weight_diff": diff,
            "max_update": moved,
            "replicas": replicas,
        }
    )
)
sys.stdout.flush()
