"""The train.py runs of the trainer tests (test_trainer*.py) and their readers: the command
of a tiny run, its final weights, metrics events, TensorBoard steps, checkpoint values, and
two local multi-worker processes. The cluster and preemption tests use them too."""

import gzip
import json
import os
import socket
import subprocess
import sys

import numpy as np
import tensorflow as tf

from keras_transformer.run_dir import LOG_DIR, Run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
    "--preset",
    "tiny",
    "--vocab-size",
    "500",
    "--max-length",
    "32",
    "--batch-tokens",
    "512",
    "--eval-sentences",
    "8",
    "--eval-beam-size",
    "1",
    "--verbose",
    "0",
    "--log-every",
    "5",
]


def train_cmd(model_dir, data_dir, *extra):
    return [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--data-dir",
        data_dir,
        "--model-dir",
        str(model_dir),
        *TINY,
        *extra,
    ]


def run_train(model_dir, data_dir, *extra, env=None, check=True):
    out = subprocess.run(
        train_cmd(model_dir, data_dir, *extra), capture_output=True, text=True, env=env, cwd=ROOT
    )
    if check and out.returncode != 0:
        raise AssertionError(out.stderr[-3000:])
    return out


def final_weights(model_dir):
    """(newest checkpoint, its model weights as a list of arrays)."""
    run = Run(str(model_dir))
    model, _ = run.load_model()
    return run.checkpoints()[-1], model.get_weights()


def events(run_dir):
    """[(event, step)] of metrics.jsonl, in order."""
    return [(r["event"], r["step"]) for r in Run(str(run_dir)).read_metrics()]


def tensorboard_steps(run_dir, tag="loss", folder="train"):
    """The steps of the `tag` scalars in logs/`folder`, in the order written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # as TensorBoard reads a directory: events a restarted run writes again replace those
    # the killed one wrote past its restored step (purge_orphaned_data)
    accumulator = EventAccumulator(str(run_dir / LOG_DIR / folder))
    accumulator.Reload()
    return [event.step for event in accumulator.Tensors(tag)]


def checkpoint_values(path, *keys):
    """The values of the checkpoint variables whose names contain each key, in order."""
    reader = tf.train.load_checkpoint(path)
    names = [n for n, _ in tf.train.list_variables(path)]
    return [float(reader.get_tensor(next(n for n in names if key in n))) for key in keys]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(model_dir, data_dir, *args, timeout=420):
    """Two local workers of one MultiWorkerMirroredStrategy job; their stdout."""
    workers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    procs = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(
            subprocess.Popen(
                train_cmd(model_dir, data_dir, "--strategy", "multi_worker", *args),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=dict(os.environ, TF_CONFIG=json.dumps(config)),
                cwd=ROOT,
            )
        )
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError("a worker hung (blocked in a collective?)") from None
        assert proc.returncode == 0, err[-3000:]
        outputs.append(out)
    return outputs


def assert_same_variables(first, second, tolerance=0.0):
    """Every saved weight (some stored under the optimizer's references) and slot is equal
    (to `tolerance`, relative to the largest value of the variable)."""
    a, b = tf.train.load_checkpoint(first), tf.train.load_checkpoint(second)
    names = [n for n, _ in tf.train.list_variables(first) if n.startswith(("model/", "optimizer/"))]
    assert len(names) > 100
    for name in names:
        x, y = a.get_tensor(name), b.get_tensor(name)
        scale = max(float(np.max(np.abs(x))), 1e-6) if np.size(x) else 1.0
        assert float(np.max(np.abs(x - y), initial=0.0)) <= tolerance * scale, name


def write_mini_multi30k(directory, multi30k_dir, train=400, val=100):
    """A Multi30k folder (train, val and test_2016_flickr .gz files) holding the first `train`
    training and `val` validation pairs (test: the first 20), for `--data-dir`: the corpus
    reader, SentencePiece and every validation stay those of Multi30k, at a fraction of the cost."""
    os.makedirs(directory, exist_ok=True)
    for split, count in (("train", train), ("val", val), ("test_2016_flickr", 20)):
        for lang in ("en", "de"):
            with gzip.open(os.path.join(multi30k_dir, f"{split}.{lang}.gz"), "rt") as handle:
                lines = [line for _, line in zip(range(count), handle)]
            with gzip.open(os.path.join(directory, f"{split}.{lang}.gz"), "wt") as handle:
                handle.writelines(lines)
    return str(directory)
