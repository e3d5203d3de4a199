"""One segment of `kt-export --xla`'s search (xla_search.py): the steps of a fixed batch of P
sentences, in a `tf.while_loop` compiled by XLA, until at most P / 2 are live, the cache is
full or the longest maximum length is reached. A sentence that settles stays in the batch,
its result frozen; the step's bookkeeping is beam.py's, as in search.py."""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.inference import batch_rows as br
from keras_transformer.inference import beam
from keras_transformer.inference.candidates import next_tokens


class Segment:
    """The compiled segment over `step_fn` (as for `search.beam_search`); `eos_id`,
    `min_length` and `stop_early` as there; `jit_compile` False runs it in the ordinary
    graph (the same results; tests).

    Called with (step, length, per, hypotheses, done, special, rest) -> (step, hypotheses,
    done, "sentence", rest, per), `per` with the stop rules' counts (`beam.count_finished`)
    carried on; hypotheses: (alive_seq (P, K, C + 1), alive_lp (P, K), finished_seq,
    finished_scores); done (P,) bool: settled (their finished hypotheses frozen); special:
    the cache's "sentence" and "constant" entries (P rows / as given); rest: its other
    entries (P K rows).
    """

    def __init__(self, step_fn, eos_id: int, *, min_length=None, stop_early=True, jit_compile=True):
        self.step_fn = step_fn
        self.eos_id = eos_id
        self.min_length = min_length
        self.stop_early = stop_early
        self.jit_compile = jit_compile
        self._function = None

    def __call__(self, *args):
        """One function for every call, traced once for tensors of any size (a graph that
        calls it twice, e.g. a signature and the warmup, shares one XLA compilation cache
        entry per shape)."""
        if self._function is None:
            self._function = tf.function(
                self._steps,
                input_signature=(
                    *tf.nest.map_structure(lambda t: _any_size(t, False), args[:-2]),
                    *tf.nest.map_structure(lambda t: _any_size(t, True), args[-2:]),
                ),
                jit_compile=self.jit_compile,
                autograph=False,  # explicit while loops: no conversion (Translator's note)
            )
        return self._function(*args)

    def _steps(self, step, length, per, hypotheses, done, special, rest):
        """The segment's loop (see the class docstring)."""
        batch, _, width = tf.unstack(tf.shape(hypotheses[0]))
        capacity = width - 1

        def cond(step, hypotheses, done, sentence, rest, per):
            live = tf.reduce_sum(tf.cast(tf.logical_not(done), tf.int32))
            return (step < length) & (step < capacity) & (live > batch // 2)

        def body(step, *state):
            state = self._step(step, special, *state)
            # the shapes do not change (lost by ops with tensor sizes when traced for known ones)
            return (step + 1, *tf.nest.map_structure(_same_shape, state, shapes))

        sentence = special.get("sentence", {})
        shapes = br.nest_shapes((hypotheses, done, sentence, rest, per))
        return tf.while_loop(cond, body, (step, hypotheses, done, sentence, rest, per))

    def _step(self, step, special, hypotheses, done, sentence, rest, per):
        """One step of the P sentences: (hypotheses, done, "sentence", rest, per) after it."""
        batch, k = tf.shape(hypotheses[0])[0], tf.shape(hypotheses[0])[1]
        prefix_end = tf.shape(per["prefix"])[1] - 1
        finished_seq, finished_scores = hypotheses[2:]
        cache = dict(rest)
        if "sentence" in special:
            cache["sentence"] = sentence
        if special.get("constant") is not None:
            cache["constant"] = special["constant"]
        ids = tf.reshape(hypotheses[0][:, :, step], [-1])
        logits, cache = self.step_fn(ids, step, cache)
        sentence, _, new_rest = br.split(cache)
        per_beam = tf.minimum(2 * k, tf.shape(logits)[-1])
        row_lp, row_ids = next_tokens(
            logits, step, per, per_beam, k, self.eos_id, self.min_length, False, prefix_end
        )
        per, new, beam_origin = beam.advance(
            hypotheses, row_lp, row_ids, step, per, k, per_beam, self.eos_id
        )
        alive_seq, alive_lp, new_seq, new_scores = new
        # a settled sentence keeps the pool it settled with
        finished_scores = tf.where(done[:, tf.newaxis], finished_scores, new_scores)
        finished_seq = tf.where(done[:, tf.newaxis, tf.newaxis], finished_seq, new_seq)
        can_improve = beam.can_improve(alive_lp, finished_scores, per, self.stop_early)
        done = tf.logical_or(done, tf.logical_not(can_improve))
        rows = tf.reshape(beam_origin + k * tf.range(batch)[:, tf.newaxis], [-1])
        new_rest = tf.nest.map_structure(lambda t: tf.gather(t, rows), new_rest)
        hypotheses = (alive_seq, alive_lp, finished_seq, finished_scores)
        return hypotheses, done, sentence, new_rest, per


def _same_shape(tensor, shape):
    return tf.ensure_shape(tensor, shape)


def _any_size(tensor, cache):
    """A TensorSpec for `tensor` of any size, but for the last axis of a floating-point
    cache tensor of rank >= 2 (a feature depth, which layers need to know; as
    `br.free_batch`)."""
    keep = cache and tensor.dtype.is_floating and tensor.shape.rank >= 2
    shape = [None] * (tensor.shape.rank - keep) + (tensor.shape[-1:].as_list() if keep else [])
    return tf.TensorSpec(shape, tensor.dtype)
