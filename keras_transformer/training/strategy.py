"""Distribution strategy factory and the Keras dtype policy."""

from __future__ import annotations

import json
import os

import keras
import tensorflow as tf

from keras_transformer.errors import KerasTransformerError
from keras_transformer.settings.args import PRECISIONS, STRATEGIES


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


def configure_devices(*, memory_growth: bool = False, deterministic: bool = False) -> None:
    """--gpu-memory-growth and --deterministic; before TensorFlow initializes the GPUs.

    `deterministic`: every op picks a deterministic kernel (or raises when it has none),
    and float32 matmuls and convolutions stop using TensorFloat-32 (on by default on
    Ampere and later GPUs: 10-bit mantissas inside float32 ops).
    """
    if memory_growth:
        for gpu in tf.config.list_physical_devices("GPU"):
            try:
                tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError as err:
                raise StrategyError(
                    f"--gpu-memory-growth must be set before TensorFlow starts: {err}"
                ) from None
    if deterministic:
        tf.config.experimental.enable_op_determinism()
        tf.config.experimental.enable_tensor_float_32_execution(False)


def communication_options():
    """The collectives of a multi-worker job: NCCL when this worker has GPUs, RING (gRPC)
    otherwise (NCCL runs on GPUs only). No per-collective timeout: TensorFlow starts a
    sleeping thread per collective for the whole timeout (thousands of threads within
    minutes); `--collective-timeout` is a progress watchdog instead (`training.watchdog`)."""
    implementation = tf.distribute.experimental.CommunicationImplementation
    gpus = tf.config.list_physical_devices("GPU")
    return tf.distribute.experimental.CommunicationOptions(
        implementation=implementation.NCCL if gpus else implementation.RING
    )


def make_strategy(name: str) -> tf.distribute.Strategy:
    """default | one_device | mirrored (all GPUs, else all logical CPUs) | multi_worker | tpu."""
    if name not in STRATEGIES:
        raise StrategyError(f"unknown --strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "multi_worker":  # before anything that starts the runtime (collectives)
        tf_config()
        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=communication_options()
        )
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


def tf_config() -> dict:
    """$TF_CONFIG, checked: JSON with a "cluster" of at least one chief or worker."""
    if "TF_CONFIG" not in os.environ:
        raise StrategyError("--strategy multi_worker needs the TF_CONFIG environment variable")
    try:
        config = json.loads(os.environ["TF_CONFIG"])
    except json.JSONDecodeError as err:
        raise StrategyError(f"TF_CONFIG is not valid JSON: {err}") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not (cluster.get("chief") or cluster.get("worker")):
        raise StrategyError('TF_CONFIG has no "cluster" with a "chief" or "worker" task')
    return config


def chief_task() -> str:
    """The task TensorFlow makes the chief (it writes the run directory): "chief:0" when
    TF_CONFIG's cluster has a chief job (Kubeflow's TFJob, Vertex AI), else "worker:0"."""
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster") or {}
    except (json.JSONDecodeError, AttributeError):
        cluster = {}
    return "chief:0" if cluster.get("chief") else "worker:0"


def planned_replicas(name: str) -> int:
    """The replicas of `make_strategy(name)`'s strategy (`--dry-run`). For multi_worker,
    counted from TF_CONFIG (chief and workers, each with this machine's GPUs, or one CPU)
    without building the strategy: that would start its server and wait for the peers."""
    if name != "multi_worker":
        return make_strategy(name).num_replicas_in_sync
    cluster = tf_config()["cluster"]
    tasks = len(cluster.get("chief") or []) + len(cluster.get("worker") or [])
    return tasks * max(1, len(tf.config.list_logical_devices("GPU")))


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """TensorFlow's own answer (`strategy.extended.should_checkpoint`): True on one machine;
    in a multi-worker job, the task of type "chief" when TF_CONFIG has one (Kubeflow's TFJob,
    Vertex AI), else worker 0 (tensorflow/python/distribute/multi_worker_util.is_chief)."""
    return bool(strategy.extended.should_checkpoint)


def set_precision(name: str) -> None:
    """Variables stay float32; compute in float16 or bfloat16 for the mixed policies."""
    if name not in PRECISIONS:
        raise StrategyError(f"unknown --precision {name!r}; choose from {', '.join(PRECISIONS)}")
    keras.config.set_dtype_policy(name)
