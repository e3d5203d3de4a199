import collections
import dataclasses
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
    pipeline,
    train_sentencepiece,
    training_batches,
)
from keras_transformer.data.batching import batch_count
from keras_transformer.data.pipeline import split_position, stream_position
from keras_transformer.data.subword import subword_sampler


def pairs_in(dataset):
    """The (source, target) pairs of `dataset`, in order, read 1,000 at a time (tf.data's
    per-element cost, ~1 ms in eager mode, made most of these tests' time)."""
    return [pair for batch in dataset.batch(1000).as_numpy_iterator() for pair in zip(*batch)]


def read_multi30k(multi30k_dir, name):
    """The stripped lines of one of Multi30k's gzipped files."""
    with gzip.open(os.path.join(multi30k_dir, name), "rt", encoding="utf-8") as handle:
        return [line.strip() for line in handle]


@pytest.fixture(scope="module")
def setup(multi30k_dir):
    tokenizer = SubwordTokenizer(
        train_sentencepiece(
            read_multi30k(multi30k_dir, "train.en.gz") + read_multi30k(multi30k_dir, "train.de.gz"),
            2000,
        )
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
    for (src, tgt), _ in tokenized_pairs(pairs.dataset, tokenizer):
        ids = tuple(src) + (3,)
        if len(ids) <= max_length and len(tgt) + 1 <= max_length:
            expected[ids] += 1
    assert seen == expected
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


STREAM = dict(batch_tokens=512, max_length=32, seed=5, shuffle_buffer=2000, positions=True)


def stream(corpus, tokenizer, **kwargs):
    stats = PipelineStats()
    data = training_batches(corpus, tokenizer, stats=stats, **{**STREAM, **kwargs})
    return data, stats


def tagged(batches):
    """[(pass, index in the pass, batch)] of a training stream's batches."""
    out = []
    for (src, tgt_in), tgt_out, position in batches:
        values = set(position.numpy().tolist())
        assert len(values) == 1 and position.shape[0] == src.shape[0]  # one tag per row
        out.append((*split_position(values.pop()), ((src, tgt_in), tgt_out)))
    return out


def first_passes(corpus, tokenizer, passes=2, **kwargs):
    """The batches of the first `passes` passes, grouped by pass."""
    data, _ = stream(corpus, tokenizer, **kwargs)
    groups = collections.defaultdict(list)
    for epoch, index, batch in tagged(
        data.take_while(lambda *b: b[2][0] < stream_position(passes, 0))
    ):
        assert index == len(groups[epoch])  # indexes count the batches of each pass
        groups[epoch].append(batch)
    return [groups[e] for e in range(passes)]


def tokenized_pairs(pairs, tokenizer):
    """((source ids, target ids), (source, target)) of every pair of the dataset `pairs`, in
    its order; the sentences tokenized 1,000 at a time (SentencePiece segments each sentence
    on its own: the ids are those of one sentence at a time)."""
    for src, tgt in pairs.batch(1000).as_numpy_iterator():
        ids = [tokenizer.tokenize(tf.constant(x)).to_list() for x in (src, tgt)]
        yield from zip(zip(*ids, strict=True), zip(src, tgt, strict=True), strict=True)


def expected_rows(pairs, tokenizer, max_length):
    """Every pair as (source ids + eos, target ids + eos), those that fit `max_length`."""
    rows = collections.Counter()
    for (s, t), _ in tokenized_pairs(pairs, tokenizer):
        s, t = s + [3], t + [3]
        if len(s) <= max_length and len(t) <= max_length:
            rows[(tuple(s), tuple(t))] += 1
    return rows


def test_every_pass_sees_every_pair_once_in_its_own_order(setup):
    """Files: each pass is the whole corpus (hashing every (source, target) pair), each
    pass in a different order."""
    tokenizer, pairs = setup
    passes = first_passes(pairs, tokenizer, max_length=64, batch_tokens=1024)
    expected = expected_rows(pairs.dataset, tokenizer, 64)
    rows = [pair_rows(batches) for batches in passes]
    assert sum(expected.values()) > 900
    for one in rows:
        assert collections.Counter(one) == expected
    assert rows[0] != rows[1]


def test_two_workers_shares_of_a_pass_see_each_pair_once(setup):
    """`shard=(w, 2)`: worker w's stream reads and tokenizes pairs w, w + 2, ... of each
    pass's order only; the two streams' first passes together hold every pair once."""
    tokenizer, pairs = setup
    expected = expected_rows(pairs.dataset, tokenizer, 64)
    shares = [
        collections.Counter(
            pair_rows(first_passes(pairs, tokenizer, 1, max_length=64, shard=(w, 2))[0])
        )
        for w in range(2)
    ]
    assert sum(expected.values()) > 900
    assert shares[0] + shares[1] == expected
    assert 0.4 < sum(shares[0].values()) / sum(expected.values()) < 0.6


@pytest.fixture(scope="module")
def tfds_corpus(tmp_path_factory):
    from tests.data import tfds_fixture

    data_dir = tfds_fixture.prepare(str(tmp_path_factory.mktemp("tfds")))
    return load_parallel(f"tfds:{tfds_fixture.NAME}", "train", "en", "de", data_dir=data_dir)


def test_a_tfds_pass_reads_every_pair_once_in_a_new_order(setup, tfds_corpus):
    """TFDS: the size comes from the split info; each pass reads every pair once, the
    dataset's pieces interleaved in an order drawn from (seed, pass)."""
    from tests.data.tfds_fixture import sentence_pairs

    tokenizer, _ = setup
    assert tfds_corpus.num_pairs == 1200
    kept = [(en, de) for en, de in sentence_pairs("train", 1200) if de]
    corpus = tf.data.Dataset.from_tensor_slices(([en for en, _ in kept], [de for _, de in kept]))
    expected = expected_rows(corpus, tokenizer, 64)
    assert sum(expected.values()) == len(kept) == 1029
    # a 1-pair shuffle buffer does not shuffle: the order is the pieces' interleaving alone
    passes = first_passes(
        tfds_corpus, tokenizer, max_length=64, batch_tokens=1024, shuffle_buffer=1
    )
    rows = [pair_rows(batches) for batches in passes]
    for one in rows:
        assert collections.Counter(one) == expected
    stored = pair_rows(
        make_batches(
            tfds_corpus.dataset, tokenizer, batch_tokens=1024, max_length=64, shuffle=False
        )
    )
    assert rows[0] != rows[1] and stored not in rows  # each pass in an order of its own


@pytest.mark.parametrize("at", ["inside", "last", "next_pass"])
def test_training_stream_restarts_exactly(setup, at):
    """Starting at the position a batch carries gives the uninterrupted stream from that
    batch: inside the first pass, at its last batch, and inside the second pass."""
    tokenizer, pairs = setup
    full, _ = stream(pairs, tokenizer)
    batches = tagged(full.take(200))
    first_pass = sum(1 for epoch, _, _ in batches if epoch == 0)
    k = {"inside": 3, "last": first_pass - 1, "next_pass": first_pass + 2}[at]
    epoch, index, _ = batches[k]
    resumed, _ = stream(pairs, tokenizer, start=stream_position(epoch, index))
    got = [batch for _, _, batch in tagged(resumed.take(5))]
    assert_same_batches(got, [batch for _, _, batch in batches[k : k + 5]])


def test_training_stream_depends_on_the_seed_and_counts_drops(setup):
    tokenizer, pairs = setup
    data, stats = stream(pairs, tokenizer)
    first = pair_rows([b for _, _, b in tagged(data.take(7))])
    assert int(stats.too_long.numpy()) > 0
    other, _ = stream(pairs, tokenizer, seed=6)
    assert pair_rows([b for _, _, b in tagged(other.take(7))]) != first


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"start": -1}, "start must be a stream position >= 0, got -1"),
        ({"batch_tokens": 16}, "at least --max-length"),
    ],
)
def test_training_stream_bad_settings(setup, kwargs, match):
    tokenizer, pairs = setup
    with pytest.raises(PipelineError, match=match):
        stream(pairs, tokenizer, **kwargs)


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


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_file_pass_draws_from_the_whole_corpus_from_its_start(setup, tmp_path, suffix):
    """A corpus of two concatenated halves (as WMT's sub-corpora): the first 1% of a pass
    draws from both halves; each pass reads every pair once (empty lines skipped), in an
    order of its own, gzip or not."""
    tokenizer, _ = setup
    lines = {"en": [], "de": []}
    for half in ("first", "second"):
        for i in range(2000):
            empty = half == "second" and i % 500 == 7  # skipped, as in file order
            lines["en"].append(f"A {half} dog number {i} runs.")
            lines["de"].append("" if empty else f"Ein {half} Hund Nummer {i} rennt.")
    paths = []
    for lang in ("en", "de"):
        path = tmp_path / f"train.{lang}{suffix}"
        data = ("\n".join(lines[lang]) + "\n").encode()
        path.write_bytes(gzip.compress(data) if suffix else data)
        paths.append(str(path))
    corpus = load_parallel("files", "train", "en", "de", files=tuple(paths))
    assert corpus.num_pairs == 4000 - 4 and len(corpus.piece_sizes) > 8
    stored = pairs_in(corpus.dataset)
    orders = [pairs_in(corpus.epoch(11, e)) for e in (0, 1)]
    for order in orders:
        assert collections.Counter(order) == collections.Counter(stored)
        first = order[: len(order) // 100]  # the first 1% of the pass
        assert {src.split()[1] for src, _ in first} == {b"first", b"second"}
    assert orders[0] != orders[1] and stored not in orders
    # through the pipeline: every pair once per pass
    passes = first_passes(corpus, tokenizer, max_length=64, batch_tokens=1024)
    expected = expected_rows(corpus.dataset, tokenizer, 64)
    for one in passes:
        assert collections.Counter(pair_rows(one)) == expected


def file_corpus(folder, pairs):
    """`pairs` (a ParallelText) written to two files and read back in pieces."""
    lines = [(s.decode(), t.decode()) for s, t in pairs_in(pairs.dataset)]
    for side, lang in enumerate(("en", "de")):
        (folder / f"c.{lang}").write_text("".join(f"{p[side]}\n" for p in lines), encoding="utf-8")
    return load_parallel(
        "files", "train", "en", "de", files=(str(folder / "c.en"), str(folder / "c.de"))
    )


def chunk_of(index):
    return index >> 20  # pipeline.CHUNK_BITS


@pytest.fixture(scope="module")
def chunked(setup, tmp_path_factory):
    """A corpus of Multi30k's validation pairs read in pieces, and the first 160 batches of
    its training stream in chunks of 150 raw pairs (pipeline.CHUNK_PAIRS, patched here and in
    the tests for their own streams), made once for the tests below: (corpus, tagged batches)."""
    tokenizer, pairs = setup
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "CHUNK_PAIRS", 150, raising=False)
        corpus = file_corpus(tmp_path_factory.mktemp("chunked"), pairs)
        full, _ = stream(corpus, tokenizer)
        return corpus, tagged(full.take(160))


