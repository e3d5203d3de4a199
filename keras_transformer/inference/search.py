"""Beam search over a step function, in one `tf.while_loop`; beam 1 with alpha 0 is greedy
search and sampling draws in the same loop (the package has no second loop: a leaner greedy
loop was measured and did not pay, see the README's "Speed").

The search knows the model only through

    step_fn(ids_t (N,) int32, step scalar int32, cache) -> (logits (N, V), cache)

where N is the number of live rows, live sentences x beam size, and `cache` is a nested
structure of tensors whose first axis is N. The search reorders the cache with one gather per
step, except two top-level entries:
  - "sentence" (e.g. cross-attention keys and values, or a self-attention cache that
    every beam of a sentence reads its own part of) has one row per live sentence (N / K
    rows, each shared by K consecutive ids): it is never reordered or copied per beam, and
    may change from step to step;
  - "constant" (e.g. the transposed output projection) is the same for every row: it is
    handed to every step as it was first given, and whatever the step returns for it is
    ignored.
A sentence whose result is settled leaves the batch (all its rows, "sentence" included), so
the steps that follow run on the sentences still being decoded only (batch_rows.py). The
candidates of a step (top-k, log-probabilities, forced tokens) are in candidates.py.

Shapes: B batch, b live sentences, K beam size, L maximum decode length, V vocabulary.
"""

from __future__ import annotations

import tensorflow as tf

# The paper's decoding settings (section 6.1), the defaults of every entry point.
from keras_transformer.config import ALPHA, BEAM_SIZE
from keras_transformer.inference import batch_rows as br
from keras_transformer.inference import beam

# the beam bookkeeping's public names, kept importable from here
from keras_transformer.inference.beam import (
    STOP_EXACT,
    STOP_FINISHED,
    STOP_TOP,
    length_penalty,
    stop_rule_code,
)
from keras_transformer.inference.candidates import NEG_INF, next_tokens

__all__ = ["NEG_INF", "STOP_EXACT", "STOP_FINISHED", "STOP_TOP", "beam_search", "length_penalty",
           "sample", "stop_rule_code"]  # fmt: skip


