import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.inference import search
from keras_transformer.inference.search import beam_search, length_penalty, sample
from tests.inference import reference

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
    greedy, greedy_lp = beam_search(step_fn, bos, {}, max_lengths, EOS, beam_size=1, alpha=0.0)
    np.testing.assert_array_equal(greedy[:, 0], [[A, EOS]])
    assert float(greedy_lp[0, 0]) == pytest.approx(math.log(0.048), abs=1e-4)
    seqs, scores = beam_search(step_fn, bos, {}, max_lengths, EOS, beam_size=2, alpha=0.0)
    np.testing.assert_array_equal(seqs[0, 0], [B, EOS])
    assert float(scores[0, 0]) == pytest.approx(math.log(0.054), abs=1e-4)
    np.testing.assert_array_equal(seqs[0, 1], [A, EOS])  # n-best: the runner-up, scored
    assert float(scores[0, 1]) == pytest.approx(math.log(0.048), abs=1e-4)


def test_length_penalty_formula():
    assert float(length_penalty(10, 0.6)) == pytest.approx(((5 + 10) / 6) ** 0.6)
    assert float(length_penalty(7, 0.0)) == 1.0


def second_order_step_fn(table):
    """logits = table[prev, current] + a per-sentence bias: the cache (prev token) must follow the
    beams; the bias, a "sentence" entry (one row per sentence, shared by its beams), must
    follow the sentences as they leave the batch."""
    logits = tf.convert_to_tensor(table, tf.float32)  # a tensor too, in a graph

    def step_fn(ids, step, cache):
        prev, bias = cache["decoder"]["prev"], cache["sentence"]["bias"]
        bias = tf.repeat(bias, tf.shape(ids)[0] // tf.shape(bias)[0], axis=0)  # per beam
        out = tf.gather_nd(logits, tf.stack([prev, ids], axis=1)) + bias
        return out, {"decoder": {"prev": ids}, "sentence": cache["sentence"]}

    return step_fn


def brute_force(table, bias, length, alpha, vocab):
    """Every sequence of at most `length` tokens ending in eos, best first: (score, tokens)."""
    logits = table + bias
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    scored = []
    for n in range(1, length + 1):
        for body in itertools.product([t for t in range(vocab) if t != EOS], repeat=n - 1):
            prev, cur, total = BOS, BOS, 0.0
            for token in (*body, EOS):
                total += log_probs[prev, cur, token]
                prev, cur = cur, token
            scored.append((total / ((5 + n) / 6) ** alpha, (*body, EOS)))
    return sorted(scored, reverse=True)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_beam_search_equals_brute_force_over_every_sequence(alpha):
    """Vocabulary 4, at most 4 tokens: 40 sequences. With K = 36 every candidate of every
    step ranks within the top K, so the search is exact and its n-best list must be the
    brute-force top 36, in order, with the same scores."""
    vocab, length, k = 4, 4, 36
    rng = np.random.default_rng(0)
    table = rng.normal(scale=2.0, size=(vocab, vocab, vocab)).astype(np.float32)
    bias = rng.normal(size=(vocab,)).astype(np.float32)
    cache = {"decoder": {"prev": tf.constant([BOS])}, "sentence": {"bias": tf.constant([bias])}}
    seqs, scores = beam_search(
        second_order_step_fn(table),
        tf.constant([BOS]),
        cache,
        tf.constant([length]),
        EOS,
        beam_size=k,
        alpha=alpha,
    )
    expected = brute_force(table, bias, length, alpha, vocab)
    assert len(expected) == 40
    for (score, tokens), got_seq, got_score in zip(expected[:k], seqs[0].numpy(), scores[0]):
        assert tuple(got_seq[: len(tokens)]) == tokens
        assert not got_seq[len(tokens) :].any()  # 0 after eos
        assert float(got_score) == pytest.approx(score, abs=1e-4)


@pytest.mark.parametrize("beam_size, alpha", [(1, 0.0), (3, 0.6)])
def test_batch_equals_sentences_one_by_one(beam_size, alpha):
    """Sentences settle at different steps and leave the batch; each one's result (and its
    per-sentence cache) must be what it gets alone."""
    rng = np.random.default_rng(3)
    table = rng.normal(scale=1.5, size=(V, V, V)).astype(np.float32)
    bias = rng.normal(scale=2.0, size=(5, V)).astype(np.float32)
    bias[1, EOS] = 4.0  # ends early
    max_lengths = np.array([3, 6, 8, 1, 5], np.int32)

    def run(rows):
        cache = {
            "decoder": {"prev": tf.fill([len(rows)], BOS)},
            "sentence": {"bias": tf.constant(bias[rows])},
        }
        args = (second_order_step_fn(table), tf.fill([len(rows)], BOS), cache)
        lengths = tf.constant(max_lengths[rows])
        return beam_search(*args, lengths, EOS, beam_size=beam_size, alpha=alpha)

    batch_seqs, batch_scores = run(list(range(5)))
    for i in range(5):
        seqs, scores = run([i])
        width = seqs.shape[-1]
        np.testing.assert_array_equal(batch_seqs[i, ..., :width], seqs[0])
        assert not np.any(batch_seqs[i, ..., width:])
        np.testing.assert_allclose(batch_scores[i], scores[0], atol=1e-5)
        ends = np.argmax(np.asarray(seqs[0]).reshape(-1, width) == EOS, axis=-1)
        assert np.all(ends < max_lengths[i])  # eos at or before the sentence's max length


def test_beam_size_can_be_a_tensor():
    rng = np.random.default_rng(1)
    table = rng.normal(scale=1.5, size=(V, V, V)).astype(np.float32)
    cache = {"decoder": {"prev": tf.constant([BOS])}, "sentence": {"bias": tf.zeros([1, V])}}
    args = (second_order_step_fn(table), tf.constant([BOS]), cache, tf.constant([5]), EOS)
    fn = tf.function(lambda k: beam_search(*args, beam_size=k, alpha=0.6))
    for k in (1, 3):
        seqs, scores = fn(tf.constant(k))
        expected_seqs, expected_scores = beam_search(*args, beam_size=k, alpha=0.6)
        assert seqs.shape[1] == k
        np.testing.assert_array_equal(seqs, expected_seqs)
        np.testing.assert_allclose(scores, expected_scores, atol=1e-6)


@pytest.mark.parametrize("min_length", [None, 3])
def test_beam_one_equals_greedy(min_length):
    """Beam 1 with alpha 0 is greedy search, against a plain loop that takes the argmax at
    every step: the same tokens and log-probabilities."""
    rng = np.random.default_rng(1)
    table = rng.normal(scale=1.5, size=(V, V, V)).astype(np.float32)
    bias = rng.normal(scale=2.0, size=(5, V)).astype(np.float32)
    bias[:, EOS] += 1.0  # some sentences end before their max length
    max_lengths = np.array([3, 5, 8, 2, 6], np.int32)

    def cache():
        return {"decoder": {"prev": tf.fill([5], BOS)}, "sentence": {"bias": tf.constant(bias)}}

    args = (second_order_step_fn(table), tf.fill([5], BOS))
    expected, expected_lp = reference.greedy(*args, cache(), max_lengths, EOS, min_length)
    beam, lp = beam_search(
        *args, cache(), max_lengths, EOS, beam_size=1, alpha=0.0, min_length=min_length
    )
    np.testing.assert_array_equal(beam[:, 0], expected)
    np.testing.assert_allclose(lp[:, 0], expected_lp, atol=1e-5)
    assert ((expected == EOS).argmax(-1) < max_lengths - 1).any()  # eos chosen, not forced


def test_alpha_trades_probability_for_length():
    """[eos] has log p -1.20; [A x 9, eos] has -3.50 but length 10: alpha 0 picks the first,
    alpha 1.5 divides the second by (15/6)^1.5 = 3.95 (-0.89) and picks it."""
    probs = np.full((V, V), 1e-9)
    probs[BOS, [EOS, A]] = [0.3, 0.7]
    probs[A, [A, EOS]] = [0.9, 0.1]
    args = (table_step_fn(probs), tf.constant([BOS]), {}, tf.constant([10]), EOS)
    short, short_score = beam_search(*args, beam_size=2, alpha=0.0)
    long, long_score = beam_search(*args, beam_size=2, alpha=1.5)
    np.testing.assert_array_equal(short[0, 0, :1], [EOS])
    assert float(short_score[0, 0]) == pytest.approx(math.log(0.3), abs=1e-4)
    np.testing.assert_array_equal(long[0, 0], [A] * 9 + [EOS])
    expected = (math.log(0.7) + 8 * math.log(0.9) + math.log(0.1)) / (15 / 6) ** 1.5
    assert float(long_score[0, 0]) == pytest.approx(expected, abs=1e-4)


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


@pytest.mark.parametrize("vocab, count", [(8000, 8), (1000, 3), (300, 128), (6, 4)])
def test_two_stage_top_k_equals_top_k(vocab, count):
    from keras_transformer.inference.candidates import row_top_k as _row_top_k

    rng = np.random.default_rng(vocab)
    logits = rng.normal(size=(5, vocab)).astype(np.float32)
    logits[0, :200] = logits[0, 0]  # ties in one block do not break it
    count = min(count, vocab)
    values, ids, row_max = _row_top_k(tf.constant(logits), tf.constant(count))
    expected_values, _ = tf.math.top_k(logits, k=count)
    np.testing.assert_array_equal(values, expected_values)
    np.testing.assert_array_equal(np.take_along_axis(logits, ids.numpy(), 1), values)
    assert all(len(set(row)) == count for row in ids.numpy().tolist())
    np.testing.assert_array_equal(row_max[:, 0], logits.max(-1))


@pytest.mark.parametrize("beam_size", [1, 2])
def test_min_length_keeps_eos_out_until_then_without_renormalizing(beam_size):
    """eos is not a candidate before min_length; the other tokens keep their own
    log-probabilities (eos is dropped after the log-softmax, as CTranslate2 does)."""
    probs = np.full((V, V), 1e-6)
    probs[BOS, [EOS, A]] = [0.7, 0.3]
    probs[A, [EOS, B]] = [0.9, 0.1]
    probs[B, EOS] = 1.0
    step_fn = table_step_fn(probs)
    lp = np.log(probs + 1e-12)
    expected = {
        None: ([EOS], lp[BOS, EOS]),
        2: ([A, EOS], lp[BOS, A] + lp[A, EOS]),
        3: ([A, B, EOS], lp[BOS, A] + lp[A, B] + lp[B, EOS]),
    }
    for min_length, (tokens, score) in expected.items():
        args = (step_fn, tf.constant([BOS]), {}, tf.constant([5]), EOS)
        seqs, scores = beam_search(*args, beam_size=beam_size, alpha=0.0, min_length=min_length)
        seqs, scores = seqs[:, 0], scores[:, 0]
        np.testing.assert_array_equal(seqs[0, : len(tokens)], tokens)
        assert not np.any(seqs[0, len(tokens) :])
        assert float(scores[0]) == pytest.approx(score, abs=1e-4)


def reference_beam(log_probs, k, alpha, length, vocab, window, stop=None, num_best=None):
    """The rule of tensor2tensor's and Model Garden's beam search, written out over a
    vocabulary small enough to list: every step ranks the 2K best extensions of the alive
    beams; an eos among the first `window` of them enters the finished pool, the K best
    others stay alive; no early stop by default (the exact one never changes the result).
    `stop`: "finished" ends the search once K eos have been counted among the first K of the
    steps' candidates, "top" once the first candidate of a step was eos and `num_best`
    hypotheses have finished (CTranslate2's rules). (score, tokens) best first.
    """
    alive, finished = [((), 0.0)], []
    counted, top_finished = 0, False
    for step in range(length):
        candidates = []
        for seq, lp in alive:
            row = log_probs(seq)
            tokens = [EOS] if step + 1 >= length else range(vocab)
            candidates += [(seq + (t,), lp + row[t]) for t in tokens]
        top = sorted(candidates, key=lambda c: -c[1])[: 2 * k]
        penalty = ((5 + step + 1) / 6) ** alpha
        finished += [
            (lp / penalty, seq) for i, (seq, lp) in enumerate(top[:window]) if seq[-1] == EOS
        ]
        alive = [c for c in top if c[0][-1] != EOS][:k]
        counted += sum(seq[-1] == EOS for seq, _ in top[:k])
        top_finished = top_finished or top[0][0][-1] == EOS
        if stop == "finished" and counted >= k:
            break
        if stop == "top" and top_finished and len(finished) >= num_best:
            break
    return sorted(finished, reverse=True)[:k]


def table_log_probs(table, bias):
    logits = table + bias
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))

    def fn(seq):
        prev, cur = ((BOS, BOS) + seq)[-2:]
        return log_probs[prev, cur]

    return fn