@pytest.mark.parametrize("at", ["inside", "chunk_end", "next_pass"])
def test_a_pass_in_chunks_sees_every_pair_once_and_restarts_exactly(
    setup, chunked, monkeypatch, at
):
    """A pass cut into chunks of 150 raw pairs (100,000 in training) of a corpus read in 64
    pieces: every pass sees every pair once, chunk by chunk; starting at the position a batch
    carries gives the uninterrupted stream from that batch: inside a chunk, at a chunk's last
    batch (the next position is past the chunk's end) and inside the second pass."""
    monkeypatch.setattr(pipeline, "CHUNK_PAIRS", 150, raising=False)
    tokenizer, _ = setup
    corpus, batches = chunked  # the stream's first 160 batches
    assert corpus.num_pairs == 1014 and len(corpus.piece_sizes) > 8  # 7 chunks per pass
    first_pass = [index for epoch, index, _ in batches if epoch == 0]
    assert [chunk_of(i) for i in first_pass] == sorted(chunk_of(i) for i in first_pass)
    assert {chunk_of(i) for i in first_pass} == set(range(7))
    expected = expected_rows(corpus.dataset, tokenizer, 32)
    assert collections.Counter(pair_rows([b for e, _, b in batches if e == 0])) == expected
    ends = [
        k
        for k in range(len(first_pass) - 1)
        if chunk_of(first_pass[k + 1]) != chunk_of(first_pass[k])
    ]
    k = {
        "inside": next(k for k, (e, i, _) in enumerate(batches) if chunk_of(i) == 3) + 2,
        "chunk_end": ends[1],
        "next_pass": next(k for k, (e, i, _) in enumerate(batches) if e == 1 and chunk_of(i) == 4)
        + 1,
    }[at]
    epoch, index, _ = batches[k]
    resumed, _ = stream(corpus, tokenizer, start=stream_position(epoch, index))
    got = [batch for _, _, batch in tagged(resumed.take(5))]
    assert_same_batches(got, [batch for _, _, batch in batches[k : k + 5]])


