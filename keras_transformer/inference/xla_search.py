"""Beam search with its steps compiled by XLA, in segments: the search of `kt-export --xla`.

The search of search.py, step for step (the same candidates, pools and stopping bound, the
functions of beam.py and candidates.py), run differently. search.py's loop drops a sentence
as soon as it settles, so its batch changes size at every step; XLA compiles a loop for fixed
shapes only. Here the steps run in segments:

  - a segment is a `tf.while_loop` compiled by XLA (`jit_compile`) over a fixed batch of P
    sentences (P a power of two) and a self-attention cache with room for C steps (C a
    power of two, from INITIAL_CAPACITY); a sentence that settles stays in the batch, its
    result frozen, and the segment exits once at most P / 2 sentences are live (they fit
    the next smaller P), or its cache is full, or at the longest maximum length;
  - between segments, in the ordinary graph: the settled sentences are written out, the live
    ones gathered (compaction) and padded to the next power of two P (padding rows settled
    from the start), and a full cache doubles (C -> 2C).
So the steps run few rows where search.py's would, and the host sees the batch size (the
`Where` of the compaction) once per segment instead of at every step: on a GPU, the
compaction's device-to-host copies happen per segment, not per step (the compiled loop still
reads its own predicate at every step; `benchmarks/loop_ops.py` counts both).

The outputs are those of `search.beam_search`: a sentence's result depends only on its own
rows, whichever batch and cache capacity it runs in; the positions a fixed-capacity cache
has not written yet are masked (exactly zero attention weight). Floating-point sums may be
ordered differently by XLA, so scores agree to rounding, and a near-tie between two
candidates could in principle rank the other way (tested on random models;
`benchmarks/bench_real.py --xla --baseline .` counts the changed outputs on real sentences).

Compiled shapes: one XLA compilation per (P, C, K, source width, prefix width) met
(xla_shapes.py lists them for the export's warmup).

The step function's cache must be a dict; `grow_cache(cache, capacity)` makes room for
`capacity` steps (`Transformer.grow_cache`; None: the cache does not depend on the capacity).
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.config import ALPHA, BEAM_SIZE
from keras_transformer.inference import batch_rows as br
from keras_transformer.inference import beam
from keras_transformer.inference.xla_segment import Segment

# the compiled shapes, kept importable from here
from keras_transformer.inference.xla_shapes import (  # noqa: F401
    INITIAL_CAPACITY,
    MIN_SOURCE_WIDTH,
    next_power_of_two,
    source_widths,
    warmup_shapes,
)

__all__ = [
    "INITIAL_CAPACITY",
    "SegmentedSearch",
    "next_power_of_two",
    "source_widths",
    "warmup_shapes",
]


class SegmentedSearch:
    """Beam search over `step_fn` in XLA-compiled segments (see the module docstring).

    Args:
        step_fn: (ids_t (N,) int32, step scalar int32, cache) -> (logits (N, V), cache), as
            for `search.beam_search`.
        eos_id: end-of-sequence id.
        grow_cache: (cache, capacity) -> the cache with room for `capacity` steps; None if
            the step function's cache has no capacity.
        min_length: shortest output, eos included (as `search.beam_search`); None: none.
        stop_early: as `search.beam_search` (False: the exhaustive reference).
        jit_compile: False runs the segments in the ordinary graph (same results; tests).
        initial_capacity: C of the first segment.
    """

    def __init__(
        self,
        step_fn,
        eos_id: int,
        *,
        grow_cache=None,
        min_length=None,
        stop_early: bool = True,
        jit_compile: bool = True,
        initial_capacity: int = INITIAL_CAPACITY,
    ):
        self.step_fn = step_fn
        self.eos_id = eos_id
        self.grow_cache = grow_cache
        self.min_length = min_length
        self.stop_early = stop_early
        self.initial_capacity = initial_capacity
        self.jit_compile = jit_compile
        self._segment = Segment(
            step_fn, eos_id, min_length=min_length, stop_early=stop_early,
            jit_compile=jit_compile,
        )  # fmt: skip

    def segment(self, *args):
        """One compiled segment (`xla_segment.Segment`): (step, length, per, hypotheses,
        done, special, rest) -> (step, hypotheses, done, "sentence", rest, per)."""
        return self._segment(*args)

    def compile_shape(self, cache, batch, beam_size, capacity, prefix_width):
        """Run the compiled segment for no step on `batch` sentences with `beam_size` beams,
        room for `capacity` steps and prefixes `prefix_width` wide: XLA compiles that shape
        (the same compilation as in a search, e.g. for a server's warmup).

        Args:
            cache: the step function's initial cache for `batch` sentences (a source of
                the width to compile for); the sizes are int32 scalars.

        Returns:
            the segment's outputs (to depend on).
        """
        per = self._options(
            tf.zeros([batch], tf.int32), tf.zeros([batch], tf.int32), beam_size, 0.0,
            tf.fill([batch, prefix_width - 1], -1), None, beam.STOP_EXACT,
            beam.FINISH_TENSOR2TENSOR,  # a value per sentence: the same compilation either way
        )  # fmt: skip
        del per["index"]
        special, sentence, rest = self._tiled(cache, beam_size, capacity)
        step = tf.constant(0)
        return self.segment(
            step,
            step,  # length 0: no step runs
            per,
            beam.start(tf.zeros([batch], tf.int32), beam_size, capacity),
            tf.ones([batch], tf.bool),
            self._special(special, sentence),
            rest,
        )

    # -- the search ------------------------------------------------------------------------

    def beam_search(
        self,
        initial_ids,
        initial_cache,
        max_lengths,
        *,
        beam_size=BEAM_SIZE,
        alpha=ALPHA,
        prefix=None,
        num_best=None,
        stop_rule=beam.STOP_EXACT,
        finish_rule=beam.FINISH_TENSOR2TENSOR,
    ):
        """`search.beam_search`'s arguments and results (eos_id, min_length, stop_early given
        to the constructor); `initial_cache` a dict, of any capacity if `grow_cache` is set."""
        if isinstance(beam_size, int) and beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        initial_ids = tf.convert_to_tensor(initial_ids, tf.int32)
        per = self._options(
            initial_ids, max_lengths, beam_size, alpha, prefix, num_best, stop_rule, finish_rule
        )
        k = tf.maximum(tf.reduce_max(tf.convert_to_tensor(beam_size, tf.int32)), 1)
        length = tf.maximum(tf.reduce_max(per["max_length"]), 1)
        special, sentence, rest = self._tiled(initial_cache, k, self.initial_capacity)
        hypotheses = beam.start(initial_ids, k, self.initial_capacity)
        out = [tf.zeros([tf.shape(initial_ids)[0], k, length + 1], tf.int32), hypotheses[3]]
        index = per.pop("index")

        def cond(step, out, index, *_):
            return tf.logical_and(step < length, tf.size(index) > 0)

        def body(step, out, index, *state):
            return self._segment_and_compact(step, length, k, special, out, index, *state)

        state = (per, hypotheses, sentence, rest)
        invariants = (tf.TensorShape([]), br.nest_shapes(out), tf.TensorShape([None]))
        invariants += tuple(br.free_batch(state))
        result = tf.while_loop(
            cond, body, (tf.constant(0), out, index, *state), shape_invariants=invariants
        )
        out, index, hypotheses = result[1], result[2], result[4]
        # every sentence settles by its maximum length; this only guards the last step
        finished = [_columns(hypotheses[2], length + 1), hypotheses[3]]
        out = br.settle(out, index, tf.ones_like(index, tf.bool), finished)
        return out[0][:, :, 1:], out[1]

    def _segment_and_compact(
        self, step, length, k, special, out, index, per, hypotheses, sentence, rest
    ):
        """One segment over the live sentences (`index`), padded to a power of two P, its
        settled sentences written to `out`: (step, out, and the state of those that stay)."""
        live = tf.size(index)
        padded = next_power_of_two(live)
        # a full cache doubles
        capacity = tf.shape(hypotheses[0])[2] - 1
        capacity = tf.where(step >= capacity, 2 * capacity, capacity)
        hypotheses, sentence, rest = self._with_capacity(
            hypotheses, sentence, rest, special, capacity
        )
        # padded to P sentences, the padding settled from the start
        pad = tf.minimum(tf.range(padded), live - 1)
        per, hypotheses, sentence, rest = _take(pad, k, per, hypotheses, sentence, rest)
        step, hypotheses, done, sentence, rest, per = self.segment(
            step, length, per, hypotheses, tf.range(padded) >= live,
            self._special(special, sentence), rest,
        )  # fmt: skip
        done = done[:live]
        finished = [_columns(hypotheses[2][:live], length + 1), hypotheses[3][:live]]
        out = br.settle(out, index, done, finished)
        stay = br.rows(tf.logical_not(done))
        return (step, out, tf.gather(index, stay), *_take(stay, k, per, hypotheses, sentence, rest))

    @staticmethod
    def _options(
        initial_ids, max_lengths, beam_size, alpha, prefix, num_best, stop_rule, finish_rule
    ):
        """`beam.sentence_options` for the segments (no sampling; the prefixes padded with
        -1 to a power of two: more -1 columns change nothing, as the column read once every
        prefix is done is -1 either way, and the compiled shapes stay few)."""
        per = beam.sentence_options(
            initial_ids, max_lengths, beam_size, alpha, prefix, None, num_best, stop_rule,
            finish_rule,
        )  # fmt: skip
        del per["sampling"]
        width = tf.shape(per["prefix"])[1]
        per["prefix"] = tf.pad(
            per["prefix"], [[0, 0], [0, next_power_of_two(width) - width]], constant_values=-1
        )
        return per

    def _tiled(self, cache, k, capacity):
        """The initial cache as a segment takes it: (its special entries, "sentence", the
        rest tiled to K rows a sentence), with room for `capacity` steps."""
        special = {key: cache[key] for key in br.SPECIAL if key in cache}
        _, _, rest = br.split(cache)
        rest = tf.nest.map_structure(lambda t: tf.repeat(t, k, axis=0), rest)
        sentence, _, rest = br.split(self._grow({**rest, **special}, capacity))
        return special, sentence, rest

    def _grow(self, cache, capacity):
        return cache if self.grow_cache is None else self.grow_cache(cache, capacity)

    @staticmethod
    def _special(special, sentence):
        """The cache's special entries for a segment: "sentence" (P rows), "constant"."""
        out = {}
        if "sentence" in special:
            out["sentence"] = sentence
        if "constant" in special:
            out["constant"] = special["constant"]
        return out

    def _with_capacity(self, hypotheses, sentence, rest, special, capacity):
        """Hypotheses (b, K, capacity + 1) and the cache with room for `capacity` steps."""
        hypotheses = (
            _columns(hypotheses[0], capacity + 1),
            hypotheses[1],
            _columns(hypotheses[2], capacity + 1),
            hypotheses[3],
        )
        if self.grow_cache is None:
            return hypotheses, sentence, rest
        cache = self._grow({**rest, **self._special(special, sentence)}, capacity)
        sentence, _, rest = br.split(cache)
        return hypotheses, sentence, rest


def _take(rows, k, per, hypotheses, sentence, rest):
    """The state of the sentences `rows` (b,): their options, hypotheses and "sentence"
    rows, and their K rows each of the rest of the cache."""
    gather = lambda t: tf.gather(t, rows)  # noqa: E731
    beam_rows = tf.reshape(rows[:, tf.newaxis] * k + tf.range(k), [-1])
    return (
        tf.nest.map_structure(gather, per),
        tuple(map(gather, hypotheses)),
        tf.nest.map_structure(gather, sentence),
        tf.nest.map_structure(lambda t: tf.gather(t, beam_rows), rest),
    )


def _columns(sequences, width):
    """(b, K, W) int32 sequences cut or padded (with 0) to `width` columns."""
    sequences = sequences[:, :, :width]
    return tf.pad(sequences, [[0, 0], [0, 0], [0, width - tf.shape(sequences)[2]]])
