"""The micro-batch memory model: how many padded tokens one replica's training step may hold.

`--accum-steps` (automatic) splits the recipe's update into the fewest micro-batches whose
training step keeps at most `--micro-batch-memory` GiB per replica (`settings.recipe`).
"""

from __future__ import annotations

import logging
import math

from keras_transformer.config import PRESETS

logger = logging.getLogger(__name__)

# The automatic micro-batch bound without a GPU to measure: the GiB one replica's training
# step on one micro-batch may keep (a quarter of a 16 GB GPU such as the paper's P100s, whose
# 8 shared its 25000-token update; the rest is left to the weights, Adam's moments, the
# summed gradients and TF).
MICRO_BATCH_MEMORY_GIB = 4.0
# With a GPU: the same quarter of the memory TensorFlow may allocate on it.
DEVICE_MEMORY_SHARE = 0.25


def device_memory_gib(gpus=None, total_mib=None) -> float | None:
    """GiB of the smallest local GPU, or None without a GPU or when it cannot be read.

    Read through public interfaces only: a GPU split or capped by the user
    (`tf.config.set_logical_device_configuration(gpu, [...(memory_limit=MiB)])`) counts its
    limit, read back with `tf.config.get_logical_device_configuration`; otherwise the card's
    memory as the driver reports it (`total_mib(index)`, default `nvidia-smi
    --query-gpu=memory.total`). TensorFlow's public device queries give no total
    (`tf.config.experimental.get_memory_info` returns only the current and peak use,
    `get_device_details` the name and compute capability). `gpus` and `total_mib` are
    injectable (tests); call after the strategy is made."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU") if gpus is None else gpus
    if not gpus:
        return None
    total_mib = total_mib or _driver_total_mib
    sizes = []
    for index, gpu in enumerate(gpus):
        try:
            logical = tf.config.get_logical_device_configuration(gpu) or []
        except (ValueError, RuntimeError):
            logical = []
        limits = [c.memory_limit for c in logical if c.memory_limit]
        size = min(limits) if limits else total_mib(index)
        if size:
            sizes.append(size)
    return round(min(sizes) / 1024, 2) if sizes else None


def _driver_total_mib(index: int) -> float | None:
    """MiB of GPU `index` as the NVIDIA driver reports it (None when nvidia-smi is absent)."""
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
             f"--id={index}"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return float(out.stdout.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def micro_batch_memory_gib(device_gib: float | None = None) -> float:
    """The automatic --micro-batch-memory: the GiB per replica a micro-batch's step may keep,
    a quarter of the GPU's memory (`device_memory_gib`, read when not given), or
    `MICRO_BATCH_MEMORY_GIB` without a GPU (CPU training: host memory is not the limit).
    Logs the bound and where it came from."""
    device_gib = device_memory_gib() if device_gib is None else device_gib
    if not device_gib:
        logger.info(
            "micro-batch memory bound: %g GiB per replica (no GPU memory to read)",
            MICRO_BATCH_MEMORY_GIB,
        )
        return MICRO_BATCH_MEMORY_GIB
    bound = round(DEVICE_MEMORY_SHARE * device_gib, 2)
    logger.info(
        "micro-batch memory bound: %g GiB per replica (%g of the smallest GPU's %g GiB)",
        bound, DEVICE_MEMORY_SHARE, device_gib,
    )  # fmt: skip
    return bound


def step_floats_per_token(
    preset: str, vocab_size: int, max_length: int, num_layers: int | None = None
) -> int:
    """Estimated float32 values that a training step keeps (for its backward pass) per padded
    token of a micro-batch, i.e. per source and target position: 4 vocabulary-sized rows
    (logits, smoothed targets, softmax, the logits' gradient) and, per layer, the encoder's
    and the decoder's activations: 32 d_model-sized rows, 6 d_ff-sized rows and 9
    heads x max_length attention rows (scores, softmax, dropout of the three attentions).
    `num_layers`: the preset's unless given (benchmarks/bench_gpu.py --num-layers).
    """
    p = PRESETS[preset]
    attention = p["num_heads"] * max_length
    per_layer = 32 * p["d_model"] + 6 * p["d_ff"] + 9 * attention
    return 4 * vocab_size + (num_layers or p["num_layers"]) * per_layer


def fewest_micro_batches(update_tokens: int, tokens_that_fit: int) -> int:
    """The fewest micro-batches that divide `update_tokens` exactly, each of at most
    `tokens_that_fit` tokens (or as close as an exact division allows)."""
    accum_steps = math.ceil(update_tokens / tokens_that_fit)
    while update_tokens % accum_steps:
        accum_steps += 1
    return accum_steps


def micro_batches(
    update_tokens: int, replicas: int, memory_gib: float, preset: str, vocab_size: int,
    max_length: int, precision="float32",
) -> int:  # fmt: skip
    """The fewest micro-batches that split an update of `update_tokens` (all `replicas`)
    exactly, each replica's share within `memory_gib` (`tokens_that_fit`)."""
    fits = tokens_that_fit(memory_gib, preset, vocab_size, max_length, precision)
    return fewest_micro_batches(update_tokens, fits * replicas)


def step_bytes_per_token(
    preset: str,
    vocab_size: int,
    max_length: int,
    precision: str = "float32",
    num_layers: int | None = None,
) -> int:
    """Bytes a training step keeps per padded token (`step_floats_per_token`) in the compute
    dtype: float32 4 bytes a value; the mixed policies keep the layers' activations in 16
    bits (2 bytes) and the loss's 4 vocabulary rows in float32 plus the 16-bit logits and
    their gradient (2 more rows of 2 bytes)."""
    floats = step_floats_per_token(preset, vocab_size, max_length, num_layers)
    if precision in (None, "float32"):
        return 4 * floats
    vocab_rows = 4 * vocab_size
    return 4 * vocab_rows + 2 * 2 * vocab_size + 2 * (floats - vocab_rows)


def tokens_that_fit(
    memory_gib: float,
    preset: str,
    vocab_size: int,
    max_length: int,
    precision="float32",
    num_layers: int | None = None,
) -> int:
    """Padded tokens per micro-batch and replica within `memory_gib` (at least 1)."""
    step_bytes = step_bytes_per_token(preset, vocab_size, max_length, precision, num_layers)
    return max(1, int(memory_gib * 2**30 // step_bytes))


__all__ = [
    "DEVICE_MEMORY_SHARE",
    "MICRO_BATCH_MEMORY_GIB",
    "device_memory_gib",
    "fewest_micro_batches",
    "micro_batch_memory_gib",
    "micro_batches",
    "step_bytes_per_token",
    "step_floats_per_token",
    "tokens_that_fit",
]
