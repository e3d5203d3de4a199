"""The beam bookkeeping both searches share (search.py's loop and xla_search.py's segments):
the hypotheses before the first step, the per-sentence options, and what one step does with
its candidates: the 2K best extensions, the finished pool, the K alive beams, the stop rules'
counts and the stopping bound. The rules, as `search.beam_search` applies them:

Alive and finished hypotheses are kept apart. At every step the 2K best extensions of the
alive beams are ranked; those ending in eos (among all 2K, as in tensor2tensor's and Model
Garden's beam search) join the finished pool (scored log p / length_penalty), the K best
others stay alive. A sentence is settled, and leaves the batch, when none of its alive
hypotheses can still beat the n-th best of its finished ones (n = `num_best`, the hypotheses
the caller keeps), or at its maximum length, where eos is forced. K = 1 is greedy search: only
the best extension counts (with alpha 0 this is the most probable token at every step, as
CTranslate2's beam 1).

The stopping bound, exact for the GNMT penalty lp(m) = ((5 + m) / 6) ** alpha: a live beam
with log-probability s <= 0 after l tokens can only finish at a length m in (l, L] (L: the
sentence's maximum length, eos included) with a log-probability s' <= s (every token, forced
or not, adds log p <= 0), so its final score is at most max over m in (l, L] of s / lp(m).
For alpha > 0, lp grows with m and s <= 0, so that maximum is s / lp(L); for alpha = 0 it is
s. No tighter bound holds for every model (the next tokens may all have probability near 1,
and the beam may end exactly at L), and the best live beam has the largest s, so it alone
decides. Every finished hypothesis comes from a live beam, so once the bound is below the
n-th best finished score, the n best are final: they equal those of the exhaustive search
(`stop_early=False`), ties included (the pool's top-k keeps an earlier hypothesis first). The
hypotheses ranked after n (still returned, K in all) are then the best found so far, not
necessarily those of a search that waits for all K.

Two faster stop rules may be asked for (`stop_rule`), each settling a sentence at the earlier
of the exact bound and its own condition, so never later than the exact rule; the finished
pool is the same, only the step at which it is read changes, so a rule's n best may differ
from the exact rule's (scores never higher: the pool only improves), and only in sentences
where its condition fires first:
  - STOP_FINISHED ("finished", CTranslate2's rule with a length penalty): once K hypotheses
    have finished, counting, at every step, the eos among the sentence's K best candidates
    only (under "tensor2tensor", the eos ranked in (K, 2K] still enter the pool, uncounted);
  - STOP_TOP ("top", CTranslate2's rule without one): once the best candidate of some step
    was eos and n hypotheses have finished. At alpha 0 and n = 1 this is the exact rule (that
    eos beats every live beam already).

The finish rule (`finish_rule`, config.FINISH_RULES) says which candidates finish and how
they are scored; "tensor2tensor" (the default) is the above. FINISH_CTRANSLATE2
("ctranslate2") is CTranslate2's `BeamSearch::search` (src/decoding.cc, v4.x), step by step:
only the eos among the K best candidates finish (the eos ranked in (K, 2K] are dropped, alive
or finished); at the maximum length the K best candidates finish whatever their token (no eos
is forced); a finished hypothesis scores log p / length ** alpha, eos counted in its length
(`finalize_hypothesis_score`; CTranslate2 drops eos after scoring); before `min_length`, log-probabilities are renormalized without
eos (candidates.py). The alive beams are the same under both: the K best non-eos of the 2K
(CTranslate2 refills a finished beam's slot from candidates K+1.. in order). With stop rule
"top" at alpha 0, or "finished" otherwise (CTranslate2's early exit and its patience 1), the
n best are CTranslate2's (the exact bound, under length ** alpha, may settle a sentence
earlier, never changing its n best).

Every option may differ per sentence: a sentence with a smaller K keeps only its first K
alive beams and its 2K best extensions, so its result is the one it gets alone, whatever else
is in the batch.

Shapes: b live sentences, K beam size, L maximum decode length, V vocabulary.
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.config import FINISH_RULES, STOP_RULES
from keras_transformer.inference import batch_rows as br
from keras_transformer.inference.candidates import NEG_INF

__all__ = [
    "FINISH_CTRANSLATE2", "FINISH_TENSOR2TENSOR", "STOP_EXACT", "STOP_FINISHED", "STOP_TOP",
    "advance", "alive_beams", "can_improve", "count_finished", "ended_scores", "finish_rule_code",
    "finished_pool", "hypothesis_penalty", "length_penalty", "sentence_options", "start",
    "stop_rule_code", "top_extensions",
]  # fmt: skip

# the stop rules' codes (config.STOP_RULES in order), see the module docstring
STOP_EXACT, STOP_FINISHED, STOP_TOP = range(len(STOP_RULES))
# the finish rules' codes (config.FINISH_RULES in order), see the module docstring
FINISH_TENSOR2TENSOR, FINISH_CTRANSLATE2 = range(len(FINISH_RULES))


def stop_rule_code(name: str) -> int:
    """The code of a stop rule named in config.STOP_RULES."""
    if name not in STOP_RULES:
        raise ValueError(f"stop_rule must be one of {', '.join(STOP_RULES)}, got {name!r}")
    return STOP_RULES.index(name)


def finish_rule_code(name: str) -> int:
    """The code of a finish rule named in config.FINISH_RULES."""
    if name not in FINISH_RULES:
        raise ValueError(f"finish_rule must be one of {', '.join(FINISH_RULES)}, got {name!r}")
    return FINISH_RULES.index(name)


def length_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016)."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, tf.cast(alpha, tf.float32))


def hypothesis_penalty(length, alpha, ctranslate2):
    """The length penalty of each finish rule, broadcast together: GNMT's (`length_penalty`)
    or, where `ctranslate2` (bool), CTranslate2's length ** alpha (decoding.cc,
    `finalize_hypothesis_score`)."""
    plain = tf.pow(tf.cast(length, tf.float32), tf.cast(alpha, tf.float32))
    return tf.where(ctranslate2, plain, length_penalty(length, alpha))


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
    initial_ids, max_lengths, beam_size, alpha, prefix, sampling, num_best, stop_rule=STOP_EXACT,
    finish_rule=FINISH_TENSOR2TENSOR,
):  # fmt: skip
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
        "ctranslate2": tf.equal(br.per_sentence(finish_rule, batch, tf.int32), FINISH_CTRANSLATE2),
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
    ended = ended_scores(top_lp, is_eos, dead, rank, beams, step, per)
    per = count_finished(per, is_eos, dead, rank, beams)
    finished_scores, finished_seq = finished_pool(finished_scores, finished_seq, ended, top_seq, k)
    alive_lp, alive_seq, beam_origin = alive_beams(top_lp, top_seq, origin, is_eos, rank, beams, k)
    # none stays alive past its sentence's maximum length (under "tensor2tensor" eos was
    # forced there, so none is alive anyway)
    alive_lp = tf.where((step + 1 >= per["max_length"])[:, tf.newaxis], NEG_INF, alive_lp)
    return per, (alive_seq, alive_lp, finished_seq, finished_scores), beam_origin


def top_extensions(alive_seq, alive_lp, row_lp, row_ids, step, live, k, per_beam, eos_id):
    """The 2K best extensions of each sentence: log-probs, origin beams, sequences, eos (b, 2K)."""
    scores = alive_lp[:, :, tf.newaxis] + tf.reshape(row_lp, [live, k, per_beam])
    top_lp, top_index = tf.math.top_k(tf.reshape(scores, [live, -1]), k=2 * k)  # (b, 2K)
    origin = top_index // per_beam
    token = tf.gather(tf.reshape(row_ids, [live, -1]), top_index, batch_dims=1)
    top_seq = br.write(tf.gather(alive_seq, origin, batch_dims=1), step + 1, token)
    return top_lp, origin, top_seq, tf.equal(token, eos_id)


def ended_scores(top_lp, is_eos, dead, rank, beams, step, per):
    """(b, 2K) scores of the extensions that enter the finished pool; NEG_INF the others.

    "tensor2tensor": the eos among the 2K candidates (the best one only at K = 1), over
    GNMT's penalty of their length, eos included. "ctranslate2" (decoding.cc,
    `BeamSearch::search`: its loop over the beam_size first candidates): the eos among the
    K candidates, and at the maximum length all K whatever their token, over length ** alpha
    (eos counted: include_eos_in_hypotheses, true for translations)."""
    ct2 = per["ctranslate2"][:, tf.newaxis]
    last = (step + 1 >= per["max_length"])[:, tf.newaxis]
    window = tf.where(beams > 1, tf.where(ct2, beams, 2 * beams), 1)
    ends = tf.logical_or(is_eos, tf.logical_and(ct2, last))
    new_finished = tf.logical_and(tf.logical_and(ends, rank < window), tf.logical_not(dead))
    penalty = hypothesis_penalty(step + 1, per["alpha"][:, tf.newaxis], ct2)
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
    hypothesis (the bound of the module docstring: log-probs only fall, the penalty is
    largest at the max length) and the sentence's stop rule has not fired; always, while it
    has a live beam, if not `stop_early`."""
    # the longest hypothesis: max_length tokens, eos included ("ctranslate2": a last token
    # that is not eos counts too)
    best_alive = alive_lp[:, 0] / hypothesis_penalty(
        per["max_length"], per["alpha"], per["ctranslate2"]
    )
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
