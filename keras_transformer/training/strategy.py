"""Distribution strategy factory and the Keras dtype policy."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil

import keras
import tensorflow as tf

from keras_transformer.errors import KerasTransformerError
from keras_transformer.settings.args import PRECISIONS, STRATEGIES, TrainArgs

logger = logging.getLogger(__name__)

# What a GPU machine installs: TensorFlow with its CUDA and cuDNN wheels (setup.py's extra).
GPU_INSTALL = 'pip install "keras-transformer-nmt[gpu]"'
NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"


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


def configure_devices(
    *, cpu_devices: int | None = None, memory_growth: bool = False, deterministic: bool = False
) -> None:
    """--cpu-devices (`split_cpu`), --gpu-memory-growth and --deterministic; before
    TensorFlow initializes its devices.

    `deterministic`: every op picks a deterministic kernel (or raises when it has none),
    and float32 matmuls and convolutions stop using TensorFloat-32 (on by default on
    Ampere and later GPUs: 10-bit mantissas inside float32 ops).
    """
    if cpu_devices is not None:
        split_cpu(cpu_devices)
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


def make_strategy(name: str, model_dir: str | None = None) -> tf.distribute.Strategy:
    """default | one_device | mirrored (all GPUs, else all logical CPUs) | multi_worker | tpu.

    multi_worker: every task checks at start that it has the chief's devices and sees the
    chief's `model_dir` (the run directory)."""
    if name not in STRATEGIES:
        raise StrategyError(f"unknown --strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    check_strategy(name)
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "multi_worker":  # before anything that starts the runtime (collectives)
        tf_config()
        job_task(os.environ["TF_CONFIG"])
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=communication_options()
        )
        from keras_transformer.training.startup import check_same_layout

        check_same_layout(strategy, model_dir=model_dir)  # before the first collective
        return strategy
    gpus = tf.config.list_logical_devices("GPU")
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        if not gpus:
            logger.warning(
                "--strategy mirrored: no GPU visible, training on %d CPU device%s",
                len(devices), "" if len(devices) == 1 else "s",
            )  # fmt: skip
        return tf.distribute.MirroredStrategy(devices=devices)
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    except (ValueError, RuntimeError, tf.errors.OpError) as err:
        raise StrategyError(f"--strategy tpu: no TPU found ({err})") from None
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def check_strategy(name: str) -> None:
    """--strategy against the job, before anything is built: a TF_CONFIG cluster of several
    tasks needs `multi_worker` (under any other strategy every task trains alone, each
    writing the same --model-dir)."""
    if name == "multi_worker" or not os.environ.get("TF_CONFIG"):
        return
    try:
        cluster = json.loads(os.environ["TF_CONFIG"]).get("cluster") or {}
        tasks = len(cluster.get("chief") or []) + len(cluster.get("worker") or [])
    except (json.JSONDecodeError, AttributeError, TypeError):
        return  # not a cluster this strategy would use
    if tasks > 1:
        raise StrategyError(
            f"--strategy {name}: TF_CONFIG names a job of {tasks} tasks; give --strategy "
            "multi_worker (or unset TF_CONFIG to train on this machine alone)"
        )


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


def job_task(tf_config: str) -> dict:
    """This task's place in a multi-worker job, from TF_CONFIG (StrategyError when it cannot
    be): {"type", "index", "chief" (TensorFlow's own rule: the task of type "chief", else
    worker 0), "tasks" (every task of the job)}. Kubeflow's TFJob writes it for every pod."""
    from tensorflow.python.distribute import multi_worker_util

    try:
        config = json.loads(tf_config)
    except json.JSONDecodeError as err:
        raise StrategyError(f"TF_CONFIG is not valid JSON: {err}") from None
    cluster, task = config.get("cluster"), config.get("task") or {}
    kind, index = task.get("type"), task.get("index", 0)
    if not isinstance(cluster, dict) or kind not in cluster or not 0 <= index < len(cluster[kind]):
        raise StrategyError(
            f"TF_CONFIG: task {kind!r} {index!r} is not in its cluster {sorted(cluster or {})}"
        )
    spec = tf.train.ClusterSpec(cluster)
    return {
        "type": kind,
        "index": index,
        "chief": multi_worker_util.is_chief(spec, kind, index),
        "tasks": sum(len(addresses) for addresses in cluster.values()),
    }


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """TensorFlow's own answer (`strategy.extended.should_checkpoint`): True on one machine;
    in a multi-worker job, the task of type "chief" when TF_CONFIG has one (Kubeflow's TFJob,
    Vertex AI), else worker 0 (tensorflow/python/distribute/multi_worker_util.is_chief)."""
    return bool(strategy.extended.should_checkpoint)


def set_up_devices(args: TrainArgs) -> None:
    """kt-train's --cpu-devices, --gpu-memory-growth and --deterministic (`configure_devices`),
    first thing in `place` and in a dry run: before anything starts TensorFlow's runtime."""
    configure_devices(
        cpu_devices=args.cpu_devices or 1,
        memory_growth=args.gpu_memory_growth,
        deterministic=args.deterministic,
    )


