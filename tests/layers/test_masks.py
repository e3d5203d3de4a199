import numpy as np
import tensorflow as tf

from keras_transformer.layers import masks


def test_padding_and_causal_masks():
    ids = tf.constant([[4, 5, 0], [6, 0, 0]])
    np.testing.assert_array_equal(masks.padding_mask(ids), [[1, 1, 0], [1, 0, 0]])
    assert masks.key_padding_mask(ids).shape == (2, 1, 1, 3)
    np.testing.assert_array_equal(masks.causal_mask(3)[0, 0], np.tril(np.ones((3, 3), bool)))


def test_bias_is_float32_zero_where_allowed_and_a_finite_minimum_elsewhere():
    mask = tf.constant([[True, False, True]])
    bias = masks.attention_bias(mask)
    assert bias.dtype == tf.float32
    np.testing.assert_array_equal(bias.numpy(), [[0.0, masks.LARGE_NEGATIVE, 0.0]])
    assert np.isfinite(masks.LARGE_NEGATIVE) and masks.LARGE_NEGATIVE <= -1e9
    assert masks.attention_bias(None) is None


def test_bias_gives_masked_keys_zero_weight_and_a_masked_row_a_uniform_one():
    """What attention relies on: added to float32 scores (large ones too), the bias gives
    the masked keys exactly zero softmax weight; a fully masked row gets uniform weights."""
    scores = tf.constant([[0.0, 1e5, 3.0, 5e4], [2.0, 1.0, -5.0, 7.0]])
    mask = tf.constant([[True, False, True, False], [False, False, False, False]])
    weights = tf.nn.softmax(scores + masks.attention_bias(mask)).numpy()
    allowed = np.exp([0.0, 3.0]) / np.exp([0.0, 3.0]).sum()
    np.testing.assert_allclose(weights[0], [allowed[0], 0.0, allowed[1], 0.0], rtol=1e-6)
    assert weights[0, 1] == 0.0 and weights[0, 3] == 0.0
    np.testing.assert_array_equal(weights[1], [0.25] * 4)
