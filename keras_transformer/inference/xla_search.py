"""Beam search with its steps compiled by XLA, in segments: the search of `kt-export --xla`.

The search of search.py, step for step (the same candidates, pools and stopping bound, the
functions of search.py and candidates.py), run differently. search.py's loop drops a sentence
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

Compiled shapes: one XLA compilation per (P, C, K, source width, prefix width) met, P and C
powers of two; `Translator` pads the source to a power of two too, so the number of shapes
is small and `warmup_shapes` lists them (the export's warmup requests compile them all before
a server takes traffic).

The step function's cache must be a dict; `grow_cache(cache, capacity)` makes room for
`capacity` steps (`Transformer.grow_cache`; None: the cache does not depend on the capacity).
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.config import ALPHA, BEAM_SIZE
from keras_transformer.inference import batch_rows as br
from keras_transformer.inference import search as s
from keras_transformer.inference.candidates import next_tokens

__all__ = [
    "INITIAL_CAPACITY",
    "SegmentedSearch",
    "next_power_of_two",
    "source_widths",
    "warmup_shapes",
]

INITIAL_CAPACITY = 16  # the first segments' cache, in steps; doubled when full
MIN_SOURCE_WIDTH = 16  # `Translator` pads sources to a power of two, at least this


def next_power_of_two(n):
    """The smallest power of two >= n (n >= 1, int32 tensor or int)."""
    v = tf.convert_to_tensor(n, tf.int32) - 1
    for shift in (1, 2, 4, 8, 16):
        v = tf.bitwise.bitwise_or(v, tf.bitwise.right_shift(v, shift))
    return v + 1


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
        self._function = None

    def segment(self, *args):
        """The compiled segment (`_segment`). One function for every call, traced once for
        tensors of any size (a graph that calls it twice, e.g. a signature and the warmup,
        shares one XLA compilation cache entry per shape)."""
        if self._function is None:
            self._function = tf.function(
                self._segment,
                input_signature=(
                    *tf.nest.map_structure(lambda t: _any_size(t, False), args[:-2]),
                    *tf.nest.map_structure(lambda t: _any_size(t, True), args[-2:]),
                ),
                jit_compile=self.jit_compile,
            )
        return self._function(*args)

    # -- one segment, compiled -------------------------------------------------------------

    def _segment(self, step, length, per, hypotheses, done, special, rest):
        """Steps from `step` over a fixed batch of P sentences until at most P / 2 are live,
        the cache is full or `length` is reached: (step, hypotheses, done, special, rest,
        per), `per` with the stop rules' counts (`s._count_finished`) carried on.

        hypotheses: (alive_seq (P, K, C + 1), alive_lp (P, K), finished_seq, finished_scores);
        done (P,) bool: settled (their finished hypotheses frozen); special: the cache's
        "sentence" and "constant" entries (P rows / as given); rest: its other entries
        (P K rows).
        """
        alive_seq = hypotheses[0]
        batch, k = tf.shape(alive_seq)[0], tf.shape(alive_seq)[1]
        capacity = tf.shape(alive_seq)[2] - 1
        prefix_end = tf.shape(per["prefix"])[1] - 1
        rank = tf.range(2 * k)[tf.newaxis, :]
        constant = special.get("constant")

        def cond(step, hypotheses, done, sentence, rest, per):
            live = tf.reduce_sum(tf.cast(tf.logical_not(done), tf.int32))
            return (step < length) & (step < capacity) & (live > batch // 2)

        def body(step, hypotheses, done, sentence, rest, per):
            alive_seq, alive_lp, finished_seq, finished_scores = hypotheses
            cache = dict(rest)
            if "sentence" in special:
                cache["sentence"] = sentence
            if constant is not None:
                cache["constant"] = constant
            ids = tf.reshape(alive_seq[:, :, step], [-1])
            logits, cache = self.step_fn(ids, step, cache)
            sentence, _, new_rest = br.split(cache)
            per_beam = tf.minimum(2 * k, tf.shape(logits)[-1])
            row_lp, row_ids = next_tokens(
                logits, step, per, per_beam, k, self.eos_id, self.min_length, False, prefix_end
            )
            top_lp, origin, top_seq, is_eos = s._top_extensions(
                alive_seq, alive_lp, row_lp, row_ids, step, batch, k, per_beam, self.eos_id
            )
            beams = per["beams"][:, tf.newaxis]
            dead = tf.logical_or(top_lp <= s.NEG_INF / 2, rank >= 2 * beams)
            top_lp = tf.where(dead, s.NEG_INF, top_lp)
            ended = s._ended_scores(top_lp, is_eos, dead, rank, beams, step, per["alpha"])
            per = s._count_finished(per, is_eos, dead, rank, beams)
            new_scores, new_seq = s._finished_pool(finished_scores, finished_seq, ended, top_seq, k)
            # a settled sentence keeps the pool it settled with
            finished_scores = tf.where(done[:, tf.newaxis], finished_scores, new_scores)
            finished_seq = tf.where(done[:, tf.newaxis, tf.newaxis], finished_seq, new_seq)
            alive_lp, alive_seq, beam_origin = s._alive_beams(
                top_lp, top_seq, origin, is_eos, rank, beams, k
            )
            can_improve = s._can_improve(alive_lp, finished_scores, per, self.stop_early)
            done = tf.logical_or(done, tf.logical_not(can_improve))
            rows = tf.reshape(beam_origin + k * tf.range(batch)[:, tf.newaxis], [-1])
            new_rest = tf.nest.map_structure(lambda t: tf.gather(t, rows), new_rest)
            hypotheses = (alive_seq, alive_lp, finished_seq, finished_scores)
            # the shapes do not change (lost by ops with tensor sizes when traced for known ones)
            state = (hypotheses, done, sentence, new_rest, per)
            return (step + 1, *tf.nest.map_structure(_same_shape, state, shapes))

        sentence = special.get("sentence", {})
        shapes = br.nest_shapes((hypotheses, done, sentence, rest, per))
        return tf.while_loop(cond, body, (step, hypotheses, done, sentence, rest, per))

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
        k = beam_size
        per = {
            "max_length": tf.zeros([batch], tf.int32),
            "beams": tf.fill([batch], k),
            "nth": tf.zeros([batch], tf.int32),
            "alpha": tf.zeros([batch], tf.float32),
            "prefix": tf.fill([batch, prefix_width], -1),
            "stop_rule": tf.zeros([batch], tf.int32),
            "finished_count": tf.zeros([batch], tf.int32),
            "top_finished": tf.zeros([batch], tf.bool),
        }
        sentence, _, rest = br.split(cache)
        special = {key: cache[key] for key in br.SPECIAL if key in cache}
        rest = tf.nest.map_structure(lambda t: tf.repeat(t, k, axis=0), rest)
        cache = self._grow({**rest, **special}, capacity)
        sentence, _, rest = br.split(cache)
        step = tf.constant(0)
        return self.segment(
            step,
            step,  # length 0: no step runs
            per,
            s._start(tf.zeros([batch], tf.int32), k, capacity),
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
        stop_rule=s.STOP_EXACT,
    ):
        """`search.beam_search`'s arguments and results (eos_id, min_length and stop_early
        given to the constructor; `stop_rule` as there, per sentence too); `initial_cache` a
        dict, with a fixed-capacity cache of any capacity if `grow_cache` is set."""
        if isinstance(beam_size, int) and beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        initial_ids = tf.convert_to_tensor(initial_ids, tf.int32)
        per = s._options(
            initial_ids, max_lengths, beam_size, alpha, prefix, None, num_best, stop_rule
        )
        del per["sampling"]
        # more -1 columns change nothing (the column read once every prefix is done is -1
        # either way); a power of two keeps the compiled shapes few
        width = tf.shape(per["prefix"])[1]
        per["prefix"] = tf.pad(
            per["prefix"], [[0, 0], [0, next_power_of_two(width) - width]], constant_values=-1
        )
        k = tf.maximum(tf.reduce_max(tf.convert_to_tensor(beam_size, tf.int32)), 1)
        length = tf.maximum(tf.reduce_max(per["max_length"]), 1)
        sentence, constant, rest = br.split(initial_cache)
        special = {key: initial_cache[key] for key in br.SPECIAL if key in initial_cache}
        rest = tf.nest.map_structure(lambda t: tf.repeat(t, k, axis=0), rest)
        cache = self._grow({**rest, **special}, self.initial_capacity)
        sentence, _, rest = br.split(cache)
        hypotheses = s._start(initial_ids, k, self.initial_capacity)
        out = [tf.zeros([tf.shape(initial_ids)[0], k, length + 1], tf.int32), hypotheses[3]]
        index = per.pop("index")

        def cond(step, out, index, *_):
            return tf.logical_and(step < length, tf.size(index) > 0)

        def body(step, out, index, per, hypotheses, sentence, rest):
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
            gather = lambda t: tf.gather(t, pad)  # noqa: E731
            beam_rows = tf.reshape(pad[:, tf.newaxis] * k + tf.range(k), [-1])
            step, hypotheses, done, sentence, rest, per = self.segment(
                step,
                length,
                tf.nest.map_structure(gather, per),
                tuple(map(gather, hypotheses)),
                tf.range(padded) >= live,
                self._special(special, tf.nest.map_structure(gather, sentence)),
                tf.nest.map_structure(lambda t: tf.gather(t, beam_rows), rest),
            )
            done = done[:live]
            finished = [_columns(hypotheses[2][:live], length + 1), hypotheses[3][:live]]
            out = br.settle(out, index, done, finished)
            stay = br.rows(tf.logical_not(done))
            gather = lambda t: tf.gather(t, stay)  # noqa: E731
            beam_rows = tf.reshape(stay[:, tf.newaxis] * k + tf.range(k), [-1])
            return (
                step,
                out,
                gather(index),
                tf.nest.map_structure(gather, per),
                tuple(map(gather, hypotheses)),
                tf.nest.map_structure(gather, sentence),
                tf.nest.map_structure(lambda t: tf.gather(t, beam_rows), rest),
            )

        state = (per, hypotheses, sentence, rest)
        result = tf.while_loop(
            cond,
            body,
            (tf.constant(0), out, index, *state),
            shape_invariants=(
                tf.TensorShape([]),
                br.nest_shapes(out),
                tf.TensorShape([None]),
                *br.free_batch(state),
            ),
        )
        out, index, hypotheses = result[1], result[2], result[4]
        # every sentence settles by its maximum length; this only guards the last step
        finished = [_columns(hypotheses[2], length + 1), hypotheses[3]]
        out = br.settle(out, index, tf.ones_like(index, tf.bool), finished)
        return out[0][:, :, 1:], out[1]

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


def _columns(sequences, width):
    """(b, K, W) int32 sequences cut or padded (with 0) to `width` columns."""
    sequences = sequences[:, :, :width]
    return tf.pad(sequences, [[0, 0], [0, 0], [0, width - tf.shape(sequences)[2]]])


def _same_shape(tensor, shape):
    return tf.ensure_shape(tensor, shape)


def _any_size(tensor, cache):
    """A TensorSpec for `tensor` of any size, but for the last axis of a floating-point
    cache tensor of rank >= 2 (a feature depth, which layers need to know; as
    `br.free_batch`)."""
    keep = cache and tensor.dtype.is_floating and tensor.shape.rank >= 2
    shape = [None] * (tensor.shape.rank - keep) + (tensor.shape[-1:].as_list() if keep else [])
    return tf.TensorSpec(shape, tensor.dtype)