def place(args: TrainArgs) -> tuple[tf.distribute.Strategy, int | None]:
    """Where a training job runs, in one call (`job.Job.start`): the devices set up first
    (`set_up_devices`), the strategy (`make_strategy`, its `device_report` logged), this
    task's worker index (None for the chief: `is_chief`)."""
    set_up_devices(args)
    strategy = make_strategy(args.strategy, args.model_dir)
    logger.info("%s", device_report(strategy))
    return strategy, None if is_chief(strategy) else strategy.cluster_resolver.task_id


def use_precision(name: str | None, cpu_devices: int | None = None) -> None:
    """`check_devices` for the precision `name`, then `set_precision` (None: only checked)."""
    check_devices(name, cpu_devices)
    if name is not None:
        set_precision(name)


def set_precision(name: str) -> None:
    """Variables stay float32; compute in float16 or bfloat16 for the mixed policies."""
    if name not in PRECISIONS:
        raise StrategyError(f"unknown --precision {name!r}; choose from {', '.join(PRECISIONS)}")
    keras.config.set_dtype_policy(name)


def nvidia_driver_present(version_file: str = NVIDIA_DRIVER_FILE, which=shutil.which) -> bool:
    """An NVIDIA driver on this machine: its /proc file, or `nvidia-smi` on PATH."""
    return os.path.exists(version_file) or which("nvidia-smi") is not None


def cpu_requested(cpu_devices: int | None) -> bool:
    """CPU devices asked for explicitly: --cpu-devices given (any N, as the tests do), or
    the GPUs hidden on purpose (CUDA_VISIBLE_DEVICES empty or -1)."""
    return cpu_devices is not None or os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1")


def check_devices(precision: str | None, cpu_devices: int | None = None, driver=None) -> None:
    """Stop (StrategyError, one line) where a run would silently train on the CPU: an
    NVIDIA driver that TensorFlow cannot use (its CUDA libraries missing), or
    --precision mixed_float16 without a GPU (float16 only slows a CPU; bfloat16 stays
    allowed: AMX CPUs run it). CPU devices asked for explicitly (`cpu_requested`) pass.
    `driver` (injectable): whether the machine has an NVIDIA driver."""
    if tf.config.list_physical_devices("GPU") or cpu_requested(cpu_devices):
        return
    if (driver or nvidia_driver_present)():
        raise StrategyError(
            "this machine has an NVIDIA driver but TensorFlow sees no GPU (its CUDA/cuDNN "
            f"libraries are missing): {GPU_INSTALL}, or give --cpu-devices 1 to train on the CPU"
        )
    if precision == "mixed_float16":
        raise StrategyError(
            "--precision mixed_float16 needs a GPU and TensorFlow sees none (float16 only slows "
            "a CPU): use --precision mixed_bfloat16 or float32, or give --cpu-devices N"
        )


def _cross_device_ops(strategy: tf.distribute.Strategy) -> str:
    """How the replicas' gradients are summed (the strategy's private fields: TensorFlow has
    no public accessor)."""
    if strategy.num_replicas_in_sync == 1 and not isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy
    ):
        return "none (one replica)"
    options = getattr(strategy.extended, "_communication_options", None)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and options is not None:
        return f"collective ops, {options.implementation.name}"
    ops = getattr(strategy.extended, "_cross_device_ops", None)
    return type(ops).__name__ if ops is not None else "TensorFlow's choice"


def _nccl_version() -> str:
    for wheel in ("nvidia-nccl-cu12", "nvidia-nccl-cu13"):
        try:
            return f"{importlib.metadata.version(wheel)} ({wheel})"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed (the gpu extra brings it)"


def device_report(strategy: tf.distribute.Strategy) -> str:
    """The log block of kt-train's start: devices, cross-device ops, NCCL and the TensorFlow,
    CUDA and cuDNN versions (`tf.sysconfig.get_build_info`: what the wheel was built with)."""
    build = tf.sysconfig.get_build_info()
    replicas = strategy.num_replicas_in_sync
    try:
        devices = list(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy: TensorFlow's placement, first GPU else CPU
        devices = [d.name for d in tf.config.list_logical_devices("GPU")[:1]] or ["/cpu:0"]
    lines = ["devices:", f"  replicas      {replicas} ({', '.join(devices)})"]
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        capability = ".".join(map(str, details.get("compute_capability", ()))) or "?"
        lines.append(f"  {gpu.name:13} {details.get('device_name', '?')}, compute {capability}")
    lines += [
        f"  cross-device  {_cross_device_ops(strategy)}",
        f"  NCCL          {_nccl_version()}",
        f"  TensorFlow    {tf.__version__}, built with CUDA {build.get('cuda_version', '-')}, "
        f"cuDNN {build.get('cudnn_version', '-')} for "
        f"{', '.join(build.get('cuda_compute_capabilities', ())) or '-'}",
    ]
    return "\n".join(lines)