def test_eos_ranked_beyond_k_enters_the_finished_pool():
    """Against the brute-force rule (eos among all 2K candidates, K = 2): the search's n-best
    list and scores are the reference's. The seeds are chosen where the old rule (eos only
    within the top K) gives another list, so the test tells the two apart."""
    vocab, length, k, alpha = 5, 5, 2, 0.6
    differs = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        table = rng.normal(scale=2.0, size=(vocab, vocab, vocab)).astype(np.float32)
        bias = rng.normal(size=(vocab,)).astype(np.float32)
        fn = table_log_probs(table, bias)
        expected = reference_beam(fn, k, alpha, length, vocab, window=2 * k)
        differs += expected != reference_beam(fn, k, alpha, length, vocab, window=k)
        cache = {"decoder": {"prev": tf.constant([BOS])}, "sentence": {"bias": tf.constant([bias])}}
        seqs, scores = beam_search(
            second_order_step_fn(table), tf.constant([BOS]), cache, tf.constant([length]), EOS,
            beam_size=k, alpha=alpha,
        )  # fmt: skip
        for (score, tokens), got_seq, got_score in zip(expected, seqs[0].numpy(), scores[0]):
            assert tuple(got_seq[: len(tokens)]) == tokens
            assert float(got_score) == pytest.approx(score, abs=1e-4)
    assert differs >= 1