class CountingTokenizer:
    """A tokenizer that counts the sentences it tokenizes."""

    def __init__(self, inner):
        self.inner = inner
        with tf.device("/CPU:0"):
            self.sentences = tf.Variable(0, dtype=tf.int64, trainable=False)

    def tokenize(self, text):
        counted = self.sentences.assign_add(tf.size(text, out_type=tf.int64))
        with tf.control_dependencies([counted]):
            return self.inner.tokenize(tf.identity(text))


def test_a_restart_tokenizes_its_own_chunk_not_what_came_before(setup, chunked, monkeypatch):
    """Restarted at the last batch of a pass of 7 chunks of 150 raw pairs, the stream
    tokenizes that chunk (114 pairs) and what it prefetches after it, not the 900 pairs of
    the chunks before it: a resume costs about one chunk, whatever the corpus size."""
    monkeypatch.setattr(pipeline, "CHUNK_PAIRS", 150, raising=False)
    tokenizer, _ = setup
    corpus, batches = chunked
    batches = batches[:120]  # the stream's first 120 batches
    k = sum(1 for epoch, _, _ in batches if epoch == 0) - 1
    epoch, index, batch = batches[k]
    counting = CountingTokenizer(tokenizer)
    resumed, _ = stream(corpus, counting, start=stream_position(epoch, index))
    first = next(iter(resumed))
    tokenized = int(counting.sentences.numpy()) // 2  # pairs
    assert_same_batches([first[:2]], [batch])
    assert 114 <= tokenized < 900


