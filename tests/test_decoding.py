import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding import beam_search, greedy_search, length_penalty

BOS, EOS, A, B = 2, 3, 4, 5
V = 6


def table_step_fn(probs_by_prev):
    """Step function from a table: next-token probabilities given the previous token."""
    logits = tf.math.log(tf.constant(probs_by_prev, tf.float32) + 1e-12)

    def step_fn(ids, step, cache):
        return tf.gather(logits, ids), cache

    return step_fn


def greedy_trap():
    """Greedy takes A (0.6) then eos (0.08) = 0.048; beam finds B (0.4) then eos (0.135) = 0.054."""
    probs = np.full((V, V), 1e-6)
    probs[BOS, [A, B]] = [0.6, 0.4]
    probs[A, [EOS, B]] = [0.08, 0.92]
    probs[B, [EOS, A]] = [0.135, 0.865]
    return table_step_fn(probs)


def test_beam_search_escapes_the_greedy_trap():
    step_fn = greedy_trap()
    bos = tf.constant([BOS])
    max_lengths = tf.constant([2])  # eos is forced at the second position
    greedy, greedy_lp = greedy_search(step_fn, bos, {}, max_lengths, EOS)
    np.testing.assert_array_equal(greedy, [[A, EOS]])
    assert float(greedy_lp[0]) == pytest.approx(math.log(0.048), abs=1e-4)
    seqs, scores = beam_search(step_fn, bos, {}, max_lengths, EOS, beam_size=2, alpha=0.0)
    np.testing.assert_array_equal(seqs[0, 0], [B, EOS])
    assert float(scores[0, 0]) == pytest.approx(math.log(0.054), abs=1e-4)
    np.testing.assert_array_equal(seqs[0, 1], [A, EOS])  # n-best: the runner-up, scored
    assert float(scores[0, 1]) == pytest.approx(math.log(0.048), abs=1e-4)


def test_length_penalty_formula():
    assert float(length_penalty(10, 0.6)) == pytest.approx(((5 + 10) / 6) ** 0.6)
    assert float(length_penalty(7, 0.0)) == 1.0


def second_order_step_fn(table):
    """logits = table[prev, current]: needs the cache (prev token) reordered with the beams."""
    logits = tf.constant(table, tf.float32)

    def step_fn(ids, step, cache):
        prev = cache["decoder"]["prev"]
        out = tf.gather_nd(logits, tf.stack([prev, ids], axis=1))
        return out, {"decoder": {"prev": ids}, "static": cache["static"]}

    return step_fn


def brute_force_best(table, length, alpha):
    log_probs = table - np.log(np.exp(table).sum(-1, keepdims=True))
    best = (-np.inf, None)
    for n in range(1, length + 1):
        for body in itertools.product([t for t in range(V) if t != EOS], repeat=n - 1):
            seq, prev, cur, total = list(body) + [EOS], BOS, BOS, 0.0
            for position, token in enumerate(seq):
                lp = log_probs[prev, cur].copy()
                if position + 1 >= length:
                    lp[np.arange(V) != EOS] = -np.inf
                total += lp[token]
                prev, cur = cur, token
            normalized = total / ((5 + n) / 6) ** alpha
            best = max(best, (normalized, tuple(seq)))
    return best


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_exhaustive_beam_equals_brute_force(alpha):
    rng = np.random.default_rng(0)
    table = rng.normal(scale=2.0, size=(V, V, V)).astype(np.float32)
    cache = {"decoder": {"prev": tf.constant([BOS])}, "static": {"unused": tf.zeros([1, 3])}}
    seqs, scores = beam_search(
        second_order_step_fn(table),
        tf.constant([BOS]),
        cache,
        tf.constant([4]),
        EOS,
        beam_size=16,
        alpha=alpha,
    )
    expected_score, expected_seq = brute_force_best(table, 4, alpha)
    got = tuple(int(t) for t in seqs[0, 0].numpy()[: len(expected_seq)])
    assert got == expected_seq
    assert float(scores[0, 0]) == pytest.approx(expected_score, abs=1e-4)


def test_beam_one_equals_greedy():
    rng = np.random.default_rng(1)
    table = rng.normal(scale=1.5, size=(V, V)).astype(np.float32)
    step_fn = table_step_fn(np.exp(table))
    bos = tf.fill([5], BOS)
    max_lengths = tf.constant([3, 5, 8, 2, 6])
    greedy, _ = greedy_search(step_fn, bos, {}, max_lengths, EOS)
    beam, _ = beam_search(step_fn, bos, {}, max_lengths, EOS, beam_size=1, alpha=0.0)
    np.testing.assert_array_equal(beam[:, 0], greedy)


def test_finished_hypotheses_are_kept():
    """eos right away (0.5) beats every longer continuation, which only get worse."""
    probs = np.full((V, V), 1e-6)
    probs[BOS, [EOS, A]] = [0.5, 0.5]
    probs[A, [A, EOS]] = [0.7, 0.3]
    seqs, scores = beam_search(
        table_step_fn(probs), tf.constant([BOS]), {}, tf.constant([10]), EOS, beam_size=2, alpha=0.0
    )
    np.testing.assert_array_equal(seqs[0, 0, :1], [EOS])
    assert float(scores[0, 0]) == pytest.approx(math.log(0.5), abs=1e-4)


def test_empty_batch():
    seqs, scores = beam_search(
        greedy_trap(), tf.zeros([0], tf.int32), {}, tf.zeros([0], tf.int32), EOS
    )
    assert seqs.shape[0] == 0 and scores.shape == (0, 4)