def beam_search(
    step_fn,
    initial_ids,
    initial_cache,
    max_lengths,
    eos_id: int,
    *,
    beam_size=BEAM_SIZE,
    alpha=ALPHA,
    min_length=None,
    prefix=None,
    num_best=None,
    stop_early=True,
    stop_rule=STOP_EXACT,
):
    """Beam search with GNMT length normalization and early stopping.

    Alive and finished hypotheses are kept apart. At every step the 2K best extensions of
    the alive beams are ranked; those ending in eos (among all 2K, as in tensor2tensor's and
    Model Garden's beam search) join the finished pool (scored log p / length_penalty), the
    K best others stay alive. A sentence is settled, and leaves the batch, when none of its
    alive hypotheses can still beat the n-th best of its finished ones (n = `num_best`, the
    hypotheses the caller keeps), or at its maximum length, where eos is forced. K = 1 is
    greedy search: only the best extension counts (with alpha 0 this is the most probable
    token at every step, as CTranslate2's beam 1).

    The stopping bound, exact for the GNMT penalty lp(m) = ((5 + m) / 6) ** alpha: a live
    beam with log-probability s <= 0 after l tokens can only finish at a length m in
    (l, L] (L: the sentence's maximum length, eos included) with a log-probability
    s' <= s (every token, forced or not, adds log p <= 0), so its final score is at most
    max over m in (l, L] of s / lp(m). For alpha > 0, lp grows with m and s <= 0, so that
    maximum is s / lp(L); for alpha = 0 it is s. No tighter bound holds for every model
    (the next tokens may all have probability near 1, and the beam may end exactly at L),
    and the best live beam has the largest s, so it alone decides. Every finished
    hypothesis comes from a live beam, so once the bound is below the n-th best finished
    score, the n best are final: they equal those of the exhaustive search
    (`stop_early=False`), ties included (the pool's top-k keeps an earlier hypothesis
    first). The hypotheses ranked after n (still returned, K in all) are then the best
    found so far, not necessarily those of a search that waits for all K.

    Two faster rules may be asked for (`stop_rule`), each settling a sentence at the earlier of
    the exact bound and its own condition, so never later than the exact rule; the finished
    pool is the same, only the step at which it is read changes, so a rule's n best may
    differ from the exact rule's (scores never higher: the pool only improves), and only in
    sentences where its condition fires first:
      - STOP_FINISHED ("finished", CTranslate2's rule with a length penalty): once K
        hypotheses have finished, counting, at every step, the eos among the sentence's K
        best candidates only (the eos ranked in (K, 2K] still enter the pool, uncounted);
      - STOP_TOP ("top", CTranslate2's rule without one): once the best candidate of some
        step was eos and n hypotheses have finished. At alpha 0 and n = 1 this is the exact
        rule (that eos beats every live beam already).

    Every option may differ per sentence: the search runs max(K) rows per sentence, and a
    sentence with a smaller K keeps only its first K alive beams and its 2K best extensions,
    so its result is the one it gets alone, whatever else is in the batch.

    Args:
        initial_ids: (B,) int32 first input ids (bos).
        initial_cache: the step function's cache for batch B (tiled to B*K here, except
            the "sentence" entry, which keeps B rows, and "constant").
        max_lengths: (B,) int32 longest output per sentence, eos included.
        eos_id: end-of-sequence id.
        beam_size: K (paper: 4), >= 1: a Python int, a scalar int32 tensor or (B,) int32
            per sentence (checked by callers).
        alpha: length-penalty exponent (paper: 0.6), >= 0: a float, a scalar or (B,).
        min_length: shortest output, eos included (eos is not a candidate before it, as
            CTranslate2's min_decoding_length); None (the default): no minimum.
        prefix: (B, P) int32 tokens every hypothesis of a sentence starts with (their
            log-probabilities count in its score), -1 after each sentence's prefix; None:
            no prefix. `max_lengths` must leave room for the prefix and eos.
        num_best: n, the hypotheses the caller keeps, in [1, K] per sentence (clipped to
            the sentence's K): a Python int, a scalar or (B,) int32; None (the default): K.
        stop_early: False runs every sentence until its maximum length (or until all its
            beams die): the exhaustive reference the early stop is tested against.
        stop_rule: STOP_EXACT (the default), STOP_FINISHED or STOP_TOP (see above): a Python
            int, a scalar or (B,) int32 per sentence.

    Returns:
        (sequences (B, K, L) int32 best first, without bos, eos included, 0 after;
         scores (B, K) float32 length-normalized log-probabilities, best first), K the
        largest beam size; a sentence's columns beyond its own K score NEG_INF or less.
    """
    if isinstance(beam_size, int) and beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    return _search(
        step_fn, initial_ids, initial_cache, max_lengths, eos_id, beam_size, alpha, min_length,
        prefix, sampling=None, num_best=num_best, stop_early=stop_early, stop_rule=stop_rule,
    )  # fmt: skip


def sample(
    step_fn, initial_ids, initial_cache, max_lengths, eos_id: int, sampling: dict,
    min_length=None,
):  # fmt: skip
    """Ancestral sampling, one hypothesis per sentence, in the same loop as `beam_search`
    (beam 1, alpha 0) with the best extension replaced by a drawn one (see
    `sampling.sampled_log_probs`).

    Args:
        sampling: {"temperature": (B,) float32 > 0, "top_k": (B,) int32 (0: the whole
            vocabulary), "top_p": (B,) float32 in (0, 1], "seed": (B,) int64}; a sentence's
            draws depend only on its own logits, options and seed.
        min_length: shortest output, eos included (eos is never drawn before it); None
            (the default): no minimum.

    Returns:
        (sequences (B, L) int32, log-probabilities under the model (B,) float32, at
         temperature 1 and without the top-k / top-p cut, so that `score` gives the same).
    """
    seqs, scores = _search(
        step_fn, initial_ids, initial_cache, max_lengths, eos_id, 1, 0.0, min_length, None,
        sampling,
    )  # fmt: skip
    return seqs[:, 0], scores[:, 0]


