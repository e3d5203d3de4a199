"""Beam search over a step function, in one `tf.while_loop`; beam 1 with alpha 0 is greedy
search (the package has no second loop for it).

The search knows the model only through

    step_fn(ids_t (N,) int32, step scalar int32, cache) -> (logits (N, V), cache)

where N is the number of live rows, live sentences x beam size, and `cache` is a nested
structure of tensors whose first axis is N. The search reorders the cache with one gather per step, except two top-level entries:
  - "sentence" (e.g. cross-attention keys and values, or a self-attention cache that
    every beam of a sentence reads its own part of) has one row per live sentence (N / K
    rows, each shared by K consecutive ids): it is never reordered or copied per beam, and
    may change from step to step;
  - "constant" (e.g. the transposed output projection) is the same for every row: it is
    handed to every step as it was first given, and whatever the step returns for it is
    ignored.
A sentence whose result is settled leaves the batch (all its rows, "sentence" included), so
the steps that follow run on the sentences still being decoded only.

Shapes: B batch, b live sentences, K beam size, L maximum decode length, V vocabulary.
"""

from __future__ import annotations

import tensorflow as tf

# The paper's decoding settings (section 6.1), the defaults of every entry point.
from keras_transformer.config import ALPHA, BEAM_SIZE
from keras_transformer.inference.sampling import sampled_log_probs

NEG_INF = -1.0e9  # finite: float32 log-probabilities only, never float16


def length_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016)."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, tf.cast(alpha, tf.float32))


TOP_K_BLOCK = 64  # vocabulary block of the two-stage top-k


