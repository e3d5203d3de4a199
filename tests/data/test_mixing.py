"""Several training corpora with weights: quotas, each corpus's own passes, the mix's
proportions (statistically), tags, and an exact restart of the mixed training stream."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data import (
    ParallelText,
    SubwordTokenizer,
    load_parallel,
    pipeline,
    read_parallel_files,
    train_sentencepiece,
)
from keras_transformer.data.mixing import TAG, MixedText, quotas
from keras_transformer.data.pipeline import stream_position
from tests.data.test_pipeline import (
    assert_same_batches,
    pairs_in,
    read_multi30k,
    stream,
    tagged,
)


def write_corpus(folder, name, lines):
    """The corpus read as 4 pieces, not FILE_PIECES (64): each piece is a generator dataset
    that every pass (and every stream built) instantiates, 20-30 ms each, and the mix does not
    depend on how many pieces a corpus has (the pieces: tests/data/test_pipeline.py)."""
    (folder / f"{name}.en").write_text("".join(f"{s}\n" for s, _ in lines), encoding="utf-8")
    (folder / f"{name}.de").write_text("".join(f"{t}\n" for _, t in lines), encoding="utf-8")
    return read_parallel_files(str(folder / f"{name}.en"), str(folder / f"{name}.de"), pieces=4)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, multi30k_dir):
    """Two file corpora cut from Multi30k's validation set (600 and 414 pairs) and a
    SentencePiece model with the tag symbol, trained on them."""

    pairs = list(
        zip(read_multi30k(multi30k_dir, "val.en.gz"), read_multi30k(multi30k_dir, "val.de.gz"))
    )
    folder = tmp_path_factory.mktemp("mix")
    a, b = write_corpus(folder, "a", pairs[:600]), write_corpus(folder, "b", pairs[600:])
    sentences = [s for pair in pairs for s in pair]
    tokenizer = SubwordTokenizer(train_sentencepiece(sentences, 700, user_symbols=(TAG,)))
    return a, b, tokenizer


@pytest.fixture(scope="module")
def tfds_corpus(tmp_path_factory):
    from tests.data import tfds_fixture

    data_dir = tfds_fixture.prepare(str(tmp_path_factory.mktemp("tfds")))
    return load_parallel(f"tfds:{tfds_fixture.NAME}", "train", "en", "de", data_dir=data_dir)


def sources(data):
    return [s.decode("utf-8") for s, _ in pairs_in(data)]


def test_quotas_follow_the_weights_and_fill_the_pass():
    assert quotas([600, 414], [3, 1]) == [761, 253]  # 1014 * 3/4 = 760.5: largest remainder
    assert quotas([600, 414], [600, 414]) == [600, 414]
    assert quotas([10, 10, 10], [1, 1, 1]) == [10, 10, 10]
    assert quotas([1000, 5], [1, 0.0001]) == [1004, 1]  # every corpus is drawn from


def test_each_corpus_is_read_in_full_passes_of_its_own(corpora):
    """Three mixed passes at weights 1:3: corpus b (414 pairs) is drawn 760 times per
    mixed pass, so its stream crosses pass boundaries mid-pass; cut at every 414 pairs it
    is the whole corpus each time, in a new order each time."""
    a, b, _ = corpora
    mix = MixedText([a, b], [1, 3])
    assert mix.quotas == [254, 760] and mix.num_pairs == 1014
    names = {s: "a" for s in sources(a.dataset)} | {s: "b" for s in sources(b.dataset)}
    drawn = {"a": [], "b": []}
    for e in range(3):
        got = sources(mix.epoch(seed=4, epoch=e))
        counts = collections.Counter(names[s] for s in got)
        assert counts == {"a": 254, "b": 760}  # exactly the quotas in every mixed pass
        for s in got:
            drawn[names[s]].append(s)
    for name, corpus in (("a", a), ("b", b)):
        whole, n = sorted(sources(corpus.dataset)), corpus.num_pairs
        full = [drawn[name][i : i + n] for i in range(0, len(drawn[name]) - n + 1, n)]
        assert len(full) >= 1 + (name == "b") * 4
        for one in full:
            assert sorted(one) == whole
        assert len({tuple(one) for one in full}) == len(full)  # each pass its own order


def test_the_mix_follows_the_weights_throughout_a_pass(corpora):
    """In every window of 100 pairs the share of corpus a is what drawing without
    replacement from the pass's quotas gives: a chi-square test over the windows (and
    the pass is not cut into runs of one corpus)."""
    a, b, _ = corpora
    mix = MixedText([a, b], [3, 1])
    in_a = set(sources(a.dataset))
    flags = np.array([s in in_a for s in sources(mix.epoch(seed=1, epoch=0))])
    n, k, window = len(flags), mix.quotas[0], 100
    windows = flags[: n // window * window].reshape(-1, window).sum(axis=1)
    mean = window * k / n
    var = window * (k / n) * (1 - k / n) * (n - window) / (n - 1)  # hypergeometric
    chi2 = float(np.sum((windows - mean) ** 2 / var))
    assert len(windows) == 10
    assert chi2 < 29.588, (chi2, windows)  # the chi-square(10 dof) 99.9% quantile
    longest = max(len(run) for run in "".join("ab"[int(not f)] for f in flags).split("a"))
    assert longest < 15  # a b-run this long has probability ~ (1/4)^15 per position


def test_a_mixed_pass_depends_on_seed_and_epoch_only(corpora):
    a, b, _ = corpora
    first = sources(MixedText([a, b], [3, 1]).epoch(seed=2, epoch=1))
    assert sources(MixedText([a, b], [3, 1]).epoch(seed=2, epoch=1)) == first
    assert sources(MixedText([a, b], [3, 1]).epoch(seed=2, epoch=2)) != first
    assert sources(MixedText([a, b], [3, 1]).epoch(seed=3, epoch=1)) != first


def test_a_tagged_corpus_has_the_tag_as_one_id_before_its_sources(corpora):
    a, b, tokenizer = corpora
    mix = MixedText([a, b], tagged=(1,))
    in_b = set(sources(b.dataset))
    tag_id = int(tokenizer.tokenizer.string_to_id(TAG))
    assert tag_id == 4  # the first id after pad, unk, bos, eos
    drawn = [(s.decode("utf-8"), t.decode("utf-8")) for s, t in pairs_in(mix.epoch(0, 0).take(300))]
    sources_ = [src for src, _ in drawn]
    untagged = [src.removeprefix(TAG + " ") for src in sources_]
    # tokenized 300 at a time: SentencePiece segments each sentence on its own
    tokenized = (tokenizer.tokenize(tf.constant(x)).to_list() for x in (sources_, untagged))
    assert len(drawn) == 300
    for (src, tgt), ids, plain in zip(drawn, *tokenized, strict=True):
        is_b = src.startswith(TAG + " ")
        assert is_b == (src[len(TAG) + 1 :] in in_b) and TAG not in tgt
        assert ids.count(tag_id) == int(is_b)
        if is_b:  # "▁", <BT>, then the untagged sentence's ids
            assert ids[1] == tag_id and ids[2:] == plain


@pytest.mark.parametrize("at", ["inside", "next_pass"])
def test_mixed_training_stream_restarts_exactly(corpora, at):
    """The stream of a 3:1 mix, started at a batch's position (inside mixed pass 0 and
    inside pass 1, where both corpora stand mid-pass), is the uninterrupted stream."""
    a, b, tokenizer = corpora
    mix = MixedText([a, b], [3, 1], tagged=(1,))
    full, _ = stream(mix, tokenizer)
    batches = tagged(full.take(120))
    first_pass = sum(1 for epoch, _, _ in batches if epoch == 0)
    assert first_pass < 100
    k = {"inside": 5, "next_pass": first_pass + 3}[at]
    epoch, index, _ = batches[k]
    resumed, _ = stream(mix, tokenizer, start=stream_position(epoch, index))
    got = [batch for _, _, batch in tagged(resumed.take(6))]
    assert_same_batches(got, [batch for _, _, batch in batches[k : k + 6]])


def test_a_tfds_corpus_in_a_mix_is_counted_before_its_empty_pairs_are_dropped(corpora, tfds_corpus):
    """TFDS corpus (1200 pairs, 171 with an empty side) mixed 1:1 with a file corpus: the
    quotas count every pair (mixed passes of exactly 1800 draws), empty pairs are dropped
    after the choice, and the TFDS stream's first 1029 kept pairs are its whole first pass."""
    from tests.data.tfds_fixture import sentence_pairs

    a, _, _ = corpora
    mix = MixedText([tfds_corpus, a], [1, 1])
    assert mix.quotas == [900, 900] and mix.num_pairs == 1800
    in_a = set(sources(a.dataset))
    drawn = [
        (s.decode("utf-8"), t.decode("utf-8"))
        for e in range(2)
        for s, t in pairs_in(mix.epoch(seed=0, epoch=e))
    ]
    from_tfds = [pair for pair in drawn if pair[0] not in in_a]
    assert len(drawn) - len(from_tfds) == 1800 and all(s and t for s, t in from_tfds)
    kept = [(en, de) for en, de in sentence_pairs("train", 1200) if de]
    assert collections.Counter(from_tfds[: len(kept)]) == collections.Counter(kept)