def test_prefix_search_equals_brute_force_over_the_sequences_it_starts():
    """Every hypothesis starts with the prefix, the prefix's log-probability counts: with K
    large enough to be exact, the n-best list is the brute-force list of the sequences that
    start with the prefix (vocabulary 4, prefix (A,), at most 4 tokens: 13 sequences)."""
    vocab, length, k, alpha = 4, 4, 13, 0.6
    rng = np.random.default_rng(5)
    table = rng.normal(scale=2.0, size=(vocab, vocab, vocab)).astype(np.float32)
    bias = rng.normal(size=(vocab,)).astype(np.float32)
    bias[EOS] += 3.0  # without the prefix the best output is eos alone
    expected = [e for e in brute_force(table, bias, length, alpha, vocab) if e[1][0] == 0]
    assert len(expected) == k
    cache = {"decoder": {"prev": tf.constant([BOS])}, "sentence": {"bias": tf.constant([bias])}}
    seqs, scores = beam_search(
        second_order_step_fn(table), tf.constant([BOS]), cache, tf.constant([length]), EOS,
        beam_size=k, alpha=alpha, prefix=tf.constant([[0]]),
    )  # fmt: skip
    for (score, tokens), got_seq, got_score in zip(expected, seqs[0].numpy(), scores[0]):
        assert tuple(got_seq[: len(tokens)]) == tokens
        assert float(got_score) == pytest.approx(score, abs=1e-4)


