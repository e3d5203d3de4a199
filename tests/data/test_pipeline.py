import collections
import gzip
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data import (
    PipelineError,
    PipelineStats,
    SubwordTokenizer,
    bucket_boundaries,
    load_parallel,
    make_batches,
    train_sentencepiece,
    training_batches,
)


@pytest.fixture(scope="module")
def setup(multi30k_dir):
    def read(name):
        with gzip.open(os.path.join(multi30k_dir, name), "rt", encoding="utf-8") as handle:
            return [line.strip() for line in handle]

    tokenizer = SubwordTokenizer(
        train_sentencepiece(read("train.en.gz") + read("train.de.gz"), 2000)
    )
    pairs = load_parallel("multi30k", "validation", "en", "de", data_dir=multi30k_dir)
    return tokenizer, pairs


def epoch(setup, **kwargs):
    tokenizer, pairs = setup
    stats = PipelineStats()
    batches = list(make_batches(pairs.dataset, tokenizer, stats=stats, **kwargs))
    return batches, stats


def test_token_budget_fixed_shapes_and_every_pair_once(setup):
    tokenizer, pairs = setup
    max_length = 32
    batches, stats = epoch(setup, batch_tokens=512, max_length=max_length, seed=3)
    allowed = set(bucket_boundaries(max_length))
    seen = collections.Counter()
    for (src, tgt_in), tgt_out in batches:
        rows, length = src.shape
        assert rows * length <= 512
        assert length in allowed and tgt_in.shape == tgt_out.shape == src.shape
        assert np.all(tgt_in.numpy()[:, 0] == 2)  # bos
        for row in src.numpy():
            seen[tuple(row[row != 0])] += 1
    # every pair under the limit appears exactly once (by its source ids)
    expected = collections.Counter()
    for src, tgt in pairs.dataset:
        ids = tuple(tokenizer.tokenize(src[tf.newaxis])[0].numpy().tolist()) + (3,)
        tgt_len = int(tf.size(tokenizer.tokenize(tgt[tf.newaxis])[0])) + 1
        if len(ids) <= max_length and tgt_len <= max_length:
            expected[ids] += 1
    assert seen == expected
    assert int(stats.kept.numpy()) == sum(expected.values())
    assert int(stats.too_long.numpy()) == 1014 - sum(expected.values()) > 0


def pair_rows(batches):
    """Every (source ids, target ids) row of the batches, pads removed, in order."""
    rows = []
    for (src, tgt_in), tgt_out in batches:
        shifted = tgt_out.numpy()[:, :-1]  # tgt_in is bos + tgt_out without its eos
        np.testing.assert_array_equal(tgt_in.numpy()[:, 1:], np.where(shifted == 3, 0, shifted))
        for s, t in zip(src.numpy(), tgt_out.numpy(), strict=True):
            rows.append((tuple(s[s != 0].tolist()), tuple(t[t != 0].tolist())))
    return rows


def assert_same_batches(first, second):
    assert len(first) == len(second) > 0
    for ((a_src, a_in), a_out), ((b_src, b_in), b_out) in zip(first, second, strict=True):
        for a, b in ((a_src, b_src), (a_in, b_in), (a_out, b_out)):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_deterministic_with_seed_and_reshuffled_each_epoch(setup):
    first, _ = epoch(setup, batch_tokens=1024, max_length=64, seed=7)
    second, _ = epoch(setup, batch_tokens=1024, max_length=64, seed=7)
    assert_same_batches(first, second)  # both sides, equal lengths
    tokenizer, pairs = setup
    data = make_batches(pairs.dataset, tokenizer, batch_tokens=1024, max_length=64, seed=7)
    epoch_1, epoch_2 = pair_rows(data), pair_rows(data)
    assert epoch_1 == pair_rows(first)
    # the same multiset of (source, target) pairs, in another order
    assert len(epoch_1) == len(epoch_2) > 900
    assert collections.Counter(epoch_1) == collections.Counter(epoch_2)
    assert epoch_1 != epoch_2
    other_seed, _ = epoch(setup, batch_tokens=1024, max_length=64, seed=8)
    assert pair_rows(other_seed) != epoch_1


STREAM = dict(batch_tokens=512, max_length=32, seed=5, steps_per_epoch=7, shuffle_buffer=2000)


def stream(setup, **kwargs):
    tokenizer, pairs = setup
    stats = PipelineStats()
    data = training_batches(pairs.dataset, tokenizer, stats=stats, **{**STREAM, **kwargs})
    return data, stats


@pytest.mark.parametrize("num_pairs", [None, 1014])
@pytest.mark.parametrize("start_step", [3, 9, 14])
def test_training_stream_restarts_exactly(setup, start_step, num_pairs):
    """start_step=k equals the uninterrupted stream from batch k: inside an epoch (3), across
    an epoch boundary (9 = epoch 1 + 2) and at one (14)."""
    full, _ = stream(setup, num_pairs=num_pairs)
    resumed, _ = stream(setup, num_pairs=num_pairs, start_step=start_step)
    expected = list(full.skip(start_step).take(10))
    assert_same_batches(list(resumed.take(10)), expected)
    # batch i depends only on (seed, i): iterating again gives the same stream
    assert_same_batches(list(full.skip(start_step).take(10)), expected)


def test_training_stream_epochs_differ_and_stats_count(setup):
    data, stats = stream(setup)
    batches = list(data.take(14))
    epoch_0, epoch_1 = pair_rows(batches[:7]), pair_rows(batches[7:])
    # both epochs start from the corpus's first pair, shuffled differently
    assert epoch_0 != epoch_1 and set(epoch_0) & set(epoch_1)
    kept, too_long = int(stats.kept.numpy()), int(stats.too_long.numpy())
    assert kept >= len(epoch_0) + len(epoch_1) and too_long > 0
    other_seed, _ = stream(setup, seed=6)
    assert pair_rows(other_seed.take(7)) != epoch_0


def test_short_corpus_is_repeated_within_an_epoch(setup):
    tokenizer, pairs = setup
    small = pairs.dataset.take(50)
    data = training_batches(small, tokenizer, **{**STREAM, "steps_per_epoch": 40})
    rows = pair_rows(data.take(40))
    assert len(rows) > 100 and len(set(rows)) <= 50  # more rows than pairs: repeated


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"steps_per_epoch": 0}, "--steps-per-epoch must be an integer >= 1, got 0"),
        ({"start_step": -1}, "start_step must be an integer >= 0, got -1"),
        ({"batch_tokens": 16}, "at least --max-length"),
    ],
)
def test_training_stream_bad_settings(setup, kwargs, match):
    with pytest.raises(PipelineError, match=match):
        stream(setup, **kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"batch_tokens": 0, "max_length": 64}, "--batch-tokens"),
        ({"batch_tokens": 4096, "max_length": -1}, "--max-length"),
        ({"batch_tokens": 16, "max_length": 64}, "at least --max-length"),
    ],
)
def test_bad_settings_name_the_flag(setup, kwargs, match):
    tokenizer, pairs = setup
    with pytest.raises(PipelineError, match=match):
        make_batches(pairs.dataset, tokenizer, **kwargs)


def test_boundaries_are_sorted_and_end_at_max_length():
    b = bucket_boundaries(256)
    assert b == sorted(set(b)) and b[0] == 8 and b[-1] == 256 and len(b) < 32
