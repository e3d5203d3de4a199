"""The XLA search in segments (xla_search.py) against the search of search.py: the same
sequences (exactly) and scores (to rounding), on table step functions and random models, with
per-sentence options, prefixes, a minimum length, a cache that grows, in any batch."""

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.inference import search
from keras_transformer.inference.xla_search import SegmentedSearch, next_power_of_two
from tests.inference.test_search import BOS, EOS, V, second_order_step_fn


def test_next_power_of_two():
    got = [int(next_power_of_two(n)) for n in (1, 2, 3, 4, 5, 63, 64, 65, 1000)]
    assert got == [1, 2, 4, 4, 8, 64, 64, 128, 1024]


def table_case():
    rng = np.random.default_rng(3)
    table = rng.normal(scale=1.5, size=(V, V, V)).astype(np.float32)
    bias = rng.normal(scale=2.0, size=(7, V)).astype(np.float32)
    bias[1, EOS] = 4.0  # ends early
    bias[4, EOS] = -6.0  # runs long
    max_lengths = np.array([3, 6, 9, 1, 12, 5, 7], np.int32)
    cache = {"decoder": {"prev": tf.fill([7], BOS)}, "sentence": {"bias": tf.constant(bias)}}
    return second_order_step_fn(table), cache, max_lengths


def assert_same_results(got, expected, tol=1e-5):
    """The same scores (to `tol`) and the same hypotheses of every sentence in the same order,
    except among tied ones: hypotheses whose scores are equal in exact arithmetic (the same
    tokens in another order, e.g. [2, 0, 2] and [0, 2, 2] under a bias that repeats) rank by
    the float rounding of their sums, which differs with the order XLA adds them in (measured
    on an AMD EPYC: two such beams swapped at 1e-7). Within a run of scores closer than `tol`
    the hypotheses are compared as a set."""
    got_ids, got_scores = got[0].numpy(), got[1].numpy()
    ids, scores = expected[0].numpy(), expected[1].numpy()
    np.testing.assert_allclose(got_scores, scores, rtol=tol, atol=tol)
    assert got_ids.shape == ids.shape
    for row in range(ids.shape[0]):
        start = 0
        for end in range(1, ids.shape[1] + 1):
            if end < ids.shape[1] and abs(scores[row, end] - scores[row, end - 1]) <= tol:
                continue  # a tie: the run goes on
            group = slice(start, end)
            assert sorted(map(tuple, got_ids[row, group])) == sorted(map(tuple, ids[row, group])), (
                f"sentence {row}, beams {start}..{end - 1}: {got_ids[row, group]} != "
                f"{ids[row, group]}"
            )
            start = end


@pytest.fixture(scope="module")
def table_searches():
    """table_case() and its SegmentedSearch (initial capacity 2) with and without XLA, one
    each for all the searches below: a segment is traced once for tensors of any size and,
    called eagerly, compiled by XLA once per shape (P, C, K), so the cases share those (a
    search in a tf.function compiles its own); the stop rules' K = 4 is a beam size here."""
    step_fn, cache, max_lengths = table_case()
    searches = {
        jit: SegmentedSearch(step_fn, EOS, jit_compile=jit, initial_capacity=2)
        for jit in (False, True)
    }
    return step_fn, cache, max_lengths, searches


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("beam_size, alpha", [(1, 0.0), (3, 0.6), (4, 1.5)])
def test_table_search_equals_the_default_search(table_searches, beam_size, alpha, graph, jit):
    """Sentences settle at different steps (segments end, the live ones are compacted into
    smaller powers of two), the sequences outgrow the first capacity (2 steps, doubled up to
    16): the results are search.beam_search's, eagerly and in a graph."""
    step_fn, cache, max_lengths, searches = table_searches
    bos = tf.fill([7], BOS)
    expected = search.beam_search(step_fn, bos, cache, max_lengths, EOS, beam_size=beam_size,
                                  alpha=alpha)  # fmt: skip
    segmented = searches[jit]

    def run():
        return segmented.beam_search(bos, cache, max_lengths, beam_size=beam_size, alpha=alpha)

    got = tf.function(run)() if graph else run()
    assert_same_results(got, expected)


def test_stop_rules_per_sentence_equal_the_default_search(table_searches):
    """search.beam_search's stop rules (STOP_FINISHED, STOP_TOP), one per sentence: the same
    results, and a rule changes some sentence's result (so the comparison can tell)."""
    step_fn, cache, max_lengths, searches = table_searches
    bos = tf.fill([7], BOS)
    segmented = searches[True]  # XLA, initial capacity 2: the table search's K = 4 shapes
    options = dict(beam_size=4, alpha=tf.constant([0.0, 0.6, 1.5, 0.6, 0.0, 1.0, 0.6]))
    exact = search.beam_search(step_fn, bos, cache, max_lengths, EOS, **options)
    changed = set()
    for rules in (
        [search.STOP_FINISHED] * 7,
        [search.STOP_TOP] * 7,
        [search.STOP_TOP, search.STOP_EXACT, search.STOP_FINISHED, search.STOP_TOP,
         search.STOP_FINISHED, search.STOP_EXACT, search.STOP_TOP],
    ):  # fmt: skip
        rule = tf.constant(rules)
        expected = search.beam_search(step_fn, bos, cache, max_lengths, EOS, stop_rule=rule,
                                      **options)  # fmt: skip
        got = segmented.beam_search(bos, cache, max_lengths, stop_rule=rule, **options)
        np.testing.assert_array_equal(got[0].numpy(), expected[0].numpy())
        np.testing.assert_allclose(got[1].numpy(), expected[1].numpy(), rtol=1e-5, atol=1e-5)
        differs = (expected[0].numpy() != exact[0].numpy()).any(axis=(1, 2))
        changed |= {(rules[i], i) for i in np.flatnonzero(differs)}
    assert changed