def test_per_sentence_options_give_each_sentence_its_own_result():
    """Beam size, alpha, max length and prefix per sentence, in one batch: each sentence's
    n-best list (its first K columns) is what it gets alone with its options."""
    rng = np.random.default_rng(7)
    table = rng.normal(scale=1.5, size=(V, V, V)).astype(np.float32)
    bias = rng.normal(scale=2.0, size=(5, V)).astype(np.float32)
    beams = np.array([1, 4, 2, 3, 1], np.int32)
    alphas = np.array([0.0, 0.6, 1.5, 0.0, 0.6], np.float32)
    max_lengths = np.array([4, 6, 5, 7, 3], np.int32)
    prefix = np.array([[-1, -1], [A, B], [-1, -1], [B, -1], [A, -1]], np.int32)

    def run(rows):
        cache = {
            "decoder": {"prev": tf.fill([len(rows)], BOS)},
            "sentence": {"bias": tf.constant(bias[rows])},
        }
        return beam_search(
            second_order_step_fn(table), tf.fill([len(rows)], BOS), cache,
            tf.constant(max_lengths[rows]), EOS, beam_size=tf.constant(beams[rows]),
            alpha=tf.constant(alphas[rows]), prefix=tf.constant(prefix[rows]),
        )  # fmt: skip

    batch_seqs, batch_scores = run(list(range(5)))
    for i in range(5):
        seqs, scores = run([i])
        k, width = beams[i], seqs.shape[-1]
        np.testing.assert_array_equal(batch_seqs[i, :k, :width], seqs[0])
        np.testing.assert_allclose(batch_scores[i, :k], scores[0], atol=1e-5)
        assert scores.shape[1] == k
        given = prefix[i][prefix[i] >= 0]
        assert all(np.array_equal(row[: len(given)], given) for row in seqs[0].numpy())


def sampling_options(n, temperature=1.0, top_k=0, top_p=1.0, seed=0):
    fill = lambda value, dtype: tf.constant(np.broadcast_to(value, [n]), dtype)  # noqa: E731
    return {
        "temperature": fill(temperature, tf.float32),
        "top_k": fill(top_k, tf.int32),
        "top_p": fill(top_p, tf.float32),
        "seed": fill(seed, tf.int64),
    }