def counted(corpus, reads):
    """`corpus` (no pieces) read through a Python generator that counts the pairs it yields
    in `reads[0]`: a pair skipped by tf.data is read, and counted, too."""
    pairs = list(corpus.dataset.as_numpy_iterator())

    def generate():
        for pair in pairs:
            reads[0] += 1
            yield pair

    spec = (tf.TensorSpec((), tf.string), tf.TensorSpec((), tf.string))
    dataset = tf.data.Dataset.from_generator(generate, output_signature=spec)
    return ParallelText(dataset, corpus.description, num_pairs=len(pairs))


def test_a_mixed_stream_reads_each_corpus_once_per_pass(corpora, monkeypatch):
    """Four mixed passes at 1:3: both corpora stand mid-pass at every epoch start (corpus
    b, 414 pairs, is drawn 760 times a pass). Each is read as often as it is drawn, plus at
    most what is read ahead (chunks of 100 draws, shuffle runs of 50 pairs), not again from
    the start of its pass up to its place at every epoch start (834 and 924 pairs more)."""
    monkeypatch.setattr(pipeline, "CHUNK_PAIRS", 100, raising=False)
    a, b, tokenizer = corpora
    reads = [[0], [0]]
    mix = MixedText([counted(a, reads[0]), counted(b, reads[1])], [1, 3], shuffle_buffer=50)
    assert mix.quotas == [254, 760]
    data, _ = stream(mix, tokenizer)
    passes = 4
    batches = tagged(data.take_while(lambda *b: b[2][0] < stream_position(passes, 0)))
    assert {epoch for epoch, _, _ in batches} == set(range(passes))
    for (count,), quota in zip(reads, mix.quotas):
        assert passes * quota <= count <= passes * quota + 500