def test_finish_rules_per_sentence_equal_the_default_search():
    """search.beam_search's finish rule "ctranslate2" (some sentences, a minimum length and
    every stop rule): the XLA segments give the same results, and the rule changes some
    sentence's result."""
    step_fn, cache, max_lengths = table_case()
    bos = tf.fill([7], BOS)
    segmented = SegmentedSearch(step_fn, EOS, initial_capacity=2, min_length=3)
    finish = tf.constant([1, 0, 1, 1, 0, 1, 1])  # search.FINISH_CTRANSLATE2 where 1
    options = dict(
        beam_size=tf.constant([4, 4, 2, 1, 3, 4, 4]),
        alpha=tf.constant([0.0, 0.6, 1.5, 0.6, 0.0, 1.0, 0.6]),
        stop_rule=tf.constant([search.STOP_TOP, 0, 0, 1, 1, 1, 0]),
    )
    tensor2tensor = search.beam_search(step_fn, bos, cache, max_lengths, EOS, min_length=3,
                                       **options)  # fmt: skip
    expected = search.beam_search(step_fn, bos, cache, max_lengths, EOS, min_length=3,
                                  finish_rule=finish, **options)  # fmt: skip
    got = segmented.beam_search(bos, cache, max_lengths, finish_rule=finish, **options)
    np.testing.assert_array_equal(got[0].numpy(), expected[0].numpy())
    np.testing.assert_allclose(got[1].numpy(), expected[1].numpy(), rtol=1e-5, atol=1e-5)
    differs = (expected[1].numpy() != tensor2tensor[1].numpy()).any(axis=1)
    assert not differs[[1, 4]].any() and differs.any()


def test_exhaustive_search_and_empty_batch():
    step_fn, cache, max_lengths = table_case()
    bos = tf.fill([7], BOS)
    expected = search.beam_search(
        step_fn, bos, cache, max_lengths, EOS, beam_size=3, stop_early=False
    )
    segmented = SegmentedSearch(step_fn, EOS, stop_early=False, initial_capacity=4)
    got = segmented.beam_search(bos, cache, max_lengths, beam_size=3)
    np.testing.assert_array_equal(got[0].numpy(), expected[0].numpy())
    empty = {"decoder": {"prev": tf.zeros([0], tf.int32)}, "sentence": {"bias": tf.zeros([0, V])}}
    seqs, scores = segmented.beam_search(tf.zeros([0], tf.int32), empty, tf.zeros([0], tf.int32))
    assert seqs.shape[0] == 0 and scores.shape[0] == 0


def random_transformer(num_layers: int):
    """A random (untrained) tiny Transformer of `num_layers` layers and a batch of sources of
    different lengths."""
    tf.keras.utils.set_random_seed(7)
    cfg = kt.TransformerConfig.preset(
        "tiny", vocab_size=40, max_length=64, dropout_rate=0.0, num_layers=num_layers
    )
    model = kt.Transformer(cfg)
    model.build()
    rng = np.random.default_rng(5)
    lengths = [3, 9, 1, 6, 12, 4]
    source = np.zeros([len(lengths), 12], np.int32)
    for i, n in enumerate(lengths):
        source[i, :n] = rng.integers(4, 40, size=n)
        source[i, n - 1] = EOS
    return model, tf.constant(source)


@pytest.fixture(scope="module")
def random_model():
    """One layer: the searches below run eagerly, step by step, in less time the fewer
    layers (a cache of several layers: test_fixed_capacity_cache_steps_equal_the_growing_cache).
    With the model, its SegmentedSearch by minimum length (None, 4; initial capacity 4), one
    each for all the searches below: a segment is traced once and compiled by XLA once per
    shape (P, C, K, source and prefix widths), so searches of the same K share those."""
    model, source = random_transformer(num_layers=1)
    grow = model.grow_cache
    searches = {
        n: SegmentedSearch(
            model.decode_step, EOS, grow_cache=grow, min_length=n, initial_capacity=4
        )
        for n in (None, 4)
    }
    return model, source, searches