def sample_table(n):
    rng = np.random.default_rng(11)
    table = rng.normal(scale=1.0, size=(V, V, V)).astype(np.float32)
    bias = rng.normal(scale=0.5, size=(n, V)).astype(np.float32)

    def run(rows, options, lengths=6):
        cache = {
            "decoder": {"prev": tf.fill([len(rows)], BOS)},
            "sentence": {"bias": tf.constant(bias[rows])},
        }
        args = (second_order_step_fn(table), tf.fill([len(rows)], BOS), cache)
        return sample(*args, tf.fill([len(rows)], lengths), EOS, options)

    return table, bias, run


def test_sample_top_k_one_is_greedy_and_scores_are_model_log_probs():
    table, bias, run = sample_table(4)
    seqs, scores = run(list(range(4)), sampling_options(4, temperature=0.7, top_k=1, seed=3))
    cache = {"decoder": {"prev": tf.fill([4], BOS)}, "sentence": {"bias": tf.constant(bias)}}
    expected, expected_lp = reference.greedy(
        second_order_step_fn(table), np.full([4], BOS), cache, np.full([4], 6), EOS
    )
    np.testing.assert_array_equal(seqs, expected)
    np.testing.assert_allclose(scores, expected_lp, atol=1e-5)


def test_sample_depends_only_on_the_sentence_and_its_seed():
    _, _, run = sample_table(6)
    seeds = np.array([5, 9, 5, 2, 7, 9], np.int64)
    options = {**sampling_options(6), "seed": tf.constant(seeds)}
    options["temperature"] = tf.constant([1.0, 2.0, 1.0, 0.5, 1.5, 1.0], tf.float32)
    batch, batch_scores = run(list(range(6)), options)
    for i in range(6):
        alone = {name: value[i : i + 1] for name, value in options.items()}
        seqs, scores = run([i], alone)
        width = seqs.shape[-1]
        np.testing.assert_array_equal(batch[i, :width], seqs[0])
        np.testing.assert_allclose(batch_scores[i], scores[0], atol=1e-5)
    # and the seed matters: another seed gives other draws somewhere in 6 sentences
    other, _ = run(list(range(6)), {**options, "seed": tf.constant(seeds + 100)})
    assert not np.array_equal(other, batch)


def test_sample_draws_from_the_tempered_truncated_distribution():
    """First tokens over 3,000 seeds: their frequencies follow softmax(logits / T) over the
    top_k tokens (renormalized), and top_p keeps the smallest set reaching p of what top_k
    kept, renormalized (Hugging Face's and fairseq's order): at T 2, top_k 3, top_p 0.8 the
    three tokens hold 0.37 + 0.26 + 0.13 of the whole distribution, 0.49 + 0.34 + 0.17 of
    theirs, so two are kept (over the whole distribution, 0.63 < 0.8 would keep three)."""
    table, bias, run = sample_table(1)
    n = 3000
    rows = [0] * n
    logits = table[BOS, BOS] + bias[0]
    order = np.argsort(-logits)
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.5, 3, 1.0), (2.0, 0, 0.6), (2.0, 3, 0.8)]:
        options = sampling_options(n, temperature, top_k, top_p)
        options["seed"] = tf.range(n, dtype=tf.int64)
        # in a graph: one map_fn over the 3,000 rows' draws, not 3,000 eager ops per step
        seqs, _ = tf.function(lambda options=options: run(rows, options, lengths=1 + 1))()
        probs = np.exp(logits / temperature - np.max(logits / temperature))
        probs = probs[order] / probs.sum()
        keep = np.ones(V, bool)
        if top_k:
            keep[top_k:] = False
        if top_p < 1:
            kept = np.where(keep, probs, 0.0) / probs[keep].sum()
            keep &= np.concatenate([[0.0], np.cumsum(kept)[:-1]]) < top_p
        expected = np.zeros(V)
        expected[order[keep]] = probs[keep] / probs[keep].sum()
        counts = np.bincount(seqs.numpy()[:, 0], minlength=V) / n
        np.testing.assert_allclose(counts, expected, atol=0.03)
        assert not counts[order[~keep]].any()
        if top_k and top_p < 1:
            assert keep.sum() == 2