def _search(
    step_fn, initial_ids, initial_cache, max_lengths, eos_id, beam_size, alpha, min_length,
    prefix, sampling, num_best=None, stop_early=True, stop_rule=STOP_EXACT,
):  # fmt: skip
    """The one loop behind `beam_search` and `sample`."""
    initial_ids = tf.convert_to_tensor(initial_ids, tf.int32)
    per = beam.sentence_options(
        initial_ids, max_lengths, beam_size, alpha, prefix, sampling, num_best, stop_rule
    )
    # K: the (largest) beam size; an empty batch still has shapes
    k = tf.maximum(tf.reduce_max(tf.convert_to_tensor(beam_size, tf.int32)), 1)
    length = tf.maximum(tf.reduce_max(per["max_length"]), 1)
    prefix_end = tf.shape(per["prefix"])[1] - 1
    join = br.joiner(initial_cache)
    sentence, _, rest = br.split(initial_cache)  # "sentence": (B, ...), one row per sentence
    rest = tf.nest.map_structure(lambda t: tf.repeat(t, k, axis=0), rest)  # (B*K, ...)
    alive_seq, alive_lp, finished_seq, finished_scores = beam.start(initial_ids, k, length)
    out = [finished_seq, finished_scores]

    def body(step, out, per, alive_seq, alive_lp, finished_seq, finished_scores, *c):
        live = tf.shape(per["index"])[0]
        ids = tf.reshape(alive_seq[:, :, step], [-1])
        logits, cache = step_fn(ids, step, join(*c))
        sentence, _, rest = br.split(cache)
        # the 2K best of the K x V extensions are among the 2K best of each beam's V
        per_beam = tf.minimum(2 * k, tf.shape(logits)[-1])
        row_lp, row_ids = next_tokens(
            logits, step, per, per_beam, k, eos_id, min_length, bool(sampling), prefix_end
        )
        hypotheses = (alive_seq, alive_lp, finished_seq, finished_scores)
        per, hypotheses, beam_origin = beam.advance(
            hypotheses, row_lp, row_ids, step, per, k, per_beam, eos_id
        )
        out, *state = _settle_and_drop(
            out, per, hypotheses, beam_origin, sentence, rest, live, k, stop_early
        )
        return (step + 1, out, *state)

    def cond(step, out, per, *_):
        return tf.logical_and(step < length, tf.size(per["index"]) > 0)

    state = (per, alive_seq, alive_lp, finished_seq, finished_scores, sentence, rest)
    return _run_loop(cond, body, out, state)


def _run_loop(cond, body, out, state):
    """The while loop from step 0, then the last settling: (sequences (B, K, L), scores (B, K))."""
    result = tf.while_loop(
        cond,
        body,
        (tf.constant(0), out, *state),
        shape_invariants=(tf.TensorShape([]), br.nest_shapes(out), *br.free_batch(state)),
    )
    out, index = result[1], result[2]["index"]
    # every sentence settles by its maximum length; this only guards the loop's last step
    out = br.settle(out, index, tf.ones_like(index, tf.bool), list(result[5:7]))
    return out[0][:, :, 1:], out[1]


def _settle_and_drop(out, per, hypotheses, beam_origin, sentence, rest, live, k, stop_early):
    """Settled sentences written to `out` and dropped: (out, the loop state of those that stay)."""
    alive_seq, alive_lp, finished_seq, finished_scores = hypotheses
    can_improve = beam.can_improve(alive_lp, finished_scores, per, stop_early)
    done = tf.logical_not(can_improve)
    out = br.settle(out, per["index"], done, [finished_seq, finished_scores])
    stay = br.rows(can_improve)
    gather = lambda t: tf.gather(t, stay)  # noqa: E731
    per = tf.nest.map_structure(gather, per)
    hypotheses = tuple(map(gather, hypotheses))
    # one gather both reorders the beams and drops the settled sentences
    rows = tf.reshape(gather(beam_origin + k * tf.range(live)[:, tf.newaxis]), [-1])
    rest = tf.nest.map_structure(lambda t: tf.gather(t, rows), rest)
    sentence = br.shrink_sentences(sentence, done, stay)
    return (out, per, *hypotheses, sentence, rest)
