import math

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import LearnedPositionalEmbedding, PositionalEncoding, SharedEmbedding
from keras_transformer.layers.embedding import sinusoid_table
from tests.layer_test import run_layer_test

IDS = np.array([[5, 7, 9, 0], [1, 2, 3, 4]], np.int32)
X = np.random.default_rng(0).normal(size=(2, 4, 8)).astype(np.float32)


def test_shared_embedding_layer():
    run_layer_test(
        SharedEmbedding,
        {"vocab_size": 11, "d_model": 8},
        (IDS,),
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=1,
    )


def test_embedding_is_scaled_and_logits_use_the_same_matrix():
    layer = SharedEmbedding(vocab_size=11, d_model=8)
    out = layer(IDS).numpy()
    table = layer.embeddings.numpy()
    np.testing.assert_allclose(out, table[IDS] * math.sqrt(8), rtol=1e-6)
    logits = layer.logits(tf.constant(X))
    assert logits.dtype == tf.float32 and logits.shape == (2, 4, 11)
    np.testing.assert_allclose(logits.numpy(), X @ table.T, rtol=1e-5, atol=1e-5)


def test_logits_are_float32_under_mixed_precision():
    layer = SharedEmbedding(vocab_size=11, d_model=8, dtype="mixed_float16")
    assert layer(IDS).dtype == tf.float16
    assert layer.logits(tf.constant(X, tf.float16)).dtype == tf.float32


def test_positional_encoding_layer():
    run_layer_test(
        PositionalEncoding,
        {"d_model": 8},
        (X,),
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=0,
    )


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (7, 1), (50, 3), (123, 10)])
def test_sinusoid_matches_the_papers_formula(pos, i):
    d_model = 32
    table = sinusoid_table(tf.range(200), d_model).numpy()
    angle = pos / 10000 ** (2 * i / d_model)
    assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
    assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)


def test_positional_offset_equals_slicing_a_longer_sequence():
    layer = PositionalEncoding(d_model=8)
    zeros = tf.zeros([1, 10, 8])
    full = layer(zeros).numpy()
    np.testing.assert_allclose(layer(zeros[:, :3], offset=4).numpy(), full[:, 4:7], atol=1e-6)


def test_learned_positional_embedding_layer():
    run_layer_test(
        LearnedPositionalEmbedding,
        {"max_length": 6, "d_model": 8},
        (X,),
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=1,
    )


def test_learned_positions_offset_and_limit():
    layer = LearnedPositionalEmbedding(max_length=6, d_model=8)
    zeros = tf.zeros([1, 6, 8])
    np.testing.assert_allclose(layer(zeros[:, :2], offset=3), layer(zeros)[:, 3:5])
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_length"):
        layer(tf.zeros([1, 7, 8]))


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="even"):
        PositionalEncoding(d_model=7)
    with pytest.raises(ValueError, match="positive"):
        SharedEmbedding(vocab_size=0, d_model=8)


def test_sinusoid_halves_layout_matches_the_numpy_formula():
    # Hugging Face's Marian / CTranslate2: sin(pos w_i) on [0, d/2), cos(pos w_i) on [d/2, d)
    d, positions = 16, np.arange(40)
    w = 1.0 / np.power(10000.0, 2 * np.arange(d // 2) / d)
    angles = positions[:, None] * w[None, :]
    expected = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    table = sinusoid_table(tf.constant(positions), d, "halves").numpy()
    np.testing.assert_allclose(table, expected, atol=1e-5)
    # the same values as the interleaved table, channels permuted
    interleaved = sinusoid_table(tf.constant(positions), d).numpy()
    np.testing.assert_allclose(interleaved[:, 0::2], expected[:, : d // 2], atol=1e-6)
    np.testing.assert_allclose(interleaved[:, 1::2], expected[:, d // 2 :], atol=1e-6)


def test_positional_encoding_halves_layer_adds_its_table_and_round_trips():
    run_layer_test(
        PositionalEncoding,
        {"d_model": 8, "layout": "halves"},
        (X,),
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=0,
    )
    layer = PositionalEncoding(d_model=8, layout="halves")
    expected = X + sinusoid_table(tf.range(2, 6), 8, "halves").numpy()
    np.testing.assert_allclose(layer(X, offset=2).numpy(), expected, atol=1e-6)
    with pytest.raises(ValueError, match="layout"):
        PositionalEncoding(d_model=8, layout="diagonal")


def test_output_bias_is_added_to_the_logits_in_float32():
    run_layer_test(
        SharedEmbedding,
        {"vocab_size": 11, "d_model": 8, "output_bias": True},
        (IDS,),
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=2,
    )
    layer = SharedEmbedding(vocab_size=11, d_model=8, output_bias=True)
    layer.build()
    bias = np.arange(11, dtype=np.float32) - 5.0
    layer.bias.assign(bias)
    expected = X @ layer.embeddings.numpy().T + bias
    np.testing.assert_allclose(layer.logits(tf.constant(X)).numpy(), expected, rtol=1e-5)
    kernel = layer.output_kernel()
    np.testing.assert_allclose(layer.logits(tf.constant(X), kernel=kernel), expected, rtol=1e-5)
    assert "output_bias" not in SharedEmbedding(vocab_size=11, d_model=8).get_config()
