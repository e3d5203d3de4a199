"""Distribution strategy factory and the Keras dtype policy."""

from __future__ import annotations

import json
import os

import keras
import tensorflow as tf

from keras_transformer.errors import KerasTransformerError
from keras_transformer.training.args import PRECISIONS, STRATEGIES


class StrategyError(KerasTransformerError, ValueError):
    """A bad --strategy / --precision / --cpu-devices setting."""


def split_cpu(num_devices: int) -> None:
    """Expose the CPU as `num_devices` logical devices (multi-device code paths without GPUs).

    Must run before TensorFlow initializes its devices, i.e. first thing in the process.
    """
    if num_devices < 1:
        raise StrategyError(f"--cpu-devices must be >= 1, got {num_devices}")
    if num_devices == 1:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)]
        )
    except RuntimeError as err:
        raise StrategyError(f"--cpu-devices must be set before TensorFlow starts: {err}") from None


def make_strategy(name: str) -> tf.distribute.Strategy:
    """default | one_device | mirrored (all GPUs, else all logical CPUs) | multi_worker | tpu."""
    if name not in STRATEGIES:
        raise StrategyError(f"unknown --strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "multi_worker":  # before anything that starts the runtime (collectives)
        if "TF_CONFIG" not in os.environ:
            raise StrategyError("--strategy multi_worker needs the TF_CONFIG environment variable")
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as err:
            raise StrategyError(f"TF_CONFIG is not valid JSON: {err}") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        return tf.distribute.MirroredStrategy(devices=devices)
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True unless this is a non-chief worker of a multi-worker job."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0
    )


def set_precision(name: str) -> None:
    """Variables stay float32; compute in float16 or bfloat16 for the mixed policies."""
    if name not in PRECISIONS:
        raise StrategyError(f"unknown --precision {name!r}; choose from {', '.join(PRECISIONS)}")
    keras.config.set_dtype_policy(name)
