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


def test_deterministic_with_seed(setup):
    first, _ = epoch(setup, batch_tokens=1024, max_length=64, seed=7)
    second, _ = epoch(setup, batch_tokens=1024, max_length=64, seed=7)
    for (a, _), (b, _) in zip(first, second):
        np.testing.assert_array_equal(a[0], b[0])


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
