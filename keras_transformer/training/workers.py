"""A multi-worker run's start: the non-chief workers wait for the chief's config.json, and
the chief stops when one of them gave up waiting (instead of blocking in its first
collective)."""

from __future__ import annotations

import json
import os
import time

import tensorflow as tf

from keras_transformer.files import write_atomic
from keras_transformer.run_dir import Run
from keras_transformer.settings.args import ConfigError

GAVE_UP = "worker_{}.gave_up"  # a non-chief worker that stopped waiting leaves this file


def check_workers(run_dir: Run) -> None:
    """The chief stops when a worker gave up waiting for it (and clears the note)."""
    notes = sorted(tf.io.gfile.glob(run_dir.path(GAVE_UP.format("*"))))
    if notes:
        for note in notes:
            tf.io.gfile.remove(note)
        raise ConfigError(
            f"{', '.join(os.path.basename(n).split('.')[0] for n in notes)} gave up waiting for "
            f"this chief (--worker-wait) and exited: start every worker again, with a larger "
            "--worker-wait if the chief's preparation takes longer"
        )


def wait_for(path: str, timeout: float, gave_up: str) -> None:
    """A non-chief worker waits for the chief to write the run's config.json; when it gives
    up it writes `gave_up` (read by the chief) and says so."""
    deadline = time.monotonic() + timeout
    while not tf.io.gfile.exists(path):  # the run directory may be gs://...
        if time.monotonic() > deadline:
            tf.io.gfile.makedirs(os.path.dirname(gave_up))
            write_atomic(gave_up, f"gave up after {timeout:.0f} s\n")
            raise ConfigError(
                f"waited {timeout:.0f} s (--worker-wait) for the chief to write {path}: start "
                f"the chief (TF_CONFIG task {chief_task()}) with the same --model-dir (a "
                "directory every worker can read), or raise --worker-wait"
            )
        time.sleep(1.0)


def chief_task() -> str:
    """The task TensorFlow makes the chief (it writes the run directory): "chief:0" when
    TF_CONFIG's cluster has a chief job (Kubeflow's TFJob, Vertex AI), else "worker:0"."""
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster") or {}
    except (json.JSONDecodeError, AttributeError):
        cluster = {}
    return "chief:0" if cluster.get("chief") else "worker:0"


__all__ = ["GAVE_UP", "check_workers", "chief_task", "wait_for"]
