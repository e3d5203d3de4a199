"""Subword regularization: sampled segmentations vary, decode to the same text, are a
function of (seed, pass) only, follow the model's own sampling on average, and alpha 0 (no
sampler) is the deterministic pipeline."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer.data import SubwordTokenizer, make_batches, train_sentencepiece
from keras_transformer.data.pipeline import stream_position
from keras_transformer.data.sources import ParallelText
from keras_transformer.data.subword import SubwordSampler, merge_tree, subword_sampler
from tests.data.test_pipeline import (
    assert_same_batches,
    expected_rows,
    pair_rows,
    read_multi30k,
    stream,
    tagged,
)


@pytest.fixture(scope="module")
def text(multi30k_dir):
    return read_multi30k(multi30k_dir, "val.en.gz"), read_multi30k(multi30k_dir, "val.de.gz")


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def tokenizer(request, text):
    return SubwordTokenizer(train_sentencepiece(text[0] + text[1], 900, model_type=request.param))


def pairs_of(text, n=None):
    src, tgt = text[0][:n], text[1][:n]
    return ParallelText(tf.data.Dataset.from_tensor_slices((src, tgt)), "val", len(src))


def rows(ragged):
    return [tuple(r) for r in ragged.to_list()]


def test_sampled_segmentations_vary_and_decode_to_the_same_text(tokenizer, text):
    sentences = tf.constant(text[0][:200])
    plain = tokenizer.tokenize(sentences)
    sampler = SubwordSampler(tokenizer, 0.2)
    first = sampler(sentences, tf.constant([0, 1], tf.int64))
    again = sampler(sentences, tf.constant([0, 1], tf.int64))
    other = sampler(sentences, tf.constant([0, 2], tf.int64))
    assert rows(first) == rows(again)  # a function of the seed
    changed = [a != p for a, p in zip(rows(first), rows(plain))]
    assert np.mean(changed) > 0.3
    # one sentence 50 times in a call: drawn anew for every row, not once per call
    copies = rows(sampler(tf.constant([text[0][0]] * 50), tf.constant([0, 1], tf.int64)))
    assert len(set(copies)) > 10
    assert np.mean([a != b for a, b in zip(rows(first), rows(other))]) > 0.3  # across seeds
    decoded = tokenizer.detokenize(plain).numpy().tolist()
    for sample in (first, other):
        assert tokenizer.detokenize(sample).numpy().tolist() == decoded


def test_sampling_matches_sentencepiece_on_average(tokenizer, text):
    """Mean tokens per sentence: unigram equals SentencePiece's own n-best sampling (same
    distribution); our BPE-dropout, on the deterministic segmentation's merge trees only,
    splits somewhat more than SentencePiece's, which can merge across pieces again."""
    sentences = tf.constant(text[0][:300])
    sampler = SubwordSampler(tokenizer, 0.1)
    own = tf_text.SentencepieceTokenizer(
        model=tokenizer.proto, alpha=0.1, nbest_size=64 if sampler.model_type == "unigram" else -1
    )

    def mean_length(fn):
        return np.mean(
            [float(tf.reduce_mean(tf.cast(fn(k).row_lengths(), tf.float32))) for k in range(6)]
        )

    ours = mean_length(lambda k: sampler(sentences, tf.constant([k, 0], tf.int64)))
    theirs = mean_length(lambda k: own.tokenize(sentences))
    plain = float(tf.reduce_mean(tf.cast(tokenizer.tokenize(sentences).row_lengths(), tf.float32)))
    assert plain < theirs
    if sampler.model_type == "unigram":
        assert abs(ours - theirs) < 0.02 * theirs, (ours, theirs)
    else:
        assert theirs < ours < 1.15 * theirs, (ours, theirs)


def test_bpe_merge_tree_rebuilds_every_piece(text):
    """Each merged piece is the concatenation of its two children, and a merged child was
    made before it (a higher score; characters have scores of their own)."""
    import sentencepiece as spm

    proto = train_sentencepiece(text[0] + text[1], 900, model_type="bpe")
    sp = spm.SentencePieceProcessor(model_proto=proto)
    left, right = merge_tree(proto)
    merged = np.flatnonzero(left >= 0)
    assert len(merged) > 300
    for i in merged:
        piece = sp.id_to_piece(int(i))
        assert sp.id_to_piece(int(left[i])) + sp.id_to_piece(int(right[i])) == piece
        for child in (left[i], right[i]):
            assert left[child] < 0 or sp.get_score(int(child)) > sp.get_score(int(i))


STREAM = dict(batch_tokens=512, max_length=48, seed=5, shuffle_buffer=500, positions=True)


def test_training_batches_alpha_zero_is_today_and_sampling_is_per_pass(tokenizer, text):
    """No sampler: exactly the deterministic stream. With one: the same seed gives the
    same batches, passes differ in segmentation, and every pass decodes to the corpus."""
    pairs = pairs_of(text, 400)
    plain, _ = stream(pairs, tokenizer, **STREAM)
    again, _ = stream(pairs, tokenizer, **STREAM, subword=None)
    assert_same_batches(
        [b for _, _, b in tagged(plain.take(10))], [b for _, _, b in tagged(again.take(10))]
    )
    sampler = SubwordSampler(tokenizer, 0.2)

    def passes(**kwargs):
        data, _ = stream(pairs, tokenizer, **{**STREAM, **kwargs}, subword=sampler)
        groups = collections.defaultdict(list)
        for epoch, _, batch in tagged(data.take_while(lambda *b: b[2][0] < stream_position(2, 0))):
            groups[epoch].append(batch)
        return [pair_rows(groups[e]) for e in (0, 1)]

    first, second = passes()
    assert passes() == [first, second]  # same seed, same batches
    assert passes(seed=6) != [first, second]
    plain_rows = collections.Counter(pair_rows(
        make_batches(pairs.dataset, tokenizer, batch_tokens=512, max_length=400, shuffle=False)
    ))  # fmt: skip
    assert set(first) != set(plain_rows) and set(first) != set(second)

    def decoded(rows_):
        return collections.Counter(
            tokenizer.detokenize(tf.ragged.constant([list(s) for s, _ in rows_])).numpy()
        )

    # every pair once per pass (those the sampled lengths keep under max_length)
    whole = decoded(plain_rows)
    for one in (first, second):
        assert len(one) > 250 and all(whole[k] >= v for k, v in decoded(one).items())


