"""The micro-batch memory model: how many padded tokens one replica's training step may hold.

`--accum-steps` (automatic) splits the recipe's update into the fewest micro-batches whose
training step keeps at most `--micro-batch-memory` GiB per replica (`settings.recipe`).
"""

from __future__ import annotations

import math

from keras_transformer.config import PRESETS

# The automatic micro-batch bound without a GPU to measure: the GiB one replica's training
# step on one micro-batch may keep (a quarter of a 16 GB GPU such as the paper's P100s, whose
# 8 shared its 25000-token update; the rest is left to the weights, Adam's moments, the
# summed gradients and TF).
MICRO_BATCH_MEMORY_GIB = 4.0
# With a GPU: the same quarter of the memory TensorFlow may allocate on it.
DEVICE_MEMORY_SHARE = 0.25


def device_memory_gib() -> float | None:
    """GiB that TensorFlow's allocator may use on the smallest local GPU (its
    `memory_limit`: the card's memory less what the driver and TF reserve), or None without
    a GPU or when it cannot be read. Call after the strategy is made (GPUs initialized)."""
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return None
    try:
        from tensorflow.python.client import device_lib

        limits = [d.memory_limit for d in device_lib.list_local_devices() if d.device_type == "GPU"]
    except Exception:  # noqa: BLE001 - an internal API: fall back to the default bound
        return None
    limits = [limit for limit in limits if limit > 0]
    return min(limits) / 2**30 if limits else None


def micro_batch_memory_gib(device_gib: float | None = None) -> float:
    """The automatic --micro-batch-memory: the GiB per replica a micro-batch's step may keep,
    a quarter of the GPU's memory (`device_memory_gib`, read when not given), or
    `MICRO_BATCH_MEMORY_GIB` without a GPU (CPU training: host memory is not the limit)."""
    device_gib = device_memory_gib() if device_gib is None else device_gib
    if not device_gib:
        return MICRO_BATCH_MEMORY_GIB
    return round(DEVICE_MEMORY_SHARE * device_gib, 2)


def step_floats_per_token(preset: str, vocab_size: int, max_length: int) -> int:
    """Estimated float32 values that a training step keeps (for its backward pass) per padded
    token of a micro-batch, i.e. per source and target position: 4 vocabulary-sized rows
    (logits, smoothed targets, softmax, the logits' gradient) and, per layer, the encoder's
    and the decoder's activations: 32 d_model-sized rows, 6 d_ff-sized rows and 9
    heads x max_length attention rows (scores, softmax, dropout of the three attentions).
    """
    p = PRESETS[preset]
    attention = p["num_heads"] * max_length
    per_layer = 32 * p["d_model"] + 6 * p["d_ff"] + 9 * attention
    return 4 * vocab_size + p["num_layers"] * per_layer


def fewest_micro_batches(update_tokens: int, tokens_that_fit: int) -> int:
    """The fewest micro-batches that divide `update_tokens` exactly, each of at most
    `tokens_that_fit` tokens (or as close as an exact division allows)."""
    accum_steps = math.ceil(update_tokens / tokens_that_fit)
    while update_tokens % accum_steps:
        accum_steps += 1
    return accum_steps


def step_bytes_per_token(
    preset: str, vocab_size: int, max_length: int, precision: str = "float32"
) -> int:
    """Bytes a training step keeps per padded token (`step_floats_per_token`) in the compute
    dtype: float32 4 bytes a value; the mixed policies keep the layers' activations in 16
    bits (2 bytes) and the loss's 4 vocabulary rows in float32 plus the 16-bit logits and
    their gradient (2 more rows of 2 bytes)."""
    floats = step_floats_per_token(preset, vocab_size, max_length)
    if precision in (None, "float32"):
        return 4 * floats
    vocab_rows = 4 * vocab_size
    return 4 * vocab_rows + 2 * 2 * vocab_size + 2 * (floats - vocab_rows)


def tokens_that_fit(
    memory_gib: float, preset: str, vocab_size: int, max_length: int, precision="float32"
) -> int:
    """Padded tokens per micro-batch and replica within `memory_gib` (at least 1)."""
    step_bytes = step_bytes_per_token(preset, vocab_size, max_length, precision)
    return max(1, int(memory_gib * 2**30 // step_bytes))


__all__ = [
    "DEVICE_MEMORY_SHARE",
    "MICRO_BATCH_MEMORY_GIB",
    "device_memory_gib",
    "fewest_micro_batches",
    "micro_batch_memory_gib",
    "step_bytes_per_token",
    "step_floats_per_token",
    "tokens_that_fit",
]
