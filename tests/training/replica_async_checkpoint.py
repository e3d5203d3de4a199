"""Run as a script: --async-checkpoint's files under MirroredStrategy on 2 logical CPUs.

The model, its Adam slots and a step variable are mirrored variables (Keras' wrapping
TensorFlow's `MirroredVariable`); three asynchronous saves, the weights changed while each is
written, must hold the tensors of the synchronous saves of the same steps. Prints JSON. Kept
out of the pytest process because logical devices must be configured before TensorFlow starts.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer.training.async_checkpoint import AsyncWrites  # noqa: E402
from keras_transformer.training.strategy import split_cpu  # noqa: E402

split_cpu(2)
from test_async_checkpoint import tensors, training_state  # noqa: E402  (this folder)


def main(directory: str) -> dict:
    with tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"]).scope():
        items, train = training_state()
    sync = tf.train.CheckpointManager(tf.train.Checkpoint(**items), f"{directory}/s", 5)
    writes = AsyncWrites(
        tf.train.CheckpointManager(tf.train.Checkpoint(**items), f"{directory}/a", 5)
    )
    for step in (1, 2, 3):
        train()
        sync.save(checkpoint_number=step)
        writes.save(step)
        train()  # the weights change while the write is in flight
        writes.wait()
    differ, keys = [], 0
    for expected_path, got_path in zip(sync.checkpoints, writes.manager.checkpoints, strict=True):
        expected, got = tensors(expected_path), tensors(got_path)
        keys = len(expected)
        differ += sorted(set(expected) ^ set(got))
        differ += [k for k in expected if k in got and not np.array_equal(expected[k], got[k])]
    kind = type(items["model"].trainable_variables[0]._value).__name__
    return {"variable": kind, "checkpoints": len(writes.manager.checkpoints), "keys": keys,
            "differ": differ}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
