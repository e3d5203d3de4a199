"""The micro-batch memory model: how many padded tokens one replica's training step may hold.

`--accum-steps` (automatic) splits the recipe's update into the fewest micro-batches whose
training step keeps at most `--micro-batch-memory` GiB per replica (`training.recipe`).
"""

from __future__ import annotations

import math

from keras_transformer.config import PRESETS

# The automatic micro-batch bound: the GiB one replica's training step on one micro-batch may
# keep (a quarter of a 16 GB GPU such as the paper's P100s, whose 8 shared its 25000-token
# update; the rest is left to the weights, Adam's moments, the summed gradients and TF).
MICRO_BATCH_MEMORY_GIB = 4.0


def micro_batch_memory_gib() -> float:
    """The automatic --micro-batch-memory: the GiB per replica a micro-batch's step may keep."""
    return MICRO_BATCH_MEMORY_GIB


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


def tokens_that_fit(memory_gib: float, preset: str, vocab_size: int, max_length: int) -> int:
    """Padded tokens per micro-batch and replica within `memory_gib` (at least 1)."""
    floats = step_floats_per_token(preset, vocab_size, max_length)
    return max(1, int(memory_gib * 2**30 // (4 * floats)))


__all__ = [
    "MICRO_BATCH_MEMORY_GIB",
    "fewest_micro_batches",
    "micro_batch_memory_gib",
    "step_floats_per_token",
    "tokens_that_fit",
]