def test_sample_keeps_eos_out_until_min_length_without_renormalizing():
    """eos takes 0.9 of the first step: without a minimum most draws are empty; with one
    token before eos (min_length 2, eos included) none is, the first token follows the other
    tokens' renormalized probabilities, and the score stays the model's log-probability."""
    probs = np.full((V, V), 1e-6)
    probs[BOS, [EOS, A, B]] = [0.9, 0.075, 0.025]
    probs[A, EOS] = probs[B, EOS] = 1.0
    step_fn, n = table_step_fn(probs), 400
    args = (step_fn, tf.fill([n], BOS), {}, tf.fill([n], 4), EOS)
    options = {**sampling_options(n), "seed": tf.range(n, dtype=tf.int64)}
    free, _ = sample(*args, options)
    assert np.mean(free.numpy()[:, 0] == EOS) > 0.8
    seqs, scores = sample(*args, options, min_length=2)
    first = seqs.numpy()[:, 0]
    assert set(first) == {A, B} and np.all(seqs.numpy()[:, 1] == EOS)
    assert np.mean(first == A) == pytest.approx(0.75, abs=0.07)
    expected = np.log(np.where(first == A, 0.075, 0.025) + 1e-12)
    np.testing.assert_allclose(scores, expected, atol=1e-4)
    # top_k 1 with the minimum is beam-1 greedy search with it
    greedy, greedy_lp = beam_search(*args, beam_size=1, alpha=0.0, min_length=2)
    argmax, argmax_lp = sample(*args, {**options, "top_k": tf.ones([n], tf.int32)}, min_length=2)
    np.testing.assert_array_equal(argmax, greedy[:, 0])
    np.testing.assert_allclose(argmax_lp, greedy_lp[:, 0], atol=1e-5)


def counting(step_fn):
    """(step_fn, calls): the same step function, counting its calls (the search runs
    eagerly here, one call per step)."""
    calls = []

    def counted(ids, step, cache):
        calls.append(int(step))
        return step_fn(ids, step, cache)

    return counted, calls


def test_the_best_settles_before_the_worst():
    """[eos] (0.5) is the best; [A eos] (0.15) the runner-up. Keeping one hypothesis, the
    search stops after step 1, when the live [A A] (0.35) can no longer beat 0.5; keeping
    two, it runs until 0.5 * 0.7^k < 0.15 (k = 4). The best is the same either way, and the
    exhaustive search runs all 10 steps."""
    probs = np.full((V, V), 1e-6)
    probs[BOS, [EOS, A]] = [0.5, 0.5]
    probs[A, [A, EOS]] = [0.7, 0.3]
    results = {}
    for num_best, stop_early in ((1, True), (2, True), (1, False)):
        step_fn, calls = counting(table_step_fn(probs))
        seqs, scores = beam_search(
            step_fn, tf.constant([BOS]), {}, tf.constant([10]), EOS, beam_size=2, alpha=0.0,
            num_best=num_best, stop_early=stop_early,
        )  # fmt: skip
        results[num_best, stop_early] = seqs[0, 0].numpy(), float(scores[0, 0]), len(calls)
    assert [r[2] for r in results.values()] == [2, 5, 10]
    for seq, score, _ in results.values():
        np.testing.assert_array_equal(seq, results[1, False][0])
        assert score == pytest.approx(math.log(0.5), abs=1e-4)


@tf.function
def graph_search(counter, table, bias, max_lengths, beams, alphas, prefix, **kwargs):
    """`beam_search` on the second-order table model in one graph (traced once per set of
    Python options and shapes, not per model: the searches of the random models share it),
    each step function call counted in the variable `counter`."""
    inner = second_order_step_fn(table)

    def step_fn(ids, step, cache):
        counter.assign_add(1)
        return inner(ids, step, cache)

    cache = {"decoder": {"prev": tf.fill(tf.shape(bias)[:1], BOS)}, "sentence": {"bias": bias}}
    return beam_search(
        step_fn, tf.fill(tf.shape(bias)[:1], BOS), cache, max_lengths, EOS, beam_size=beams,
        alpha=alphas, prefix=prefix, **kwargs,
    )  # fmt: skip