def _row_top_k(logits, count):
    """Exact top `count` of every row of (N, V) float32 logits, in two small stages:
    (values (N, count), ids (N, count) int32, row max (N, 1)).

    The row is cut into blocks of TOP_K_BLOCK; every one of the `count` largest entries lies
    in one of the `count` blocks with the largest maxima (a block ranked lower has `count`
    larger entries elsewhere), so one max-reduction over the row and two top-k's over
    (N, V / 64) and (N, count x 64) replace a top-k over (N, V), the slowest op of a step.
    """
    vocab = logits.shape[-1]
    if vocab is None or vocab < 4 * TOP_K_BLOCK:
        values, ids = tf.math.top_k(logits, k=count)
        return values, ids, tf.reduce_max(logits, axis=-1, keepdims=True)
    blocks = -(-vocab // TOP_K_BLOCK)
    if blocks * TOP_K_BLOCK != vocab:
        logits = tf.pad(
            logits, [[0, 0], [0, blocks * TOP_K_BLOCK - vocab]], constant_values=-float("inf")
        )
    rows = tf.shape(logits)[0]
    x = tf.reshape(logits, [rows, blocks, TOP_K_BLOCK])
    block_max = tf.reduce_max(x, axis=-1)  # (N, blocks)
    _, top_blocks = tf.math.top_k(block_max, k=tf.minimum(count, blocks))
    candidates = tf.reshape(tf.gather(x, top_blocks, batch_dims=1), [rows, -1])
    values, position = tf.math.top_k(candidates, k=count)
    block = tf.gather(top_blocks, position // TOP_K_BLOCK, batch_dims=1)
    ids = block * TOP_K_BLOCK + position % TOP_K_BLOCK
    return values, ids, tf.reduce_max(block_max, axis=-1, keepdims=True)


def _top_log_probs(logits, step, count, eos_id, min_length=None):
    """The `count` most probable next tokens of every row: (log-probs (N, count) float32,
    ids (N, count) int32, logsumexp (N, 1)), best first.

    Before `min_length` (step + 1 < min_length) eos is not a candidate: the top count + 1
    are formed and eos dropped from them, so the other tokens keep their log-probabilities
    under the full distribution (not renormalized over the tokens allowed: the score stays
    the model's log-probability of the output, as `score` gives it). CTranslate2's
    min_decoding_length differs there: it masks eos before its log-softmax, which
    renormalizes; its scores are then higher by -log(1 - p(eos)) at every step before the
    minimum, and the candidates of a row rank the same either way.
    Log-probabilities are logits - logsumexp(logits) in float32; only the top `count` of each
    row are ever formed (the full (N, V) log-softmax and masking would be four more passes
    over the largest tensor of the step). logsumexp = max + log(sum(exp(logits - max))) is
    read off the fused softmax op (one kernel, faster than Sub, Exp and Sum): the row
    maximum's probability is exactly 1 / sum(exp(logits - max)), and it is >= 1 / V, so its
    log is well conditioned.
    """
    # one more, to drop eos from, when the vocabulary has one more
    formed = count if min_length is None else tf.minimum(count + 1, tf.shape(logits)[-1])
    top_logits, top_ids, row_max = _row_top_k(logits, formed)
    max_prob = tf.gather(tf.nn.softmax(logits), top_ids[:, :1], batch_dims=1)  # (N, 1)
    normalizer = row_max - tf.math.log(max_prob)  # logsumexp (N, 1)
    if min_length is not None:
        banned = tf.logical_and(tf.equal(top_ids, eos_id), step + 1 < min_length)
        top_logits, keep = tf.math.top_k(tf.where(banned, NEG_INF, top_logits), k=count)
        top_ids = tf.gather(top_ids, keep, batch_dims=1)
    return top_logits - normalizer, top_ids, normalizer


def _forced(logits, normalizer, top_lp, top_ids, forced):
    """Rows whose `forced` (N,) token is >= 0 (a prefix token, or eos at the max length) get
    that token's log-prob first and NEG_INF after it; the other rows keep their candidates."""
    token = tf.maximum(forced, 0)[:, tf.newaxis]
    forced_lp = tf.gather(logits, token, batch_dims=1) - normalizer  # (N, 1)
    first = tf.equal(tf.range(tf.shape(top_lp)[1]), 0)[tf.newaxis, :]
    is_forced = (forced >= 0)[:, tf.newaxis]
    return (
        tf.where(is_forced, tf.where(first, forced_lp, NEG_INF), top_lp),
        tf.where(is_forced, token, top_ids),
    )


def _write(sequences, position, values):
    """sequences (..., L + 1) with `values` (...) written at `position`."""
    slot = tf.equal(tf.range(tf.shape(sequences)[-1]), position)
    return tf.where(slot, values[..., tf.newaxis], sequences)


def _free_batch(state):
    """Shape invariants: any axis of the step function's cache (the last entry of `state`)
    may change in the loop (live sentences leave; a self-attention cache grows one position
    per step, a record of positions one column), except the last axis of a floating-point
    tensor of rank >= 2 (its feature depth, which stays known to the step function); the
    search's own tensors keep only their rank."""
    *fixed, cache = state

    def free(t):
        keep = t.dtype.is_floating and t.shape.rank >= 2
        return tf.TensorShape([None] * (t.shape.rank - keep)).concatenate(
            t.shape[-1:] if keep else []
        )

    fixed = tf.nest.map_structure(lambda t: tf.TensorShape([None] * t.shape.rank), fixed)
    return (*fixed, tf.nest.map_structure(free, cache))


_SPECIAL = ("sentence", "constant")


def _split(cache):
    """(the top-level "sentence" entry or {}, "constant" or {}, the rest of the cache)."""
    if not isinstance(cache, dict):
        return {}, {}, cache
    rest = {k: v for k, v in cache.items() if k not in _SPECIAL}
    return cache.get("sentence", {}), cache.get("constant", {}), rest


def _joiner(initial_cache):
    """A function (sentence, rest) -> the step function's cache, with the initial "constant"
    entry (a loop invariant, captured by the loop body) and the top-level keys it had."""
    keys = [k for k in _SPECIAL if isinstance(initial_cache, dict) and k in initial_cache]
    _, constant, _ = _split(initial_cache)

    def join(sentence, rest):
        special = {"sentence": sentence, "constant": constant}
        return {**rest, **{k: special[k] for k in keys}}

    return join


def _rows(mask):
    """int32 positions where the (b,) bool `mask` is True."""
    return tf.cast(tf.where(mask)[:, 0], tf.int32)


def _settle(out, index, done, values):
    """Write the rows of `values` where `done` into `out` at their batch positions `index`."""
    rows = _rows(done)
    positions = tf.gather(index, rows)[:, tf.newaxis]
    return [
        tf.tensor_scatter_nd_update(o, positions, tf.gather(v, rows))
        for o, v in zip(out, values, strict=True)
    ]


def _shrink_sentences(sentence, done, stay):
    """Keep the rows (sentences) `stay` of the "sentence" cache, if any sentence is `done`."""
    if not tf.nest.flatten(sentence):
        return sentence

    def shrink():
        return tf.nest.map_structure(lambda t: tf.gather(t, stay), sentence)

    return tf.cond(tf.reduce_any(done), shrink, lambda: sentence)


def _nest_shapes(structure):
    return tf.nest.map_structure(lambda t: t.shape, structure)


def _per_sentence(value, batch, dtype):
    """A scalar or (B,) option as a (B,) tensor."""
    value = tf.convert_to_tensor(value, dtype)
    return tf.broadcast_to(value, [batch]) if value.shape.rank == 0 else value


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

    Returns:
        (sequences (B, K, L) int32 best first, without bos, eos included, 0 after;
         scores (B, K) float32 length-normalized log-probabilities, best first), K the
        largest beam size; a sentence's columns beyond its own K score NEG_INF or less.
    """
    if isinstance(beam_size, int) and beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    return _search(
        step_fn, initial_ids, initial_cache, max_lengths, eos_id, beam_size, alpha, min_length,
        prefix, sampling=None, num_best=num_best, stop_early=stop_early,
    )  # fmt: skip


def sample(step_fn, initial_ids, initial_cache, max_lengths, eos_id: int, sampling: dict):
    """Ancestral sampling, one hypothesis per sentence, in the same loop as `beam_search`
    (beam 1, alpha 0) with the best extension replaced by a drawn one (see
    `sampling.sampled_log_probs`).

    Args:
        sampling: {"temperature": (B,) float32 > 0, "top_k": (B,) int32 (0: the whole
            vocabulary), "top_p": (B,) float32 in (0, 1], "seed": (B,) int64}; a sentence's
            draws depend only on its own logits, options and seed.

    Returns:
        (sequences (B, L) int32, log-probabilities under the model (B,) float32, at
         temperature 1 and without the top-k / top-p cut, so that `score` gives the same).
    """
    seqs, scores = _search(
        step_fn, initial_ids, initial_cache, max_lengths, eos_id, 1, 0.0, None, None, sampling
    )
    return seqs[:, 0], scores[:, 0]


def _search(
    step_fn, initial_ids, initial_cache, max_lengths, eos_id, beam_size, alpha, min_length,
    prefix, sampling, num_best=None, stop_early=True,
):  # fmt: skip
    """The one loop behind `beam_search` and `sample`."""
    initial_ids = tf.convert_to_tensor(initial_ids, tf.int32)
    batch = tf.shape(initial_ids)[0]
    if prefix is None:
        prefix = tf.zeros([batch, 0], tf.int32)
    # per live sentence, gathered as sentences leave: the options and where it sits in the batch
    per = {
        "index": tf.range(batch),
        "max_length": tf.convert_to_tensor(max_lengths, tf.int32),
        "beams": _per_sentence(beam_size, batch, tf.int32),
        # the finished hypothesis (0-based rank) no live beam may still beat
        "nth": _per_sentence(beam_size if num_best is None else num_best, batch, tf.int32),
        "alpha": _per_sentence(alpha, batch, tf.float32),
        # one -1 column after the longest prefix, read once every prefix is done
        "prefix": tf.pad(
            tf.convert_to_tensor(prefix, tf.int32), [[0, 0], [0, 1]], constant_values=-1
        ),
        "sampling": sampling or {},
    }
    per["nth"] = tf.clip_by_value(per["nth"], 1, tf.maximum(per["beams"], 1)) - 1
    # K: the (largest) beam size; an empty batch still has shapes
    k = tf.maximum(tf.reduce_max(tf.convert_to_tensor(beam_size, tf.int32)), 1)
    length = tf.maximum(tf.reduce_max(per["max_length"]), 1)
    prefix_end = tf.shape(per["prefix"])[1] - 1
    join = _joiner(initial_cache)
    sentence, _, rest = _split(initial_cache)  # "sentence": (B, ...), one row per sentence
    rest = tf.nest.map_structure(lambda t: tf.repeat(t, k, axis=0), rest)  # (B*K, ...)
    alive_seq = tf.zeros([batch, k, length + 1], tf.int32)
    alive_seq = _write(alive_seq, 0, tf.tile(initial_ids[:, tf.newaxis], [1, k]))
    # only the first beam is live at step 0, so the K beams do not start as copies
    alive_lp = tf.tile(tf.concat([[0.0], tf.fill([k - 1], NEG_INF)], 0)[tf.newaxis], [batch, 1])
    finished_seq = tf.zeros_like(alive_seq)
    finished_scores = tf.fill([batch, k], NEG_INF)
    out = [finished_seq, finished_scores]
    rank = tf.range(2 * k)[tf.newaxis, :]

    def candidates(logits, step, per, count):
        """(log-probs (N, count), ids (N, count)) of every row's next token."""
        logits = tf.cast(logits, tf.float32)
        if sampling:
            top_lp, top_ids, normalizer = sampled_log_probs(logits, step, count, per["sampling"])
        else:
            top_lp, top_ids, normalizer = _top_log_probs(logits, step, count, eos_id, min_length)
        token = tf.gather(per["prefix"], tf.minimum(step, prefix_end), axis=1)  # (b,)
        forced = tf.where(step + 1 >= per["max_length"], eos_id, token)
        return _forced(logits, normalizer, top_lp, top_ids, tf.repeat(forced, k))

    def body(step, out, per, alive_seq, alive_lp, finished_seq, finished_scores, *c):
        live = tf.shape(per["index"])[0]
        ids = tf.reshape(alive_seq[:, :, step], [-1])
        logits, cache = step_fn(ids, step, join(*c))
        sentence, _, rest = _split(cache)
        # the 2K best of the K x V extensions are among the 2K best of each beam's V
        per_beam = tf.minimum(2 * k, tf.shape(logits)[-1])
        row_lp, row_ids = candidates(logits, step, per, per_beam)
        scores = alive_lp[:, :, tf.newaxis] + tf.reshape(row_lp, [live, k, per_beam])
        top_lp, top_index = tf.math.top_k(tf.reshape(scores, [live, -1]), k=2 * k)  # (b, 2K)
        origin = top_index // per_beam
        token = tf.gather(tf.reshape(row_ids, [live, -1]), top_index, batch_dims=1)
        top_seq = _write(tf.gather(alive_seq, origin, batch_dims=1), step + 1, token)
        is_eos = tf.equal(token, eos_id)
        beams = per["beams"][:, tf.newaxis]
        # extensions of beams never alive, and beyond a sentence's own 2K
        dead = tf.logical_or(top_lp <= NEG_INF / 2, rank >= 2 * beams)
        top_lp = tf.where(dead, NEG_INF, top_lp)

        # finished pool: eos among the 2K candidates (among the best one only at K = 1)
        window = tf.where(beams > 1, 2 * beams, 1)
        new_finished = tf.logical_and(tf.logical_and(is_eos, rank < window), tf.logical_not(dead))
        penalty = length_penalty(step + 1, per["alpha"])[:, tf.newaxis]
        new_scores = tf.where(new_finished, top_lp / penalty, NEG_INF)
        pool_scores = tf.concat([finished_scores, new_scores], axis=1)
        pool_seq = tf.concat([finished_seq, top_seq], axis=1)
        finished_scores, keep = tf.math.top_k(pool_scores, k=k)
        finished_seq = tf.gather(pool_seq, keep, batch_dims=1)

        # alive: the sentence's K best extensions that did not end
        alive_lp, keep = tf.math.top_k(tf.where(is_eos, NEG_INF, top_lp), k=k)
        alive_lp = tf.where(rank[:, :k] < beams, alive_lp, NEG_INF)
        alive_seq = tf.gather(top_seq, keep, batch_dims=1)
        beam_origin = tf.gather(origin, keep, batch_dims=1)  # (b, K)

        # settled: no alive hypothesis can beat the sentence's n-th best finished one (the
        # bound of beam_search's docstring: log-probs only fall, the penalty is largest at
        # the max length)
        best_alive = alive_lp[:, 0] / length_penalty(per["max_length"], per["alpha"])
        to_beat = tf.gather(finished_scores, per["nth"], batch_dims=1)
        can_improve = tf.logical_and(
            alive_lp[:, 0] > NEG_INF / 2, tf.logical_or(best_alive >= to_beat, not stop_early)
        )
        done = tf.logical_not(can_improve)
        out = _settle(out, per["index"], done, [finished_seq, finished_scores])
        stay = _rows(can_improve)
        gather = lambda t: tf.gather(t, stay)  # noqa: E731
        per = tf.nest.map_structure(gather, per)
        alive_seq, alive_lp, finished_seq, finished_scores = map(
            gather, (alive_seq, alive_lp, finished_seq, finished_scores)
        )
        # one gather both reorders the beams and drops the settled sentences
        rows = tf.reshape(gather(beam_origin + k * tf.range(live)[:, tf.newaxis]), [-1])
        rest = tf.nest.map_structure(lambda t: tf.gather(t, rows), rest)
        sentence = _shrink_sentences(sentence, done, stay)
        return (step + 1, out, per, alive_seq, alive_lp, finished_seq, finished_scores,
                sentence, rest)  # fmt: skip

    def cond(step, out, per, *_):
        return tf.logical_and(step < length, tf.size(per["index"]) > 0)

    state = (per, alive_seq, alive_lp, finished_seq, finished_scores, sentence, rest)
    result = tf.while_loop(
        cond,
        body,
        (tf.constant(0), out, *state),
        shape_invariants=(tf.TensorShape([]), _nest_shapes(out), *_free_batch(state)),
    )
    out, index = result[1], result[2]["index"]
    # every sentence settles by its maximum length; this only guards the loop's last step
    out = _settle(out, index, tf.ones_like(index, tf.bool), list(result[5:7]))
    return out[0][:, :, 1:], out[1]