def test_a_pass_from_a_pair_on_is_the_rest_of_the_pass(setup, tmp_path, tfds_corpus):
    """`epoch(seed, e, start=k)` is pass e without its first k raw pairs: file pieces pass
    over their lines in Python (`read_order`, a Python int or a tensor k), TFDS through
    `seek` (a Python int: it slices its split, pieces at their end included) and through
    tf.data's skip (a tensor); `passes(seed, start)` goes on into the next pass from its
    start."""
    _, pairs = setup
    files = file_corpus(tmp_path, pairs)
    assert len(files.piece_sizes) > 8 and files.read_order is not None
    assert len(tfds_corpus.pieces) > 8 and tfds_corpus.seek is not None
    for corpus in (files, tfds_corpus):
        n = corpus.num_pairs
        one, two = (pairs_in(corpus.epoch(3, e, filtered=False)) for e in (1, 2))
        assert len(one) == n
        starts = [137, n - 5] + ([tf.constant(300, tf.int64)] if corpus is not tfds_corpus else [])
        for start in starts:
            k = int(start)
            got = pairs_in(corpus.epoch(3, 1, filtered=False, start=start))
            assert got == one[k:]
        later = pairs_in(corpus.passes(3, n + n - 5).take(15))
        assert later == one[n - 5 :] + two[:10]