def random_search(seed, alpha, max_beam, graph=False):
    """A random batch of 10 sentences on the second-order table model, with per-sentence beam
    sizes in [1, max_beam], max lengths, prefixes and alpha (`alpha` or 0): a function
    (**beam_search kwargs) -> (sequences, scores, steps run), and the beam sizes. `graph`:
    the search runs in `graph_search` (else eagerly, one step function call per step)."""
    rng = np.random.default_rng(seed)
    sentences = 10
    table = rng.normal(scale=rng.uniform(0.5, 2.5), size=(V, V, V)).astype(np.float32)
    bias = rng.normal(scale=2.0, size=(sentences, V)).astype(np.float32)
    bias[:, EOS] += rng.uniform(-1.0, 2.0)  # from long outputs to most ending early
    max_lengths = rng.integers(2, 9, size=sentences).astype(np.int32)
    beams = rng.integers(1, max_beam + 1, size=sentences).astype(np.int32)
    alphas = np.where(rng.random(sentences) < 0.8, alpha, 0.0).astype(np.float32)
    prefix = np.full((sentences, 2), -1, np.int32)
    with_prefix = rng.random(sentences) < 0.3
    prefix[with_prefix, 0] = rng.integers(A, V, size=with_prefix.sum())
    max_lengths[with_prefix] = np.maximum(max_lengths[with_prefix], 2)

    def in_graph(**kwargs):
        counter = tf.Variable(0)
        args = (table, bias, max_lengths, beams, alphas, prefix)
        seqs, scores = graph_search(counter, *map(tf.constant, args), **kwargs)
        return seqs.numpy(), scores.numpy(), int(counter.numpy())

    def search(**kwargs):
        if graph:
            return in_graph(**kwargs)
        cache = {
            "decoder": {"prev": tf.fill([sentences], BOS)},
            "sentence": {"bias": tf.constant(bias)},
        }
        step_fn, calls = counting(second_order_step_fn(table))
        seqs, scores = beam_search(
            step_fn, tf.fill([sentences], BOS), cache, max_lengths, EOS,
            beam_size=tf.constant(beams), alpha=tf.constant(alphas),
            prefix=tf.constant(prefix), min_length=kwargs.pop("min_length", None), **kwargs,
        )  # fmt: skip
        return seqs.numpy(), scores.numpy(), len(calls)

    return search, beams, max_lengths


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
@pytest.mark.parametrize("max_beam", [1, 2, 4])
def test_stopping_at_the_nth_best_equals_the_exhaustive_search(max_beam, alpha):
    """On random models (12 seeds), with per-sentence beam sizes, alphas, max lengths,
    prefixes and n (the hypotheses kept, one per sentence, in [1, K]): the first n
    hypotheses (ids and scores) of each sentence equal those of the search that runs every
    sentence to its maximum length; n = K is today's rule. The early stop saves steps. (The
    searches run in one traced graph, `graph_search`; eagerly: the tests above.)"""
    saved = 0
    for seed in range(12):
        args = (seed * 31 + max_beam, alpha, max_beam)
        search, beams, max_lengths = random_search(*args, graph=True)
        min_length = 2 if seed % 3 == 0 else None
        full_seqs, full_scores, full_steps = search(stop_early=False, min_length=min_length)
        assert full_steps == max_lengths.max()
        rng = np.random.default_rng(seed)
        for num_best in (1, beams, rng.integers(1, beams + 1).astype(np.int32)):
            seqs, scores, steps = search(
                num_best=tf.constant(num_best, tf.int32), min_length=min_length
            )
            for i, n in enumerate(np.broadcast_to(num_best, beams.shape)):
                np.testing.assert_array_equal(seqs[i, :n], full_seqs[i, :n], err_msg=f"{seed=}")
                np.testing.assert_allclose(scores[i, :n], full_scores[i, :n], atol=1e-6)
            saved += full_steps - steps
    assert saved > 0


@pytest.mark.parametrize("beam_size", [1, 3])
def test_settled_sentences_leave_the_batch(beam_size):
    """eos is never a candidate before it is forced at each sentence's max length, so
    sentence i settles at step max_length[i] - 1: the step function must then get K rows
    (and one "sentence" row) for each sentence not settled yet, and no more."""
    vocab = 12
    probs = np.full((vocab, vocab), 1.0)
    probs[:, [0, 1, BOS, EOS]] = 1e-9
    max_lengths = np.array([4, 1, 6, 2, 6], np.int32)
    inner = table_step_fn(probs / probs.sum(-1, keepdims=True))
    seen = []

    def step_fn(ids, step, cache):
        seen.append((int(tf.shape(ids)[0]), int(tf.shape(cache["sentence"]["bias"])[0])))
        logits, _ = inner(ids, step, cache)
        return logits, cache

    cache = {"sentence": {"bias": tf.zeros([5, 1])}}
    beam_search(step_fn, tf.fill([5], BOS), cache, max_lengths, EOS, beam_size=beam_size)
    live = [int((max_lengths > step).sum()) for step in range(max_lengths.max())]
    assert seen == [(beam_size * n, n) for n in live]


