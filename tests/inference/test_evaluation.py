import gzip
import math
import os

import pytest
import sacrebleu

from keras_transformer.inference.evaluation import (
    EvaluationError,
    bleu_from_statistics,
    bleu_statistics,
    length_order,
    score,
    translate_all,
)


def test_bleu_equals_the_hand_computed_value():
    # one substitution in 6 tokens: n-gram precisions 5/6, 4/5, 3/4, 2/3, same length (BP 1)
    result = score(["a b c d e f"], ["a b c d e g"])
    assert result["bleu"] == pytest.approx(100 * (5 / 6 * 4 / 5 * 3 / 4 * 2 / 3) ** 0.25, abs=0.01)
    # a correct but short hypothesis: precisions 1, brevity penalty exp(1 - 6/4)
    assert score(["a b c d"], ["a b c d e f"])["bleu"] == pytest.approx(
        100 * math.exp(1 - 6 / 4), abs=0.01
    )


def test_a_better_hypothesis_scores_higher():
    refs = ["Two dogs play in the snow.", "A man rides a red bike."]
    good = score(["Two dogs play in snow.", "A man rides a bike."], refs)
    bad = score(["Dogs snow.", "A bike man."], refs)
    assert good["bleu"] > bad["bleu"] and good["chrf"] > bad["chrf"]


def noisy_hypotheses(references):
    """Hypotheses of every kind a young model writes: exact, shortened, reordered, empty."""
    out = []
    for i, ref in enumerate(references):
        words = ref.split()
        out.append([ref, " ".join(words[: len(words) // 2]), " ".join(words[::-1]), ""][i % 4])
    return out


@pytest.mark.parametrize("shards", [1, 2, 3, 7, 60])
def test_bleu_of_summed_shard_statistics_is_the_whole_sets_bleu(shards, multi30k_dir):
    """Validation BLEU in a multi-worker run: each worker scores its share (sentences w,
    w + N, ...), the statistics are summed; the BLEU is sacreBLEU's of the whole set, exactly
    (also with more shards than sentences: empty shares add zeros)."""
    with gzip.open(os.path.join(multi30k_dir, "val.de.gz"), "rt", encoding="utf-8") as handle:
        references = [next(handle).rstrip("\n") for _ in range(40)]
    hypotheses = noisy_hypotheses(references)
    parts = [bleu_statistics(hypotheses[w::shards], references[w::shards]) for w in range(shards)]
    summed = [sum(column) for column in zip(*parts)]
    assert summed == bleu_statistics(hypotheses, references)
    whole = sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert 0 < whole < 100
    assert bleu_from_statistics(summed) == round(whole, 2) == score(hypotheses, references)["bleu"]


def test_bleu_statistics_of_no_sentences_are_zeros_and_score_zero():
    assert bleu_statistics([], []) == [0] * 10
    assert bleu_from_statistics([0] * 10) == 0.0


def test_length_order_is_longest_first_and_a_permutation():
    sentences = ["a", "a b c", "", "a b", "a bb"]
    order = length_order(sentences)
    assert sorted(order) == list(range(5))
    assert order == [1, 4, 3, 0, 2]


def test_translate_all_batches_by_length_and_restores_order():
    import tensorflow as tf

    seen = []

    def translate_fn(inputs):
        batch = [s.decode() for s in inputs.numpy()]
        seen.append(batch)
        return {
            "outputs": tf.constant([s.upper() for s in batch]),
            "scores": tf.constant([-float(len(s)) for s in batch]),
        }

    sentences = ["b", "a a a", "c c", "d d d d", "e"]
    texts, scores = translate_all(translate_fn, sentences, batch_size=2)
    assert texts == [s.upper() for s in sentences]
    assert scores == [-float(len(s)) for s in sentences]
    assert seen == [["d d d d", "a a a"], ["c c", "b"], ["e"]]
    with pytest.raises(EvaluationError, match="batch size must be >= 1"):
        translate_all(translate_fn, sentences, batch_size=0)
    with pytest.raises(EvaluationError, match="2 hypotheses but 1 references"):
        score(["a", "b"], ["a"])


@pytest.mark.parametrize("where", ["file", "gz", "stdin", "stdin-gz"])
def test_read_lines_splits_on_newline_only_as_training_does(tmp_path, monkeypatch, where):
    """A stray "\\r" never splits a line (2 lines in, 2 out), in files and on stdin, gzip or
    not (`kt-translate < test.en.gz`), and the lines equal what training reads from the same
    bytes (tf.data.TextLineDataset)."""
    import gzip
    import io
    import sys

    import tensorflow as tf

    from keras_transformer.inference.evaluation import read_lines

    data = b"A dog\rruns.\r\nA cat.\nlast \xff without newline"
    plain = tmp_path / "in.txt"
    plain.write_bytes(data)
    if where.startswith("stdin"):
        given = gzip.compress(data) if where == "stdin-gz" else data
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(given)))
        path = "-"
    elif where == "gz":
        path = str(tmp_path / "in.txt.gz")
        with gzip.open(path, "wb") as handle:
            handle.write(data)
    else:
        path = str(plain)
    lines = read_lines(path)
    training = [
        line.decode("utf-8", "replace")
        for line in tf.data.TextLineDataset(str(plain)).as_numpy_iterator()
    ]
    assert lines == training == ["A dogruns.", "A cat.", "last \ufffd without newline"]


def test_read_lines_refuses_a_cut_gzip_stream_and_warns_of_bytes_not_utf8(
    tmp_path, monkeypatch, caplog
):
    import gzip
    import io
    import sys

    from keras_transformer.inference.evaluation import EvaluationError, read_lines

    cut = gzip.compress(b"A dog.\n" * 100)[:30]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(cut)))
    with pytest.raises(EvaluationError, match="stdin is not a complete gzip file"):
        read_lines("-")
    (tmp_path / "latin1.txt").write_bytes("Ein Bär.\n".encode("latin-1"))
    with caplog.at_level("WARNING", "keras_transformer"):
        assert read_lines(str(tmp_path / "latin1.txt")) == ["Ein B\ufffdr."]
    assert "latin1.txt is not UTF-8 text (an invalid byte at offset 5" in caplog.text