def test_a_file_pass_is_its_pieces_interleaved_by_choose_from_datasets(setup, tmp_path):
    """A file corpus's pieces, read by one generator in the pass's order (`read_order`),
    give the pairs in the order `choose_from_datasets` gives over one dataset per piece
    (how passes were read before it: a run's order and weights are unchanged), from a
    pair `start` on too."""
    _, pairs = setup
    corpus = file_corpus(tmp_path, pairs)
    stored, sizes = pairs_in(corpus.dataset), corpus.piece_sizes
    assert len(sizes) > 8 and sum(sizes) == len(stored) == corpus.num_pairs
    ends = np.cumsum([0, *sizes])
    pieces = [
        tf.data.Dataset.from_tensor_slices(tuple(map(list, zip(*stored[a:b]))))
        for a, b in zip(ends[:-1], ends[1:])
    ]
    by_datasets = dataclasses.replace(corpus, read_order=None, pieces=pieces)
    for e, start in ((0, 0), (1, 0), (1, 137), (2, tf.constant(300, tf.int64))):
        got = pairs_in(corpus.epoch(5, e, start=start))
        assert got == pairs_in(by_datasets.epoch(5, e, start=start))
        assert len(got) == corpus.num_pairs - int(start)


def test_batch_count_is_the_number_of_batches_make_batches_gives(setup):
    """`batch_count` (lengths tokenized eagerly, no dataset function traced) is the number
    of batches `make_batches(..., shuffle=False)` gives, pairs over `max_length` (16) dropped,
    at the deterministic segmentation and at a sampled one (seeded per tokenization batch:
    1014 pairs are two)."""
    tokenizer, pairs = setup
    for batch_tokens in (64, 512):
        for subword in (None, subword_sampler(tokenizer, 0.5)):
            kwargs = dict(batch_tokens=batch_tokens, max_length=16, subword=subword)
            stats = PipelineStats()
            made = make_batches(pairs.dataset, tokenizer, shuffle=False, stats=stats, **kwargs)
            expected = int(made.reduce(0, lambda n, _: n + 1))
            assert int(stats.too_long.numpy()) > 0
            assert batch_count(pairs.dataset, tokenizer, **kwargs) == expected


@pytest.mark.slow
def test_static_rows_give_one_shape_per_bucket_over_a_pass_of_chunks(setup, tmp_path):
    """--jit-compile's batches (static_rows m = replicas x accumulation steps) on a pass of 7
    chunks of 150 raw pairs: every batch of a bucket has its row count, a multiple of m, so
    the pass has at most one shape per bucket (without: a partial batch per bucket and
    chunk, of a random row count); the padding rows are all pad ids and the real rows are
    every pair once."""
    tokenizer, pairs = setup
    corpus = file_corpus(tmp_path, pairs)
    boundaries = bucket_boundaries(32)

    def first_pass(**kwargs):
        data, _ = stream(corpus, tokenizer, chunk_pairs=150, **kwargs)
        return [b for e, _, b in tagged(data.take_while(lambda *b: b[2][0] < (1 << 32))) if not e]

    def shapes(batches):
        return {tuple(batch[0][0].shape) for batch in batches}

    plain, static = first_pass(), first_pass(static_rows=4)
    assert len(shapes(plain)) > 2 * len(boundaries)  # a partial batch per bucket and chunk
    assert len(shapes(static)) <= len(boundaries)
    assert all(rows % 4 == 0 for rows, _ in shapes(static))
    real = []
    for (src, tgt_in), tgt_out in static:
        empty = (tf.reduce_sum(src, 1) == 0) & (tf.reduce_sum(tgt_in, 1) == 0)
        assert not tf.reduce_any(tf.boolean_mask(tgt_out, empty) != 0)  # no tokens
        keep = tf.logical_not(empty)
        src, tgt_in, tgt_out = (tf.boolean_mask(t, keep) for t in (src, tgt_in, tgt_out))
        real.append(((src, tgt_in), tgt_out))
    expected = expected_rows(corpus.dataset, tokenizer, 32)
    assert collections.Counter(pair_rows(real)) == expected
    assert collections.Counter(pair_rows(plain)) == expected