def test_fixed_capacity_cache_steps_equal_the_growing_cache():
    """Transformer.decode_step over a cache with room for 4 steps, grown to 8 then 16
    (`grow_cache`), gives the growing cache's logits at every step, 2 rows a sentence (the
    tiny preset's 2 layers: every layer's cache grows)."""
    model, source = random_transformer(num_layers=2)
    memory = model.encode(source)
    growing = model.init_cache(memory, source)
    fixed = model.init_cache(memory, source, fixed_capacity=True)
    for cache in (growing, fixed):
        cache["rows"]["slots"] = tf.zeros([12, 0], tf.int32)  # 2 rows a sentence
    fixed = model.grow_cache(fixed, 4)
    # the two rows of a sentence swap histories at step 3 (as beams reorder)
    order = tf.constant([1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10])
    rng = np.random.default_rng(0)
    for step in range(12):
        if step in (4, 8):
            fixed = model.grow_cache(fixed, 2 * step)
        ids = tf.constant(rng.integers(4, 40, size=12), tf.int32)
        expected, growing = model.decode_step(ids, step, growing)
        got, fixed = model.decode_step(ids, step, fixed)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-5)
        if step == 3:
            growing["rows"]["slots"] = tf.gather(growing["rows"]["slots"], order)
            fixed["rows"]["slots"] = tf.gather(fixed["rows"]["slots"], order)
    assert fixed["rows"]["slots"].shape == (12, 16)


def assert_same(expected, got):
    np.testing.assert_array_equal(got[0].numpy(), expected[0].numpy())
    real = expected[1].numpy() > -1e8
    np.testing.assert_allclose(got[1].numpy()[real], expected[1].numpy()[real], atol=1e-4)
    assert (got[1].numpy()[~real] <= -1e8).all()


@pytest.mark.parametrize("min_length", [None, 4])
def test_model_search_equals_the_default_search(random_model, min_length):
    """A random model (its outputs run to the maximum length, 16 steps: the cache grows
    from 4 to 16), per-sentence beam sizes, alphas, numbers of hypotheses and maximum
    lengths, and a minimum length."""
    model, source, searches = random_model
    lengths = tf.constant([16, 7, 13, 3, 16, 9])
    options = dict(
        beam_size=tf.constant([4, 1, 3, 2, 4, 4]),
        alpha=tf.constant([0.6, 0.0, 1.0, 0.6, 0.0, 2.0]),
        num_best=tf.constant([1, 1, 2, 2, 4, 3]),
    )
    memory = model.encode(source)
    bos = tf.fill([6], 2)
    expected = search.beam_search(
        model.decode_step, bos, model.init_cache(memory, source), lengths, EOS,
        min_length=min_length, **options,
    )  # fmt: skip
    segmented = searches[min_length]  # initial capacity 4
    got = segmented.beam_search(
        bos, model.init_cache(memory, source, fixed_capacity=True), lengths, **options
    )
    assert_same(expected, got)


def test_model_search_with_prefixes_in_a_graph(random_model):
    model, source, _ = random_model
    prefix = tf.constant(
        [[5, 6, 7], [9, -1, -1], [-1, -1, -1], [11, 12, -1], [4, 4, 4], [-1, -1, -1]]
    )
    lengths = tf.constant([12, 6, 10, 5, 9, 8])

    @tf.function
    def run():
        memory = model.encode(source)
        bos = tf.fill([6], 2)
        expected = search.beam_search(
            model.decode_step, bos, model.init_cache(memory, source), lengths, EOS,
            beam_size=3, alpha=0.6, prefix=prefix, min_length=2,
        )  # fmt: skip
        segmented = SegmentedSearch(
            model.decode_step, EOS, grow_cache=model.grow_cache, min_length=2,
            initial_capacity=2,
        )  # fmt: skip
        cache = model.init_cache(memory, source, fixed_capacity=True)
        got = segmented.beam_search(bos, cache, lengths, beam_size=3, alpha=0.6, prefix=prefix)
        return expected, got

    expected, got = run()
    assert_same(expected, got)
    # every hypothesis starts with its sentence's prefix
    np.testing.assert_array_equal(got[0].numpy()[0, :, :3], np.tile([5, 6, 7], (3, 1)))


def test_model_search_is_batch_invariant(random_model):
    """Each sentence alone gets what it gets in the batch (other batches, other P; K = 4, the
    shapes of test_model_search_equals_the_default_search, whose compilations it shares)."""
    model, source, searches = random_model
    lengths = tf.constant([16, 7, 13, 3, 16, 9])
    segmented = searches[None]

    def run(rows):
        src = tf.gather(source, rows)
        memory = model.encode(src)
        cache = model.init_cache(memory, src, fixed_capacity=True)
        bos = tf.fill([len(rows)], 2)
        return segmented.beam_search(bos, cache, tf.gather(lengths, rows), beam_size=4)

    batch = run(list(range(6)))
    for i in range(6):
        alone = run([i])
        ids, in_batch = alone[0].numpy()[0], batch[0].numpy()[i]  # (K, L) for their own L
        np.testing.assert_array_equal(in_batch[:, : ids.shape[1]], ids)
        assert not in_batch[:, ids.shape[1] :].any()
        np.testing.assert_allclose(alone[1].numpy()[0], batch[1].numpy()[i], atol=1e-4)
