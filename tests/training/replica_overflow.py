"""Run as a script: mixed_float16 on 2 logical CPUs, an overflow injected on replica 1 only.

Step 1 has finite gradients everywhere; in step 2 replica 1's gradients get an inf. The step
must be skipped on every replica (weights unchanged and finite, iterations not advanced) and
the loss scale must halve. Prints JSON. Kept out of the pytest process because logical
devices must be configured before TensorFlow starts.
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


class OverflowOnReplicaOne(TrainingModel):
    """Adds inf to replica 1's gradients from the second batch on (data_position >= 1)."""

    def compute_gradients(self, *args):
        grads, loss = super().compute_gradients(*args)
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        bad = tf.logical_and(tf.equal(replica, 1), self.data_position >= 1)
        grads = list(grads)
        grads[-1] = grads[-1] + tf.where(bad, float("inf"), 0.0)
        return grads, loss


def batch(seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(4, 60, size=(4, 9)).astype("int32")
    tgt = rng.integers(4, 60, size=(4, 8)).astype("int32")
    return (src, tgt[:, :-1]), tgt[:, 1:]


set_precision("mixed_float16")
strategy = make_strategy("mirrored")
with strategy.scope():
    transformer = kt.Transformer(
        kt.TransformerConfig.preset("tiny", num_layers=1, vocab_size=60, dropout_rate=0.0)
    )
    model = OverflowOnReplicaOne(transformer)
    model.compile(optimizer=kt.paper_optimizer(64, 10), loss=kt.LabelSmoothedCrossEntropy())
    model.optimizer.build(transformer.trainable_variables)


def per_replica(variable):
    return [np.asarray(v) for v in strategy.experimental_local_results(variable)]


def snapshot():
    return [per_replica(v.value) for v in transformer.trainable_variables]


def largest_change(a, b):
    return max(float(np.max(np.abs(x - y))) for va, vb in zip(a, b) for x, y in zip(va, vb))


start = snapshot()
model.fit(tf.data.Dataset.from_tensors(batch(1)), epochs=1, verbose=0)
after_one = snapshot()
model.fit(tf.data.Dataset.from_tensors(batch(2)), epochs=1, verbose=0)
after_two = snapshot()
scale_var = model.optimizer.dynamic_scale
scale_var = scale_var.value if hasattr(scale_var, "value") else scale_var
print(
    json.dumps(
        {
            "replicas": strategy.num_replicas_in_sync,
            "iterations": [int(x) for x in per_replica(model.optimizer.iterations.value)],
            "data_position": int(model.data_position.numpy()),
            "loss_scale": [float(x) for x in per_replica(scale_var)],
            "changed_by_step_1": largest_change(start, after_one),
            "changed_by_step_2": largest_change(after_one, after_two),
            "finite": all(np.all(np.isfinite(x)) for v in after_two for x in v),
            "replicas_agree": all(np.array_equal(v[0], v[1]) for v in after_two),
        }
    )
)
sys.stdout.flush()