@pytest.mark.parametrize(
    "rule, alpha, num_best",
    [("finished", 0.6, None), ("finished", 0.0, None), ("top", 0.6, 1), ("top", 0.6, 3),
     ("top", 1.5, 1)],
)  # fmt: skip
def test_stop_rules_give_the_reference_rules_result(rule, alpha, num_best):
    """Against the plain-Python search with CTranslate2's rule (`reference_beam(stop=...)`),
    K = 3, 16 random models: the search's n best (ids and scores) are the reference's (it
    stops at the earlier of the exact bound and the rule, and the exact bound never changes
    the n best); it never runs more steps than the exact rule, and on some models the rule
    gives another n-best list than the exact one (so the rule is not the exact rule)."""
    vocab, length, k = 5, 7, 3
    n = k if num_best is None else num_best
    code = search.stop_rule_code(rule)
    differs = fewer_steps = 0
    for seed in range(16):
        rng = np.random.default_rng(seed)
        table = rng.normal(scale=2.0, size=(vocab, vocab, vocab)).astype(np.float32)
        bias = rng.normal(size=(vocab,)).astype(np.float32)
        bias[EOS] += rng.uniform(-1.0, 1.0)
        fn = table_log_probs(table, bias)
        expected = reference_beam(fn, k, alpha, length, vocab, 2 * k, stop=rule, num_best=n)
        exact = reference_beam(fn, k, alpha, length, vocab, 2 * k)
        differs += expected[:n] != exact[:n]
        results = {}
        for stop_rule in (search.STOP_EXACT, code):
            cache = {
                "decoder": {"prev": tf.constant([BOS])},
                "sentence": {"bias": tf.constant([bias])},
            }
            step_fn, calls = counting(second_order_step_fn(table))
            seqs, scores = beam_search(
                step_fn, tf.constant([BOS]), cache, tf.constant([length]), EOS, beam_size=k,
                alpha=alpha, num_best=num_best, stop_rule=stop_rule,
            )  # fmt: skip
            results[stop_rule] = seqs[0].numpy(), scores[0].numpy(), len(calls)
        seqs, scores, steps = results[code]
        for (score, tokens), got_seq, got_score in zip(expected[:n], seqs, scores):
            assert tuple(got_seq[: len(tokens)]) == tokens, f"{seed=}"
            assert float(got_score) == pytest.approx(score, abs=1e-4)
        assert steps <= results[search.STOP_EXACT][2]
        fewer_steps += steps < results[search.STOP_EXACT][2]
    assert fewer_steps >= 1
    # at n = 1 and alpha > 0 "top" rarely differs on random models: see the next test
    assert differs >= 1 or (rule, n) == ("top", 1)


def test_top_rule_stops_at_a_best_candidate_eos_the_exact_rule_would_beat():
    """[eos] (0.51) is the best candidate of step 0, [A eos] (0.49) scores higher at alpha
    1.5 (log 0.49 / (7/6)^1.5 > log 0.51): the exact rule finds it, "top" stops at step 0 with
    [eos], "finished" (K = 1) too, as CTranslate2 would."""
    probs = np.full((V, V), 1e-9)
    probs[BOS, [EOS, A]] = [0.51, 0.49]
    probs[A, EOS] = 1.0
    got = {}
    for rule in range(3):
        step_fn, calls = counting(table_step_fn(probs))
        seqs, scores = beam_search(
            step_fn, tf.constant([BOS]), {}, tf.constant([5]), EOS, beam_size=1, alpha=1.5,
            stop_rule=rule,
        )  # fmt: skip
        got[rule] = list(seqs[0, 0].numpy()[:2]), len(calls)
    assert got[search.STOP_EXACT] == ([A, EOS], 2)
    assert got[search.STOP_TOP] == got[search.STOP_FINISHED] == ([EOS, 0], 1)


def test_stop_rules_per_sentence_give_each_sentence_its_own_result():
    """A batch mixing the three rules (and beam sizes, alphas) per sentence: each sentence
    gets what it gets alone with its rule."""
    search_fn, beams, _ = random_search(5, 0.6, 4)
    rules = np.array([0, 1, 2, 1, 0, 2, 2, 1, 0, 1], np.int32)
    batch_seqs, batch_scores, _ = search_fn(stop_rule=tf.constant(rules))
    for rule in range(3):
        seqs, scores, _ = search_fn(stop_rule=rule)
        for i in np.flatnonzero(rules == rule):
            np.testing.assert_array_equal(batch_seqs[i], seqs[i])
            np.testing.assert_allclose(batch_scores[i], scores[i], atol=1e-6)
