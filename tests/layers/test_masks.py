import numpy as np
import tensorflow as tf

from keras_transformer.layers import masks


def test_padding_and_causal_masks():
    ids = tf.constant([[4, 5, 0], [6, 0, 0]])
    np.testing.assert_array_equal(masks.padding_mask(ids), [[1, 1, 0], [1, 0, 0]])
    assert masks.key_padding_mask(ids).shape == (2, 1, 1, 3)
    np.testing.assert_array_equal(masks.causal_mask(3)[0, 0], np.tril(np.ones((3, 3), bool)))
    np.testing.assert_array_equal(masks.step_mask(1, 4)[0, 0, 0], [True, True, False, False])


def test_bias_is_finite_in_every_dtype():
    mask = tf.constant([True, False])
    for dtype in (tf.float16, tf.bfloat16, tf.float32):
        bias = masks.attention_bias(mask, dtype)
        assert bias.dtype == dtype
        values = tf.cast(bias, tf.float32).numpy()
        assert values[0] == 0 and np.isfinite(values[1]) and values[1] < -1e4
    assert masks.attention_bias(None) is None
