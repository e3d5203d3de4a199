"""The shapes `kt-export --xla`'s search compiles for (xla_search.py) and their warmup.

XLA compiles one program per (P, C, K, source width, prefix width) met: P sentences and C
cache steps, both powers of two; `Translator` pads sources to a power of two too. So the
shapes are few, `warmup_shapes` lists those a server meets, and `compile_shapes` compiles
them (the export's `xla_warmup` signature, called by its warmup requests).
"""

from __future__ import annotations

import tensorflow as tf

INITIAL_CAPACITY = 16  # the first segments' cache, in steps; doubled when full
MIN_SOURCE_WIDTH = 16  # `Translator` pads sources to a power of two, at least this


def next_power_of_two(n):
    """The smallest power of two >= n (n >= 1, int32 tensor or int)."""
    v = tf.convert_to_tensor(n, tf.int32) - 1
    for shift in (1, 2, 4, 8, 16):
        v = tf.bitwise.bitwise_or(v, tf.bitwise.right_shift(v, shift))
    return v + 1


def warmup_shapes(
    *, max_batch: int, source_widths, max_extra_length: int, beam_sizes,
    max_output_length: int | None = None, initial_capacity: int = INITIAL_CAPACITY,
):  # fmt: skip
    """The shapes a search compiles for, as rows [P, C, S, K, W] (batch, cache capacity,
    source width, beam size, prefix width): requests of at most `max_batch` sentences,
    sources padded to one of `source_widths`, outputs up to the source + `max_extra_length`
    (at most `max_output_length`), beam sizes `beam_sizes`, no prefix (W = 1)."""
    shapes = []
    for width in source_widths:
        longest = width + max_extra_length
        if max_output_length is not None:
            longest = min(longest, max_output_length)
        # steps 0 ... longest - 1 need a capacity >= longest
        capacities = [initial_capacity]
        while capacities[-1] < longest:
            capacities.append(2 * capacities[-1])
        batch = 1
        while batch < 2 * max_batch:
            for capacity in capacities:
                for beam in beam_sizes:
                    shapes.append([batch, capacity, width, beam, 1])
            if batch >= max_batch:
                break
            batch *= 2
    return shapes


def source_widths(max_input_length: int) -> list[int]:
    """The widths `Translator` pads sources to: powers of two from MIN_SOURCE_WIDTH, at most
    `max_input_length` (itself the last)."""
    widths, width = [], MIN_SOURCE_WIDTH
    while width < max_input_length:
        widths.append(width)
        width *= 2
    return [*widths, max_input_length]


def compile_shapes(segmented, model, shapes):
    """Compile `segmented`'s search (an `xla_search.SegmentedSearch` over `model`'s steps)
    for every row [P, C, S, K, W] of `shapes` (N, 5) without decoding anything: `shapes`,
    once every one is compiled."""
    d_model = model.config.d_model

    def body(i):
        batch, capacity, width, beam, prefix_width = tf.unstack(shapes[i])
        source = tf.zeros([batch, width], tf.int32)
        memory = tf.zeros([batch, width, d_model], model.compute_dtype)
        cache = model.init_cache(memory, source, fixed_capacity=True)
        done = segmented.compile_shape(cache, batch, beam, capacity, prefix_width)
        with tf.control_dependencies(tf.nest.flatten(done)):
            return i + 1

    (count,) = tf.while_loop(lambda i: i < tf.shape(shapes)[0], body, (tf.constant(0),))
    with tf.control_dependencies([count]):
        return tf.identity(shapes)