def test_validation_batches_are_never_sampled(tokenizer, text):
    """make_batches without a sampler (validation, count_batches) is deterministic."""
    pairs = pairs_of(text, 200)
    kwargs = dict(batch_tokens=512, max_length=64, shuffle=False)
    a = pair_rows(make_batches(pairs.dataset, tokenizer, **kwargs))
    b = pair_rows(make_batches(pairs.dataset, tokenizer, **kwargs))
    assert a == b and collections.Counter(a) == expected_rows(pairs.dataset, tokenizer, 64)


def test_sampled_stream_restarts_exactly(tokenizer, text):
    pairs = pairs_of(text, 400)
    sampler = SubwordSampler(tokenizer, 0.2)
    full, _ = stream(pairs, tokenizer, **STREAM, subword=sampler)
    batches = tagged(full.take(60))
    first_pass = sum(1 for epoch, _, _ in batches if epoch == 0)
    k = first_pass + 2
    epoch, index, _ = batches[k]
    resumed, _ = stream(
        pairs, tokenizer, **{**STREAM, "start": stream_position(epoch, index)}, subword=sampler
    )
    got = [batch for _, _, batch in tagged(resumed.take(4))]
    assert_same_batches(got, [batch for _, _, batch in batches[k : k + 4]])


def test_unigram_draws_follow_the_segmentation_probabilities(text):
    """Unigram, alpha 0.5: the frequency of each of a sentence's n-best segmentations over
    4000 draws is softmax(alpha * log P(segmentation)) (Kudo, 2018), within 4 sigma."""
    proto = train_sentencepiece(text[0] + text[1], 900, model_type="unigram")
    tokenizer = SubwordTokenizer(proto)
    sampler = SubwordSampler(tokenizer, 0.5)
    sentence = "Two dogs play."
    nbest = tf_text.SentencepieceTokenizer(model=proto, nbest_size=64, return_nbest=True)
    candidates = rows(nbest.tokenize(tf.constant([sentence])))
    scores = np.array([sum(float(sampler.scores[i]) for i in c) for c in candidates])
    expected = np.exp(0.5 * (scores - scores.max()))
    expected /= expected.sum()
    draws = collections.Counter(rows(sampler(tf.constant([sentence] * 4000), tf.constant([3, 4]))))
    assert set(draws) <= set(candidates) and len(candidates) > 5
    for candidate, p in zip(candidates, expected):
        sigma = np.sqrt(p * (1 - p) / 4000)
        assert abs(draws[candidate] / 4000 - p) <= 4 * sigma + 1e-3, (candidate, p)


def test_bpe_dropout_matches_independent_merge_drops(text):
    """BPE, alpha 0.3: over 8000 draws, each segmentation of a one-piece word is as frequent
    as dropping every merge of its tree independently makes it (the exact distribution,
    enumerated), within 4 sigma."""
    proto = train_sentencepiece(text[0] + text[1], 900, model_type="bpe")
    tokenizer = SubwordTokenizer(proto)
    left, right = merge_tree(proto)
    drop = 0.3

    def exact(node):  # ({segmentation: probability}, P(the whole piece forms))
        if left[node] < 0:
            return {(int(node),): 1.0}, 1.0
        (dist_a, forms_a), (dist_b, forms_b) = exact(left[node]), exact(right[node])
        forms = (1 - drop) * forms_a * forms_b
        out = collections.Counter({(int(node),): forms})
        for seg_a, p_a in dist_a.items():
            for seg_b, p_b in dist_b.items():
                whole = seg_a == (int(left[node]),) and seg_b == (int(right[node]),)
                out[seg_a + seg_b] += (drop if whole else 1.0) * p_a * p_b
        return out, forms

    words = list(dict.fromkeys(" ".join(text[0]).split()))  # in order, each once
    pieces = tokenizer.tokenize(tf.constant(words)).row_lengths().numpy()  # one call
    word = max((w for w, n in zip(words, pieces) if n == 1), key=len)
    (piece,) = tokenizer.tokenize(tf.constant([word]))[0].numpy().tolist()
    expected, _ = exact(piece)
    assert len(expected) > 10 and abs(sum(expected.values()) - 1) < 1e-9
    n = 8000
    sampler = SubwordSampler(tokenizer, drop)
    got = collections.Counter(rows(sampler(tf.constant([word] * n), tf.constant([1, 2]))))
    assert set(got) <= set(expected)
    for segmentation, p in expected.items():
        sigma = np.sqrt(p * (1 - p) / n)
        assert abs(got[segmentation] / n - p) <= 4 * sigma + 1e-3, (segmentation, p)


def test_subword_sampler_is_off_without_an_alpha(tokenizer):
    """--subword-alpha unset or 0: no sampler (the deterministic segmentation)."""
    assert subword_sampler(tokenizer, None) is None and subword_sampler(tokenizer, 0.0) is None
    sampler = subword_sampler(tokenizer, 0.1)
    assert isinstance(sampler, SubwordSampler) and sampler.alpha == 0.1
