"""How long the chief is blocked writing a training checkpoint (the model and its Adam slots,
as kt-train saves them), synchronously, with TensorFlow's asynchronous checkpoint as it is,
and with kt-train's --async-checkpoint. Prints one JSON object.

    python benchmarks/bench_checkpoint.py [--preset base] [--repeats 3] [--dir /tmp/x]

`sync`: the seconds each `CheckpointManager.save` blocked (the chief waits that long, and in a
multi-worker job every other worker waits in its next collective). `async`: the same saves
with `tf.train.CheckpointOptions(enable_async=True)`: the time the
caller was blocked per save, or the error that stopped them (TF 2.21 with Keras 3.15: the
second save fails, Keras' variables create a tf.Variable inside TensorFlow's copy function).
`kt_async`: kt-train's --async-checkpoint (`training.async_checkpoint.AsyncWrites`: the
same asynchronous checkpoint with Keras' variables fixed), the seconds each save blocked,
the previous write finished, and the seconds its write went on in the background.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import keras
import tensorflow as tf

from keras_transformer.config import TransformerConfig
from keras_transformer.model import Transformer
from keras_transformer.training.async_checkpoint import AsyncWrites


def training_state(preset: str):
    """A Transformer of `preset` with a built Adam optimizer: the checkpoint's bulk."""
    model = Transformer(TransformerConfig.preset(preset, vocab_size=32000))
    ids = tf.ones((1, 8), tf.int32)
    model((ids, ids))
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    return {"model": model, "optimizer": optimizer}, model


def timed_saves(checkpoint, directory: str, repeats: int, options=None) -> dict:
    """{"blocked_s": the seconds each save blocked its caller} (`repeats` saves, then a sync
    timed as "sync_s"), or with "error": the first failure and the save it stopped."""
    manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=1)
    result = {"blocked_s": []}
    try:
        for step in range(1, repeats + 1):
            start = time.perf_counter()
            manager.save(checkpoint_number=step, options=options)
            result["blocked_s"].append(round(time.perf_counter() - start, 3))
        start = time.perf_counter()
        manager.sync()
        result["sync_s"] = round(time.perf_counter() - start, 3)
    except Exception as err:  # noqa: BLE001  (the figure is the error itself)
        result["error"] = error_line(err, step)
    return result


def error_line(err: Exception, step: int) -> str:
    """ "save N: Kind: message" (the message's last line)."""
    kind = type(err).__name__
    message = str(err).strip().splitlines()[-1].strip().removeprefix(f"{kind}: ")
    return f"save {step}: {kind}: {message}"


def kt_async_saves(checkpoint, directory: str, repeats: int) -> dict:
    """kt-train's --async-checkpoint: "blocked_s", the seconds each save blocked its caller
    (the previous write finished first, as when saves are --checkpoint-every steps apart),
    and "write_s", the seconds the write went on in the background after that."""
    writes = AsyncWrites(tf.train.CheckpointManager(checkpoint, directory, max_to_keep=1))
    result = {"blocked_s": [], "write_s": []}
    try:
        for step in range(1, repeats + 1):
            start = time.perf_counter()
            writes.save(step)
            saved = time.perf_counter()
            writes.wait()
            result["blocked_s"].append(round(saved - start, 3))
            result["write_s"].append(round(time.perf_counter() - saved, 3))
    except Exception as err:  # noqa: BLE001  (the figure is the error itself)
        result["error"] = error_line(err, step)
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="kt-bench-ckpt-", dir=args.dir)
    try:
        items, model = training_state(args.preset)
        result = {"preset": args.preset, "parameters": model.count_params()}
        # a Checkpoint each: TensorFlow's asynchronous writer stays attached to its own
        checkpoint = tf.train.Checkpoint(**items)
        result["sync"] = timed_saves(checkpoint, os.path.join(root, "sync"), args.repeats)
        result["checkpoint_mb"] = round(
            sum(e.stat().st_size for e in os.scandir(os.path.join(root, "sync"))) / 2**20, 1
        )
        options = tf.train.CheckpointOptions(enable_async=True)
        result["async"] = timed_saves(
            tf.train.Checkpoint(**items), os.path.join(root, "async"), args.repeats, options
        )
        result["kt_async"] = kt_async_saves(
            tf.train.Checkpoint(**items), os.path.join(root, "kt_async"), args.repeats
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
