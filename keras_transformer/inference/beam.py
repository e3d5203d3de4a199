"""The beam bookkeeping both searches share (search.py's loop and xla_search.py's segments):
the hypotheses before the first step, the per-sentence options, and what one step does with
its candidates: the 2K best extensions, the finished pool, the K alive beams, the stop rules'
counts and the stopping bound (see `search.beam_search` for the rules).

Shapes: b live sentences, K beam size, L maximum decode length, V vocabulary.
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.config import STOP_RULES
from keras_transformer.inference import batch_rows as br
from keras_transformer.inference.candidates import NEG_INF

__all__ = [
    "STOP_EXACT", "STOP_FINISHED", "STOP_TOP", "advance", "alive_beams", "can_improve",
    "count_finished", "ended_scores", "finished_pool", "length_penalty", "sentence_options",
    "start", "stop_rule_code", "top_extensions",
]  # fmt: skip

# the stop rules' codes (config.STOP_RULES in order), see `search.beam_search`
STOP_EXACT, STOP_FINISHED, STOP_TOP = range(len(STOP_RULES))


def stop_rule_code(name: str) -> int:
    """The code of a stop rule named in config.STOP_RULES."""
    if name not in STOP_RULES:
        raise ValueError(f"stop_rule must be one of {', '.join(STOP_RULES)}, got {name!r}")
    return STOP_RULES.index(name)


def length_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016)."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, tf.cast(alpha, tf.float32))


def start(initial_ids, k, length):
    """The hypotheses before the first step: (alive sequences (B, K, L + 1), bos first;
    their log-probs (B, K); finished sequences; finished scores (B, K) NEG_INF)."""
    batch = tf.shape(initial_ids)[0]
    alive_seq = tf.zeros([batch, k, length + 1], tf.int32)
    alive_seq = br.write(alive_seq, 0, tf.tile(initial_ids[:, tf.newaxis], [1, k]))
    # only the first beam is live at step 0, so the K beams do not start as copies
    alive_lp = tf.tile(tf.concat([[0.0], tf.fill([k - 1], NEG_INF)], 0)[tf.newaxis], [batch, 1])
    return alive_seq, alive_lp, tf.zeros_like(alive_seq), tf.fill([batch, k], NEG_INF)


def sentence_options(
    initial_ids, max_lengths, beam_size, alpha, prefix, sampling, num_best, stop_rule=STOP_EXACT
):
    """Per live sentence, gathered as sentences leave: its options, where it sits in the
    batch and what its stop rule counts, (B, ...) each."""
    batch = tf.shape(initial_ids)[0]
    if prefix is None:
        prefix = tf.zeros([batch, 0], tf.int32)
    per = {
        "index": tf.range(batch),
        "max_length": tf.convert_to_tensor(max_lengths, tf.int32),
        "beams": br.per_sentence(beam_size, batch, tf.int32),
        # the finished hypothesis (0-based rank) no live beam may still beat
        "nth": br.per_sentence(beam_size if num_best is None else num_best, batch, tf.int32),
        "alpha": br.per_sentence(alpha, batch, tf.float32),
        # one -1 column after the longest prefix, read once every prefix is done
        "prefix": tf.pad(
            tf.convert_to_tensor(prefix, tf.int32), [[0, 0], [0, 1]], constant_values=-1
        ),
        "sampling": sampling or {},
        "stop_rule": br.per_sentence(stop_rule, batch, tf.int32),
        # eos counted among the top-K candidates so far (STOP_FINISHED)
        "finished_count": tf.zeros([batch], tf.int32),
        # the best candidate of a step was eos (STOP_TOP)
        "top_finished": tf.zeros([batch], tf.bool),
    }
    per["nth"] = tf.clip_by_value(per["nth"], 1, tf.maximum(per["beams"], 1)) - 1
    return per


def advance(hypotheses, row_lp, row_ids, step, per, k, per_beam, eos_id):
    """One step's bookkeeping, from each row's `per_beam` best candidates (row_lp, row_ids
    (b K, per_beam)): (`per` with the stop rules' counts, the hypotheses after the step
    (alive_seq, alive_lp, finished_seq, finished_scores), the origin beam (b, K) of each
    alive beam)."""
    alive_seq, alive_lp, finished_seq, finished_scores = hypotheses
    live = tf.shape(alive_seq)[0]
    rank = tf.range(2 * k)[tf.newaxis, :]
    top_lp, origin, top_seq, is_eos = top_extensions(
        alive_seq, alive_lp, row_lp, row_ids, step, live, k, per_beam, eos_id
    )
    beams = per["beams"][:, tf.newaxis]
    # extensions of beams never alive, and beyond a sentence's own 2K
    dead = tf.logical_or(top_lp <= NEG_INF / 2, rank >= 2 * beams)
    top_lp = tf.where(dead, NEG_INF, top_lp)
    ended = ended_scores(top_lp, is_eos, dead, rank, beams, step, per["alpha"])
    per = count_finished(per, is_eos, dead, rank, beams)
    finished_scores, finished_seq = finished_pool(finished_scores, finished_seq, ended, top_seq, k)
    alive_lp, alive_seq, beam_origin = alive_beams(top_lp, top_seq, origin, is_eos, rank, beams, k)
    return per, (alive_seq, alive_lp, finished_seq, finished_scores), beam_origin


def top_extensions(alive_seq, alive_lp, row_lp, row_ids, step, live, k, per_beam, eos_id):
    """The 2K best extensions of each sentence: log-probs, origin beams, sequences, eos (b, 2K)."""
    scores = alive_lp[:, :, tf.newaxis] + tf.reshape(row_lp, [live, k, per_beam])
    top_lp, top_index = tf.math.top_k(tf.reshape(scores, [live, -1]), k=2 * k)  # (b, 2K)
    origin = top_index // per_beam
    token = tf.gather(tf.reshape(row_ids, [live, -1]), top_index, batch_dims=1)
    top_seq = br.write(tf.gather(alive_seq, origin, batch_dims=1), step + 1, token)
    return top_lp, origin, top_seq, tf.equal(token, eos_id)


def ended_scores(top_lp, is_eos, dead, rank, beams, step, alpha):
    """(b, 2K) scores of the extensions that enter the finished pool; NEG_INF the others."""
    # eos among the 2K candidates (among the best one only at K = 1)
    window = tf.where(beams > 1, 2 * beams, 1)
    new_finished = tf.logical_and(tf.logical_and(is_eos, rank < window), tf.logical_not(dead))
    penalty = length_penalty(step + 1, alpha)[:, tf.newaxis]
    return tf.where(new_finished, top_lp / penalty, NEG_INF)


def alive_beams(top_lp, top_seq, origin, is_eos, rank, beams, k):
    """The K best extensions of each sentence that did not end: log-probs, sequences, origins."""
    alive_lp, keep = tf.math.top_k(tf.where(is_eos, NEG_INF, top_lp), k=k)
    alive_lp = tf.where(rank[:, :k] < beams, alive_lp, NEG_INF)
    alive_seq = tf.gather(top_seq, keep, batch_dims=1)
    return alive_lp, alive_seq, tf.gather(origin, keep, batch_dims=1)


def finished_pool(finished_scores, finished_seq, scores, sequences, k):
    """The pool after a step: the K best of the finished hypotheses (b, K) so far and the
    step's candidates (b, 2K) (NEG_INF where they do not enter it): (scores (b, K),
    sequences (b, K, L + 1)). The earlier hypothesis ranks first on ties."""
    pool_scores = tf.concat([finished_scores, scores], axis=1)
    pool_seq = tf.concat([finished_seq, sequences], axis=1)
    finished_scores, keep = tf.math.top_k(pool_scores, k=k)
    return finished_scores, tf.gather(pool_seq, keep, batch_dims=1)


def count_finished(per, is_eos, dead, rank, beams):
    """`per` with this step's finished hypotheses counted for the stop rules (b, 2K inputs):
    the eos among the sentence's K best candidates, and whether the best one is eos."""
    ended = tf.logical_and(is_eos, tf.logical_not(dead))
    counted = tf.logical_and(ended, rank < beams)
    return {
        **per,
        "finished_count": per["finished_count"] + tf.reduce_sum(tf.cast(counted, tf.int32), 1),
        "top_finished": tf.logical_or(per["top_finished"], ended[:, 0]),
    }


def can_improve(alive_lp, finished_scores, per, stop_early):
    """(b,) bool: a live beam of the sentence can still beat its n-th best finished
    hypothesis (the bound of beam_search's docstring: log-probs only fall, the penalty is
    largest at the max length) and the sentence's stop rule has not fired; always, while it
    has a live beam, if not `stop_early`."""
    best_alive = alive_lp[:, 0] / length_penalty(per["max_length"], per["alpha"])
    to_beat = tf.gather(finished_scores, per["nth"], batch_dims=1)
    rule = per["stop_rule"]
    k_finished = tf.logical_and(
        tf.equal(rule, STOP_FINISHED), per["finished_count"] >= per["beams"]
    )
    top_finished = tf.logical_and(
        tf.equal(rule, STOP_TOP), tf.logical_and(per["top_finished"], to_beat > NEG_INF / 2)
    )
    go_on = tf.logical_and(
        best_alive >= to_beat, tf.logical_not(tf.logical_or(k_finished, top_finished))
    )
    return tf.logical_and(alive_lp[:, 0] > NEG_INF / 2, tf.logical_or(go_on, not stop_early))
