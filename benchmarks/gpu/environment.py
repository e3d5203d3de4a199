"""The environment block of bench_gpu.py's JSON: what a figure was measured on.

Read in a child process (TensorFlow is imported there, not in the parent): the Python,
TensorFlow and Keras versions, the CUDA and cuDNN versions the TensorFlow wheel was built with
(`tf.sysconfig.get_build_info`), the GPUs TensorFlow sees with their name and compute
capability (`tf.config.experimental.get_device_details`), the NCCL wheel's version and the
NVIDIA driver's (`nvidia-smi`). Each is None where it does not exist (on a CPU machine: the
GPUs empty, NCCL and the driver None).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess


def nccl_version() -> str | None:
    """The NCCL wheel's version (the `gpu` extra installs it), or None."""
    for wheel in ("nvidia-nccl-cu12", "nvidia-nccl-cu13"):
        try:
            return f"{importlib.metadata.version(wheel)} ({wheel})"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def driver_version() -> str | None:
    """The NVIDIA driver's version from `nvidia-smi`, or None (no driver, or no nvidia-smi)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else the platform's word for it)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as lines:
            for line in lines:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    """The block itself (imports TensorFlow: call it in a child process)."""
    import keras
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    gpus = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        capability = details.get("compute_capability")
        gpus.append(
            {
                "name": gpu.name,
                "device_name": details.get("device_name"),
                "compute_capability": ".".join(map(str, capability)) if capability else None,
            }
        )
    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "cuda_build": build.get("cuda_version"),
        "cudnn_build": build.get("cudnn_version"),
        "cuda_compute_capabilities": list(build.get("cuda_compute_capabilities", ())) or None,
        "gpus": gpus,
        "nccl": nccl_version(),
        "nvidia_driver": driver_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }
