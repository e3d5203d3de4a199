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


def _top_log_probs(logits, step, max_lengths, eos_id, count, repeat, min_length=None):
    """The `count` most probable next tokens of every row: (log-probs (N, count) float32,
    ids (N, count) int32), best first.

    Where step + 1 reaches the sentence's max length only eos is allowed: its log-prob comes
    first, the other entries are NEG_INF. Before `min_length` (step + 1 < min_length) eos
    is not a candidate: the top count + 1 are formed and eos dropped from them, as
    CTranslate2's min_decoding_length disables eos after the log-softmax (so the other
    tokens' log-probabilities are not renormalized). Log-probabilities are logits - logsumexp(logits)
    in float32; only the top `count` of each row are ever formed (the full (N, V) log-softmax
    and masking would be four more passes over the largest tensor of the step).
    logsumexp = max + log(sum(exp(logits - max))) is read off the fused softmax op (one
    kernel, faster than Sub, Exp and Sum): the row maximum's probability is exactly
    1 / sum(exp(logits - max)), and it is >= 1 / V, so its log is well conditioned.
    """
    logits = tf.cast(logits, tf.float32)
    top_logits, top_ids, row_max = _row_top_k(logits, count if min_length is None else count + 1)
    max_prob = tf.gather(tf.nn.softmax(logits), top_ids[:, :1], batch_dims=1)  # (N, 1)
    normalizer = row_max - tf.math.log(max_prob)  # logsumexp (N, 1)
    if min_length is not None:
        banned = tf.logical_and(tf.equal(top_ids, eos_id), step + 1 < min_length)
        top_logits, keep = tf.math.top_k(tf.where(banned, NEG_INF, top_logits), k=count)
        top_ids = tf.gather(top_ids, keep, batch_dims=1)
    top_lp = top_logits - normalizer
    eos_lp = logits[:, eos_id : eos_id + 1] - normalizer  # (N, 1)
    first = tf.equal(tf.range(count), 0)[tf.newaxis, :]
    forced_lp = tf.where(first, eos_lp, NEG_INF)
    must_end = tf.repeat(step + 1 >= max_lengths, repeat)[:, tf.newaxis]  # (N, 1)
    return tf.where(must_end, forced_lp, top_lp), tf.where(must_end, eos_id, top_ids)


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
):
    """Beam search with GNMT length normalization and early stopping.

    Alive and finished hypotheses are kept apart. At every step the 2K best extensions of
    the alive beams are ranked; those ending in eos within the top K join the finished pool
    (scored log p / length_penalty), the K best others stay alive. A sentence is settled,
    and leaves the batch, when none of its alive hypotheses can still beat its worst
    finished one (log-probabilities only fall, and the penalty is largest at the maximum
    length), or at its maximum length, where eos is forced. With beam_size 1 and alpha 0
    this is greedy search.

    Args:
        initial_ids: (B,) int32 first input ids (bos).
        initial_cache: the step function's cache for batch B (tiled to B*K here, except
            the "sentence" entry, which keeps B rows, and "constant").
        max_lengths: (B,) int32 longest output per sentence, eos included.
        eos_id: end-of-sequence id.
        beam_size: K (paper: 4); a Python int or a scalar int32 tensor (checked by callers).
        alpha: length-penalty exponent (paper: 0.6), >= 0; a float or a scalar tensor.
        min_length: shortest output, eos included (eos is not a candidate before it, as
            CTranslate2's min_decoding_length); None (the default): no minimum.

    Returns:
        (sequences (B, K, L) int32 best first, without bos, eos included, 0 after;
         scores (B, K) float32 length-normalized log-probabilities, best first).
    """
    if isinstance(beam_size, int) and beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    k = tf.convert_to_tensor(beam_size, tf.int32)
    alpha = tf.convert_to_tensor(alpha, tf.float32)
    initial_ids = tf.convert_to_tensor(initial_ids, tf.int32)
    max_lengths = tf.convert_to_tensor(max_lengths, tf.int32)
    batch = tf.shape(initial_ids)[0]
    length = tf.maximum(tf.reduce_max(max_lengths), 1)
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

    def body(step, out, index, lengths, alive_seq, alive_lp, finished_seq, finished_scores, *c):
        live = tf.shape(index)[0]
        ids = tf.reshape(alive_seq[:, :, step], [-1])
        logits, cache = step_fn(ids, step, join(*c))
        sentence, _, rest = _split(cache)
        # the 2K best of the K x V extensions are among the 2K best of each beam's V
        per_beam = tf.minimum(2 * k, tf.shape(logits)[-1])
        row_lp, row_ids = _top_log_probs(logits, step, lengths, eos_id, per_beam, k, min_length)
        candidates = alive_lp[:, :, tf.newaxis] + tf.reshape(row_lp, [live, k, per_beam])
        top_lp, top_index = tf.math.top_k(tf.reshape(candidates, [live, -1]), k=2 * k)  # (b, 2K)
        origin = top_index // per_beam
        token = tf.gather(tf.reshape(row_ids, [live, -1]), top_index, batch_dims=1)
        top_seq = _write(tf.gather(alive_seq, origin, batch_dims=1), step + 1, token)
        is_eos = tf.equal(token, eos_id)
        dead = top_lp <= NEG_INF / 2  # extensions of beams that were never alive

        # finished pool: eos among the top K candidates, length-normalized
        in_top_k = tf.range(2 * k)[tf.newaxis, :] < k
        new_finished = tf.logical_and(tf.logical_and(is_eos, in_top_k), tf.logical_not(dead))
        new_scores = tf.where(new_finished, top_lp / length_penalty(step + 1, alpha), NEG_INF)
        pool_scores = tf.concat([finished_scores, new_scores], axis=1)
        pool_seq = tf.concat([finished_seq, top_seq], axis=1)
        finished_scores, keep = tf.math.top_k(pool_scores, k=k)
        finished_seq = tf.gather(pool_seq, keep, batch_dims=1)

        # alive: the K best extensions that did not end
        alive_lp, keep = tf.math.top_k(tf.where(is_eos, NEG_INF, top_lp), k=k)
        alive_seq = tf.gather(top_seq, keep, batch_dims=1)
        beam_origin = tf.gather(origin, keep, batch_dims=1)  # (b, K)

        # settled: no alive hypothesis can beat the worst finished one (an upper bound of
        # its final score: log-probs only fall, the penalty is largest at the max length)
        best_alive = alive_lp[:, 0] / length_penalty(lengths, alpha)
        can_improve = tf.logical_and(
            alive_lp[:, 0] > NEG_INF / 2, best_alive >= finished_scores[:, -1]
        )
        done = tf.logical_not(can_improve)
        out = _settle(out, index, done, [finished_seq, finished_scores])
        stay = _rows(can_improve)
        gather = lambda t: tf.gather(t, stay)  # noqa: E731
        index, lengths, alive_seq, alive_lp, finished_seq, finished_scores = map(
            gather, (index, lengths, alive_seq, alive_lp, finished_seq, finished_scores)
        )
        # one gather both reorders the beams and drops the settled sentences
        rows = tf.reshape(gather(beam_origin + k * tf.range(live)[:, tf.newaxis]), [-1])
        rest = tf.nest.map_structure(lambda t: tf.gather(t, rows), rest)
        sentence = _shrink_sentences(sentence, done, stay)
        return (step + 1, out, index, lengths, alive_seq, alive_lp, finished_seq,
                finished_scores, sentence, rest)  # fmt: skip

    def cond(step, out, index, *_):
        return tf.logical_and(step < length, tf.size(index) > 0)

    state = (tf.range(batch), max_lengths, alive_seq, alive_lp, finished_seq, finished_scores)
    state += (sentence, rest)
    result = tf.while_loop(
        cond,
        body,
        (tf.constant(0), out, *state),
        shape_invariants=(tf.TensorShape([]), _nest_shapes(out), *_free_batch(state)),
    )
    out, index = result[1], result[2]
    # every sentence settles by its maximum length; this only guards the loop's last step
    out = _settle(out, index, tf.ones_like(index, tf.bool), list(result[6:8]))
    return out[0][:, :, 1:], out[1]
