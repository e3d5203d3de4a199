import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.run_dir import load_trained
from keras_transformer.translator import Translator
from tests.run_fixture import make_run

SENTENCES = [
    "A man is riding a bike.",
    "Two dogs play in the snow near a red house.",
    "A girl.",
    "People walk.",
]


@pytest.fixture(scope="module")
def translator(tmp_path_factory, multi30k_dir):
    path = make_run(str(tmp_path_factory.mktemp("run")), multi30k_dir)
    model, tokenizer, _ = load_trained(path)
    return Translator(model, tokenizer, beam_size=4, alpha=0.6, max_extra_length=10)


def test_batch_translates_as_sentences_one_by_one(translator):
    batch = translator(tf.constant(SENTENCES))
    for i, sentence in enumerate(SENTENCES):
        single = translator(tf.constant([sentence]))
        assert single["outputs"].numpy()[0] == batch["outputs"].numpy()[i]
        np.testing.assert_allclose(
            single["scores"].numpy()[0], batch["scores"].numpy()[i], atol=1e-4
        )


def test_nbest_is_sorted_and_first_equals_best(translator):
    best = translator(tf.constant(SENTENCES))
    nbest = translator.translate_nbest(tf.constant(SENTENCES))
    assert nbest["outputs"].shape == (4, 4)
    scores = nbest["scores"].numpy()
    assert np.all(np.diff(scores, axis=1) <= 1e-6)
    np.testing.assert_array_equal(nbest["outputs"].numpy()[:, 0], best["outputs"].numpy())


def test_edge_inputs(translator):
    inputs = tf.constant(["", "   ", b"caf\xc3 \xff broken", " ".join(["word"] * 400)])
    out = translator(inputs)
    assert out["outputs"].numpy()[0] == b"" and out["outputs"].numpy()[1] == b""
    assert np.all(out["scores"].numpy()[:2] == 0.0)
    assert np.all(np.isfinite(out["scores"].numpy()))
    empty = translator(tf.constant([], tf.string))
    assert empty["outputs"].shape == (0,)


def test_output_length_is_bounded_by_input_plus_extra(translator):
    ids, _, _ = translator.search(tf.constant(["A girl."]), 4)
    source_len = int(tf.size(translator.tokenizer.tokenize(tf.constant(["A girl."]))[0])) + 1
    assert ids.shape[-1] <= source_len + translator.max_extra_length
